//! Turning a role profile, an agent and the host's [`SandboxReport`] into a
//! concrete launch: which program runs (bubblewrap or this binary's stage
//! 2), with which mounts, as which uid, in which cgroup, under which limits,
//! and what stage 2 must apply to itself.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::namespaces::{MountStep, NamespacePlan};
use super::profile::{Network, Resolved};
use super::report::{Isolation, Level, NsBackend, SandboxReport};
use super::stage2::StagePolicy;

/// System paths every role may read and execute.
pub const SYSTEM_READ_EXEC: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32",
];

/// The narrow part of `/etc` children need (spec §c.5).
pub const SYSTEM_READ_ONLY: &[&str] = &[
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/gitconfig",
    "/proc",
    "/dev/urandom",
    "/dev/random",
];

/// Device files children may write (discarding or producing data only).
pub const DEV_WRITABLE: &[&str] = &["/dev/null", "/dev/zero", "/dev/tty", "/dev/full"];

/// Resource limits applied with setrlimit before exec.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Rlimits {
    pub nofile: u64,
    pub fsize: u64,
    /// Only effective for a non-root uid (the kernel exempts uid 0).
    pub nproc: u64,
}

/// Everything the launcher needs.
#[derive(Debug, Clone, Serialize)]
pub struct LaunchPlan {
    pub level: Level,
    pub isolation: Isolation,
    /// Program to exec (bwrap, or this binary).
    pub program: PathBuf,
    /// Arguments before the child-stage program (bwrap's).
    pub wrapper_args: Vec<OsString>,
    /// The stage-2 policy, when any layer applies.
    pub stage: Option<StagePolicy>,
    /// Switch to this uid/gid (supervisor running as root).
    pub uid: Option<u32>,
    pub rlimits: Option<Rlimits>,
    /// `cgroup.procs` files to join before exec.
    pub cgroup_procs: Vec<PathBuf>,
    /// `TMPDIR` for the child.
    pub tmpdir: PathBuf,
}

impl LaunchPlan {
    /// How many levels of the launched process tree are the launcher's own
    /// wrappers rather than the program: the namespace monitor and init, or
    /// bubblewrap and its pid-1; none when the stage execs the program
    /// itself. Fixed by the plan, so a program cannot change it.
    pub fn wrapper_depth(&self) -> usize {
        let native = self.stage.as_ref().is_some_and(|s| s.namespaces.is_some());
        if native || !self.wrapper_args.is_empty() {
            2
        } else {
            0
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(
        "isolation {isolation:?} needs level L0 or L2 but this host reaches {level:?} ({missing}); \
         pass --isolation degraded to accept fewer layers, or off for none"
    )]
    Refused {
        isolation: Isolation,
        level: Level,
        missing: String,
    },
    #[error("no seccomp allow-list for role {0:?}; refusing to launch")]
    UnknownRole(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Inputs of [`plan`].
pub struct PlanInput<'a> {
    pub report: &'a SandboxReport,
    pub isolation: Isolation,
    pub home: &'a Path,
    pub agent_dir: &'a Path,
    pub agent_id: &'a str,
    pub tmp_dir: &'a Path,
    pub resolved: &'a Resolved,
    /// The mini-letta binary (the programs children run may be it).
    pub exe: &'a Path,
    /// The stage-2 program children start with.
    pub stage_exe: &'a Path,
    /// The agent-side program (the agent's turn, the escape probes).
    pub agent_exe: &'a Path,
    pub uid: Option<u32>,
}

/// Decide how to launch, or refuse.
pub fn plan(input: &PlanInput<'_>) -> Result<LaunchPlan, PlanError> {
    let r = input.report;
    if input.isolation == Isolation::Off {
        return Ok(LaunchPlan {
            level: Level::None,
            isolation: Isolation::Off,
            program: input.exe.to_path_buf(),
            wrapper_args: Vec::new(),
            stage: None,
            uid: None,
            rlimits: None,
            cgroup_procs: Vec::new(),
            tmpdir: PathBuf::from("/tmp"),
        });
    }
    if !input.isolation.accepts(r.level) {
        return Err(PlanError::Refused {
            isolation: input.isolation,
            level: r.level,
            missing: if r.missing.is_empty() {
                "no layer missing".into()
            } else {
                r.missing.join("; ")
            },
        });
    }
    let res = input.resolved;
    let exe_dir = input.exe.to_path_buf();
    let mut read_exec: Vec<PathBuf> = SYSTEM_READ_EXEC.iter().map(PathBuf::from).collect();
    read_exec.push(exe_dir);
    read_exec.push(input.stage_exe.to_path_buf());
    read_exec.push(input.agent_exe.to_path_buf());
    let mut read_only: Vec<PathBuf> = SYSTEM_READ_ONLY.iter().map(PathBuf::from).collect();
    // Only the parts the role's profile lists: the agent directory itself
    // is not granted (landlock does not need it to reach its parts), so a
    // role never lists or reads a sibling its profile leaves out.
    read_only.extend(res.read_only.iter().cloned());
    let mut writable: Vec<PathBuf> = DEV_WRITABLE.iter().map(PathBuf::from).collect();
    writable.extend(res.writable.iter().cloned());
    let namespaces = r.namespaces.available;
    let seccomp_role = super::seccomp::Role::parse(&res.role)
        .ok_or_else(|| PlanError::UnknownRole(res.role.clone()))?;
    let mut stage = StagePolicy {
        landlock: r.landlock.available,
        scopes: r.landlock.available && r.landlock_abi >= super::report::LANDLOCK_SCOPES_ABI,
        read_exec,
        read_only,
        writable,
        seccomp: r.seccomp.available,
        seccomp_role,
        no_network: res.network == Network::None,
        // Set below once the namespace backend is chosen.
        private_ipc: false,
        require_no_caps: true,
        namespaces: None,
    };
    let uid = if r.uid_switch.available {
        input.uid
    } else {
        None
    };
    let cgroup_procs = cgroup_procs(r, input.agent_id, &res.role);
    let rlimits = Rlimits {
        nofile: res.limits.open_files,
        fsize: res.limits.file_size_mb.saturating_mul(1024 * 1024),
        nproc: res.limits.pids,
    };
    let (program, wrapper_args, tmpdir) = match (namespaces, r.ns_backend, &r.bwrap) {
        // TMPDIR is the agent's own `tmp/` in every view: the `/tmp` of a
        // namespaced child is a root-owned tmpfs it cannot write.
        (true, Some(NsBackend::Native), _) => {
            stage.private_ipc = true;
            stage.namespaces = Some(NamespacePlan {
                mounts: view_steps(input, &res.writable),
            });
            (
                input.stage_exe.to_path_buf(),
                Vec::new(),
                input.tmp_dir.to_path_buf(),
            )
        }
        (true, Some(NsBackend::Bwrap), Some(bwrap)) => {
            // BWRAP_BASE_ARGS has --unshare-ipc.
            stage.private_ipc = true;
            (
                bwrap.clone(),
                bwrap_args(input, &res.writable),
                input.tmp_dir.to_path_buf(),
            )
        }
        _ => (
            input.exe.to_path_buf(),
            Vec::new(),
            input.tmp_dir.to_path_buf(),
        ),
    };
    Ok(LaunchPlan {
        level: r.level,
        isolation: input.isolation,
        program,
        wrapper_args,
        stage: Some(stage),
        uid,
        rlimits: Some(rlimits),
        cgroup_procs,
        tmpdir,
    })
}

fn cgroup_procs(r: &SandboxReport, agent: &str, role: &str) -> Vec<PathBuf> {
    r.cgroup_info
        .roots
        .iter()
        .map(|root| root.join(agent).join(role).join("cgroup.procs"))
        .collect()
}

/// The namespaces and root every bubblewrap launch uses (also what the
/// layer probe and the benchmark run): new user, pid, net, ipc and uts
/// namespaces, no capabilities, no nested user namespaces, death with the
/// parent, a new session, a read-only root with private `/dev` and `/proc`.
pub const BWRAP_BASE_ARGS: &[&str] = &[
    "--unshare-user",
    "--unshare-pid",
    "--unshare-net",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
    "--disable-userns",
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "ALL",
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
];

/// The child's filesystem view on top of the read-only root with private
/// `/dev` and `/proc`, in order: temporary and users' directories and the
/// whole mini-letta home masked, then this binary and exactly the paths the
/// role's profile lists (read-only or writable) brought back. Both
/// namespace backends build exactly this.
pub fn view_steps(input: &PlanInput<'_>, writable: &[PathBuf]) -> Vec<MountStep> {
    let mut steps: Vec<MountStep> = ["/tmp", "/var/tmp", "/run", "/home", "/root"]
        .iter()
        .map(|d| MountStep::Tmpfs {
            dest: PathBuf::from(d),
        })
        .collect();
    steps.push(MountStep::Tmpfs {
        dest: input.home.to_path_buf(),
    });
    let ro = |p: &Path| MountStep::RoBind {
        src: p.to_path_buf(),
        dest: p.to_path_buf(),
    };
    steps.push(ro(input.exe));
    for program in [input.stage_exe, input.agent_exe] {
        if program != input.exe {
            steps.push(ro(program));
        }
    }
    // The profile's paths one by one (never the whole agent directory),
    // parents before what lies below them.
    let mut binds: Vec<(&PathBuf, bool)> = input
        .resolved
        .read_only
        .iter()
        .map(|p| (p, true))
        .chain(writable.iter().map(|p| (p, false)))
        .filter(|(p, _)| p.exists())
        .collect();
    binds.sort_by_key(|(p, _)| p.components().count());
    for (p, read_only) in binds {
        steps.push(if read_only {
            ro(p)
        } else {
            MountStep::Bind {
                src: p.clone(),
                dest: p.clone(),
            }
        });
    }
    steps
}

fn bwrap_args(input: &PlanInput<'_>, writable: &[PathBuf]) -> Vec<OsString> {
    let mut a: Vec<OsString> = BWRAP_BASE_ARGS.iter().map(OsString::from).collect();
    for step in view_steps(input, writable) {
        let (flag, src, dest) = match step {
            MountStep::Tmpfs { dest } => ("--tmpfs", None, dest),
            MountStep::RoBind { src, dest } => ("--ro-bind", Some(src), dest),
            MountStep::Bind { src, dest } => ("--bind", Some(src), dest),
        };
        a.push(flag.into());
        a.extend(src.map(PathBuf::into_os_string));
        a.push(dest.into_os_string());
    }
    a
}
