//! A turn's wait for its conversation's slot: the notice on the caller's
//! own stream, and a stopped turn ahead of it resumed so the wait ends.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::frames_io::PassedFds;
use super::state::{State, error};
use super::turns::TurnSlot;
use crate::protocol::{ErrorCode, Outcome};

/// The conversation's turn slot, now or once its running turn ends.
pub(super) async fn take(
    state: &Arc<State>,
    agent: &str,
    conversation: &str,
    fds: &PassedFds,
    gone: &CancellationToken,
) -> Result<TurnSlot, Outcome> {
    match state.turns.try_acquire(agent, conversation) {
        Some(slot) => Ok(slot),
        None => {
            // Said on the turn's own stream, so the caller shows it.
            notify_waiting(fds, conversation);
            wait_for_slot(state, agent, conversation, gone).await
        }
    }
}

/// How often a turn waiting for its conversation looks whether the
/// running turn's child is stopped.
const STOPPED_CHECK: std::time::Duration = std::time::Duration::from_millis(200);

/// Wait for the conversation's turn slot. Meanwhile, a running turn whose
/// child is stopped (SIGSTOP, a freezer: it will never finish by itself,
/// and its own client may wait for it for long) is resumed, so the turn
/// ends and the slot comes — the holder is never killed or overtaken.
async fn wait_for_slot(
    state: &Arc<State>,
    agent: &str,
    conversation: &str,
    gone: &CancellationToken,
) -> Result<TurnSlot, Outcome> {
    let acquire = state.turns.acquire(agent, conversation);
    tokio::pin!(acquire);
    let mut tick = tokio::time::interval(STOPPED_CHECK);
    loop {
        tokio::select! {
            slot = &mut acquire => return Ok(slot),
            _ = tick.tick() => resume_stopped_holder(state, agent, conversation),
            _ = gone.cancelled() => return Err(error(ErrorCode::Unavailable, "the caller went away while its turn waited")),
            _ = state.stop.cancelled() => return Err(error(ErrorCode::Unavailable, "the supervisor is stopping")),
        }
    }
}

/// SIGCONT every stopped process of the conversation's running turn.
fn resume_stopped_holder(state: &State, agent: &str, conversation: &str) {
    let Some(id) = state.turns.running_child(agent, conversation) else {
        return;
    };
    let info = state.table.lock().ok().and_then(|t| t.get(id).cloned());
    let Some(info) = info.filter(|i| i.is_live()) else {
        return;
    };
    let resumed = super::child_signals::resume_stopped(info.pid);
    if resumed > 0 {
        tracing::warn!(
            child = id,
            agent,
            conversation,
            pid = info.pid,
            processes = resumed,
            "resumed a stopped turn another turn of its conversation waits for"
        );
    }
}

/// Write a `waiting` turn event on the caller's stdout descriptor (the
/// second of the three), before any child owns it.
fn notify_waiting(fds: &PassedFds, conversation: &str) {
    use std::io::Write;
    let Some(out) = fds.get(1) else { return };
    let Ok(dup) = out.try_clone() else { return };
    let event = crate::protocol::turn::TurnEvent::Waiting {
        reason: format!("waiting for the running turn of conversation {conversation} to finish"),
    };
    let mut file = std::fs::File::from(dup);
    // One short line into an empty pipe: it does not block.
    if let Ok(line) = serde_json::to_string(&event) {
        let _ = writeln!(file, "{line}");
    }
}
