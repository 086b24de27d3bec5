//! The supervisor's audit records of what happened to an agent, appended
//! through the state's log: the calls each site makes, in one place.

use super::state::{Peer, State};
use crate::audit::{Entry, kind};
use crate::protocol::replies::SyncOutcome;

/// Append one record for `state`, logging (not failing) when it cannot be:
/// for what has already happened and cannot be refused (an exit).
pub async fn note(state: &State, entry: Entry) {
    if let Err(e) = state.accounting.log.append(entry).await {
        tracing::error!("cannot append to the audit log: {e}");
    }
}

/// Append one record before acknowledging an action: the error to answer
/// with when it cannot be.
pub async fn record(state: &State, entry: Entry) -> Result<(), crate::protocol::Outcome> {
    state
        .accounting
        .log
        .append(entry)
        .await
        .map(drop)
        .map_err(|e| {
            super::state::error(
                crate::protocol::ErrorCode::Internal,
                format!("not acknowledged: {e}"),
            )
        })
}

/// A method refused to a child.
pub async fn denied(state: &State, peer: &Peer, method: &str, reason: &str) {
    if let Peer::Child {
        id, agent, role, ..
    } = peer
    {
        note(
            state,
            Entry::new(kind::DENIED, Some(agent), Some(role))
                .with("child", *id)
                .with("method", method)
                .with("reason", reason),
        )
        .await;
    }
}

/// The role a peer acts in, for a record.
pub fn role_of(peer: &Peer) -> &str {
    peer.kind()
}

/// A sub-agent's branch merged into `main`, or refused (its finalize
/// result: `status`, `branch`, `merge_commit`, `summary`).
pub async fn merged(state: &State, agent: &str, role: &str, result: &impl serde::Serialize) {
    let result = serde_json::to_value(result).unwrap_or_default();
    let entry = Entry::new(kind::MERGE, Some(agent), Some(role))
        .with("branch", result["branch"].clone())
        .with("sha", result["merge_commit"].clone())
        .with("outcome", result["status"].clone())
        .with("summary", result["summary"].clone());
    note(state, entry).await;
}

/// A sync with the remote: what was pushed, or why not.
pub async fn synced(state: &State, agent: &str, outcome: &SyncOutcome) {
    let mut entry = Entry::new(kind::SYNC, Some(agent), Some("supervisor"))
        .with("outcome", outcome.status.as_str())
        .with("message", outcome.message.as_str())
        .with("pushed_commits", outcome.pushed_commits);
    for (key, v) in [
        ("local", &outcome.local),
        ("remote", &outcome.remote),
        ("backup_ref", &outcome.backup_ref),
    ] {
        if let Some(v) = v {
            entry = entry.with(key, v.as_str());
        }
    }
    note(state, entry).await;
}

/// A sync that failed before it had an outcome.
pub async fn sync_failed(state: &State, agent: &str, message: &str) {
    let entry = Entry::new(kind::SYNC, Some(agent), Some("supervisor"))
        .with("outcome", "failed")
        .with("message", message);
    note(state, entry).await;
}

/// An ownership change of an agent in a cluster (`cluster::events`): the
/// host, what changed, the epoch and the instant bounding it. Durable
/// before the node acts on a take.
pub(crate) async fn owner_changed(
    log: &crate::audit::Log,
    c: crate::cluster::OwnerChange,
) -> Result<(), String> {
    let entry = Entry::new(kind::OWNER, Some(&c.agent), Some("supervisor"))
        .with("host", c.host)
        .with("change", c.change.as_str())
        .with("epoch", c.epoch)
        .with("at_ms", u64::try_from(c.at_ms).unwrap_or(u64::MAX));
    log.append(entry).await.map(drop).map_err(|e| e.to_string())
}
