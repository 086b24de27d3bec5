//! The supervisor's audit records of what happened to an agent, appended
//! through the state's log: the calls each site makes, in one place.

use serde_json::Value;

use super::state::{Peer, State};
use crate::audit::{Entry, kind};

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
pub async fn merged(state: &State, agent: &str, role: &str, result: &Value) {
    let entry = Entry::new(kind::MERGE, Some(agent), Some(role))
        .with("branch", result["branch"].clone())
        .with("sha", result["merge_commit"].clone())
        .with("outcome", result["status"].clone())
        .with("summary", result["summary"].clone());
    note(state, entry).await;
}

/// A sync with the remote: what was pushed, or why not.
pub async fn synced(state: &State, agent: &str, outcome: &Value) {
    let mut entry = Entry::new(kind::SYNC, Some(agent), Some("supervisor"))
        .with("outcome", outcome["status"].clone())
        .with("message", outcome["message"].clone());
    for key in ["local", "remote", "pushed_commits", "backup_ref"] {
        if let Some(v) = outcome.get(key) {
            entry = entry.with(key, v.clone());
        }
    }
    note(state, entry).await;
}

/// An ownership change of an agent in a cluster (`cluster::events`): the
/// host, what changed, the epoch and the instant bounding it. Durable
/// before the node acts on a take.
pub async fn owner_changed(
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
