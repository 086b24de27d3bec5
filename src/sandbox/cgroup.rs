//! Per-agent, per-role cgroups: `pids`, `memory` and `cpu` limits from the
//! role profile (v2 unified hierarchy, or the v1 controllers this kind of
//! host has). A fork bomb stops at `pids.max`; RLIMIT_NPROC alone would not
//! stop a root child; and its spinning is held to `cpu_percent` of a core.

use std::path::{Path, PathBuf};

use super::profile::Limits;
use super::report::CgroupInfo;

/// The CPU bandwidth period: the quota is `cpu_percent` of it.
const CPU_PERIOD_US: u64 = 100_000;

/// Create the group of `agent`/`role` under every root and set its limits.
/// Returns the `cgroup.procs` files a child joins.
pub fn prepare(
    info: &CgroupInfo,
    agent: &str,
    role: &str,
    limits: &Limits,
) -> std::io::Result<Vec<PathBuf>> {
    let mut procs = Vec::new();
    for root in &info.roots {
        let dir = root.join(agent).join(role);
        std::fs::create_dir_all(&dir)?;
        let controller = root
            .parent()
            .and_then(Path::file_name)
            .and_then(|n| n.to_str())
            .unwrap_or("");
        let memory = limits.memory_mb.saturating_mul(1024 * 1024).to_string();
        let quota = (limits.cpu_percent.max(1) * CPU_PERIOD_US / 100).to_string();
        if info.version == "v2" {
            write(&dir, "pids.max", &limits.pids.to_string())?;
            write(&dir, "memory.max", &memory)?;
            let _ = write(&dir, "memory.swap.max", "0");
            // Present only when the cpu controller could be enabled.
            if dir.join("cpu.max").exists() {
                write(&dir, "cpu.max", &format!("{quota} {CPU_PERIOD_US}"))?;
            }
        } else if controller == "pids" {
            write(&dir, "pids.max", &limits.pids.to_string())?;
        } else if controller == "memory" {
            write(&dir, "memory.limit_in_bytes", &memory)?;
        } else if controller == "cpu" {
            write(&dir, "cpu.cfs_period_us", &CPU_PERIOD_US.to_string())?;
            write(&dir, "cpu.cfs_quota_us", &quota)?;
        }
        procs.push(dir.join("cgroup.procs"));
    }
    Ok(procs)
}

/// Remove the (empty) groups of `agents` under every root: their children
/// are gone. A group still holding a process stays (the kernel refuses with
/// EBUSY); so does one of another home, whose agent ids differ. Without
/// this, every agent ever run leaves two groups behind on the host.
pub fn prune(info: &CgroupInfo, agents: &[String]) -> usize {
    let mut removed = 0;
    for root in &info.roots {
        for agent in agents {
            let dir = root.join(agent);
            for role in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if role.path().is_dir() && std::fs::remove_dir(role.path()).is_ok() {
                    removed += 1;
                }
            }
            let _ = std::fs::remove_dir(&dir);
        }
    }
    removed
}

fn write(dir: &Path, file: &str, value: &str) -> std::io::Result<()> {
    std::fs::write(dir.join(file), value)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}/{file}: {e}", dir.display())))
}
