//! Starting and signalling children: prepare the agent (uid, ownership,
//! cgroup) and plan the confinement off the async workers, launch, wire
//! the channel to a protocol loop, log the output, reap the exit.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::UnixStream;

use super::children::{ChildState, LaunchSpec, ROLES, ended_state};
use super::frames_io::{PassedFds, split};
use super::state::{Peer, State, blocking, error};
use super::untrusted;
use crate::paths::AgentPaths;
use crate::protocol::events::{ChildEnd, ChildExit, ChildStart};
use crate::protocol::timings::Marks;
use crate::protocol::{ErrorCode, Event, Outcome, SpawnParams, StdioMode, replies};
use crate::sandbox::plan::LaunchPlan;
use crate::sandbox::report::Isolation;
use crate::store;
use crate::store::record::AgentRecord;

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
    let started = spawn_with(state, params, fds, SubagentLaunch::default()).await?;
    Ok(Outcome::reply(&started))
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
    /// The launch's marks go into the answer (`timings`): `chat --timings`.
    pub timings: bool,
    /// Started ahead of its turn (`supervisor::warm`): it waits, unserved,
    /// for the turn handed over to it.
    pub warm: bool,
}

/// Start a child; its worktree and task, when given, are recorded with it
/// before its channel is served.
pub(crate) async fn spawn_with(
    state: &Arc<State>,
    params: SpawnParams,
    fds: PassedFds,
    sub: SubagentLaunch,
) -> Result<replies::Started, Outcome> {
    // Always taken (a few clock reads): the child's row keeps them for
    // `child.timings`; a turn that asked gets them in the answer too.
    let mut marks = Marks::new(true);
    marks.mark("sup.spawn_received");
    let answer_marks = sub.timings;
    let up = launch_registered(state, &params, fds, &sub, &mut marks).await?;
    if let Ok(mut t) = state.table.lock() {
        t.add_marks(up.id, marks.list().iter().cloned());
    }
    let mut started = up.started(&params);
    serve_child(state, up.id, &up.record, &params, sub, up.ends)?;
    if answer_marks {
        started.timings = marks.into_list();
    }
    Ok(started)
}

/// A child launched and in the table (its output logged, its reaper
/// running), whose channel is not served yet.
pub(super) struct Registered {
    pub id: u64,
    pub pid: u32,
    pub record: AgentRecord,
    pub ends: ChildEnds,
}

impl Registered {
    /// The answer of a launch.
    pub fn started(&self, params: &SpawnParams) -> replies::Started {
        replies::Started {
            child: self.id,
            pid: self.pid,
            agent: self.record.id.clone(),
            role: params.role.clone(),
            warm: false,
            timings: None,
        }
    }
}

/// Plan, launch and register a child: everything of a start but serving
/// its channel (a warm child's waits for its turn).
pub(super) async fn launch_registered(
    state: &Arc<State>,
    params: &SpawnParams,
    fds: PassedFds,
    sub: &SubagentLaunch,
    marks: &mut Marks,
) -> Result<Registered, Outcome> {
    let (isolation, stdio) = check_spawn(state, params, fds)?;
    let workspace = params.workspace.as_ref().map(PathBuf::from);
    let (record, agent, plan) = prepare_child(state, params, sub, isolation, &workspace).await?;
    marks.mark("sup.child_planned");
    let cwd = workspace.unwrap_or_else(|| agent.dir().to_path_buf());
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()
        .map_err(|e| internal("cannot create the child channel", e))?;
    let egress = egress_handshake(&plan)?;
    let wrapper_depth = plan.wrapper_depth();
    // The child's own cgroups: removed when it is reaped (or now, when it
    // cannot be started).
    let groups = plan.cgroup_procs.clone();
    let uid = plan.uid;
    let level = plan.level;
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
    marks.mark("sup.child_forked");
    let confined = Confined { uid, level };
    let id = register_child(
        state,
        &record,
        params,
        sub,
        &launched,
        wrapper_depth,
        confined,
    )
    .await?;
    marks.mark("sup.child_registered");
    state.accounting.track(id, groups.clone());
    let mut child = launched.child;
    log_output(id, child.stdout.take(), "stdout");
    log_output(id, child.stderr.take(), "stderr");
    let pid = launched.pid;
    let ended = Ended {
        id,
        agent_id: record.id.clone(),
        role: params.role.clone(),
        pid,
        uid,
        groups,
    };
    tokio::spawn(reap(state.clone(), child, ended));
    state.emit(Event::ChildStart(ChildStart {
        child: id,
        agent: record.id.clone(),
        role: params.role.clone(),
        pid,
    }));
    // Its proxy endpoint, when it has one: made now, as its stage waits
    // for it before it confines itself (a warm child's too, whose channel
    // is served only at its turn). What it may reach is decided per
    // connection from the agent's policy then.
    if let Some((ours, theirs)) = egress {
        drop(theirs);
        let child = crate::egress::serve::ChildRef {
            id,
            agent: record.id.clone(),
            role: params.role.clone(),
        };
        state.egress.serve_child(ours, child, pid);
    }
    Ok(Registered {
        id,
        pid,
        record,
        ends: ChildEnds { ours },
    })
}

type StdStream = std::os::unix::net::UnixStream;

/// The egress handshake's socket pair, for a child whose plan gives it
/// the proxy.
fn egress_handshake(plan: &LaunchPlan) -> Result<Option<(StdStream, StdStream)>, Outcome> {
    match plan.stage.as_ref().and_then(|s| s.egress.as_ref()) {
        Some(_) => StdStream::pair()
            .map(Some)
            .map_err(|e| internal("cannot create the egress handshake", e)),
        None => Ok(None),
    }
}

fn internal(what: &str, e: std::io::Error) -> Outcome {
    error(ErrorCode::Internal, format!("{what}: {e}"))
}

/// The request's own checks: the supervisor is taking children, the role
/// is known, argv names a program, the isolation parses, and "passed" stdio
/// came with its three descriptors.
fn check_spawn(
    state: &State,
    params: &SpawnParams,
    fds: PassedFds,
) -> Result<(Isolation, Option<[OwnedFd; 3]>), Outcome> {
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
    Ok((isolation, stdio))
}

/// Reading the record, chown, cgroup set-up and the confinement plan: all
/// blocking, so off the async workers.
async fn prepare_child(
    state: &Arc<State>,
    params: &SpawnParams,
    sub: &SubagentLaunch,
    isolation: Isolation,
    workspace: &Option<PathBuf>,
) -> Result<(AgentRecord, AgentPaths, LaunchPlan), Outcome> {
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
    .await
}

/// How a child was confined, as its plan said.
struct Confined {
    /// Its own uid, when it has one.
    uid: Option<u32>,
    /// The level its launch applied (what `sandbox status` promised).
    level: crate::sandbox::report::Level,
}

/// The child in the supervisor's table, and its `spawn` record in the
/// audit log before its channel is served or its start acknowledged (a
/// child whose record cannot be written is killed).
async fn register_child(
    state: &Arc<State>,
    record: &AgentRecord,
    params: &SpawnParams,
    sub: &SubagentLaunch,
    launched: &super::children::Launched,
    wrapper_depth: usize,
    confined: Confined,
) -> Result<u64, Outcome> {
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
    let spawned = crate::audit::Entry::new(
        crate::audit::kind::SPAWN,
        Some(&record.id),
        Some(&params.role),
    )
    .with("child", id)
    .with("pid", launched.pid)
    .with("uid", confined.uid)
    .with(
        "level",
        serde_json::to_value(confined.level).unwrap_or_default(),
    )
    .with("program", program_name(&params.argv))
    .with("isolation", params.isolation.as_deref().unwrap_or("strict"))
    .with("conversation", sub.conversation.clone());
    let spawned = if sub.warm {
        spawned.with("warm", true)
    } else {
        spawned
    };
    if let Err(o) = super::audit_records::record(state, spawned).await {
        let _ = super::child_signals::kill_child_tree(launched.pid);
        return Err(o);
    }
    Ok(id)
}

/// The supervisor's end of a new child's channel, not served yet.
pub(super) struct ChildEnds {
    pub ours: std::os::unix::net::UnixStream,
}

/// The child's channel served as the peer its table entry says it is, its
/// task recorded.
pub(super) fn serve_child(
    state: &Arc<State>,
    id: u64,
    record: &AgentRecord,
    params: &SpawnParams,
    sub: SubagentLaunch,
    ends: ChildEnds,
) -> Result<(), Outcome> {
    let ChildEnds { ours } = ends;
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
    tokio::spawn((state.serve_channel)(state.clone(), reader, sender, peer));
    Ok(())
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
    uid: Option<u32>,
    /// Its cgroups' `cgroup.procs` files (`sandbox::cgroup::prepare`).
    groups: Vec<PathBuf>,
}

/// Tries at removing a finished child's cgroups: one at once, then seven
/// in the background, 10 ms apart at first and doubling (1.27 s in all).
const RELEASE_GROUPS: crate::retry::Policy = crate::retry::Policy::backoff(
    8,
    std::time::Duration::from_millis(10),
    std::time::Duration::from_millis(640),
);

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
        let once = || {
            let freed = release(groups.clone());
            async move { if freed.await { Ok(()) } else { Err(()) } }
        };
        let rest = RELEASE_GROUPS.after_failures(1);
        if rest.run_async(|_| true, once).await.is_err() {
            tracing::debug!(groups = ?groups, "a child's cgroup still holds a process; left for a later sweep");
        }
    });
}

/// Wait for a child's exit, record it, remove its cgroups, and announce it.
async fn reap(state: Arc<State>, mut child: tokio::process::Child, e: Ended) {
    let Ended {
        id,
        agent_id,
        role,
        pid,
        uid,
        groups,
    } = e;
    let started = std::time::Instant::now();
    // Read (without reaping) what it used, while it is still a zombie.
    let used = super::accounting::exit_usage(child.id().unwrap_or(pid)).await;
    let ended = match child.wait().await {
        Ok(status) => ended_state(status),
        Err(e) => {
            tracing::warn!(child = id, "cannot wait for child: {e}");
            ChildState::Exited { code: -1 }
        }
    };
    if let Ok(mut t) = state.table.lock() {
        t.mark(id, "sup.child_exited");
        t.mark_ended(id, ended.clone());
    }
    if let Ok(mut ch) = state.channels.lock() {
        ch.remove(&id);
    }
    // Whatever it was doing, an ended child edits no memory.
    state.leases.release(super::leases::Holder::Child(id));
    // Its groups' figures are read before they go; recorded before its
    // exit is announced.
    let group_usage = state.accounting.untrack(id);
    let exited = exit_entry(&agent_id, &role, id, pid, uid, &ended, used, group_usage)
        .with("duration_ms", started.elapsed().as_millis() as u64);
    // In the log's order before its exit is announced; made durable with
    // the writer's next batch, which the announcement need not wait for.
    let recorded = state.accounting.log.enqueue(exited).await;
    // Nor reaches the network: its proxy endpoint and connections close.
    state.egress.child_ended(id);
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
        ChildState::Warm | ChildState::Starting | ChildState::Running => {
            ChildEnd::Exited { code: -1 }
        }
    };
    if let Ok(mut t) = state.table.lock() {
        t.mark(id, "sup.exit_announced");
    }
    state.emit(Event::ChildExit(ChildExit {
        child: id,
        agent: agent_id,
        role,
        pid,
        end,
    }));
    // Its groups go after its exit is announced (their figures are read
    // and recorded; a turn's answer need not wait), before shutdown hears
    // of its end.
    release_groups(groups).await;
    if let Err(e) = async { recorded?.durable().await }.await {
        tracing::error!("cannot append to the audit log: {e}");
    }
    state.child_ended.notify_waiters();
}
/// `child.timings`: the marks of a child's launch, `{child, marks}`, in
/// time order.
pub fn child_timings(state: &State, child: u64) -> Outcome {
    let marks = state.table.lock().ok().and_then(|t| {
        t.get(child)
            .map(|c| [c.marks.as_slice(), &c.reported_marks].concat())
    });
    match marks {
        Some(mut marks) => {
            marks.sort_by_key(|m| m.at_us);
            Outcome::reply(&replies::ChildMarks { child, marks })
        }
        None => error(ErrorCode::NotFound, format!("no child {child}")),
    }
}

/// `child.kill`: a signal to a live child (its whole tree for SIGKILL).
pub(crate) fn kill_child(state: &State, child: u64, signal: Option<i32>) -> Outcome {
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
        super::child_signals::kill_child_tree(info.pid)
    } else {
        super::child_signals::signal_child_tree(info.pid, info.wrapper_depth, sig)
    };
    match result {
        Ok(()) => Outcome::reply(&replies::Signalled { signalled: child }),
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
        // Without a uid of its own the agent runs as this user; the
        // directories it owns must exist before its view is built (only
        // what exists is bound there), as `own_agent_dir` makes them for
        // root (issue 44: a user's first turn could not make
        // `conversations/`).
        std::fs::create_dir_all(agent.tmp_dir()).map_err(|e| internal(&e))?;
        for dir in identity::agent_owned_dirs(agent) {
            std::fs::create_dir_all(&dir).map_err(|e| internal(&e))?;
        }
        // Sharing one uid, agents are kept apart by what their trees hold.
        let me = nix::unistd::geteuid().as_raw();
        crate::sandbox::shared_uid::check_tree(agent, worktree, me).map_err(|e| {
            error(
                ErrorCode::Forbidden,
                format!("refusing to start a child of agent {}: {e}", record.id),
            )
        })?;
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

/// The program a child runs, by its file name (no arguments: they may hold data).
fn program_name(argv: &[String]) -> String {
    argv.first()
        .map(|p| p.rsplit('/').next().unwrap_or(p).to_string())
        .unwrap_or_default()
}

/// The `exit` record of a child: status, and CPU and peak memory from its
/// groups and its rusage (the larger of each: both are lower bounds).
#[allow(clippy::too_many_arguments)]
fn exit_entry(
    agent: &str,
    role: &str,
    id: u64,
    pid: u32,
    uid: Option<u32>,
    ended: &ChildState,
    used: Option<(u64, u64)>,
    groups: crate::sandbox::cgroup::GroupUsage,
) -> crate::audit::Entry {
    let (code, signal) = match ended {
        ChildState::Exited { code } => (Some(*code), None),
        ChildState::Killed { signal } => (None, Some(*signal)),
        ChildState::Warm | ChildState::Starting | ChildState::Running => (None, None),
    };
    let (rusage_cpu, rusage_peak) = used.unwrap_or((0, 0));
    crate::audit::Entry::new(crate::audit::kind::EXIT, Some(agent), Some(role))
        .with("child", id)
        .with("pid", pid)
        .with("uid", uid)
        .with("exit_code", code)
        .with("signal", signal)
        .with("cpu_us", groups.cpu_us.unwrap_or(0).max(rusage_cpu))
        .with(
            "peak_memory_bytes",
            groups.peak_memory_bytes.unwrap_or(0).max(rusage_peak),
        )
}
