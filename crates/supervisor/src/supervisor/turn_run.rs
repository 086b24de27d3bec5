//! `turn.run` and `turn.cancel`: an agent's turn from its conversation's
//! slot to its settled end, as one sequence — check, slot, child, stream,
//! finish — whose steps live in `turn_slot.rs` (the wait for the slot) and
//! `turn_child.rs` (the child's start and watch).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::frames_io::PassedFds;
use super::state::{State, blocking, error};
use super::turn_child::Watched;
use super::turns::TurnSlot;
use super::{turn_child, turn_slot};
use crate::paths::AgentPaths;
use crate::protocol::events::ChildEnd;
use crate::protocol::replies::SyncOutcome;
use crate::protocol::timings::Marks;
use crate::protocol::{ErrorCode, Outcome, TurnParams, replies};
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

/// What the check found for one turn, carried through its steps.
pub(super) struct Turn {
    pub record: AgentRecord,
    pub agent: AgentPaths,
    /// The model the turn uses (the agent's, or the caller's choice).
    pub model: String,
    pub conversation: String,
}

async fn try_run_turn(
    state: &Arc<State>,
    params: TurnParams,
    fds: PassedFds,
    gone: CancellationToken,
) -> Result<Outcome, Outcome> {
    let mut marks = Marks::new(params.timings);
    marks.mark("sup.received");
    // Check: everything the turn needs, before anything is stored.
    let turn = check_turn(state, &params).await?;
    marks.mark("sup.checked");
    // Slot: one turn at a time per conversation.
    let slot = turn_slot::take(state, &turn.record.id, &turn.conversation, &fds, &gone).await?;
    marks.mark("sup.slot_taken");
    // Child: subscribed before the launch, so its exit cannot pass unseen.
    let spawn = turn_child::spawn_params(
        &params,
        &turn.record,
        &turn.agent,
        turn.model.clone(),
        Some(&turn.conversation),
    )?;
    let events = state.events.subscribe();
    let started = turn_child::start(
        state,
        &turn.record,
        spawn,
        fds,
        &turn.conversation,
        &mut marks,
    )
    .await?;
    // Stream: the child speaks to the caller on its descriptors; the
    // supervisor watches for its end, and for a cancel.
    let watched = turn_child::watch(
        state,
        &turn.record.id,
        &turn.conversation,
        started.child,
        events,
        &gone,
    )
    .await?;
    marks.mark("sup.child_exited");
    // Finish: the conversation settled, the slot freed, the sync, a
    // reflection the turn triggers, the next turn's child warmed.
    let finished = finish(state, &params, &turn, slot, watched, &mut marks).await?;
    Ok(Outcome::reply(&replies::TurnEnded {
        started: replies::Started {
            timings: marks.into_list(),
            ..started
        },
        exit: finished.end,
        conversation: turn.conversation,
        cancelled: finished.cancelled,
        reflection: finished.reflection,
        sync: finished.sync,
    }))
}

/// What a turn's finish did.
struct Finished {
    end: ChildEnd,
    cancelled: bool,
    sync: Option<SyncOutcome>,
    reflection: Option<replies::ReflectLaunch>,
}

/// Settle a turn whose child has ended: a cancelled one's conversation
/// shows the interruption; the slot is held until then. A turn that
/// finished is synced with the remote (when one is set), may start a
/// reflection (spec §5.1; it runs on under the supervisor while the
/// caller gets its answer), and warms the agent's next turn's child.
async fn finish(
    state: &Arc<State>,
    params: &TurnParams,
    turn: &Turn,
    slot: TurnSlot,
    watched: Watched,
    marks: &mut Marks,
) -> Result<Finished, Outcome> {
    // Killed by us: the turn was cancelled. A child that finished on its
    // own just before the signal was not (its answer stands).
    let cancelled = watched.signalled && watched.end.by_signal();
    if cancelled {
        record_interruption(&turn.agent, &turn.conversation, watched.child).await;
    }
    drop(slot);
    let sync = if cancelled {
        None
    } else {
        super::autosync::sync_after(state, &turn.record.id, Some(turn.conversation.clone())).await
    };
    super::cluster::acknowledged(state, sync.as_ref())?;
    marks.mark("sup.synced");
    let reflection = if cancelled {
        None
    } else {
        super::reflect::after_turn(
            state,
            &turn.record.id,
            &turn.conversation,
            params.reflection_context_window.or(params.context_window),
            params.isolation.clone(),
            watched.evaluated,
        )
        .await
    };
    marks.mark("sup.answered");
    if !cancelled
        && let Ok(next) =
            turn_child::spawn_params(params, &turn.record, &turn.agent, String::new(), None)
    {
        // Begun once this turn's own work is done, so the two do not
        // compete.
        super::warm::refill(state, &turn.record.id, next);
    }
    Ok(Finished {
        end: watched.end,
        cancelled,
        sync,
        reflection,
    })
}

/// Everything a turn needs is checked before anything is stored: a bad
/// model, key or configuration fails here, with its message, and the
/// conversation never holds a turn that could not run. In a cluster, only
/// the agent's owner runs its turns (issue 35).
async fn check_turn(state: &Arc<State>, params: &TurnParams) -> Result<Turn, Outcome> {
    if state.is_stopping() {
        return Err(error(ErrorCode::Unavailable, "the supervisor is stopping"));
    }
    let (st, selector, model, conversation) = (
        state.clone(),
        params.agent.clone(),
        params.model.clone(),
        params.conversation.clone(),
    );
    let (record, agent, model) = blocking(move || {
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
    .await?;
    let wait = params.wait_owner_secs.map(std::time::Duration::from_secs);
    super::cluster::own(state, &record.id, wait).await?;
    Ok(Turn {
        record,
        agent,
        model,
        conversation: params.conversation.clone(),
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
pub(crate) async fn cancel_turn(
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
