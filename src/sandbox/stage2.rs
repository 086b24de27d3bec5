//! Stage 2: what a child applies to itself, single-threaded, right before
//! `exec` of the real program — landlock (which confines only the calling
//! thread, hence a fresh process) and then seccomp, last, because its filter
//! denies calls the earlier steps need.

use std::path::PathBuf;

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr,
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
    /// Install the seccomp deny-list.
    pub seccomp: bool,
    /// Forbid sockets other than Unix ones.
    pub no_network: bool,
    /// Refuse to run with any effective or permitted capability.
    pub require_no_caps: bool,
    /// Build namespaces and the filesystem view natively first (instead of
    /// having been started by bubblewrap).
    #[serde(default)]
    pub namespaces: Option<super::namespaces::NamespacePlan>,
}

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("capabilities were not dropped (CapEff {eff:#x}, CapPrm {prm:#x}); refusing to run")]
    Capabilities { eff: u64, prm: u64 },
    #[error("landlock: {0}")]
    Landlock(String),
    #[error("landlock is not fully enforced ({0:?}); refusing to run")]
    NotEnforced(RulesetStatus),
    #[error("seccomp: {0}")]
    Seccomp(String),
    #[error("{0}")]
    Namespaces(#[from] super::namespaces::NsError),
    #[error("cannot read /proc/self/status: {0}")]
    Status(std::io::Error),
}

/// The landlock ABI we pin and test against: filesystem rights up to V5
/// (incl. Refer, Truncate, IoctlDev), TCP from V4, scopes from V6.
const FS_ABI: ABI = ABI::V5;

/// Apply `policy` to this (single-threaded) process.
pub fn apply(policy: &StagePolicy) -> Result<(), StageError> {
    if let Some(ns) = &policy.namespaces {
        // Returns in the program process only, capabilities dropped.
        super::namespaces::enter(ns)?;
    }
    if policy.require_no_caps {
        let (eff, prm) = capabilities()?;
        if eff != 0 || prm != 0 {
            return Err(StageError::Capabilities { eff, prm });
        }
    }
    // SAFETY: plain prctl; required by landlock and seccomp without CAP_SYS_ADMIN.
    unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    }
    if policy.landlock {
        apply_landlock(policy)?;
    }
    if policy.seccomp {
        seccomp::install(policy.no_network).map_err(StageError::Seccomp)?;
    }
    Ok(())
}

fn apply_landlock(policy: &StagePolicy) -> Result<(), StageError> {
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
        .restrict_self()
        .map_err(err)?;
    if status.ruleset != RulesetStatus::FullyEnforced {
        return Err(StageError::NotEnforced(status.ruleset));
    }
    Ok(())
}

/// Effective and permitted capability sets of this process.
pub fn capabilities() -> Result<(u64, u64), StageError> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(StageError::Status)?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(u64::MAX)
    };
    Ok((field("CapEff:"), field("CapPrm:")))
}
