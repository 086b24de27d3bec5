//! Stage 2: what a child applies to itself, single-threaded, right before
//! `exec` of the real program — landlock (which confines only the calling
//! thread, hence a fresh process) and then seccomp, last, because its filter
//! denies calls the earlier steps need.

use crate::protocol::timings;
use std::path::PathBuf;

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, path_beneath_rules,
};
use serde::{Deserialize, Serialize};

use super::seccomp;

/// The confinement a child must apply to itself, passed by the supervisor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagePolicy {
    /// Apply landlock; refuse to run when it cannot be fully enforced.
    pub landlock: bool,
    /// Use signal and abstract-socket scopes (landlock ABI ≥ 6).
    pub scopes: bool,
    /// Read and execute (system directories, this binary).
    pub read_exec: Vec<PathBuf>,
    /// Read only.
    pub read_only: Vec<PathBuf>,
    /// Read and write (never device creation).
    pub writable: Vec<PathBuf>,
    /// Install the seccomp filter.
    pub seccomp: bool,
    /// Whose seccomp allow-list applies.
    pub seccomp_role: seccomp::Role,
    /// Forbid sockets other than Unix ones.
    pub no_network: bool,
    /// The child gets an IPC namespace of its own (native namespaces or
    /// bubblewrap), so SysV/POSIX IPC reaches nobody else.
    #[serde(default)]
    pub private_ipc: bool,
    /// Refuse to run with any effective or permitted capability.
    pub require_no_caps: bool,
    /// Build namespaces and the filesystem view natively first (instead of
    /// having been started by bubblewrap).
    #[serde(default)]
    pub namespaces: Option<super::namespaces::NamespacePlan>,
    /// Reach the supervisor's egress proxy (its endpoint made in this
    /// child's network namespace once the stage is in it): TCP connect to
    /// that one port, stream sockets in seccomp.
    #[serde(default)]
    pub egress: Option<super::egress_stage::StageEgress>,
    /// `RLIMIT_NPROC` set once inside the child's own user namespace,
    /// where the kernel counts only the processes of that namespace: a
    /// pids limit per sandbox for a child that has no cgroup and shares
    /// its host uid with the user's other processes.
    #[serde(default)]
    pub nproc: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error(
        "capabilities were not dropped (CapEff {eff:#x}, CapPrm {prm:#x}, CapAmb {amb:#x}); refusing to run"
    )]
    Capabilities { eff: u64, prm: u64, amb: u64 },
    #[error("no_new_privs: {0}")]
    NoNewPrivs(String),
    #[error("landlock: {0}")]
    Landlock(String),
    #[error("landlock is not fully enforced ({0:?}); refusing to run")]
    NotEnforced(RulesetStatus),
    #[error("seccomp ({role} allow-list): {source}")]
    Seccomp {
        role: seccomp::Role,
        source: seccomp::SeccompError,
    },
    #[error("{0}")]
    Namespaces(#[from] super::namespaces::NsError),
    #[error("egress: {0}")]
    Egress(String),
    #[error("cannot read /proc/self/status: {0}")]
    Status(std::io::Error),
    #[error("process limit (RLIMIT_NPROC {limit}): {source}")]
    Nproc { limit: u64, source: nix::Error },
}

/// The landlock ABI we pin and test against: filesystem rights up to V5
/// (incl. Refer, Truncate, IoctlDev), TCP from V4, scopes from V6.
const FS_ABI: ABI = ABI::V5;

/// Apply `policy` to this (single-threaded) process.
pub fn apply(policy: &StagePolicy) -> Result<(), StageError> {
    if let Some(ns) = &policy.namespaces {
        // Returns in the program process only, capabilities dropped.
        super::namespaces::enter(ns)?;
        timings::mark("stage.namespaces");
    }
    if let Some(limit) = policy.nproc {
        use nix::sys::resource::{Resource, setrlimit};
        setrlimit(Resource::RLIMIT_NPROC, limit, limit)
            .map_err(|source| StageError::Nproc { limit, source })?;
    }
    if policy.require_no_caps {
        let (eff, prm, amb) = capabilities()?;
        if eff != 0 || prm != 0 || amb != 0 {
            return Err(StageError::Capabilities { eff, prm, amb });
        }
    }
    // In the network namespace now, before landlock and seccomp and before
    // any program of the child runs: the supervisor makes the proxy's
    // endpoint here, or declines (then the child has no network).
    let egress_port = match &policy.egress {
        Some(e) => super::egress_stage::await_endpoint()
            .map_err(StageError::Egress)?
            .then_some(e.port),
        None => None,
    };
    set_no_new_privs()?;
    if policy.landlock {
        apply_landlock(policy, egress_port)?;
        timings::mark("stage.landlock");
    }
    if policy.seccomp {
        let opts = seccomp::Options {
            no_network: policy.no_network,
            private_ipc: policy.private_ipc,
            egress: egress_port.is_some(),
        };
        seccomp::install(policy.seccomp_role, opts).map_err(|source| StageError::Seccomp {
            role: policy.seccomp_role,
            source,
        })?;
        timings::mark("stage.seccomp");
    }
    Ok(())
}

/// Set no_new_privs and read it back: without it a setuid program would
/// run with its owner's rights inside the sandbox, and landlock and
/// seccomp refuse an unprivileged caller, so a failure must stop the child
/// here (not be discovered later as a less precise error).
fn set_no_new_privs() -> Result<(), StageError> {
    nix::sys::prctl::set_no_new_privs().map_err(|e| StageError::NoNewPrivs(format!("set: {e}")))?;
    match nix::sys::prctl::get_no_new_privs() {
        Ok(true) => Ok(()),
        Ok(false) => Err(StageError::NoNewPrivs("still off after setting it".into())),
        Err(e) => Err(StageError::NoNewPrivs(format!("read back: {e}"))),
    }
}

/// `egress_port`: the one TCP port the child may connect to (the proxy's
/// endpoint); without it, no TCP connect or bind at all.
fn apply_landlock(policy: &StagePolicy, egress_port: Option<u16>) -> Result<(), StageError> {
    let err = |e: landlock::RulesetError| StageError::Landlock(e.to_string());
    let read = AccessFs::from_read(FS_ABI);
    let read_only = AccessFs::ReadFile | AccessFs::ReadDir;
    // Writable parts get everything but device creation.
    let write = AccessFs::from_all(FS_ABI) & !(AccessFs::MakeChar | AccessFs::MakeBlock);
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(FS_ABI))
        .map_err(err)?
        .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
        .map_err(err)?;
    if policy.scopes {
        ruleset = ruleset.scope(Scope::from_all(ABI::V6)).map_err(err)?;
    }
    let existing = |v: &[PathBuf]| v.iter().filter(|p| p.exists()).cloned().collect::<Vec<_>>();
    let status = ruleset
        .create()
        .map_err(err)?
        .set_compatibility(CompatLevel::HardRequirement)
        .add_rules(path_beneath_rules(existing(&policy.read_exec), read))
        .map_err(err)?
        .add_rules(path_beneath_rules(existing(&policy.read_only), read_only))
        .map_err(err)?
        .add_rules(path_beneath_rules(existing(&policy.writable), write))
        .map_err(err)?
        .add_rules(
            egress_port
                .map(|p| Ok::<_, landlock::RulesetError>(NetPort::new(p, AccessNet::ConnectTcp))),
        )
        .map_err(err)?
        .restrict_self()
        .map_err(err)?;
    if status.ruleset != RulesetStatus::FullyEnforced {
        return Err(StageError::NotEnforced(status.ruleset));
    }
    Ok(())
}

/// Effective, permitted and ambient capability sets of this process (an
/// unreadable field counts as full).
pub fn capabilities() -> Result<(u64, u64, u64), StageError> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(StageError::Status)?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(u64::MAX)
    };
    Ok((field("CapEff:"), field("CapPrm:"), field("CapAmb:")))
}
