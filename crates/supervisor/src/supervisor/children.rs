//! The child table and the launch pipeline.
//!
//! Every agent-side process is started here, through the child-stage
//! program (`mini-letta-stage2 ROLE …`, installed beside `mini-letta`), with:
//! * one end of a `socketpair` as descriptor 3 — its only channel; identity is
//!   the connection, so a child can never speak for another agent;
//! * an allow-listed environment (no API keys, no `MINI_LETTA_*` switches);
//! * every other descriptor closed, a new session, `PR_SET_PDEATHSIG`
//!   (SIGKILL) so it dies with the supervisor;
//! * a reaper that turns its exit into a `child.exit` event.
//!
//! Forks happen on one long-lived launcher thread: the parent-death signal
//! fires when the *thread* that forked exits, so forking from a short-lived
//! worker thread would kill children at random.
//!
//! Confinement layers (namespaces, landlock, seccomp) are added to this
//! pipeline by the sandbox module; until then only `isolation: off` runs.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::oneshot;

use crate::paths::AgentPaths;
use crate::sandbox::plan::LaunchPlan;
use crate::sandbox::sys;

/// The roles a child can have.
pub const ROLES: &[&str] = &["agent", "memory-worker", "reflection", "tool", "recall"];

/// Variables a child may inherit from the supervisor, by name.
const PASSED_ENV: &[&str] = &["LANG", "LC_ALL", "TZ", "TERM"];

/// A fixed search path: the supervisor's own PATH may name writable dirs.
const CHILD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

pub use crate::protocol::replies::{ChildRow, ChildState};

/// One row of the child table.
#[derive(Debug, Clone)]
pub struct ChildInfo {
    pub id: u64,
    pub agent: String,
    /// The agent's name in its record when the child was launched (the
    /// supervisor's own reading, never anything the child said).
    pub agent_name: String,
    pub role: String,
    pub pid: u32,
    pub started: Instant,
    pub started_at: SystemTime,
    pub state: ChildState,
    /// Launch → first frame, once known.
    pub first_frame: Option<std::time::Duration>,
    pub ended: Option<Instant>,
    /// Levels of the process tree that are the launcher's wrappers (see
    /// `LaunchPlan::wrapper_depth`), spared by graceful signals.
    pub wrapper_depth: usize,
    /// Where its launch went (`child.timings`): the supervisor's own marks
    /// (a fixed handful) ...
    pub marks: Vec<crate::protocol::timings::Mark>,
    /// ... and the checked ones the child sent with its hello, at most
    /// [`MAX_REPORTED_MARKS`] (kept apart: a child cannot crowd out the
    /// supervisor's).
    pub reported_marks: Vec<crate::protocol::timings::Mark>,
}

/// At most this many marks a child reports are kept: its stage takes six;
/// a child that repeats its hello adds nothing past this.
pub const MAX_REPORTED_MARKS: usize = 32;

impl ChildInfo {
    pub fn row(&self) -> ChildRow {
        let end = self.ended.unwrap_or_else(Instant::now);
        ChildRow {
            id: self.id,
            agent: self.agent.clone(),
            agent_name: self.agent_name.clone(),
            role: self.role.clone(),
            pid: self.pid,
            uptime_ms: end.duration_since(self.started).as_millis() as u64,
            state: self.state.clone(),
            first_frame_us: self.first_frame.map(|d| d.as_micros() as u64),
            figures: None,
        }
    }

    pub fn is_live(&self) -> bool {
        self.state.is_live()
    }
}

/// The table, shared by every task.
#[derive(Debug, Default)]
pub struct ChildTable {
    next_id: u64,
    rows: BTreeMap<u64, ChildInfo>,
}

/// Ended children kept for `ps --all` before the oldest are forgotten.
pub const KEEP_ENDED: usize = 64;

/// How long an ended child stays in the table at most.
pub const KEEP_ENDED_FOR: Duration = Duration::from_secs(600);

impl ChildTable {
    pub fn insert(
        &mut self,
        agent: &str,
        agent_name: &str,
        role: &str,
        pid: u32,
        started: Instant,
        wrapper_depth: usize,
    ) -> u64 {
        self.prune(Instant::now());
        self.next_id += 1;
        let id = self.next_id;
        self.rows.insert(
            id,
            ChildInfo {
                id,
                agent: agent.to_string(),
                agent_name: agent_name.to_string(),
                role: role.to_string(),
                pid,
                started,
                started_at: SystemTime::now(),
                state: ChildState::Starting,
                first_frame: None,
                ended: None,
                wrapper_depth,
                marks: Vec::new(),
                reported_marks: Vec::new(),
            },
        );
        id
    }

    pub fn get(&self, id: u64) -> Option<&ChildInfo> {
        self.rows.get(&id)
    }

    /// The child's first frame arrived. Its timing is kept even when the
    /// reaper already saw it exit (a short-lived child).
    pub(crate) fn mark_running(&mut self, id: u64) {
        if let Some(c) = self.rows.get_mut(&id) {
            if c.first_frame.is_none() {
                c.first_frame = Some(c.started.elapsed());
            }

            if c.state == ChildState::Starting {
                c.state = ChildState::Running;
            }
        }
    }

    /// Add the supervisor's own marks of a child's launch.
    pub(crate) fn add_marks(
        &mut self,
        id: u64,
        marks: impl IntoIterator<Item = crate::protocol::timings::Mark>,
    ) {
        if let Some(c) = self.rows.get_mut(&id) {
            c.marks.extend(marks);
        }
    }

    /// Add checked marks the child reported (bounded, see
    /// [`MAX_REPORTED_MARKS`]).
    pub(crate) fn add_reported_marks(
        &mut self,
        id: u64,
        marks: Vec<crate::protocol::timings::Mark>,
    ) {
        if let Some(c) = self.rows.get_mut(&id) {
            let room = MAX_REPORTED_MARKS.saturating_sub(c.reported_marks.len());
            c.reported_marks.extend(marks.into_iter().take(room));
        }
    }

    /// A mark of the supervisor's own, now.
    pub fn mark(&mut self, id: u64, name: &str) {
        self.add_marks(
            id,
            [crate::protocol::timings::Mark {
                name: name.to_string(),
                at_us: crate::protocol::timings::now_us(),
            }],
        );
    }

    /// A mark of the supervisor's own for something a child may repeat
    /// (its hello): kept the first time only, so the row cannot grow.
    pub(crate) fn mark_once(&mut self, id: u64, name: &str) {
        let seen = self
            .rows
            .get(&id)
            .is_some_and(|c| c.marks.iter().any(|m| m.name == name));
        if !seen {
            self.mark(id, name);
        }
    }

    /// A warm child's turn was handed over: it starts now.
    pub(crate) fn mark_warm(&mut self, id: u64, warm: bool) {
        if let Some(c) = self.rows.get_mut(&id) {
            match (&c.state, warm) {
                (ChildState::Starting, true) => c.state = ChildState::Warm,
                (ChildState::Warm, false) => c.state = ChildState::Starting,
                _ => {}
            }
        }
    }

    pub(crate) fn mark_ended(&mut self, id: u64, state: ChildState) {
        let now = Instant::now();
        if let Some(c) = self.rows.get_mut(&id) {
            c.state = state;
            c.ended = Some(now);
        }
        self.prune(now);
    }

    /// Forget ended children: those ended more than [`KEEP_ENDED_FOR`] ago,
    /// and all but the [`KEEP_ENDED`] that ended last. Live children are
    /// never forgotten.
    pub fn prune(&mut self, now: Instant) {
        let mut ended: Vec<(Instant, u64)> = self
            .rows
            .values()
            .filter_map(|c| c.ended.filter(|_| !c.is_live()).map(|e| (e, c.id)))
            .collect();
        // Most recently ended first.
        ended.sort_by(|a, b| b.cmp(a));
        for (i, (end, id)) in ended.into_iter().enumerate() {
            if i >= KEEP_ENDED || now.saturating_duration_since(end) > KEEP_ENDED_FOR {
                self.rows.remove(&id);
            }
        }
    }

    /// Every child the table holds, in id order (ended ones past
    /// [`KEEP_ENDED_FOR`] left out even before they are pruned).
    pub fn rows(&self) -> Vec<ChildRow> {
        let now = Instant::now();
        self.rows
            .values()
            .filter(|c| {
                c.ended
                    .is_none_or(|e| now.saturating_duration_since(e) <= KEEP_ENDED_FOR)
            })
            .map(ChildInfo::row)
            .collect()
    }

    pub fn live(&self) -> Vec<ChildInfo> {
        self.rows
            .values()
            .filter(|c| c.is_live())
            .cloned()
            .collect()
    }
}

/// Everything needed to start one child.
pub struct LaunchSpec {
    pub agent_id: String,
    pub agent: AgentPaths,
    pub role: String,
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    /// How to confine it.
    pub plan: LaunchPlan,
    /// stdin, stdout, stderr; `None` = /dev/null in, piped out to the log.
    pub stdio: Option<[OwnedFd; 3]>,
    /// The child's end of the channel, installed as descriptor 3.
    pub channel: OwnedFd,
    /// The child's end of the egress handshake, installed as descriptor 4
    /// (only when its stage policy has egress; see `crate::sandbox::egress_stage`).
    pub egress: Option<OwnedFd>,
}

/// A started child.
pub struct Launched {
    pub child: tokio::process::Child,
    pub pid: u32,
    pub started: Instant,
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("cannot find mini-letta's programs: {0}")]
    SelfExe(std::io::Error),
    #[error("cannot start child: {0}")]
    Spawn(std::io::Error),
    #[error("cannot start child: confinement step {step:?} failed before exec: {source}")]
    PreExec {
        step: &'static str,
        source: std::io::Error,
    },
    #[error("the launcher thread is gone")]
    LauncherGone,
}

type LaunchJob = (LaunchSpec, oneshot::Sender<Result<Launched, LaunchError>>);

/// The long-lived thread that forks every child.
#[derive(Clone)]
pub struct Launcher {
    tx: std::sync::mpsc::Sender<LaunchJob>,
}

impl Launcher {
    /// Start the launcher thread; `rt` is the runtime whose reaper the
    /// children register with.
    pub fn start(rt: tokio::runtime::Handle) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<LaunchJob>();
        std::thread::Builder::new()
            .name("launcher".into())
            .spawn(move || {
                let _guard = rt.enter();
                let programs = crate::paths::Programs::installed();
                while let Ok((spec, reply)) = rx.recv() {
                    let result = match &programs {
                        Ok(p) => launch(&p.stage, spec),
                        Err(e) => Err(LaunchError::SelfExe(std::io::Error::new(
                            e.kind(),
                            e.to_string(),
                        ))),
                    };
                    let _ = reply.send(result);
                }
            })?;
        Ok(Self { tx })
    }

    pub async fn launch(&self, spec: LaunchSpec) -> Result<Launched, LaunchError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send((spec, reply))
            .map_err(|_| LaunchError::LauncherGone)?;
        rx.await.map_err(|_| LaunchError::LauncherGone)?
    }
}

/// The environment a child starts with.
pub(crate) fn child_env(spec: &LaunchSpec) -> Vec<(String, String)> {
    let mut env = vec![
        ("PATH".to_string(), CHILD_PATH.to_string()),
        ("HOME".to_string(), spec.agent.dir().display().to_string()),
        ("TMPDIR".to_string(), spec.plan.tmpdir.display().to_string()),
        ("AGENT_ID".to_string(), spec.agent_id.clone()),
        (
            "MEMORY_DIR".to_string(),
            spec.agent.memory_dir().display().to_string(),
        ),
        (crate::protocol::CHANNEL_FD_ENV.to_string(), "3".to_string()),
    ];
    if spec.egress.is_some() {
        let url = crate::egress::proxy_url();
        env.extend(
            crate::egress::PROXY_VARIABLES
                .iter()
                .map(|name| (name.to_string(), url.clone())),
        );
    }
    for name in PASSED_ENV {
        if let Ok(v) = std::env::var(name) {
            env.push((name.to_string(), v));
        }
    }
    env
}

fn launch(stage: &std::path::Path, spec: LaunchSpec) -> Result<Launched, LaunchError> {
    let mut cmd = stage_command(stage, &spec)?;
    set_stdio(&mut cmd, spec.stdio);
    // Opened here, written in the child: joining a cgroup before exec puts
    // the whole sandbox under its limits from the first instruction (and
    // through `tasks` on v1, which needs no global lock: see the opener).
    let cgroup_fds: Vec<std::fs::File> = spec
        .plan
        .cgroup_procs
        .iter()
        .map(|p| crate::sandbox::cgroup::open_for_joining(p))
        .collect::<Result<_, _>>()
        .map_err(LaunchError::Spawn)?;
    let fork = ForkSteps {
        cgroups: cgroup_fds.iter().map(|f| f.as_raw_fd()).collect(),
        channel: spec.channel.as_raw_fd(),
        egress: spec.egress.as_ref().map(|f| f.as_raw_fd()),
        parent: std::process::id(),
        uid: spec.plan.uid,
        limits: spec.plan.rlimits,
    };
    // SAFETY: only async-signal-safe calls between fork and exec: the nix
    // wrappers and `sandbox::sys` used are thin system calls that do not
    // allocate; the descriptors `fork` names stay open in the supervisor
    // until `spawn` returns.
    unsafe {
        cmd.pre_exec(move || fork.run());
    }
    let started = Instant::now();
    let child = cmd.spawn().map_err(|e| {
        let err = PreExecStep::decode(e);
        tracing::error!(agent = %spec.agent_id, role = %spec.role, "{err}");
        err
    })?;
    drop(spec.channel);
    drop(cgroup_fds);
    let pid = child.id().unwrap_or(0);
    Ok(Launched {
        child,
        pid,
        started,
    })
}

/// The child-stage program's command line (through the plan's wrapper,
/// if any), its environment and working directory.
fn stage_command(
    stage: &std::path::Path,
    spec: &LaunchSpec,
) -> Result<tokio::process::Command, LaunchError> {
    let plan = &spec.plan;
    // Without a wrapper, the stage program is what we exec directly.
    let mut cmd = if plan.wrapper_args.is_empty() {
        tokio::process::Command::new(stage)
    } else {
        let mut c = tokio::process::Command::new(&plan.program);
        c.args(&plan.wrapper_args).arg("--").arg(stage);
        c
    };
    cmd.arg(&spec.role).arg("--agent").arg(&spec.agent_id);
    if let Some(stage) = &plan.stage {
        let policy = serde_json::to_string(stage)
            .map_err(|e| LaunchError::Spawn(std::io::Error::other(e)))?;
        cmd.arg("--policy").arg(policy);
    }
    cmd.arg("--");
    cmd.args(&spec.argv);
    cmd.env_clear();
    for (k, v) in child_env(spec) {
        cmd.env(k, v);
    }
    cmd.current_dir(&spec.cwd);
    cmd.kill_on_drop(false);
    Ok(cmd)
}

/// The caller's descriptors, or nothing in and both outputs piped to the
/// log.
fn set_stdio(cmd: &mut tokio::process::Command, stdio: Option<[OwnedFd; 3]>) {
    match stdio {
        Some([i, o, e]) => {
            cmd.stdin(Stdio::from(i))
                .stdout(Stdio::from(o))
                .stderr(Stdio::from(e));
        }
        None => {
            cmd.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
        }
    }
}

/// What the forked child does before exec, in order. Everything is
/// decided (and allocated) before the fork.
struct ForkSteps {
    /// The channel, installed as descriptor 3.
    channel: RawFd,
    /// The egress handshake, installed as descriptor 4.
    egress: Option<RawFd>,
    /// The agent's cgroups' join files (`tasks` on v1, else
    /// `cgroup.procs`), opened for writing.
    cgroups: Vec<RawFd>,
    /// The supervisor's pid.
    parent: u32,
    uid: Option<u32>,
    limits: Option<crate::sandbox::plan::Rlimits>,
}

/// A failed nix call's error, tagged with `step` (see [`PreExecStep`]).
fn failed(step: PreExecStep) -> impl Fn(nix::Error) -> std::io::Error {
    move |e: nix::Error| step.error(e.into())
}

impl ForkSteps {
    /// Runs in the forked child (async-signal-safe calls only). Any
    /// failure stops the child before exec (std reports the error to
    /// `spawn`), tagged with the step.
    ///
    /// # Safety
    /// Call only between fork and exec, while the supervisor holds the
    /// descriptors this names open.
    unsafe fn run(&self) -> std::io::Result<()> {
        // SAFETY: our caller's promise.
        let egress = unsafe { self.install_descriptors() }?;
        nix::unistd::setsid().map_err(failed(PreExecStep::Session))?;
        for fd in &self.cgroups {
            // SAFETY: open in the supervisor until `spawn` returns, so its
            // copy in this forked process is open while we use it.
            let procs = unsafe { BorrowedFd::borrow_raw(*fd) };
            nix::unistd::write(procs, b"0\n").map_err(failed(PreExecStep::Cgroup))?;
        }
        self.set_limits()?;
        if let Some(u) = self.uid {
            become_uid(u)?;
        }
        // After the uid change: changing credentials clears it.
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
            .map_err(failed(PreExecStep::DeathSignal))?;
        // The supervisor may have died between fork and prctl.
        if u32::try_from(nix::unistd::getppid().as_raw()) != Ok(self.parent) {
            sys::exit_now(1);
        }
        // Nothing but 0–3 (and 4, the egress handshake) survives exec,
        // whatever the supervisor holds.
        sys::cloexec_from(if egress.is_some() { 5 } else { 4 });
        Ok(())
    }

    /// The channel as descriptor 3, the egress handshake (if any) as 4;
    /// returns the handshake's temporary number.
    ///
    /// # Safety
    /// As for [`ForkSteps::run`].
    unsafe fn install_descriptors(&self) -> std::io::Result<Option<RawFd>> {
        // SAFETY: the channel stays open in the supervisor until `spawn`
        // returns, so its copy in this forked process is open while we
        // use it.
        let channel = unsafe { BorrowedFd::borrow_raw(self.channel) };
        // The handshake first out of the way (its number may be 3),
        // then both in place.
        let egress = match self.egress {
            Some(fd) => Some(
                nix::fcntl::fcntl(
                    // SAFETY: as for the channel.
                    unsafe { BorrowedFd::borrow_raw(fd) },
                    nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(10),
                )
                .map_err(failed(PreExecStep::Egress))?,
            ),
            None => None,
        };
        sys::install_fd(channel, 3).map_err(|e| PreExecStep::Channel.error(e))?;
        if let Some(fd) = egress {
            // SAFETY: the duplicate just made, open until exec.
            sys::install_fd(
                unsafe { BorrowedFd::borrow_raw(fd) },
                crate::sandbox::egress_stage::SYNC_FD,
            )
            .map_err(|e| PreExecStep::Egress.error(e))?;
        }
        Ok(egress)
    }

    /// The plan's resource limits (the process count where the plan says:
    /// the kernel exempts root, and a user's count is taken in its own
    /// user namespace by the stage).
    fn set_limits(&self) -> std::io::Result<()> {
        use nix::sys::resource::{Resource, setrlimit};
        let Some(l) = self.limits else {
            return Ok(());
        };
        let set = |res, v: u64| setrlimit(res, v, v).map_err(failed(PreExecStep::Rlimits));
        set(Resource::RLIMIT_NOFILE, l.nofile)?;
        set(Resource::RLIMIT_FSIZE, l.fsize)?;
        set(Resource::RLIMIT_CORE, 0)?;
        if l.nproc_at_launch {
            set(Resource::RLIMIT_NPROC, l.nproc)?;
        }
        Ok(())
    }
}

/// Become the agent's uid and gid for good, with no capability left to
/// regain and a private umask.
fn become_uid(u: u32) -> std::io::Result<()> {
    use nix::unistd::{Gid, Uid};
    // Empty the bounding set while still privileged, so nothing
    // below can regain a capability (even without namespaces).
    sys::clear_bounding_set().map_err(|e| PreExecStep::BoundingSet.error(e.into()))?;
    nix::unistd::setgroups(&[]).map_err(failed(PreExecStep::Groups))?;
    let (g, u) = (Gid::from_raw(u), Uid::from_raw(u));
    nix::unistd::setresgid(g, g, g).map_err(failed(PreExecStep::Gid))?;
    nix::unistd::setresuid(u, u, u).map_err(failed(PreExecStep::Uid))?;
    // Read back: a uid change that silently did not happen
    // would run the child as root.
    if nix::unistd::getresuid().map(|r| (r.real, r.effective, r.saved)) != Ok((u, u, u))
        || nix::unistd::getresgid().map(|r| (r.real, r.effective, r.saved)) != Ok((g, g, g))
    {
        return Err(failed(PreExecStep::Uid)(nix::Error::EPERM));
    }
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    Ok(())
}

/// The confinement steps done between fork and exec. `pre_exec` can hand
/// only an errno back to `spawn`, so the step travels in it:
/// `(step + 1) * STEP_BASE + errno` (errno values stay below 4096).
#[derive(Debug, Clone, Copy)]
enum PreExecStep {
    Channel,
    Session,
    Cgroup,
    Rlimits,
    BoundingSet,
    Groups,
    Gid,
    Uid,
    DeathSignal,
    Egress,
}

const STEP_BASE: i32 = 4096;

const PRE_EXEC_STEPS: &[(PreExecStep, &str)] = &[
    (PreExecStep::Channel, "install the channel as descriptor 3"),
    (PreExecStep::Session, "setsid"),
    (PreExecStep::Cgroup, "join the agent's cgroups"),
    (PreExecStep::Rlimits, "setrlimit"),
    (PreExecStep::BoundingSet, "prctl(PR_CAPBSET_DROP)"),
    (PreExecStep::Groups, "setgroups([])"),
    (PreExecStep::Gid, "setresgid to the agent's gid"),
    (PreExecStep::Uid, "setresuid to the agent's uid"),
    (PreExecStep::DeathSignal, "prctl(PR_SET_PDEATHSIG)"),
    (
        PreExecStep::Egress,
        "install the egress handshake as descriptor 4",
    ),
];

impl PreExecStep {
    /// `e` tagged with this step (no allocation: it runs after fork).
    fn error(self, e: std::io::Error) -> std::io::Error {
        let errno = e.raw_os_error().unwrap_or(nix::errno::Errno::EINVAL as i32) % STEP_BASE;
        std::io::Error::from_raw_os_error((self as i32 + 1) * STEP_BASE + errno)
    }

    /// The launch error for a `spawn` failure, naming the step if a
    /// pre-exec step failed.
    fn decode(e: std::io::Error) -> LaunchError {
        let Some(code) = e.raw_os_error().filter(|c| *c >= STEP_BASE) else {
            return LaunchError::Spawn(e);
        };
        let index = usize::try_from(code / STEP_BASE - 1).unwrap_or(usize::MAX);
        match PRE_EXEC_STEPS.get(index) {
            Some((_, step)) => LaunchError::PreExec {
                step,
                source: std::io::Error::from_raw_os_error(code % STEP_BASE),
            },
            None => LaunchError::Spawn(e),
        }
    }
}

/// How a finished child ended.
pub(crate) fn ended_state(status: std::process::ExitStatus) -> ChildState {
    match (status.code(), status.signal()) {
        (Some(code), _) => ChildState::Exited { code },
        (None, Some(signal)) => ChildState::Killed { signal },
        (None, None) => ChildState::Exited { code: -1 },
    }
}

/// Shared handle to the table.
pub type SharedTable = Arc<Mutex<ChildTable>>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Ended children are forgotten past a count and an age; live ones
    /// never are.
    #[test]
    fn ended_children_are_pruned() {
        let mut t = ChildTable::default();
        let start = Instant::now();
        let live = t.insert("a", "alice", "agent", 1, start, 0);
        for n in 0..(KEEP_ENDED as u32 + 10) {
            let id = t.insert("a", "alice", "tool", 100 + n, start, 0);
            t.mark_ended(id, ChildState::Exited { code: 0 });
        }
        let rows = t.rows();
        assert_eq!(rows.len(), KEEP_ENDED + 1);
        assert!(rows.iter().any(|r| r.id == live && r.agent_name == "alice"));
        // The oldest ended went first.
        assert!(rows.iter().all(|r| r.id == live || r.id > 11));

        // Past the age limit, every ended child goes.
        let later = Instant::now() + KEEP_ENDED_FOR + Duration::from_secs(1);
        t.prune(later);
        assert_eq!(t.rows.len(), 1);
        assert!(t.get(live).is_some_and(ChildInfo::is_live));
    }

    #[test]
    fn pre_exec_steps_are_named() {
        for (i, (step, name)) in PRE_EXEC_STEPS.iter().enumerate() {
            assert_eq!(*step as usize, i, "{name} is out of order");
            let e = step.error(std::io::Error::from_raw_os_error(
                nix::errno::Errno::EPERM as i32,
            ));
            match PreExecStep::decode(e) {
                LaunchError::PreExec { step, source } => {
                    assert_eq!(step, *name);
                    assert_eq!(source.raw_os_error(), Some(nix::errno::Errno::EPERM as i32));
                }
                other => panic!("{other}"),
            }
        }
        let plain = PreExecStep::decode(std::io::Error::from_raw_os_error(
            nix::errno::Errno::ENOENT as i32,
        ));
        assert!(matches!(plain, LaunchError::Spawn(_)));
    }
}
