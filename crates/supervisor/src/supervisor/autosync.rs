//! The sync the supervisor starts by itself: after a turn's commits or a
//! merge, when a remote is configured and `main` has commits the remote
//! lacks. Below the turn and the sub-agents that call it.

use std::sync::Arc;

use crate::protocol::replies::SyncOutcome;

use super::leases::LEASE_WAIT;
use super::state::{State, on_agent_thread};
use crate::store;

/// After a turn's commits or a merge: when a remote is configured (the
/// supervisor's `MINI_LETTA_REMOTE_ROOT`) and `main` has commits the remote
/// lacks, sync under the memory lease. A sync that needs the agent's or an
/// operator's attention leaves a reminder in `conversation` for its next
/// turn. `None` when nothing was to be synced.
pub(crate) async fn sync_after(
    state: &Arc<State>,
    agent_id: &str,
    conversation: Option<String>,
) -> Option<SyncOutcome> {
    let root = crate::remote::root_from_env()?;
    let paths = state.home.agent(agent_id).ok()?;
    let probe = paths.clone();
    let pending = super::state::blocking(move || Ok(crate::memfs::sync::has_pending(&probe)))
        .await
        .unwrap_or(false);
    if !pending {
        return None;
    }
    let _lease = match state.leases.hold(agent_id, LEASE_WAIT).await {
        Ok(l) => l,
        // Said, not swallowed: in a cluster an unpushed turn is not
        // acknowledged (`cluster::acknowledged`).
        Err(e) => {
            tracing::warn!(agent = %agent_id, "memory sync skipped: {e}");
            return Some(SyncOutcome::push_failed(e.to_string()));
        }
    };
    let id = agent_id.to_string();
    let fencing = super::cluster::fencing(state, agent_id);
    let outcome = on_agent_thread(state, agent_id, move || {
        let outcome = store::load(&paths)
            .map_err(|e| crate::memfs::sync::SyncError::Io {
                path: paths.agent_json(),
                source: std::io::Error::other(e.to_string()),
            })
            .and_then(|record| super::cluster::sync_agent(&paths, &record, Some(&root), &fencing));
        if let (Ok(o), Some(conv)) = (&outcome, &conversation)
            && let Some((rid, text)) = sync_reminder(o, &paths.memory_dir())
            && let Ok(Some(c)) =
                crate::store::conversation::Conversation::open_existing(&paths, conv)
            && let Err(e) = c.queue_reminder(rid, &text)
        {
            tracing::warn!(agent = %id, "cannot leave the sync reminder: {e}");
        }
        outcome
    })
    .await;
    match outcome {
        Ok(Ok(o)) => {
            tracing::info!(agent = %agent_id, status = ?o.status, "memory synced after a change");
            super::audit_records::synced(state, agent_id, &o).await;
            Some(o)
        }
        Ok(Err(e)) => {
            tracing::warn!(agent = %agent_id, "memory sync failed: {e}");
            let o = SyncOutcome::push_failed(e.to_string());
            super::audit_records::synced(state, agent_id, &o).await;
            Some(o)
        }
        Err(e) => {
            tracing::warn!(agent = %agent_id, "memory sync task failed: {e}");
            Some(SyncOutcome::push_failed(e))
        }
    }
}

/// The reminder a sync outcome leaves for the agent, if it needs one
/// (`agent::reminders`). `memory_dir` is the checkout on the host.
fn sync_reminder(
    o: &crate::memfs::sync::SyncOutcome,
    memory_dir: &std::path::Path,
) -> Option<(&'static str, String)> {
    use crate::agent::reminders;
    use crate::memfs::sync::SyncStatus;
    let status = &o.message;
    match o.status {
        SyncStatus::Conflict => Some((
            "memory-git-conflict",
            reminders::git_conflict(memory_dir, status, o.backup_ref.as_deref()),
        )),
        SyncStatus::Dirty => Some((
            "memory-commit-needed",
            reminders::commit_needed(memory_dir, status, "The next sync pushes them."),
        )),
        SyncStatus::Invalid | SyncStatus::PushFailed => Some((
            "memory-sync-failed",
            reminders::sync_failed(memory_dir, status),
        )),
        _ => None,
    }
}
