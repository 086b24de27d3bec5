//! Turning a role profile, an agent and the host's [`SandboxReport`] into a
//! concrete launch: which program runs (bubblewrap or this binary's stage
//! 2), with which mounts, as which uid, in which cgroup, under which limits,
//! and what stage 2 must apply to itself.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::namespaces::{BWRAP_BASE_ARGS, MountStep, NamespacePlan};
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
    /// Whether `nproc` is set before exec (the child has a uid of its own,
    /// or shares the user's with no user namespace to count in: then the
    /// limit already counts the user's other processes). Otherwise the
    /// stage sets it inside the child's user namespace, if at all.
    pub nproc_at_launch: bool,
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
        return Ok(unconfined(input));
    }
    refuse_short_level(input)?;
    let res = input.resolved;
    let mut stage = stage_policy(input)?;
    let uid = if r.uid_switch.available {
        input.uid
    } else {
        None
    };
    let cgroup_procs = cgroup_procs(r, input.agent_id, &res.role);
    let (rlimits, stage_nproc) = launch_limits(input, uid);
    stage.nproc = stage_nproc;
    let (program, wrapper_args, tmpdir) = launcher(input, &mut stage);
    stage.egress = (res.network == Network::Proxy && egress_possible(r)).then_some(
        super::egress_stage::StageEgress {
            port: super::egress_stage::PORT,
        },
    );
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

/// Isolation `off`: the program runs as it is, with no layer at all.
fn unconfined(input: &PlanInput<'_>) -> LaunchPlan {
    LaunchPlan {
        level: Level::None,
        isolation: Isolation::Off,
        program: input.exe.to_path_buf(),
        wrapper_args: Vec::new(),
        stage: None,
        uid: None,
        rlimits: None,
        cgroup_procs: Vec::new(),
        tmpdir: PathBuf::from("/tmp"),
    }
}

/// The refusal when the host's level is not enough for the isolation
/// asked for, naming what is missing.
fn refuse_short_level(input: &PlanInput<'_>) -> Result<(), PlanError> {
    let r = input.report;
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
    Ok(())
}

/// What stage 2 applies to itself: the paths the role may reach, the
/// layers the host has and the role's seccomp allow-list (refused when the
/// role has none). The namespace view, the egress exception and the
/// stage's own process limit are decided later.
fn stage_policy(input: &PlanInput<'_>) -> Result<StagePolicy, PlanError> {
    let r = input.report;
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
    let seccomp_role = super::seccomp::Role::parse(&res.role)
        .ok_or_else(|| PlanError::UnknownRole(res.role.clone()))?;
    Ok(StagePolicy {
        landlock: r.landlock.available,
        scopes: r.landlock.available && r.landlock_abi >= super::report::LANDLOCK_SCOPES_ABI,
        read_exec,
        read_only,
        writable,
        seccomp: r.seccomp.available,
        seccomp_role,
        // Neither gives sockets to anything but the proxy's endpoint
        // (the egress exception is `stage.egress`, decided below).
        no_network: matches!(res.network, Network::None | Network::Proxy),
        // Set below once the namespace backend is chosen.
        private_ipc: false,
        require_no_caps: true,
        namespaces: None,
        egress: None,
        nproc: None,
    })
}

/// The resource limits set before exec, and the process limit the stage
/// sets inside the child's own user namespace instead (a child sharing the
/// user's uid there), if any.
fn launch_limits(input: &PlanInput<'_>, uid: Option<u32>) -> (Rlimits, Option<u64>) {
    let r = input.report;
    let res = input.resolved;
    let namespaces = r.namespaces.available;
    // The kernel never limits the processes of host uid 0.
    let shares_user = uid.is_none() && !nix::unistd::geteuid().is_root();
    let own_userns = namespaces && r.ns_backend.is_some();
    let rlimits = Rlimits {
        nofile: res.limits.open_files,
        fsize: res.limits.file_size_mb.saturating_mul(1024 * 1024),
        nproc: if shares_user && !own_userns {
            // Counted with every other process of the user: what it runs
            // now plus the role's allowance.
            super::proc_tree::tasks_of_uid(nix::unistd::getuid().as_raw())
                .saturating_add(res.limits.pids)
        } else {
            res.limits.pids
        },
        nproc_at_launch: uid.is_some() || (shares_user && !own_userns),
    };
    (
        rlimits,
        (shares_user && own_userns).then_some(res.limits.pids),
    )
}

/// The program to exec, its wrapper arguments and the child's `TMPDIR`,
/// by the namespace backend; the native backend's view and the private
/// IPC namespace both backends make are noted in `stage`.
fn launcher(input: &PlanInput<'_>, stage: &mut StagePolicy) -> (PathBuf, Vec<OsString>, PathBuf) {
    let r = input.report;
    let res = input.resolved;
    match (r.namespaces.available, r.ns_backend, &r.bwrap) {
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
    }
}

/// Whether this host's children can have the egress proxy: each gets a
/// network namespace of its own (either namespace backend), and the
/// supervisor can make the proxy's endpoint inside it (entering another
/// network namespace takes root). Anywhere else a child of a `proxy`
/// role has no network: a proxy port on a shared loopback would be every
/// tenant's.
pub fn egress_possible(r: &SandboxReport) -> bool {
    let own_netns = r.namespaces.available
        && match r.ns_backend {
            Some(NsBackend::Native) => true,
            Some(NsBackend::Bwrap) => r.bwrap.is_some(),
            None => false,
        };
    own_netns && r.uid_switch.available
}

fn cgroup_procs(r: &SandboxReport, agent: &str, role: &str) -> Vec<PathBuf> {
    r.cgroup_info
        .roots
        .iter()
        .map(|root| root.join(agent).join(role).join("cgroup.procs"))
        .collect()
}

/// The child's filesystem view on top of the read-only root with private
/// `/dev` and `/proc`, in order: temporary and users' directories and the
/// whole mini-letta home masked, then this binary and exactly the paths the
/// role's profile lists (read-only or writable) brought back. Both
/// namespace backends build exactly this.
pub(crate) fn view_steps(input: &PlanInput<'_>, writable: &[PathBuf]) -> Vec<MountStep> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::{AgentPaths, Home};
    use crate::profile;
    use crate::report::{CgroupInfo, Layer};

    /// The roles, in the column order of every table below.
    const ROLES: [&str; 5] = ["agent", "tool", "memory-worker", "reflection", "recall"];

    /// What a child gets of a path.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Grant {
        /// Read (and, for system directories, execute) only.
        Ro,
        /// Read and write.
        Rw,
        /// Nothing: not granted by landlock, not shown by the view.
        No,
    }
    use Grant::{No, Ro, Rw};

    /// Where a row's path is.
    #[derive(Debug, Clone, Copy)]
    enum At {
        /// In the agent's directory (`""`: the directory itself).
        Agent(&'static str),
        /// The workspace the child was given.
        Workspace,
        /// The child's memory worktree.
        Worktree,
        /// In the home, outside the agent's directory.
        Home(&'static str),
    }

    /// What each role gets of the agent's tree, its workspace and worktree:
    /// the profiles' grants, and everything else absent.
    #[rustfmt::skip]
    const AGENT_TREE: &[(At, [Grant; 5])] = &[
        //                                     agent tool memory-worker reflection recall
        (At::Agent("agent.json"),             [Ro, Ro, Ro, Ro, Ro]),
        (At::Agent("memory.git"),             [Ro, Ro, Ro, Ro, Ro]),
        (At::Agent("memory.git/hooks"),       [Ro, Ro, Ro, Ro, Ro]),
        (At::Agent("memory"),                 [Rw, Rw, Ro, Ro, Ro]),
        (At::Agent("memory/human.md"),        [Rw, Rw, Ro, Ro, Ro]),
        (At::Agent("conversations"),          [Rw, No, No, Ro, Ro]),
        (At::Agent("reflections"),            [Ro, No, No, Ro, No]),
        (At::Agent("tmp"),                    [Rw, Rw, Rw, Rw, Rw]),
        (At::Agent("memory-worktrees"),       [No, No, No, No, No]),
        (At::Agent(".owned-by-uid"),          [No, No, No, No, No]),
        (At::Agent(""),                       [No, No, No, No, No]),
        (At::Workspace,                       [Rw, Rw, No, No, No]),
        (At::Worktree,                        [No, No, Rw, Rw, No]),
        (At::Home(""),                        [No, No, No, No, No]),
        (At::Home("agents"),                  [No, No, No, No, No]),
        (At::Home("agents/agent-other/memory"), [No, No, No, No, No]),
        (At::Home("run"),                     [No, No, No, No, No]),
        (At::Home("config.toml"),             [No, No, No, No, No]),
    ];

    /// Host paths, the same for every role: landlock grants (`Ro` for the
    /// read-and-execute system directories as for the narrow part of
    /// `/etc`), and whether the view masks the path with an empty tmpfs.
    #[rustfmt::skip]
    const SYSTEM: &[(&str, Grant, bool)] = &[
        ("/usr",                Ro, false),
        ("/usr/bin/git",        Ro, false),
        ("/bin",                Ro, false),
        ("/lib",                Ro, false),
        ("/etc/passwd",         Ro, false),
        ("/etc/ssl/certs",      Ro, false),
        ("/etc/resolv.conf",    Ro, false),
        ("/proc",               Ro, false),
        ("/dev/urandom",        Ro, false),
        ("/dev/null",           Rw, false),
        ("/dev/tty",            Rw, false),
        ("/etc",                No, false),
        ("/etc/shadow",         No, false),
        ("/etc/sudoers",        No, false),
        ("/var/lib",            No, false),
        ("/sys",                No, false),
        ("/dev/sda",            No, false),
        ("/tmp",                No, true),
        ("/var/tmp",            No, true),
        ("/run",                No, true),
        ("/home",               No, true),
        ("/root/.ssh",          No, true),
    ];

    /// One agent with every directory of its tree, a workspace and a
    /// worktree, in a temporary home.
    struct Fixture {
        _dir: tempfile::TempDir,
        home: Home,
        agent: AgentPaths,
        workspace: PathBuf,
        worktree: PathBuf,
    }

    impl Fixture {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let home = Home::at(&dir.path().join("home"));
            let agent = home.agent("agent-planned").unwrap();
            for d in [
                "memory.git/hooks",
                "memory",
                "conversations",
                "reflections",
                "tmp",
                "memory-worktrees/wt-1",
            ] {
                std::fs::create_dir_all(agent.dir().join(d)).unwrap();
            }
            for f in ["agent.json", "memory/human.md", ".owned-by-uid"] {
                std::fs::write(agent.dir().join(f), "").unwrap();
            }
            std::fs::create_dir_all(home.agents_dir().join("agent-other/memory")).unwrap();
            std::fs::create_dir_all(home.run_dir()).unwrap();
            let workspace = dir.path().join("workspace");
            std::fs::create_dir_all(&workspace).unwrap();
            let worktree = agent.dir().join("memory-worktrees/wt-1");
            Self {
                _dir: dir,
                home,
                agent,
                workspace,
                worktree,
            }
        }

        fn path(&self, at: At) -> PathBuf {
            match at {
                At::Agent("") => self.agent.dir().to_path_buf(),
                At::Agent(rel) => self.agent.dir().join(rel),
                At::Workspace => self.workspace.clone(),
                At::Worktree => self.worktree.clone(),
                At::Home("") => self.home.root().to_path_buf(),
                At::Home(rel) => self.home.root().join(rel),
            }
        }

        fn plan(
            &self,
            role: &str,
            report: &SandboxReport,
            isolation: Isolation,
        ) -> Result<LaunchPlan, PlanError> {
            let resolved = profile::load(&self.home, role).unwrap().resolve(
                &self.agent,
                Some(&self.workspace),
                Some(&self.worktree),
            );
            plan(&PlanInput {
                report,
                isolation,
                home: self.home.root(),
                agent_dir: self.agent.dir(),
                agent_id: "agent-planned",
                tmp_dir: &self.agent.tmp_dir(),
                resolved: &resolved,
                exe: Path::new(EXE),
                stage_exe: Path::new(STAGE),
                agent_exe: Path::new(AGENT_EXE),
                uid: Some(UID),
            })
        }
    }

    const EXE: &str = "/opt/mini-letta/bin/mini-letta";
    const STAGE: &str = "/opt/mini-letta/bin/mini-letta-stage2";
    const AGENT_EXE: &str = "/opt/mini-letta/bin/mini-letta-agent";
    const BWRAP: &str = "/usr/bin/bwrap";
    const UID: u32 = 200_123;

    /// A host reaching `level`, with namespaces made by `ns`.
    fn host(level: Level, ns: Option<NsBackend>, uid_switch: bool) -> SandboxReport {
        let layer = |available| Layer {
            available,
            detail: String::new(),
        };
        let landlock_abi = match level {
            Level::L0 | Level::L2 => 6,
            Level::L3 => 5,
            Level::L4 | Level::None => 0,
        };
        SandboxReport {
            level,
            backend: String::new(),
            bwrap: (ns == Some(NsBackend::Bwrap)).then(|| PathBuf::from(BWRAP)),
            ns_backend: ns,
            namespaces: layer(ns.is_some()),
            landlock: layer(landlock_abi > 0),
            landlock_abi,
            seccomp: layer(level != Level::None),
            cgroup: layer(true),
            cgroup_info: CgroupInfo {
                version: "v2".into(),
                roots: vec![PathBuf::from("/sys/fs/cgroup/mini-letta")],
            },
            uid_switch: layer(uid_switch),
            no_new_privs: layer(level != Level::None),
            disabled: Vec::new(),
            missing: if level == Level::L0 {
                Vec::new()
            } else {
                vec!["a layer".into()]
            },
        }
    }

    fn l0(ns: NsBackend) -> SandboxReport {
        host(Level::L0, Some(ns), true)
    }

    /// Landlock's answer for `path`: rights on a directory reach everything
    /// below it, and add up.
    fn landlock_grant(stage: &StagePolicy, path: &Path) -> Grant {
        let covers = |list: &[PathBuf]| list.iter().any(|p| path.starts_with(p));
        if covers(&stage.writable) {
            Rw
        } else if covers(&stage.read_only) || covers(&stage.read_exec) {
            Ro
        } else {
            No
        }
    }

    /// The view's answer for a path below a masked tree (`under_mask`) or
    /// the read-only root: the deepest step at or above it decides.
    fn view_grant(steps: &[MountStep], path: &Path) -> (Grant, bool) {
        let deepest = steps
            .iter()
            .filter(|s| {
                let dest = match s {
                    MountStep::Tmpfs { dest }
                    | MountStep::RoBind { dest, .. }
                    | MountStep::Bind { dest, .. } => dest,
                };
                path.starts_with(dest)
            })
            .max_by_key(|s| match s {
                MountStep::Tmpfs { dest }
                | MountStep::RoBind { dest, .. }
                | MountStep::Bind { dest, .. } => dest.components().count(),
            });
        match deepest {
            Some(MountStep::Tmpfs { .. }) => (No, true),
            Some(MountStep::RoBind { .. }) => (Ro, false),
            Some(MountStep::Bind { .. }) => (Rw, false),
            // The read-only root: visible, and landlock decides.
            None => (Ro, false),
        }
    }

    /// The mount steps bubblewrap is given, read back from its arguments.
    fn bwrap_steps(args: &[OsString]) -> Vec<MountStep> {
        let mut rest = args[BWRAP_BASE_ARGS.len()..].iter().map(PathBuf::from);
        let mut steps = Vec::new();
        while let Some(flag) = rest.next() {
            let mut next = || rest.next().unwrap();
            steps.push(match flag.to_str().unwrap() {
                "--tmpfs" => MountStep::Tmpfs { dest: next() },
                "--ro-bind" => MountStep::RoBind {
                    src: next(),
                    dest: next(),
                },
                "--bind" => MountStep::Bind {
                    src: next(),
                    dest: next(),
                },
                other => panic!("unexpected bwrap argument {other}"),
            });
        }
        steps
    }

    #[test]
    fn each_role_gets_exactly_its_profile_paths() {
        let f = Fixture::new();
        for (col, role) in ROLES.iter().enumerate() {
            let native = f
                .plan(role, &l0(NsBackend::Native), Isolation::Strict)
                .unwrap();
            let stage = native.stage.as_ref().unwrap();
            let view = &stage.namespaces.as_ref().unwrap().mounts;
            let bwrap = f
                .plan(role, &l0(NsBackend::Bwrap), Isolation::Strict)
                .unwrap();
            let bwrap_view = bwrap_steps(&bwrap.wrapper_args);
            for (at, grants) in AGENT_TREE {
                let want = grants[col];
                let path = f.path(*at);
                assert_eq!(
                    landlock_grant(stage, &path),
                    want,
                    "{role}: landlock, {at:?}"
                );
                // Everything in the home outside the grants is under the
                // home's mask.
                let shown = if want == No {
                    (No, true)
                } else {
                    (want, false)
                };
                assert_eq!(view_grant(view, &path), shown, "{role}: view, {at:?}");
                assert_eq!(
                    view_grant(&bwrap_view, &path),
                    shown,
                    "{role}: bwrap view, {at:?}"
                );
            }
        }
    }

    #[test]
    fn every_role_sees_the_same_host() {
        let f = Fixture::new();
        for role in ROLES {
            let plan = f
                .plan(role, &l0(NsBackend::Native), Isolation::Strict)
                .unwrap();
            let stage = plan.stage.as_ref().unwrap();
            let view = &stage.namespaces.as_ref().unwrap().mounts;
            for (path, grant, masked) in SYSTEM {
                let path = Path::new(path);
                assert_eq!(
                    landlock_grant(stage, path),
                    *grant,
                    "{role}: landlock, {path:?}"
                );
                assert_eq!(
                    view_grant(view, path).1,
                    *masked,
                    "{role}: view mask, {path:?}"
                );
            }
            // The programs it starts with: executable, shown read-only.
            for exe in [EXE, STAGE, AGENT_EXE] {
                assert!(
                    stage.read_exec.contains(&PathBuf::from(exe)),
                    "{role}: {exe}"
                );
                assert_eq!(
                    view_grant(view, Path::new(exe)),
                    (Ro, false),
                    "{role}: {exe}"
                );
            }
        }
    }

    /// Per role: its seccomp list, limits and cgroup, from its profile.
    #[test]
    fn each_role_has_its_filter_limits_and_cgroup() {
        use super::super::seccomp::Role;
        const MB: u64 = 1024 * 1024;
        #[rustfmt::skip]
        let table: [(&str, Role, u64, u64, u64); 5] = [
            // role           seccomp list        open files  file size   pids
            ("agent",         Role::Agent,        1024,       1024 * MB,  256),
            ("tool",          Role::Tool,         512,        256 * MB,   128),
            ("memory-worker", Role::MemoryWorker, 512,        64 * MB,    128),
            ("reflection",    Role::Reflection,   512,        64 * MB,    128),
            ("recall",        Role::Recall,       256,        16 * MB,    64),
        ];
        let f = Fixture::new();
        for (role, seccomp_role, nofile, fsize, nproc) in table {
            let plan = f
                .plan(role, &l0(NsBackend::Native), Isolation::Strict)
                .unwrap();
            let stage = plan.stage.as_ref().unwrap();
            assert_eq!(stage.seccomp_role, seccomp_role, "{role}");
            assert!(stage.no_network, "{role}: network");
            let limits = plan.rlimits.unwrap();
            assert_eq!(
                (limits.nofile, limits.fsize, limits.nproc),
                (nofile, fsize, nproc),
                "{role}: limits"
            );
            assert_eq!(
                plan.cgroup_procs,
                [PathBuf::from(format!(
                    "/sys/fs/cgroup/mini-letta/agent-planned/{role}/cgroup.procs"
                ))],
                "{role}: cgroup"
            );
            assert_eq!(plan.tmpdir, f.agent.tmp_dir(), "{role}: TMPDIR");
        }
    }

    /// Which children get the egress proxy: the roles that run commands
    /// (the agent's Bash tool, `tool`), and only in a network namespace of
    /// their own that a root supervisor can enter.
    #[test]
    fn only_command_roles_in_their_own_network_namespace_get_egress() {
        let f = Fixture::new();
        let port = Some(crate::egress_stage::PORT);
        #[rustfmt::skip]
        let table: [(&str, SandboxReport, Option<u16>); 9] = [
            ("agent",         l0(NsBackend::Native),                    port),
            ("tool",          l0(NsBackend::Native),                    port),
            ("tool",          l0(NsBackend::Bwrap),                     port),
            ("memory-worker", l0(NsBackend::Native),                    None),
            ("reflection",    l0(NsBackend::Native),                    None),
            ("recall",        l0(NsBackend::Native),                    None),
            // No network namespace: the host's loopback is shared.
            ("tool",          host(Level::L2, None, true),              None),
            // Not root: the endpoint cannot be made in the namespace.
            ("tool",          host(Level::L0, Some(NsBackend::Native), false), None),
            ("agent",         host(Level::L3, None, true),              None),
        ];
        for (role, report, want) in table {
            let got = f
                .plan(role, &report, Isolation::Degraded)
                .unwrap()
                .stage
                .and_then(|s| s.egress)
                .map(|e| e.port);
            assert_eq!(got, want, "{role} at {:?}", report.level);
        }
    }

    /// How each host and isolation mode launches, for every role: refused,
    /// or which program, how many wrapper levels, an IPC namespace of its
    /// own, the agent's uid, stage 2 at all.
    #[test]
    fn the_host_decides_how_every_role_launches() {
        #[derive(Debug, PartialEq)]
        enum Program {
            Stage,
            Bwrap,
            Exe,
        }
        use Isolation::{Degraded, Off, Strict};
        use NsBackend::{Bwrap, Native};
        type Shape = Option<(Program, usize, bool, bool, bool)>;
        #[rustfmt::skip]
        let table: Vec<(Level, Option<NsBackend>, bool, Isolation, Shape)> = vec![
            // host level, namespaces, uid switch, mode => (program, wrappers, private ipc, uid, stage 2)
            (Level::L0, Some(Native), true, Strict,     Some((Program::Stage, 2, true, true, true))),
            (Level::L0, Some(Bwrap), true, Strict,      Some((Program::Bwrap, 2, true, true, true))),
            (Level::L0, Some(Native), false, Strict,    Some((Program::Stage, 2, true, false, true))),
            (Level::L2, None, true, Strict,             Some((Program::Exe, 0, false, true, true))),
            (Level::L3, None, true, Strict,             None),
            (Level::L3, None, true, Degraded,           Some((Program::Exe, 0, false, true, true))),
            (Level::L4, None, true, Strict,             None),
            (Level::L4, None, true, Degraded,           Some((Program::Exe, 0, false, true, true))),
            (Level::None, None, false, Strict,          None),
            (Level::None, None, false, Degraded,        None),
            (Level::None, None, false, Off,             Some((Program::Exe, 0, false, false, false))),
            (Level::L0, Some(Native), true, Off,        Some((Program::Exe, 0, false, false, false))),
        ];
        let f = Fixture::new();
        for role in ROLES {
            for (level, ns, uid_switch, isolation, want) in &table {
                let row = format!("{role}: {level:?} {ns:?} uid {uid_switch} {isolation:?}");
                let report = host(*level, *ns, *uid_switch);
                let got = f.plan(role, &report, *isolation).ok().map(|p| {
                    let program = match p.program.to_str().unwrap() {
                        STAGE => Program::Stage,
                        BWRAP => Program::Bwrap,
                        EXE => Program::Exe,
                        other => panic!("{row}: program {other}"),
                    };
                    let private_ipc = p.stage.as_ref().is_some_and(|s| s.private_ipc);
                    (
                        program,
                        p.wrapper_depth(),
                        private_ipc,
                        p.uid == Some(UID),
                        p.stage.is_some(),
                    )
                });
                assert_eq!(&got, want, "{row}");
            }
        }
    }
}
