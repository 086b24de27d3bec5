//! Warm turn children: after an agent's turn, the supervisor starts the
//! agent's next turn child ahead of time — planned, in its cgroups, through
//! every confinement layer and exec'd — and parks it, its channel unserved,
//! until that agent's next turn hands it the conversation and the caller's
//! stdio (`protocol::handover`). The turn then skips the fork, the
//! namespaces, landlock, seccomp and both execs.
//!
//! What keeps this as safe as a cold start:
//! * one warm child per agent, used for one turn, never for another agent:
//!   the pool is keyed by the agent id from the supervisor's own records;
//! * the child reads nothing of the agent before the handover, and what it
//!   may do (its peer: agent, role, model, conversation) is fixed at the
//!   handover from the turn's request, as for a cold child;
//! * a warm child whose confinement would now be planned differently (the
//!   role's profile, the isolation, the workspace, the programs) is killed,
//!   at the turn that would use it and by the sweep every second;
//! * bounded: at most `MINI_LETTA_WARM_CHILDREN` (8) in all, each killed after
//!   `MINI_LETTA_WARM_IDLE_SECS` (120 s) unused; none in an embedded supervisor
//!   (the pool and its rules: `warm_pool`).

use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::frames_io::PassedFds;
use super::launch::{ChildEnds, SubagentLaunch, launch_registered, serve_child};
use super::state::State;
use super::warm_pool::{Found, Warm, WarmKey, discard};
use crate::paths::Home;
use crate::protocol::SpawnParams;
use crate::protocol::handover::{self, Handover};
use crate::protocol::replies;
use crate::protocol::timings::Marks;
use crate::store::record::AgentRecord;

/// How often warm children are checked against their agent's policy.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// How long a turn waits for its agent's warm child still being started
/// (most of its start is done by then) before it starts a cold one.
const WAIT_FOR_STARTING: Duration = Duration::from_millis(100);

/// The agent's warm child for a turn planned as `params`, if one is parked
/// (or about to be) and still planned the same; a stale one is killed.
pub(super) async fn take(state: &Arc<State>, agent: &str, params: &SpawnParams) -> Option<Warm> {
    let warm = match state.warm.find(agent) {
        Found::None => return None,
        Found::Ready(w) => *w,
        Found::Starting(mut rx) => {
            let _ = tokio::time::timeout(WAIT_FOR_STARTING, rx.changed()).await;
            match state.warm.find(agent) {
                Found::Ready(w) => *w,
                Found::None | Found::Starting(_) => return None,
            }
        }
    };
    if !is_parked(state, warm.id) {
        return None;
    }
    if warm.key != WarmKey::of(&state.home, params) {
        discard(warm, "its confinement would now be planned differently");
        return None;
    }
    Some(warm)
}

/// Hand a turn to a warm child: the conversation and the caller's three
/// descriptors, then its channel is served as the peer this turn makes it.
/// On failure the descriptors come back, for a cold start.
pub(super) fn hand_over(
    state: &Arc<State>,
    warm: Warm,
    record: &AgentRecord,
    params: &SpawnParams,
    sub: SubagentLaunch,
    fds: PassedFds,
) -> Result<replies::Started, PassedFds> {
    let [i, o, e] = fds.as_slice() else {
        return Err(fds);
    };
    let h = Handover {
        conversation: sub.conversation.clone().unwrap_or_default(),
        timings: sub.timings,
    };
    if let Err(err) = handover::send(warm.channel.as_fd(), &h, [i.as_fd(), o.as_fd(), e.as_fd()]) {
        tracing::debug!(child = warm.id, "cannot hand a turn to a warm child: {err}");
        discard(warm, "it did not take its turn");
        return Err(fds);
    }
    // Ours are closed now; the child holds its own copies.
    drop(fds);
    if let Ok(mut t) = state.table.lock() {
        t.mark_warm(warm.id, false);
    }
    let Warm {
        id, pid, channel, ..
    } = warm;
    let ends = ChildEnds { ours: channel };
    if serve_child(state, id, record, params, sub, ends).is_err() {
        let _ = super::child_signals::kill_child_tree(pid);
    }
    Ok(replies::Started {
        child: id,
        pid,
        agent: record.id.clone(),
        role: params.role.clone(),
        warm: true,
        timings: None,
    })
}

/// Start `params` (a warm turn child's) for `agent` in the background, when
/// it has no warm child and the pool has room.
pub(super) fn refill(state: &Arc<State>, agent: &str, params: SpawnParams) {
    if state.is_stopping() {
        return;
    }
    let Some(ready) = state.warm.reserve(agent) else {
        return;
    };
    start_sweeping(state);
    let (state, agent) = (state.clone(), agent.to_string());
    tokio::spawn(async move {
        let key = WarmKey::of(&state.home, &params);
        let sub = SubagentLaunch {
            warm: true,
            ..SubagentLaunch::default()
        };
        let launched =
            launch_registered(&state, &params, Vec::new(), &sub, &mut Marks::new(false)).await;
        let parked = match launched {
            Ok(up) => {
                if let Ok(mut t) = state.table.lock() {
                    t.mark_warm(up.id, true);
                }
                Some(Warm {
                    id: up.id,
                    pid: up.pid,
                    params,
                    key,
                    channel: up.ends.ours,
                    since: Instant::now(),
                })
            }
            Err(o) => {
                tracing::debug!(agent, "cannot start a warm child: {o:?}");
                None
            }
        };
        state.warm.park(&agent, parked, state.is_stopping());
        let _ = ready.send(true);
    });
}

/// The sweep, started with the first warm child: every second, kill the
/// warm children that waited too long, died, whose agent is gone or whose
/// confinement would be planned differently now; all of them at stop.
fn start_sweeping(state: &Arc<State>) {
    if state.warm.sweeping.swap(true, Ordering::Relaxed) {
        return;
    }
    let state = state.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SWEEP_EVERY);
        loop {
            tokio::select! {
                _ = tick.tick() => sweep(&state),
                _ = state.stop.cancelled() => break,
            }
        }
        state.warm.drain();
    });
}

fn sweep(state: &State) {
    let stale = state.warm.take_stale(|agent, w| {
        !is_parked(state, w.id)
            || w.key != WarmKey::of(&state.home, &w.params)
            || !agent_exists(&state.home, agent)
    });
    for w in stale {
        discard(
            w,
            "idle too long, ended, its agent gone, or its policy changed",
        );
    }
}

/// Whether the table says child `id` is still waiting for its turn.
fn is_parked(state: &State, id: u64) -> bool {
    state
        .table
        .lock()
        .ok()
        .and_then(|t| t.get(id).map(|c| c.state.clone()))
        == Some(super::children::ChildState::Warm)
}

/// Whether the agent's record is still there (`agent delete` removes it).
fn agent_exists(home: &Home, agent: &str) -> bool {
    home.agent(agent).is_ok_and(|a| a.agent_json().exists())
}
