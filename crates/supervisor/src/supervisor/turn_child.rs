//! A turn's child: the spawn it asks for, its start (the agent's warm
//! child when one fits), and the watch until it ends — stopped when the
//! turn is cancelled or its caller goes away.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::children::ChildState;
use super::frames_io::PassedFds;
use super::launch::{SubagentLaunch, spawn_with};
use super::state::{State, error};
use crate::paths::AgentPaths;
use crate::protocol::events::ChildEnd;
use crate::protocol::timings::Marks;
use crate::protocol::turn::TurnEvent;
use crate::protocol::{ErrorCode, Event, Outcome, SpawnParams, StdioMode, TurnParams, replies};
use crate::store::record::AgentRecord;

/// How a turn's child ended, as its watch saw it.
pub(super) struct Watched {
    pub child: u64,
    pub end: ChildEnd,
    /// Whether the watch sent the signal (the turn was cancelled).
    pub signalled: bool,
    /// The reflection trigger's evaluation when it began at the child's
    /// `done` (it runs while the child exits).
    pub evaluated: Option<super::reflect::Evaluation>,
}

/// The turn's child: the agent's warm child when one is parked and still
/// planned the same, else a new one. Returns the launch's answer.
pub(super) async fn start(
    state: &Arc<State>,
    record: &AgentRecord,
    spawn: SpawnParams,
    fds: PassedFds,
    conversation: &str,
    marks: &mut Marks,
) -> Result<replies::Started, Outcome> {
    let timings = marks.enabled();
    let sub = || SubagentLaunch {
        conversation: Some(conversation.to_string()),
        timings,
        ..SubagentLaunch::default()
    };
    let fds = match super::warm::take(state, &record.id, &spawn).await {
        Some(warm) => match super::warm::hand_over(state, warm, record, &spawn, sub(), fds) {
            Ok(started) => {
                marks.mark("sup.handed_over");
                return Ok(started);
            }
            Err(fds) => fds,
        },
        None => fds,
    };
    let mut started = spawn_with(state, spawn, fds, sub()).await?;
    if let Some(launch) = started.timings.take() {
        marks.extend(launch);
    }
    Ok(started)
}

/// The turn's child: the agent program's `turn` for `conversation`, on the
/// caller's descriptors — or, without a conversation, a warm one that waits
/// for its turn to be handed over.
pub(super) fn spawn_params(
    params: &TurnParams,
    record: &AgentRecord,
    agent: &AgentPaths,
    model: String,
    conversation: Option<&str>,
) -> Result<SpawnParams, Outcome> {
    let programs = crate::paths::Programs::installed()
        .map_err(|e| error(ErrorCode::Internal, e.to_string()))?;
    let mut argv = vec![
        programs.agent.display().to_string(),
        "turn".into(),
        "--agent-dir".into(),
        agent.dir().display().to_string(),
    ];
    match conversation {
        Some(c) => argv.extend(["--conversation".into(), c.to_string()]),
        None => argv.push("--warm".into()),
    }
    Ok(SpawnParams {
        agent: record.id.clone(),
        role: "agent".into(),
        argv,
        stdio: match conversation {
            Some(_) => StdioMode::Passed,
            None => StdioMode::Null,
        },
        workspace: params.workspace.clone(),
        isolation: params.isolation.clone(),
        model: Some(model),
    })
}

/// Wait for the turn's child `id` to end, stopping it when the turn is
/// cancelled or its caller goes away.
pub(super) async fn watch(
    state: &Arc<State>,
    agent: &str,
    conversation: &str,
    id: u64,
    mut events: tokio::sync::broadcast::Receiver<Event>,
    gone: &CancellationToken,
) -> Result<Watched, Outcome> {
    let cancel = CancellationToken::new();
    state
        .turns
        .set_running(agent, conversation, cancel.clone(), id);
    let mut cancelled = false;
    let mut evaluated = None;
    let end = loop {
        tokio::select! {
            ev = events.recv() => match ev {
                Ok(Event::ChildExit(exit)) if exit.child == id => break exit.end,
                Ok(Event::TurnEvent(notice))
                    if notice.child == id
                        && evaluated.is_none()
                        && matches!(notice.turn_event(), Some(TurnEvent::Done { .. })) =>
                {
                    evaluated = Some(super::reflect::evaluate_early(state, agent, conversation));
                }
                Ok(_) => {}
                // Missed events: the table still knows how the child ended.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    if let Some(end) = ended_in_table(state, id) {
                        break end;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    state.turns.clear_running(agent, conversation);
                    return Err(error(ErrorCode::Unavailable, "the supervisor is stopping"));
                }
            },
            _ = cancel.cancelled(), if !cancelled => {
                cancelled = stop_turn_child(state, id);
            }
            _ = gone.cancelled(), if !cancelled => {
                tracing::info!(child = id, "the caller of a turn went away: cancelling it");
                cancelled = stop_turn_child(state, id);
            }
        }
    };
    state.turns.clear_running(agent, conversation);
    Ok(Watched {
        child: id,
        end,
        signalled: cancelled,
        evaluated,
    })
}

/// SIGKILL a turn's child and everything it started. True when a signal
/// was sent (the child was still running).
fn stop_turn_child(state: &State, id: u64) -> bool {
    let info = state.table.lock().ok().and_then(|t| t.get(id).cloned());
    match info {
        Some(info) if info.is_live() => {
            tracing::info!(child = id, pid = info.pid, "cancelling a turn");
            super::child_signals::kill_child_tree(info.pid).is_ok()
        }
        _ => false,
    }
}

/// How child `id` ended, if the table says it has.
fn ended_in_table(state: &State, id: u64) -> Option<ChildEnd> {
    let info = state.table.lock().ok()?.get(id).cloned()?;
    match info.state {
        ChildState::Exited { code } => Some(ChildEnd::Exited { code }),
        ChildState::Killed { signal } => Some(ChildEnd::Killed { signal }),
        ChildState::Warm | ChildState::Starting | ChildState::Running => None,
    }
}
