//! `sync --repair` (issue 36 §5): after a sync conflict the local commits
//! are set aside and a repair worker re-applies them onto the remote's
//! memory. Success is checked, never assumed: the sync waits for the
//! repair, then asks [`sync::not_carried_over`] whether every local change
//! is on the new `main`. Only then does it report the final sync's status;
//! otherwise it stays a `conflict` naming the paths not carried over, and
//! the backup ref that keeps them.

use std::sync::Arc;
use std::time::Duration;

use super::leases::LEASE_WAIT;
use super::state::State;
use crate::memfs::sync::{self, Aside, SetAside, SyncOutcome, SyncStatus};
use crate::store::record::AgentRecord;

/// Longest a `sync --repair` waits for its repair worker.
pub const REPAIR_WAIT: Duration = Duration::from_secs(600);

/// How often the repair's record is looked at while waiting.
const POLL: Duration = Duration::from_millis(100);

/// The outcome of `sync --repair` after `conflict` (the sync's outcome)
/// and what [`sync::set_aside_for_repair`] did; with the repair branch when
/// local commits were set aside. Called without the agent's lease: the
/// repair worker needs it.
pub async fn finish(
    state: &Arc<State>,
    record: &AgentRecord,
    root: Option<String>,
    conflict: SyncOutcome,
    aside: Aside,
) -> (SyncOutcome, Option<String>) {
    match aside {
        Aside::Nothing => (conflict, None),
        Aside::Refused(why) => {
            let mut out = conflict;
            out.status = SyncStatus::Invalid;
            out.message = format!(
                "the remote's memory is refused, so nothing was set aside for a repair; local \
main is unchanged:\n{why}"
            );
            (out, None)
        }
        Aside::Set(aside) => {
            let branch = aside.branch.clone();
            (
                repair(state, record, root, conflict, aside).await,
                Some(branch),
            )
        }
    }
}

/// Queue the repair of `aside`, wait for it, check what it carried over
/// and sync once more.
async fn repair(
    state: &Arc<State>,
    record: &AgentRecord,
    root: Option<String>,
    conflict: SyncOutcome,
    aside: SetAside,
) -> SyncOutcome {
    let kept = |mut out: SyncOutcome, why: String| {
        out.status = SyncStatus::Conflict;
        out.message = format!(
            "{why}; the local commits are kept in {} and on {}",
            aside.backup_ref, aside.branch
        );
        out.backup_ref = Some(aside.backup_ref.clone());
        out
    };
    let Some(signature) = super::workers::repair_set_aside(state, &record.id, &aside.branch).await
    else {
        return kept(
            conflict,
            "no repair worker was queued (this conflict was repaired before)".into(),
        );
    };
    if !wait_done(state, record, &signature).await {
        return kept(
            conflict,
            format!(
                "the repair worker did not finish within {} s",
                REPAIR_WAIT.as_secs()
            ),
        );
    }
    let lease = match state.leases.hold(&record.id, LEASE_WAIT).await {
        Ok(l) => l,
        Err(e) => return kept(conflict, format!("cannot check the repair: {e}")),
    };
    let (paths, synced, checked) = match state.home.agent(&record.id) {
        Ok(p) => (p.clone(), record.clone(), aside.clone()),
        Err(e) => return kept(conflict, format!("cannot check the repair: {e}")),
    };
    let fencing = super::cluster::fencing(state, &record.id);
    let result = tokio::task::spawn_blocking(move || {
        let missing = sync::not_carried_over(&paths, &checked)?;
        let out = super::cluster::sync_agent(&paths, &synced, root.as_deref(), &fencing)?;
        Ok::<_, sync::SyncError>((missing, out))
    })
    .await;
    drop(lease);
    match result {
        Ok(Ok((missing, out))) if missing.is_empty() => {
            let mut out = out;
            out.message = format!("repaired: every local change is on main; {}", out.message);
            out.backup_ref = Some(aside.backup_ref.clone());
            out
        }
        Ok(Ok((missing, out))) => {
            tracing::warn!(agent = %record.id, ?missing, "the repair did not carry the local change over");
            let mut out = kept(
                out,
                format!(
                    "the repair did not keep the local side: not carried over to main: {}",
                    missing.join(", ")
                ),
            );
            out.not_carried_over = missing;
            out
        }
        Ok(Err(e)) => kept(conflict, format!("cannot check the repair: {e}")),
        Err(e) => kept(conflict, format!("cannot check the repair: {e}")),
    }
}

/// Whether the repair `signature` was finalized within [`REPAIR_WAIT`]
/// (not while the supervisor stops).
async fn wait_done(state: &Arc<State>, record: &AgentRecord, signature: &str) -> bool {
    let once = || {
        let (home, id, sig) = (state.home.clone(), record.id.clone(), signature.to_string());
        async move {
            if state.is_stopping() {
                return Ok(false);
            }
            let done = tokio::task::spawn_blocking(move || {
                let paths = home.agent(&id).ok()?;
                let attempts = crate::reflection::repair::attempts(&paths).ok()?;
                Some(attempts.get(&sig)?.state == "done")
            })
            .await
            .ok()
            .flatten()
            .unwrap_or(false);
            if done { Ok(true) } else { Err(()) }
        }
    };
    crate::retry::Policy::polling(POLL, REPAIR_WAIT)
        .run_async(|_| true, once)
        .await
        .unwrap_or(false)
}
