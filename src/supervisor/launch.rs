//! Starting and signalling children: prepare the agent (uid, ownership,
//! cgroup) and plan the confinement off the async workers, launch, wire
//! the channel to a protocol loop, log the output, reap the exit.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::json;
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;

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
    spawn_with(state, params, fds, SubagentLaunch::default()).await
}

/// What a sub-agent child gets beyond a plain child: its worktree (its
/// profile's `$WORKTREE`, where its commits land) and its task.
#[derive(Debug, Default)]
pub struct SubagentLaunch {
    /// Name (under `memory-worktrees/`) and directory of the worktree.
    pub worktree: Option<(String, PathBuf)>,
    pub task: Option<crate::protocol::task::SubagentTask>,
    /// The conversation a turn child runs.
    pub conversation: Option<String>,
}

/// Start a child; its worktree and task, when given, are recorded with it
/// before its channel is served.
pub async fn spawn_with(
    state: &Arc<State>,
    params: SpawnParams,
    fds: PassedFds,
    sub: SubagentLaunch,
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
        let (st, name, role, ws, wt) = (
            state.clone(),
            params.agent.clone(),
            params.role.clone(),
            workspace.clone(),
            sub.worktree.as_ref().map(|(_, dir)| dir.clone()),
        );
        blocking(move || {
            let (mut record, agent) = store::find(&st.home, Some(&name))
                .map_err(|e| error(ErrorCode::NotFound, e.to_string()))?;
            let plan = plan_child(
                &st,
                &mut record,
                &agent,
                &role,
                isolation,
                ws.as_deref(),
                wt.as_deref(),
            )?;
            Ok((record, agent, plan))
        })
        .await?
    };
    let cwd = workspace.unwrap_or_else(|| agent.dir().to_path_buf());
    let internal =
        |what: &str, e: std::io::Error| error(ErrorCode::Internal, format!("{what}: {e}"));
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()
        .map_err(|e| internal("cannot create the child channel", e))?;
    // The egress handshake, for a child whose plan gives it the proxy.
    let egress = match plan.stage.as_ref().and_then(|s| s.egress.as_ref()) {
        Some(_) => Some(
            std::os::unix::net::UnixStream::pair()
                .map_err(|e| internal("cannot create the egress handshake", e))?,
        ),
        None => None,
    };
    let wrapper_depth = plan.wrapper_depth();
    // The child's own cgroups: removed when it is reaped (or now, when it
    // cannot be started).
    let groups = plan.cgroup_procs.clone();
    let spec = LaunchSpec {
        agent_id: record.id.clone(),
        agent,
        role: params.role.clone(),
        argv: params.argv.clone(),
        cwd,
        plan,
        stdio,
        channel: OwnedFd::from(theirs),
        egress: egress
            .as_ref()
            .and_then(|(_, t)| t.try_clone().ok())
            .map(OwnedFd::from),
    };
    let launched = match state.launcher.launch(spec).await {
        Ok(l) => l,
        Err(e) => {
            release_groups(groups).await;
            return Err(error(ErrorCode::Internal, e.to_string()));
        }
    };
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
        worktree: sub.worktree.as_ref().map(|(name, _)| name.clone()),
        isolation: params.isolation.clone(),
        conversation: sub.conversation.clone(),
    };
    if let Some((ours, theirs)) = egress {
        drop(theirs);
        let child = crate::egress::serve::ChildRef {
            id,
            agent: record.id.clone(),
            role: params.role.clone(),
        };
        state.egress.serve_child(ours, child, launched.pid);
    }
    if let Some(task) = sub.task
        && let Ok(mut tasks) = state.tasks.lock()
    {
        tasks.insert(id, super::state::TaskEntry { task, report: None });
    }
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
    let ended = Ended {
        id,
        agent_id,
        role,
        pid,
        groups,
    };
    tokio::spawn(reap(state.clone(), child, ended));
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
    if state.is_stopping() {
        return Err(error(ErrorCode::Unavailable, "the supervisor is stopping"));
    }
    let (st, selector, model, conversation) = (
        state.clone(),
        params.agent.clone(),
        params.model.clone(),
        params.conversation.clone(),
    );
    // Everything a turn needs is checked before anything is stored: a bad
    // model, key or configuration fails here, with its message, and the
    // conversation never holds a turn that could not run.
    let (record, agent, model) = blocking(move || {
        let (record, agent) = store::find(&st.home, selector.as_deref())
            .map_err(|e| error(ErrorCode::NotFound, e.to_string()))?;
        agent
            .conversation(&conversation)
            .map_err(|e| error(ErrorCode::InvalidParams, e.to_string()))?;
        let model = model.unwrap_or_else(|| record.model.clone());
        check_model(&st.home, &model)?;
        Ok((record, agent, model))
    })
    .await?;
    let conversation = params.conversation.clone();
    let slot = match state.turns.try_acquire(&record.id, &conversation) {
        Some(slot) => slot,
        None => {
            // Said on the turn's own stream, so the caller shows it.
            notify_waiting(&fds, &conversation);
            wait_for_slot(state, &record.id, &conversation, &gone).await?
        }
    };
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
            "--conversation".into(),
            conversation.clone(),
        ],
        stdio: StdioMode::Passed,
        workspace: params.workspace,
        isolation: params.isolation.clone(),
        model: Some(model),
    };
    // Subscribed before the launch, so the exit cannot pass unseen.
    let mut events = state.events.subscribe();
    let sub = SubagentLaunch {
        conversation: Some(conversation.clone()),
        ..SubagentLaunch::default()
    };
    let Outcome::Result(started) = spawn_with(state, spawn, fds, sub).await? else {
        return Err(error(ErrorCode::Internal, "the turn's child did not start"));
    };
    let id = started["child"].as_u64().unwrap_or_default();
    let cancel = CancellationToken::new();
    state
        .turns
        .set_running(&record.id, &conversation, cancel.clone(), id);
    let mut cancelled = false;
    let end = loop {
        tokio::select! {
            ev = events.recv() => match ev {
                Ok(Event::ChildExit(exit)) if exit.child == id => break exit.end,
                Ok(_) => {}
                // Missed events: the table still knows how the child ended.
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    if let Some(end) = ended_in_table(state, id) {
                        break end;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    state.turns.clear_running(&record.id, &conversation);
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
    state.turns.clear_running(&record.id, &conversation);
    // Killed by us: the turn was cancelled. A child that finished on its
    // own just before the signal was not (its answer stands).
    let cancelled = cancelled && matches!(end, ChildEnd::Killed { .. });
    if cancelled {
        let (a, c) = (agent.clone(), conversation.clone());
        let recorded = blocking(move || {
            crate::agent::runtime::record_interruption(&a, &c)
                .map_err(|e| error(ErrorCode::Internal, e.to_string()))
        })
        .await;
        if let Err(Outcome::Error(e)) = recorded {
            tracing::warn!(child = id, "cannot record the interruption: {}", e.message);
        }
    }
    // The slot is held until the conversation is settled.
    drop(slot);
    // A turn that committed is synced with the remote, when one is set.
    let synced = if cancelled {
        None
    } else {
        super::rpc::sync_after(state, &record.id, Some(conversation.clone())).await
    };
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
        )
        .await
    };
    let mut result = started;
    if let Some(obj) = result.as_object_mut() {
        if let Ok(end) = serde_json::to_value(end) {
            obj.insert("exit".into(), end);
        }
        obj.insert("conversation".into(), json!(conversation));
        obj.insert("cancelled".into(), json!(cancelled));
        if let Some(r) = reflection {
            obj.insert("reflection".into(), r);
        }
        if let Some(s) = synced {
            obj.insert("sync".into(), s);
        }
    }
    Ok(Outcome::Result(result))
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
    Outcome::Result(
        json!({ "agent": record.id, "conversation": conversation, "cancelled": cancelled }),
    )
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
    let resumed = super::children::resume_stopped(info.pid);
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
    let _ = writeln!(file, "{}", json!(event));
}

/// SIGKILL a turn's child and everything it started. True when a signal
/// was sent (the child was still running).
fn stop_turn_child(state: &State, id: u64) -> bool {
    let info = state.table.lock().ok().and_then(|t| t.get(id).cloned());
    match info {
        Some(info) if info.is_live() => {
            tracing::info!(child = id, pid = info.pid, "cancelling a turn");
            super::children::kill_child_tree(info.pid).is_ok()
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

/// What is known of a child when it ends.
struct Ended {
    id: u64,
    agent_id: String,
    role: String,
    pid: u32,
    /// Its cgroups' `cgroup.procs` files (`sandbox::cgroup::prepare`).
    groups: Vec<PathBuf>,
}

/// Remove a finished child's cgroups. Its namespace's last processes may
/// still be exiting as it is reaped, which keeps a group busy for a moment:
/// then a few more tries in the background, and after those the group is
/// left to a later sweep.
async fn release_groups(groups: Vec<PathBuf>) {
    if groups.is_empty() {
        return;
    }
    let release = |g: Vec<PathBuf>| async move {
        tokio::task::spawn_blocking(move || crate::sandbox::cgroup::release(&g))
            .await
            .unwrap_or(false)
    };
    if release(groups.clone()).await {
        return;
    }
    tokio::spawn(async move {
        for delay_ms in [10u64, 20, 40, 80, 160, 320, 640] {
            tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
            if release(groups.clone()).await {
                return;
            }
        }
        tracing::debug!(groups = ?groups, "a child's cgroup still holds a process; left for a later sweep");
    });
}

/// Wait for a child's exit, record it, remove its cgroups, and announce it.
async fn reap(state: Arc<State>, mut child: tokio::process::Child, e: Ended) {
    let Ended {
        id,
        agent_id,
        role,
        pid,
        groups,
    } = e;
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
    // Whatever it was doing, an ended child edits no memory.
    state.leases.release(super::leases::Holder::Child(id));
    // Nor reaches the network: its proxy endpoint and connections close.
    state.egress.child_ended(id);
    release_groups(groups).await;
    state.child_ended.notify_waiters();
    match &ended {
        ChildState::Killed { signal } => {
            tracing::warn!(child = id, agent = %agent_id, role = %role, pid, signal, "child killed by a signal")
        }
        // A command's exit status is its result, reported to whoever ran
        // it (`sandbox run`, a Bash call): not a warning.
        ChildState::Exited { code } if *code != 0 && role == "tool" => {
            tracing::info!(child = id, agent = %agent_id, role = %role, pid, code, "command exited non-zero")
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
    worktree: Option<&std::path::Path>,
) -> Result<LaunchPlan, Outcome> {
    use crate::sandbox::{cgroup, identity, plan, profile};
    let internal = |e: &dyn std::fmt::Display| error(ErrorCode::Internal, e.to_string());
    let programs = crate::paths::Programs::installed().map_err(|e| internal(&e))?;
    if isolation == Isolation::Off {
        tracing::warn!(agent = %record.id, role, "ISOLATION OFF: starting a child without confinement, as requested");
    }
    let profile = profile::load(&state.home, role)
        .map_err(|e| error(ErrorCode::InvalidParams, e.to_string()))?;
    let resolved = profile.resolve(agent, workspace, worktree);
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
