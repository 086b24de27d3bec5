//! From a decoded request to its outcome: the per-role allow-list first,
//! then one function per method family (supervisor, children, memory,
//! model, turn and log).

use std::sync::Arc;

use super::frames_io::{FrameSender, PassedFds};
use super::state::{Connection, Peer, State, error};
use super::{integration, launch, policy, recall_delegate, reflect, rpc, tasks, turn_run, workers};
use crate::protocol::events::TurnNotice;
use crate::protocol::{Call, ErrorCode, Event, Outcome, PROTOCOL_VERSION, replies};

/// Answer one request of `peer`.
pub async fn handle(
    state: &Arc<State>,
    peer: &Peer,
    id: u64,
    call: Call,
    fds: PassedFds,
    sender: &FrameSender,
    conn: &Connection,
) -> Outcome {
    if let Some(refused) = refuse_by_policy(peer, &call) {
        super::audit_records::denied(state, peer, call.method(), "outside the role's allow-list")
            .await;
        return refused;
    }
    match call {
        Call::Ping {} | Call::Status {} | Call::Stop {} | Call::Ps {} | Call::Subscribe {} => {
            supervisor_call(state, call)
        }
        Call::Spawn(_) | Call::Kill { .. } | Call::ChildTimings { .. } => {
            children_call(state, call, fds).await
        }
        Call::TurnRun(params) => turn_run::run_turn(state, params, fds, conn.gone.clone()).await,
        Call::TurnCancel {
            agent,
            conversation,
        } => turn_run::cancel_turn(state, agent, conversation).await,
        Call::MemoryCommit { .. }
        | Call::MemoryStatus { .. }
        | Call::MemoryLease { .. }
        | Call::MemoryRelease {} => memory_call(state, peer, call, conn).await,
        Call::ModelComplete { request } => {
            rpc::model_complete(state, peer, id, request, sender).await
        }
        Call::ModelInfo { model } => rpc::model_info(state, peer, model).await,
        Call::TurnEvent { ref event, .. } => {
            // A tool call the child reports is recorded before it is taken.
            if let Peer::Child {
                id, agent, role, ..
            } = peer
                && let Err(e) = state.accounting.turn_event(id, agent, role, event).await
            {
                return error(ErrorCode::Internal, format!("not recorded: {e}"));
            }
            child_report(state, peer, call)
        }
        Call::Log { .. } => child_report(state, peer, call),
        Call::TaskGet {} => tasks::task_get(state, peer),
        Call::TaskFinish { report } => tasks::task_finish(state, peer, report),
        Call::ReflectRun(params) => reflect::reflect_run(state, params).await,
        Call::ReflectStatus { agent } => reflect::reflect_status(state, agent).await,
        Call::WorkerStart { instruction } => workers::worker_start(state, peer, instruction).await,
        Call::RecallDelegate { query } => {
            recall_delegate::recall_delegate(state, peer, query).await
        }
        Call::MemoryMerge { branch } => integration::memory_merge(state, peer, branch).await,
        Call::MemorySync {
            agent,
            remote_root,
            repair,
        } => rpc::memory_sync(state, agent, remote_root, repair).await,
        Call::MemoryRepair {} => rpc::memory_repair(state, peer).await,
        Call::AgentRelease { agent } => super::cluster::release(state, agent).await,
    }
}

/// The per-role allow-list (`policy::TABLE`), decided from the identity
/// the connection was made with.
pub(crate) fn refuse_by_policy(peer: &Peer, call: &Call) -> Option<Outcome> {
    let who = peer.kind();
    let method = call.method();
    if policy::allowed(who, method) {
        return None;
    }
    if let Peer::Child { id, agent, .. } = peer {
        tracing::warn!(child = id, agent = %agent, role = who, method, "refused a method outside the role's allow-list");
    }
    Some(error(ErrorCode::Forbidden, policy::refusal(who, method)))
}

/// `ping`, `supervisor.*`, `ps`, `events.subscribe` (the subscription
/// itself is made by the connection loop, which owns the sender).
fn supervisor_call(state: &State, call: Call) -> Outcome {
    match call {
        Call::Ping {} => Outcome::reply(&replies::Pong { pong: true }),
        Call::Status {} => Outcome::reply(&status(state)),
        Call::Ps {} => {
            let rows = state.table.lock().map(|t| t.rows()).unwrap_or_default();
            let children = rows.into_iter().map(|r| with_figures(state, r)).collect();
            Outcome::reply(&replies::Children { children })
        }
        Call::Stop {} => {
            state.request_stop();
            Outcome::reply(&replies::Stopping { stopping: true })
        }
        Call::Subscribe {} => Outcome::reply(&replies::Subscribed { subscribed: true }),
        other => unrouted(&other),
    }
}

/// `child.spawn`, `child.kill`.
async fn children_call(state: &Arc<State>, call: Call, fds: PassedFds) -> Outcome {
    match call {
        Call::Spawn(params) => launch::spawn_child(state, params, fds).await,
        // Inline, not on a blocking thread: a few procfs reads and pidfd
        // calls, and answering before yielding keeps the response ahead of
        // the `child.exit` a SIGKILL causes (callers wait for the response,
        // then for the exit).
        Call::Kill { child, signal } => launch::kill_child(state, child, signal),
        Call::ChildTimings { child } => launch::child_timings(state, child),
        other => unrouted(&other),
    }
}

/// `memory.*`: validated commits and status of the caller's checkout.
async fn memory_call(state: &Arc<State>, peer: &Peer, call: Call, conn: &Connection) -> Outcome {
    match call {
        Call::MemoryCommit {
            paths,
            message,
            agent,
        } => rpc::memory_commit(state, peer, conn, paths, message, agent).await,
        Call::MemoryStatus { agent } => rpc::memory_status(state, peer, agent).await,
        Call::MemoryLease { agent } => rpc::memory_lease(state, peer, agent, conn).await,
        Call::MemoryRelease {} => rpc::memory_release(state, peer, conn),
        other => unrouted(&other),
    }
}

/// What a child reports about itself: turn events (re-broadcast to
/// subscribers, attributed from the child table) and log lines.
fn child_report(state: &State, peer: &Peer, call: Call) -> Outcome {
    match (call, peer) {
        (Call::Log { level, message }, _) => rpc::log(peer, level, &message),
        (
            Call::TurnEvent {
                conversation,
                event,
            },
            Peer::Child { id, agent, .. },
        ) => {
            state.emit(Event::TurnEvent(TurnNotice {
                agent: agent.clone(),
                child: *id,
                conversation,
                event,
            }));
            Outcome::reply(&replies::Ack {})
        }
        (call, Peer::Cli) => error(ErrorCode::Forbidden, policy::refusal("cli", call.method())),
        (other, _) => unrouted(&other),
    }
}

/// A call routed to the wrong family: a bug in [`handle`], not the peer's.
fn unrouted(call: &Call) -> Outcome {
    error(
        ErrorCode::Internal,
        format!("{} reached the wrong handler", call.method()),
    )
}

fn status(state: &State) -> replies::SupervisorStatus {
    let (live, total) = state
        .table
        .lock()
        .map(|t| (t.live().len(), t.rows().len()))
        .unwrap_or((0, 0));
    replies::SupervisorStatus {
        running: true,
        pid: std::process::id(),
        uptime_ms: state.started.elapsed().as_millis() as u64,
        home: state.home.root().to_path_buf(),
        socket: state.home.supervisor_socket(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        protocol: PROTOCOL_VERSION,
        children: live,
        children_known: total,
        cli_requests: state
            .cli_requests
            .load(std::sync::atomic::Ordering::Relaxed),
    }
}

/// A `ps` row, with a live child's current CPU and memory figures.
fn with_figures(state: &State, row: replies::ChildRow) -> replies::ChildRow {
    let figures = row
        .state
        .is_live()
        .then(|| state.accounting.live_figures(row.id, row.pid));
    replies::ChildRow { figures, ..row }
}
