//! `turn.run` and `turn.cancel`: an agent's turn from its conversation's
//! slot to its settled end — launched through the launcher, cancelled with
//! its caller, then the sync and the reflection a finished turn may start.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::children::ChildState;
use super::frames_io::PassedFds;
use super::launch::{SubagentLaunch, spawn_with};
use super::state::{State, blocking, error};
use crate::paths::AgentPaths;
use crate::protocol::events::ChildEnd;
use crate::protocol::timings::Marks;
use crate::protocol::turn::TurnEvent;
use crate::protocol::{ErrorCode, Event, Outcome, SpawnParams, StdioMode, TurnParams, replies};
use crate::store;
use crate::store::record::AgentRecord;

/// `turn.run`: start the agent's turn child on the caller's descriptors and
/// answer once it has exited. Turns of one conversation run one at a time;
/// `gone` is cancelled when the caller's connection closes, which cancels
/// its turn (nobody is left to read it).
pub async fn run_turn(
    state: &Arc<State>,
    params: TurnParams,
    fds: PassedFds,
    gone: CancellationToken,
) -> Outcome {
    match try_run_turn(state, params, fds, gone).await {
        Ok(o) | Err(o) => o,
    }
}

async fn try_run_turn(
    state: &Arc<State>,
    params: TurnParams,
    fds: PassedFds,
    gone: CancellationToken,
) -> Result<Outcome, Outcome> {
    let mut marks = Marks::new(params.timings);
    marks.mark("sup.received");
    if state.is_stopping() {
        return Err(error(ErrorCode::Unavailable, "the supervisor is stopping"));
    }
    let (record, agent, model) = check_turn(state, &params).await?;
    marks.mark("sup.checked");
    // In a cluster, only the agent's owner runs its turns (issue 35).
    let wait = params.wait_owner_secs.map(std::time::Duration::from_secs);
    super::cluster::own(state, &record.id, wait).await?;
    let conversation = params.conversation.clone();
    let slot = take_slot(state, &record.id, &conversation, &fds, &gone).await?;
    marks.mark("sup.slot_taken");
    let spawn = turn_spawn(&params, &record, &agent, model, Some(&conversation))?;
    // Subscribed before the launch, so the exit cannot pass unseen.
    let events = state.events.subscribe();
    let started = start_turn_child(state, &record, spawn, fds, &conversation, &mut marks).await?;
    let id = started.child;
    let (end, signalled, evaluated) =
        watch_turn(state, &record.id, &conversation, id, events, &gone).await?;
    marks.mark("sup.child_exited");
    // Killed by us: the turn was cancelled. A child that finished on its
    // own just before the signal was not (its answer stands).
    let cancelled = signalled && matches!(end, ChildEnd::Killed { .. });
    if cancelled {
        record_interruption(&agent, &conversation, id).await;
    }
    // The slot is held until the conversation is settled.
    drop(slot);
    // A turn that committed is synced with the remote, when one is set.
    let synced = if cancelled {
        None
    } else {
        super::autosync::sync_after(state, &record.id, Some(conversation.clone())).await
    };
    super::cluster::acknowledged(state, synced.as_ref())?;
    marks.mark("sup.synced");
    // A finished turn may trigger a reflection (spec §5.1); it runs on
    // under the supervisor while the caller gets its answer.
    let reflection = if cancelled {
        None
    } else {
        super::reflect::after_turn(
            state,
            &record.id,
            &conversation,
            params.reflection_context_window.or(params.context_window),
            params.isolation.clone(),
            evaluated,
        )
        .await
    };
    marks.mark("sup.answered");
    if !cancelled && let Ok(next) = turn_spawn(&params, &record, &agent, String::new(), None) {
        // The agent's next turn finds its child started (`warm`); begun
        // once this turn's own work is done, so the two do not compete.
        super::warm::refill(state, &record.id, next);
    }
    Ok(Outcome::reply(&replies::TurnEnded {
        started: replies::Started {
            timings: marks.into_list(),
            ..started
        },
        exit: end,
        conversation,
        cancelled,
        reflection,
        sync: synced,
    }))
}

/// Everything a turn needs is checked before anything is stored: a bad
/// model, key or configuration fails here, with its message, and the
/// conversation never holds a turn that could not run. Returns the agent
/// and the model the turn uses.
async fn check_turn(
    state: &Arc<State>,
    params: &TurnParams,
) -> Result<(AgentRecord, AgentPaths, String), Outcome> {
    let (st, selector, model, conversation) = (
        state.clone(),
        params.agent.clone(),
        params.model.clone(),
        params.conversation.clone(),
    );
    blocking(move || {
        let (record, agent) = store::find(&st.home, selector.as_deref())
            .map_err(|e| error(ErrorCode::NotFound, e.to_string()))?;
        agent
            .conversation(&conversation)
            .map_err(|e| error(ErrorCode::InvalidParams, e.to_string()))?;
        let model = model.unwrap_or_else(|| record.model.clone());
        check_model(&st.home, &model)?;
        // A spent budget refuses the turn before anything starts.
        st.accounting
            .check_budget(&st.home, &record.id, "agent", "turn_start", 0)
            .map_err(|r| {
                Outcome::Error(crate::protocol::ErrorBody {
                    code: ErrorCode::Forbidden,
                    message: r.message.clone(),
                    data: serde_json::to_value(&r).ok(),
                })
            })?;
        Ok((record, agent, model))
    })
    .await
}

/// The turn's child: the agent's warm child when one is parked and still
/// planned the same, else a new one. Returns the launch's answer.
async fn start_turn_child(
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

/// The conversation's turn slot, now or once its running turn ends.
async fn take_slot(
    state: &Arc<State>,
    agent: &str,
    conversation: &str,
    fds: &PassedFds,
    gone: &CancellationToken,
) -> Result<super::turns::TurnSlot, Outcome> {
    match state.turns.try_acquire(agent, conversation) {
        Some(slot) => Ok(slot),
        None => {
            // Said on the turn's own stream, so the caller shows it.
            notify_waiting(fds, conversation);
            wait_for_slot(state, agent, conversation, gone).await
        }
    }
}

/// The turn's child: the agent program's `turn` for `conversation`, on the
/// caller's descriptors — or, without a conversation, a warm one that waits
/// for its turn to be handed over.
fn turn_spawn(
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
/// cancelled or its caller goes away. Returns how it ended, whether we
/// sent the signal, and the reflection trigger's evaluation when it began
/// at the child's `done` (it runs while the child exits).
async fn watch_turn(
    state: &Arc<State>,
    agent: &str,
    conversation: &str,
    id: u64,
    mut events: tokio::sync::broadcast::Receiver<Event>,
    gone: &CancellationToken,
) -> Result<(ChildEnd, bool, Option<super::reflect::Evaluation>), Outcome> {
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
    Ok((end, cancelled, evaluated))
}

/// A cancelled turn's conversation shows the interruption (child `id`'s
/// calls answered as interrupted).
async fn record_interruption(agent: &AgentPaths, conversation: &str, id: u64) {
    let (a, c) = (agent.clone(), conversation.to_string());
    let recorded = blocking(move || {
        crate::agent::runtime::record_interruption(&a, &c)
            .map_err(|e| error(ErrorCode::Internal, e.to_string()))
    })
    .await;
    if let Err(Outcome::Error(e)) = recorded {
        tracing::warn!(child = id, "cannot record the interruption: {}", e.message);
    }
}

/// `turn.cancel`: cancel the running turn of a conversation.
pub async fn cancel_turn(
    state: &Arc<State>,
    agent: Option<String>,
    conversation: String,
) -> Outcome {
    let st = state.clone();
    let found = blocking(move || {
        store::find(&st.home, agent.as_deref())
            .map_err(|e| error(ErrorCode::NotFound, e.to_string()))
    })
    .await;
    let record = match found {
        Ok((record, _)) => record,
        Err(o) => return o,
    };
    let cancelled = state.turns.cancel(&record.id, &conversation);
    Outcome::reply(&replies::TurnCancelled {
        agent: record.id,
        conversation,
        cancelled,
    })
}

/// Whether `model` can serve a turn here (known form, key configured,
/// `config.toml` valid): the provider's own message when not.
fn check_model(home: &crate::paths::Home, model: &str) -> Result<(), Outcome> {
    let cfg = crate::model::ProviderConfig::load(home)
        .map_err(|e| error(ErrorCode::InvalidParams, e.to_string()))?;
    crate::model::open_model(model, &cfg)
        .map(drop)
        .map_err(|e| error(ErrorCode::InvalidParams, e.to_string()))
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
) -> Result<super::turns::TurnSlot, Outcome> {
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
