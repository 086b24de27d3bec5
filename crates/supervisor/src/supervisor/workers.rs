//! Memory workers under the supervisor: `worker.start` from an agent
//! child, the durable queue of instructions (`reflection::queue`) run one
//! at a time per agent, each in a confined child with the `memory-worker`
//! profile; when one exits, its branch is merged and its instruction
//! settled (`reflection::finalize`), run again after a pause when it did
//! not finish (`reflection::rerun`), and a conflict queues a repair.

use std::sync::Arc;

use super::launch::SubagentLaunch;
use super::leases::LEASE_WAIT;
use super::state::{State, blocking, error};
use super::subagent_child::{off_thread, start_child, subagent_spawn, wait_exit, with_host};
use crate::clock::now;
use crate::memfs::worktree as wt;
use crate::protocol::events::ChildEnd;
use crate::protocol::replies::WorkerStarted;
use crate::protocol::{ErrorCode, Outcome};
use crate::reflection::finalize::{WorkerRun, finished_at, integrate_and_settle};
use crate::reflection::launch_result::failed;
use crate::reflection::outcome::{Attempt, Next, TaskPart};
use crate::reflection::queue::{self, QueuedWorker};
use crate::reflection::rerun::{log_excerpt, retry_delay};
use crate::reflection::{prepare, repair, rerun};

/// Longest instruction a memory worker is given.
pub(crate) const MAX_WORKER_INSTRUCTION_BYTES: usize = 16 * 1024;

/// `worker.start`, from an agent child: a memory worker for the caller's
/// own agent (from the child table) with a self-contained instruction.
/// Workers of one agent run one at a time; a second waits its turn.
pub(crate) async fn worker_start(
    state: &Arc<State>,
    peer: &super::state::Peer,
    instruction: String,
) -> Outcome {
    let (agent, isolation, conversation) = match peer.agent_child("worker.start") {
        Ok(c) => c,
        Err(o) => return o,
    };
    let instruction = instruction.trim().to_string();
    if instruction.is_empty() {
        return error(
            ErrorCode::InvalidParams,
            "a memory worker needs an instruction",
        );
    }
    if instruction.len() > MAX_WORKER_INSTRUCTION_BYTES {
        return error(
            ErrorCode::InvalidParams,
            format!(
                "a memory worker's instruction is at most {MAX_WORKER_INSTRUCTION_BYTES} bytes"
            ),
        );
    }
    // Kept on disk before it is acknowledged: a supervisor that stops or
    // crashes leaves it to the next one, never drops it.
    // The conversation is the one the child was started for (the child
    // table's), told if the instruction ends up failing.
    let (home, id, iso, conv) = (
        state.home.clone(),
        agent.clone(),
        isolation.clone(),
        conversation.clone(),
    );
    let kept = blocking(move || {
        let paths = home
            .agent(&id)
            .map_err(|e| error(ErrorCode::NotFound, e.to_string()))?;
        queue::push_for(&paths, &instruction, iso.as_deref(), conv.as_deref(), now())
            .map_err(|e| error(ErrorCode::Unavailable, e.to_string()))
    })
    .await;
    let item = match kept {
        Ok(item) => item,
        Err(o) => return o,
    };
    let queued = state.subagents.with(agent, |a| {
        if a.worker.is_some() {
            a.queued_workers.push_back(item.clone());
            Some(a.queued_workers.len())
        } else {
            a.worker = Some(0);
            None
        }
    });
    if let Some(position) = queued {
        return Outcome::reply(&WorkerStarted::queued(position));
    }
    // The caller hears how this launch went: a failure is its answer, not
    // something to try again behind its back.
    Outcome::reply(&run_worker_chain(state.clone(), agent.clone(), item, false).await)
}

/// At start: run the memory workers a stopped supervisor acknowledged but
/// did not finish (`reflections/worker-queue.json`), one agent's at a time.
pub(crate) fn resume_workers(state: &Arc<State>) {
    let Ok(entries) = std::fs::read_dir(state.home.agents_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(id) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let Ok(agent) = state.home.agent(&id) else {
            continue;
        };
        if !agent
            .reflections_dir()
            .join(crate::paths::WORKER_QUEUE_FILE_NAME)
            .exists()
        {
            continue;
        }
        // Those marked failed wait for the agent to delegate them again.
        let items = match queue::pending(&agent) {
            Ok(items) => items,
            Err(e) => {
                tracing::warn!(agent = %id, "cannot read the memory workers left to run: {e}");
                continue;
            }
        };
        let mut items = std::collections::VecDeque::from(items);
        let Some(first) = items.pop_front() else {
            continue;
        };
        tracing::info!(agent = %id, waiting = items.len() + 1, "resuming memory workers a stopped supervisor left");
        state.subagents.with(&id, |a| {
            a.worker = Some(0);
            a.queued_workers = items;
        });
        let st = state.clone();
        state.requests.spawn(async move {
            let _ = Box::pin(run_worker_chain(st, id, first, true)).await;
        });
    }
}

/// Forget a finished instruction.
async fn forget_instruction(state: &Arc<State>, agent_id: &str, id: &str) {
    let (home, agent_id, id) = (state.home.clone(), agent_id.to_string(), id.to_string());
    let _ = off_thread(move || {
        if let Ok(paths) = home.agent(&agent_id)
            && let Err(e) = queue::remove(&paths, &id)
        {
            tracing::warn!(agent = %agent_id, "cannot update the memory-worker queue: {e}");
        }
        Ok(())
    })
    .await;
}

/// Launch a worker; when it is finalized, launch the next queued one.
/// `acknowledged`: the instruction was acknowledged as queued (or by a
/// previous supervisor) before this launch, so nobody hears its failure:
/// it is tried again. Otherwise the caller is answered with the failure and
/// the instruction is forgotten.
async fn run_worker_chain(
    state: Arc<State>,
    agent_id: String,
    item: QueuedWorker,
    acknowledged: bool,
) -> WorkerStarted {
    let first = launch_worker(&state, &agent_id, &item).await;
    if !first.launched {
        // A stopping supervisor keeps it for the next one; an acknowledged
        // instruction whose launch failed (a full or read-only disk, say)
        // is tried again, later.
        if !state.is_stopping() {
            tracing::warn!(agent = %agent_id, item = %item.id, instruction = %log_excerpt(&item.instruction), result = ?first.message, "a memory worker could not start");
            if acknowledged {
                let why = first
                    .message
                    .as_deref()
                    .unwrap_or("the worker could not start");
                let task = TaskPart::not_started(why);
                let attempt =
                    crate::reflection::outcome::attempt(item.next_run(), finished_at(), None, task);
                let settled = settle_off_thread(&state, &agent_id, &item, attempt).await;
                follow_up(&state, &agent_id, &item, Next::Retry, &settled).await;
            } else {
                forget_instruction(&state, &agent_id, &item.id).await;
            }
        }
        next_worker(state, agent_id);
    }
    first
}

/// [`outcome::settle`] of a run that did not start (on a blocking thread).
async fn settle_off_thread(
    state: &Arc<State>,
    agent_id: &str,
    item: &QueuedWorker,
    attempt: Attempt,
) -> queue::Settled {
    let (home, id, it) = (state.home.clone(), agent_id.to_string(), item.clone());
    let settled = off_thread(move || {
        let paths = home.agent(&id).map_err(failed)?;
        Ok(queue::settle(&paths, &it, attempt, Next::Retry))
    })
    .await;
    settled.unwrap_or_else(|v| queue::Settled::Unrecorded {
        attempts: item.attempts.saturating_add(1),
        error: v.message,
    })
}

/// After a run of `item` that did not finish it (`next` is
/// [`Next::Retry`]), settled as `settled`: run it again after a pause that
/// grows with its failures, unless [`rerun::again`] says it is done with or
/// left for the agent or the next supervisor.
async fn follow_up(
    state: &Arc<State>,
    agent_id: &str,
    item: &QueuedWorker,
    next: Next,
    settled: &queue::Settled,
) {
    if next != Next::Retry {
        return;
    }
    let Some((again, n)) = rerun::again(agent_id, item, settled) else {
        return;
    };
    if state.drain.is_cancelled() {
        // Its command is done: the instruction waits in the durable queue
        // for the next supervisor rather than holding this one's end.
        tracing::info!(agent = %agent_id, item = %item.id, "a failed memory worker is left for the next supervisor");
        return;
    }
    let (st, id) = (state.clone(), agent_id.to_string());
    state.requests.spawn(async move {
        tokio::select! {
            _ = tokio::time::sleep(retry_delay(n)) => {}
            // Stopping or draining: the next supervisor runs it.
            _ = st.stop.cancelled() => return,
            _ = st.drain.cancelled() => return,
        }
        let idle = st.subagents.with(&id, |a| {
            a.queued_workers.push_back(again);
            a.worker.is_none()
        });
        if idle {
            next_worker(st, id);
        }
    });
}

/// The slot is free: start the next queued worker, if any.
fn next_worker(state: Arc<State>, agent_id: String) {
    let next = state.subagents.with(&agent_id, |a| {
        let next = a.queued_workers.pop_front();
        a.worker = next.as_ref().map(|_| 0);
        next
    });
    if let Some(item) = next {
        let st = state.clone();
        state.requests.spawn(async move {
            let _ = Box::pin(run_worker_chain(st, agent_id, item, true)).await;
        });
    }
}

async fn launch_worker(state: &Arc<State>, agent_id: &str, item: &QueuedWorker) -> WorkerStarted {
    let (instruction, isolation) = (item.instruction.clone(), item.isolation.clone());
    let earlier = item.history.clone();
    let (st, id) = (state.clone(), agent_id.to_string());
    let prepared = off_thread(move || {
        with_host(&st, |host| {
            prepare::prepare_worker(host, &id, &instruction, &earlier)
        })
    })
    .await;
    let (record, agent, worktree, task) = match prepared {
        Ok(p) => p,
        Err(v) => return WorkerStarted::refused(v),
    };
    let spawn = match subagent_spawn(&record, &agent, "memory-worker", isolation) {
        Ok(s) => s,
        Err(e) => return WorkerStarted::refused(failed(e)),
    };
    let events = state.events.subscribe();
    let sub = SubagentLaunch {
        worktree: Some((worktree.name.clone(), worktree.dir.clone())),
        task: Some(task),
        conversation: None,
        timings: false,
        warm: false,
    };
    let child = match start_child(state, spawn, Vec::new(), sub).await {
        Ok(child) => child,
        Err(e) => {
            let (a, w) = (agent.clone(), worktree.clone());
            let _ = off_thread(move || Ok(wt::discard(&a, &w).map_err(|e| e.to_string()))).await;
            return WorkerStarted::refused(failed(e));
        }
    };
    state.subagents.with(&record.id, |a| a.worker = Some(child));
    let info = WorkerStarted::launched(
        record.id.clone(),
        child,
        worktree.dir.clone(),
        worktree.branch.clone(),
    );
    let run = WorkerRun {
        agent,
        worktree,
        item: item.clone(),
        child,
    };
    let st = state.clone();
    state.requests.spawn(async move {
        let end = wait_exit(&st, events, run.child).await;
        finish_worker(st, record.id, run, end).await;
    });
    info
}

/// A worker has exited: merge what it committed (even when it crashed or
/// was stopped with its supervisor — without the lease nothing is), then
/// settle its instruction on both parts of the outcome, and start the next.
async fn finish_worker(st: Arc<State>, id: String, run: WorkerRun, end: ChildEnd) {
    let child = run.child;
    let report = st
        .tasks
        .lock()
        .ok()
        .and_then(|mut t| t.remove(&child))
        .and_then(|e| e.report);
    let task = TaskPart::ended(&end, st.is_stopping(), report);
    let lease = st.leases.hold(&id, LEASE_WAIT).await;
    let cancelled = lease.is_err();
    let (item, isolation, previous) = (
        run.item.clone(),
        run.item.isolation.clone(),
        run.item.repair.clone(),
    );
    let settled = off_thread(move || Ok(integrate_and_settle(&run, end, task, cancelled))).await;
    drop(lease);
    let Ok(s) = settled else {
        next_worker(st, id);
        return;
    };
    super::audit_records::merged(&st, &id, "memory-worker", &s.record).await;
    tracing::info!(agent = %id, child, item = %item.id, instruction = %log_excerpt(&item.instruction), status = %s.record.status, summary = %s.record.summary, "memory worker finalized");
    if s.record.merged() {
        super::autosync::sync_after(&st, &id, None).await;
    }
    if s.conflicted && !st.is_stopping() {
        queue_repair(&st, &id, &s.branch, isolation, previous).await;
    }
    follow_up(&st, &id, &item, s.next, &s.settled).await;
    next_worker(st, id);
}

/// `sync --repair`: local commits were set aside on `branch` after a sync
/// conflict; queue the repair worker that re-applies them onto the memory
/// as it now is (the remote's), and start it when no worker runs. The
/// repair's signature in `reflection::repair` when one was queued.
pub(crate) async fn repair_set_aside(
    state: &Arc<State>,
    agent_id: &str,
    branch: &str,
) -> Option<String> {
    let queued = queue_repair(state, agent_id, branch, None, None).await;
    let idle = state.subagents.with(agent_id, |a| {
        a.worker.is_none() && !a.queued_workers.is_empty()
    });
    if idle {
        next_worker(state.clone(), agent_id.to_string());
    }
    queued
}

/// A worker's merge conflicted and its branch was kept: queue a repair
/// worker (chapter 17, exercise 3) that re-applies the kept change to the
/// memory as it is now — once per conflict (`reflection::repair`). Its
/// signature when it was queued.
async fn queue_repair(
    state: &Arc<State>,
    agent_id: &str,
    branch: &str,
    isolation: Option<String>,
    previous: Option<queue::RepairOf>,
) -> Option<String> {
    let (home, id, branch) = (state.home.clone(), agent_id.to_string(), branch.to_string());
    let queued =
        off_thread(move || repair::queue_for(&home, &id, &branch, isolation.as_deref(), previous))
            .await;
    match queued {
        Ok(Some(item)) => {
            tracing::info!(agent = %agent_id, branch = ?item.repair.as_ref().map(|r| &r.branch), "queued a repair of a conflicted memory worker");
            let signature = item.repair.as_ref().map(|r| r.signature.clone());
            state
                .subagents
                .with(agent_id, |a| a.queued_workers.push_back(item));
            signature
        }
        Ok(None) => None,
        Err(v) => {
            tracing::warn!(agent = %agent_id, result = %v.message, "cannot queue a repair");
            None
        }
    }
}
