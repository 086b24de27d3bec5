//! What a probe is told about the layout it attacks ([`ProbeContext`]),
//! including the egress rows' proxy and the layers the attacked level
//! leaves out by design.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::verdict::Verdict;

/// What a probe knows about the layout it attacks. Paths are as they exist
/// on the host; inside the sandbox they may be hidden, which is the point.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeContext {
    /// The confined agent's own directory (as seen inside).
    pub own_agent_dir: PathBuf,
    /// Its `memory.git` (must be read-only inside).
    pub own_memory_git_dir: PathBuf,
    /// Decoy agent B's directory, as it exists on the host.
    pub other_agent_dir: PathBuf,
    /// A file in B's directory containing `secret_marker`.
    pub other_secret_file: PathBuf,
    /// Text that must never be readable.
    pub secret_marker: String,
    /// `<home>/agents` on the host.
    pub agents_dir: PathBuf,
    /// Host pid of the supervisor.
    pub supervisor_pid: u32,
    /// Host pid of a sibling child (another agent's); must stay alive.
    pub sibling_pid: u32,
    /// A variable the supervisor holds (e.g. `OPENAI_API_KEY`).
    pub env_secret_name: String,
    /// Its value; must not be visible anywhere.
    pub env_secret_value: String,
    /// `<home>/run/supervisor.sock` on the host.
    pub control_socket: PathBuf,
    /// A TCP listener on 127.0.0.1 in the host network namespace.
    pub host_tcp_port: u16,
    /// An abstract Unix socket name listening on the host (without `@`).
    pub host_abstract_socket: String,
    /// A symlink in the own directory to `other_secret_file`, planted before
    /// confinement.
    pub planted_symlink: Option<PathBuf>,
    /// A hard link in the own directory to `other_secret_file`, planted
    /// before confinement (a documented residual of path-based layers).
    pub planted_hardlink: Option<PathBuf>,
    /// A setuid-root copy of `id` in the own directory, planted before
    /// confinement.
    pub planted_setuid: Option<PathBuf>,
    /// A host IPC object: a SysV shm key (decimal or `0x` hex) or a POSIX
    /// shm name (a file under `/dev/shm`). Visible ⇒ documented residual.
    pub host_shm_name: Option<String>,
    /// Expected pids limit (the fork bomb must stop at or below it).
    pub pids_limit: Option<u64>,
    /// `RLIMIT_FSIZE` in bytes.
    pub fsize_limit: Option<u64>,
    /// A writable directory inside the sandbox for temporary files.
    pub scratch_dir: PathBuf,
    /// The agent's main checkout, when the role must not write it (a
    /// sub-agent: reflection, memory worker).
    #[serde(default)]
    pub read_only_checkout: Option<PathBuf>,
    /// The egress proxy the child reaches, when its role has one.
    #[serde(default)]
    pub egress: Option<EgressContext>,
    /// What the launch's level leaves out by design; `None`: everything
    /// (L0 with a uid per agent and cgroups) is expected.
    #[serde(default)]
    pub by_design: Option<ByDesign>,
}

/// Layers the level the attacked child runs at does not have, by the
/// fallback table (spec sandbox.md §c.9): an attack that only such a layer
/// stops is skipped, naming it, rather than reported as an escape of the
/// layers the level does promise.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ByDesign {
    /// The level, as `sandbox status` prints it.
    pub level: String,
    /// Why there is no pid namespace (`None`: there is one).
    pub no_pid_namespace: Option<String>,
    /// Why there is no cgroup (`None`: there is one).
    pub no_cgroup: Option<String>,
    /// Why the child cannot empty its capability bounding set (`None`: it
    /// can, as root before switching uid or in its own user namespace).
    pub keeps_bounding_set: Option<String>,
    /// Why the pids limit is shared with the user's other processes
    /// (`None`: a cgroup's, or one counted in the child's own user
    /// namespace or for its own uid).
    #[serde(default)]
    pub shared_process_limit: Option<String>,
}

impl ByDesign {
    /// `verdict` as judged at this level: an escape that only `missing`
    /// would have stopped becomes a skip that says so.
    pub fn judge(&self, verdict: Verdict, missing: &[&Option<String>]) -> Verdict {
        let reasons: Vec<&str> = missing.iter().filter_map(|m| m.as_deref()).collect();
        match verdict {
            Verdict::Escaped { evidence }
                if !reasons.is_empty() && reasons.len() == missing.len() =>
            {
                Verdict::skipped(format!(
                    "level {} provides no such layer by design ({}): {evidence}",
                    self.level,
                    reasons.join("; ")
                ))
            }
            v => v,
        }
    }
}

/// What the egress rows know: the proxy's port inside the child's
/// namespace, and a listener on the host's loopback that the attacker's
/// allow-list names (`localhost:listed_port`), answering `marker`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EgressContext {
    pub proxy_port: u16,
    pub listed_port: u16,
    pub marker: String,
}
