//! Starting and signalling children: prepare the agent (uid, ownership,
//! cgroup) and plan the confinement off the async workers, launch, wire
//! the channel to a protocol loop, log the output, reap the exit.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::json;
use tokio::net::UnixStream;

use super::children::{ChildState, LaunchSpec, ROLES, ended_state};
use super::conn::{PassedFds, split};
use super::connection::serve_frames;
use super::state::{Peer, State, blocking, error};
use super::untrusted;
use crate::agent::record::AgentRecord;
use crate::agent::store;
use crate::paths::AgentPaths;
use crate::protocol::events::{ChildEnd, ChildExit, ChildStart};
use crate::protocol::{ErrorCode, Event, Outcome, SpawnParams, StdioMode, TurnParams};
use crate::sandbox::plan::LaunchPlan;
use crate::sandbox::report::Isolation;

/// `child.spawn`.
pub async fn spawn_child(state: &Arc<State>, params: SpawnParams, fds: PassedFds) -> Outcome {
    match try_spawn(state, params, fds).await {
        Ok(o) | Err(o) => o,
    }
}

async fn try_spawn(
    state: &Arc<State>,
    params: SpawnParams,
    fds: PassedFds,
) -> Result<Outcome, Outcome> {
    if state.is_stopping() {
        return Err(error(ErrorCode::Unavailable, "the supervisor is stopping"));
    }
    if !ROLES.contains(&params.role.as_str()) {
        return Err(error(
            ErrorCode::InvalidParams,
            format!(
                "unknown role {:?} (roles: {})",
                params.role,
                ROLES.join(", ")
            ),
        ));
    }
    if params.argv.is_empty() {
        return Err(error(ErrorCode::InvalidParams, "argv must name a program"));
    }
    let isolation: Isolation = params
        .isolation
        .as_deref()
        .unwrap_or("strict")
        .parse()
        .map_err(|e: String| error(ErrorCode::InvalidParams, e))?;
    let stdio = match params.stdio {
        StdioMode::Null => None,
        StdioMode::Passed => {
            let mut it = fds.into_iter();
            match (it.next(), it.next(), it.next()) {
                (Some(i), Some(o), Some(e)) => Some([i, o, e]),
                _ => {
                    return Err(error(
                        ErrorCode::InvalidParams,
                        "stdio \"passed\" needs three descriptors sent with the request",
                    ));
                }
            }
        }
    };
    let workspace = params.workspace.as_ref().map(PathBuf::from);
    // Reading the record, chown, cgroup set-up: all blocking.
    let (record, agent, plan) = {
        let (st, name, role, ws) = (
            state.clone(),
            params.agent.clone(),
            params.role.clone(),
            workspace.clone(),
        );
        blocking(move || {
            let (mut record, agent) = store::find(&st.home, Some(&name))
                .map_err(|e| error(ErrorCode::NotFound, e.to_string()))?;
            let plan = plan_child(&st, &mut record, &agent, &role, isolation, ws.as_deref())?;
            Ok((record, agent, plan))
        })
        .await?
    };
    let cwd = workspace.unwrap_or_else(|| agent.dir().to_path_buf());
    let internal =
        |what: &str, e: std::io::Error| error(ErrorCode::Internal, format!("{what}: {e}"));
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()
        .map_err(|e| internal("cannot create the child channel", e))?;
    let wrapper_depth = plan.wrapper_depth();
    let spec = LaunchSpec {
        agent_id: record.id.clone(),
        agent,
        role: params.role.clone(),
        argv: params.argv.clone(),
        cwd,
        plan,
        stdio,
        channel: OwnedFd::from(theirs),
    };
    let launched = state
        .launcher
        .launch(spec)
        .await
        .map_err(|e| error(ErrorCode::Internal, e.to_string()))?;
    let id = state
        .table
        .lock()
        .map_err(|_| error(ErrorCode::Internal, "child table poisoned"))?
        .insert(
            &record.id,
            &record.name,
            &params.role,
            launched.pid,
            launched.started,
            wrapper_depth,
        );
    // What this child may do is fixed here, from the operator's request
    // and the agent's record; nothing it sends later changes it.
    let peer = Peer::Child {
        id,
        agent: record.id.clone(),
        role: params.role.clone(),
        model: params.model.clone().unwrap_or_else(|| record.model.clone()),
    };
    let channel = ours
        .set_nonblocking(true)
        .and_then(|()| UnixStream::from_std(ours))
        .map_err(|e| internal("child channel", e))?;
    let (reader, sender) = split(channel, false);
    if let Ok(mut ch) = state.channels.lock() {
        ch.insert(id, sender.clone());
    }
    tokio::spawn(serve_frames(state.clone(), reader, sender, peer));
    let mut child = launched.child;
    log_output(id, child.stdout.take(), "stdout");
    log_output(id, child.stderr.take(), "stderr");
    let (agent_id, role, pid) = (record.id.clone(), params.role.clone(), launched.pid);
    tokio::spawn(reap(state.clone(), child, id, agent_id, role, pid));
    state.emit(Event::ChildStart(ChildStart {
        child: id,
        agent: record.id.clone(),
        role: params.role.clone(),
        pid: launched.pid,
    }));
    Ok(Outcome::Result(
        json!({ "child": id, "pid": launched.pid, "agent": record.id, "role": params.role }),
    ))
}

/// `turn.run`: start the agent's turn child on the caller's descriptors and
/// answer once it has exited.
pub async fn run_turn(state: &Arc<State>, params: TurnParams, fds: PassedFds) -> Outcome {
    match try_run_turn(state, params, fds).await {
        Ok(o) | Err(o) => o,
    }
}

async fn try_run_turn(
    state: &Arc<State>,
    params: TurnParams,
    fds: PassedFds,
) -> Result<Outcome, Outcome> {
    let (st, selector) = (state.clone(), params.agent.clone());
    let (record, agent) = blocking(move || {
        store::find(&st.home, selector.as_deref())
            .map_err(|e| error(ErrorCode::NotFound, e.to_string()))
    })
    .await?;
    let programs = crate::paths::Programs::installed()
        .map_err(|e| error(ErrorCode::Internal, e.to_string()))?;
    let spawn = SpawnParams {
        agent: record.id.clone(),
        role: "agent".into(),
        argv: vec![
            programs.agent.display().to_string(),
            "turn".into(),
            "--agent-dir".into(),
            agent.dir().display().to_string(),
        ],
        stdio: StdioMode::Passed,
        workspace: params.workspace,
        isolation: params.isolation,
        model: params.model,
    };
    // Subscribed before the launch, so the exit cannot pass unseen.
    let mut events = state.events.subscribe();
    let Outcome::Result(started) = try_spawn(state, spawn, fds).await? else {
        return Err(error(ErrorCode::Internal, "the turn's child did not start"));
    };
    let id = started["child"].as_u64().unwrap_or_default();
    let end = loop {
        match events.recv().await {
            Ok(Event::ChildExit(exit)) if exit.child == id => break exit.end,
            Ok(_) => {}
            // Missed events: the table still knows how the child ended.
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                if let Some(end) = ended_in_table(state, id) {
                    break end;
                }
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                return Err(error(ErrorCode::Unavailable, "the supervisor is stopping"));
            }
        }
    };
    let mut result = started;
    if let (Some(obj), Ok(end)) = (result.as_object_mut(), serde_json::to_value(end)) {
        obj.insert("exit".into(), end);
    }
    Ok(Outcome::Result(result))
}

/// How child `id` ended, if the table says it has.
fn ended_in_table(state: &State, id: u64) -> Option<ChildEnd> {
    let info = state.table.lock().ok()?.get(id).cloned()?;
    match info.state {
        ChildState::Exited { code } => Some(ChildEnd::Exited { code }),
        ChildState::Killed { signal } => Some(ChildEnd::Killed { signal }),
        ChildState::Starting | ChildState::Running => None,
    }
}

/// Output of children without passed stdio goes to our log, quoted and
/// capped: a child's output cannot pose as a supervisor record, nor grow
/// our memory without bound.
fn log_output<R>(id: u64, stream: Option<R>, name: &'static str)
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    let Some(stream) = stream else { return };
    tokio::spawn(async move {
        untrusted::for_each_line(stream, untrusted::MAX_LINE, |line, cut| {
            tracing::info!(child = id, stream = name, cut, text = ?line, "child output");
        })
        .await;
    });
}

/// Wait for a child's exit, record it, and announce it.
async fn reap(
    state: Arc<State>,
    mut child: tokio::process::Child,
    id: u64,
    agent_id: String,
    role: String,
    pid: u32,
) {
    let ended = match child.wait().await {
        Ok(status) => ended_state(status),
        Err(e) => {
            tracing::warn!(child = id, "cannot wait for child: {e}");
            ChildState::Exited { code: -1 }
        }
    };
    if let Ok(mut t) = state.table.lock() {
        t.mark_ended(id, ended.clone());
    }
    if let Ok(mut ch) = state.channels.lock() {
        ch.remove(&id);
    }
    state.child_ended.notify_waiters();
    match &ended {
        ChildState::Killed { signal } => {
            tracing::warn!(child = id, agent = %agent_id, role = %role, pid, signal, "child killed by a signal")
        }
        ChildState::Exited { code } if *code != 0 => {
            tracing::warn!(child = id, agent = %agent_id, role = %role, pid, code, "child failed")
        }
        _ => tracing::info!(child = id, agent = %agent_id, role = %role, pid, "child exited"),
    }
    let end = match ended {
        ChildState::Killed { signal } => ChildEnd::Killed { signal },
        ChildState::Exited { code } => ChildEnd::Exited { code },
        // An ended child is never starting or running.
        ChildState::Starting | ChildState::Running => ChildEnd::Exited { code: -1 },
    };
    state.emit(Event::ChildExit(ChildExit {
        child: id,
        agent: agent_id,
        role,
        pid,
        end,
    }));
}
/// `child.kill`: a signal to a live child (its whole tree for SIGKILL).
pub fn kill_child(state: &State, child: u64, signal: Option<i32>) -> Outcome {
    let info = state.table.lock().ok().and_then(|t| t.get(child).cloned());
    let Some(info) = info else {
        return error(ErrorCode::NotFound, format!("no child {child}"));
    };
    if !info.is_live() {
        return error(
            ErrorCode::NotFound,
            format!("child {child} has already ended"),
        );
    }
    let sig = signal.unwrap_or(nix::sys::signal::Signal::SIGTERM as i32);
    let Ok(sig) = nix::sys::signal::Signal::try_from(sig) else {
        return error(ErrorCode::InvalidParams, format!("{sig} is not a signal"));
    };
    let result = if sig == nix::sys::signal::Signal::SIGKILL {
        super::children::kill_child_tree(info.pid)
    } else {
        super::children::signal_child_tree(info.pid, info.wrapper_depth, sig)
    };
    match result {
        Ok(()) => Outcome::Result(json!({ "signalled": child })),
        Err(e) => error(
            ErrorCode::Internal,
            format!("cannot signal child {child}: {e}"),
        ),
    }
}

/// Prepare an agent for a confined child (uid, ownership, cgroup) and plan
/// its launch; refuse when the isolation asked for cannot be met.
fn plan_child(
    state: &State,
    record: &mut AgentRecord,
    agent: &AgentPaths,
    role: &str,
    isolation: Isolation,
    workspace: Option<&std::path::Path>,
) -> Result<LaunchPlan, Outcome> {
    use crate::sandbox::{cgroup, identity, plan, profile};
    let internal = |e: &dyn std::fmt::Display| error(ErrorCode::Internal, e.to_string());
    let programs = crate::paths::Programs::installed().map_err(|e| internal(&e))?;
    if isolation == Isolation::Off {
        tracing::warn!(agent = %record.id, role, "ISOLATION OFF: starting a child without confinement, as requested");
    }
    let profile = profile::load(&state.home, role)
        .map_err(|e| error(ErrorCode::InvalidParams, e.to_string()))?;
    let resolved = profile.resolve(agent, workspace, None);
    let report = &state.sandbox;
    let confined = isolation != Isolation::Off;
    let mut uid = None;
    if confined && report.uid_switch.available {
        let u = store::ensure_sandbox_uid(&state.home, record, agent).map_err(|e| internal(&e))?;
        identity::make_traversable(&state.home).map_err(|e| internal(&e))?;
        // Both run as the agent's uid: the stage always, the agent-side
        // program for turns and probes.
        for program in [&programs.stage, &programs.agent] {
            identity::check_reachable(
                program,
                "run",
                "install mini-letta's programs where every user can run them (e.g. /usr/local/bin)",
            )
            .map_err(|e| internal(&e))?;
        }
        identity::own_agent_dir(agent, u).map_err(|e| internal(&e))?;
        uid = Some(u);
    } else if confined {
        std::fs::create_dir_all(agent.tmp_dir()).map_err(|e| internal(&e))?;
    }
    let mut launch = plan::plan(&plan::PlanInput {
        report,
        isolation,
        home: state.home.root(),
        agent_dir: agent.dir(),
        agent_id: &record.id,
        tmp_dir: &agent.tmp_dir(),
        resolved: &resolved,
        exe: &programs.cli,
        stage_exe: &programs.stage,
        agent_exe: &programs.agent,
        uid,
    })
    .map_err(|e| error(ErrorCode::Unavailable, e.to_string()))?;
    if confined && report.level != crate::sandbox::report::Level::L0 {
        tracing::warn!(level = ?report.level, "child runs below L0: {}", report.missing.join("; "));
    }
    if confined && report.cgroup.available {
        launch.cgroup_procs =
            cgroup::prepare(&report.cgroup_info, &record.id, role, &resolved.limits)
                .map_err(|e| internal(&e))?;
    }
    Ok(launch)
}
