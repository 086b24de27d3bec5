//! Reflections under the supervisor (spec memfs-git.md §4–6): the launch
//! (checks and preparation in `reflection::prepare`, then a confined child
//! with the `reflection` profile) and — when it exits — the finalize ladder
//! (`reflection::finalize`), run here under the agent's memory lease and
//! the repository lock, with the transcript cursor advanced only on
//! `merged` / `no_changes`. Memory workers are in `workers.rs`, the
//! explicit mode's integration turn in `integration.rs`, the recall
//! sub-agent in `recall_delegate.rs`, and the start of every sub-agent's
//! child in `subagent_child.rs`.
//!
//! What a sub-agent may touch is fixed at launch: its worktree (from
//! which its `memory.commit` lands on its branch) and its task. Its exit,
//! whatever it reports, decides only `should_merge`; what reaches `main`
//! is what git says its branch holds, validated again as merged.

use std::sync::Arc;

use super::integration::integrate;
use super::launch::SubagentLaunch;
use super::leases::LEASE_WAIT;
use super::state::{State, blocking, error};
use super::subagent_child::{off_thread, start_child, subagent_spawn, wait_exit, with_host};
use crate::protocol::events::ChildEnd;
use crate::protocol::replies::{
    LaunchResult, ReflectLaunch, ReflectStatus, RunningSlot, SubagentResult, TranscriptRef,
};
use crate::protocol::{ErrorCode, Outcome, ReflectParams};
use crate::reflection::finalize::complete_reflection;
use crate::reflection::launch_result::Refusal;
use crate::reflection::launch_result::{failed, refused};
use crate::reflection::outcome::TaskPart;
use crate::reflection::prepare::{Prepared, Request, abandon, prepare};
use crate::reflection::{settings, status, trigger};
use crate::store;

/// A launched reflection: what the caller is told, and how to wait for it.
pub struct Launched {
    pub info: ReflectLaunch,
    pub done: tokio::sync::oneshot::Receiver<SubagentResult>,
}

/// `reflect.run`.
pub(crate) async fn reflect_run(state: &Arc<State>, params: ReflectParams) -> Outcome {
    let wait = params.wait;
    match launch_reflection(state, Request::manual(&params)).await {
        Ok(launched) => {
            let mut info = launched.info;
            if wait {
                info.result = Some(launched.done.await.unwrap_or_else(|_| {
                    SubagentResult::failed(
                        "the supervisor stopped before the reflection was finalized",
                    )
                }));
            }
            Outcome::reply(&info)
        }
        Err(refusal) => Outcome::reply(&ReflectLaunch::from(refusal)),
    }
}

/// Launch a reflection: the checks of spec §5.4 in order, then the
/// worktree, the payload and the child.
pub(crate) async fn launch_reflection(
    state: &Arc<State>,
    req: Request,
) -> Result<Launched, LaunchResult> {
    let home = state.home.clone();
    let selector = req.agent.clone();
    let (record, agent) = off_thread(move || {
        store::find(&home, selector.as_deref()).map_err(|e| failed(e.to_string()))
    })
    .await?;
    // Reserved in memory first: two launches in this process never race to
    // the lock file.
    let reserved = state.subagents.with(&record.id, |a| {
        if a.reflection.is_some() {
            false
        } else {
            a.reflection = Some(0);
            true
        }
    });
    if !reserved {
        return Err(refused(Refusal::AlreadyActive));
    }
    let prepared = {
        let (st, req, record, agent) = (state.clone(), req.clone(), record.clone(), agent.clone());
        off_thread(move || with_host(&st, |host| prepare(host, &req, record, agent))).await
    };
    let prepared = match prepared {
        Ok(p) => p,
        Err(v) => {
            state.subagents.with(&record.id, |a| a.reflection = None);
            return Err(v);
        }
    };
    let (worktree_name, worktree_dir) = (
        prepared.worktree.name.clone(),
        prepared.worktree.dir.clone(),
    );
    let spawn =
        subagent_spawn(&record, &agent, "reflection", req.isolation.clone()).map_err(failed);
    // Subscribed before the launch, so the exit cannot pass unseen.
    let events = state.events.subscribe();
    let started = match spawn {
        Ok(spawn) => {
            let sub = SubagentLaunch {
                worktree: Some((worktree_name.clone(), worktree_dir.clone())),
                task: Some(prepared.task.clone()),
                conversation: None,
                timings: false,
                warm: false,
            };
            start_child(state, spawn, Vec::new(), sub)
                .await
                .map_err(failed)
        }
        Err(v) => Err(v),
    };
    let child = match started {
        Ok(child) => child,
        Err(v) => {
            // Nothing ran: the worktree and payload go, the lock is freed.
            let p = prepared;
            let _ = off_thread(move || {
                abandon(&p);
                Ok(())
            })
            .await;
            state.subagents.with(&record.id, |a| a.reflection = None);
            return Err(v);
        }
    };
    state
        .subagents
        .with(&record.id, |a| a.reflection = Some(child));
    let info = launched(&record.id, child, &req.trigger, &prepared);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let st = state.clone();
    // Tracked: an embedded supervisor drains only after it is finalized.
    state.requests.spawn(async move {
        let end = wait_exit(&st, events, child).await;
        let result = reflection_exited(&st, prepared, child, end).await;
        let _ = tx.send(result);
    });
    Ok(Launched { info, done: rx })
}

/// What the caller of a launched reflection hears.
fn launched(agent: &str, child: u64, trigger: &str, prepared: &Prepared) -> ReflectLaunch {
    let transcripts = prepared.manifest.transcripts.iter().map(|t| TranscriptRef {
        conversation_id: t.conversation_id.clone(),
        end_message_id: t.end_message_id.clone(),
    });
    ReflectLaunch {
        launched: true,
        reason: None,
        message: None,
        retry_at: None,
        agent: Some(agent.to_string()),
        child: Some(child),
        trigger: Some(trigger.to_string()),
        worktree: Some(prepared.worktree.dir.clone()),
        branch: Some(prepared.worktree.branch.clone()),
        transcripts: Some(transcripts.collect()),
        result: None,
    }
}

/// The reflection child has exited: finalize its worktree under the
/// agent's memory lease, advance the cursors on success, record the result.
async fn reflection_exited(
    state: &Arc<State>,
    p: Prepared,
    child: u64,
    end: ChildEnd,
) -> SubagentResult {
    let agent_id = p.record.id.clone();
    let report = state
        .tasks
        .lock()
        .ok()
        .and_then(|mut t| t.remove(&child))
        .and_then(|e| e.report);
    let completed = matches!(end, ChildEnd::Exited { code: 0 });
    let task = TaskPart::ended(&end, state.is_stopping(), report.clone());
    // Explicit mode: the agent reviews and merges in a turn of its own;
    // what counts afterwards is git's ancestry, not what the turn says.
    let integration = if completed && p.mode == settings::MergeMode::Explicit {
        integrate(state, &p).await
    } else {
        None
    };
    // Merging writes the checkout: no turn edits it meanwhile. Without the
    // lease nothing is merged (the transcript is retried later).
    let lease = state.leases.hold(&agent_id, LEASE_WAIT).await;
    let should_merge = completed && lease.is_ok();
    let agent = p.agent.clone();
    let result = off_thread(move || {
        Ok(complete_reflection(
            p,
            child,
            should_merge,
            (end, task),
            report,
            integration,
        ))
    })
    .await;
    drop(lease);
    state.subagents.with(&agent_id, |a| a.reflection = None);
    let result = result.unwrap_or_else(|v| SubagentResult::failed(v.message));
    super::audit_records::merged(state, &agent_id, "reflection", &result).await;
    // Published once the lock and the reservation are free: whoever reads
    // the result may launch the next reflection at once.
    let saved = result.clone();
    let _ = off_thread(move || {
        if let Err(e) = crate::reflection::launch_result::save_last_result(&agent, &saved) {
            tracing::warn!("cannot record the reflection's result: {e}");
        }
        Ok(())
    })
    .await;
    tracing::info!(agent = %agent_id, child, status = %result.status, summary = %result.summary, "reflection finalized");
    if result.merged() {
        super::autosync::sync_after(state, &agent_id, None).await;
    }
    result
}

/// After a turn of `conversation`: evaluate the agent's trigger (spec
/// §5.1) and launch a reflection when it fires. The turn's answer carries
/// what happened (`None`: the trigger did not fire).
pub async fn after_turn(
    state: &Arc<State>,
    agent_id: &str,
    conversation: &str,
    window: Option<u64>,
    isolation: Option<String>,
    evaluated: Option<Evaluation>,
) -> Option<ReflectLaunch> {
    let fired = match evaluated {
        Some(e) => e.await.ok().flatten(),
        None => evaluate(state, agent_id, conversation).await,
    }?;
    let req = Request {
        agent: Some(agent_id.to_string()),
        manual: false,
        instruction: None,
        mode: None,
        context_window: window,
        isolation,
        trigger: match fired {
            trigger::TriggerReason::StepCount { .. } => "step-count".into(),
            trigger::TriggerReason::CompactionEvent => "compaction-event".into(),
        },
    };
    Some(match launch_reflection(state, req).await {
        Ok(l) => l.info,
        Err(v) => ReflectLaunch::from(v),
    })
}

/// A trigger evaluation begun early ([`evaluate_early`]).
pub type Evaluation = tokio::task::JoinHandle<Option<trigger::TriggerReason>>;

/// Begin a finished turn's trigger evaluation now, while its child exits:
/// once the turn's child said `done` its log holds the turn (a child that
/// said so and wrote on only moves a reflection by a step).
pub(crate) fn evaluate_early(state: &Arc<State>, agent_id: &str, conversation: &str) -> Evaluation {
    let (state, agent, conversation) = (
        state.clone(),
        agent_id.to_string(),
        conversation.to_string(),
    );
    tokio::spawn(async move { evaluate(&state, &agent, &conversation).await })
}

/// Refresh the conversation's step count, note a new compaction, decide.
async fn evaluate(
    state: &Arc<State>,
    agent_id: &str,
    conversation: &str,
) -> Option<trigger::TriggerReason> {
    let (home, id, conv) = (
        state.home.clone(),
        agent_id.to_string(),
        conversation.to_string(),
    );
    off_thread(move || {
        let agent = home.agent(&id).map_err(|e| failed(e.to_string()))?;
        let settings = settings::load(&agent).unwrap_or_default();
        Ok(trigger::evaluate(&agent, &conv, &settings).ok().flatten())
    })
    .await
    .ok()
    .flatten()
}

/// `reflect.status`: lock, backoff, running child, last result, cursors.
pub(crate) async fn reflect_status(state: &Arc<State>, agent: Option<String>) -> Outcome {
    let home = state.home.clone();
    let found = blocking(move || {
        store::find(&home, agent.as_deref()).map_err(|e| error(ErrorCode::NotFound, e.to_string()))
    })
    .await;
    let (record, agent) = match found {
        Ok(f) => f,
        Err(o) => return o,
    };
    let running = state
        .subagents
        .with(&record.id, |a| (a.reflection, a.worker));
    let waiting = state.subagents.with(&record.id, |a| a.queued_workers.len());
    let id = record.id.clone();
    let status = blocking(move || Ok(status::report(&agent, id))).await;
    match status {
        Ok(report) => Outcome::reply(&ReflectStatus {
            running: RunningSlot::of(running.0),
            worker: RunningSlot::of(running.1),
            workers_waiting: waiting,
            ..report
        }),
        Err(o) => o,
    }
}
