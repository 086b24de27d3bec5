//! Per-agent, per-role cgroups: `pids`, `memory` and `cpu` limits from the
//! role profile (v2 unified hierarchy, or the v1 controllers this kind of
//! host has). A fork bomb stops at `pids.max`; RLIMIT_NPROC alone would not
//! stop a root child; and its spinning is held to `cpu_percent` of a core.
//!
//! Layout under each root: `<agent>/<role>/` carries the limits, shared by
//! the agent's children of that role; each child runs in a group of its own
//! below it, `c<seq>-s<pid>-<start>-n<pidns>`, named after the supervisor
//! that made it (its pid, start time and pid namespace). The roots are
//! shared by every home on the host, so nothing is removed on a guess:
//! * a child's group (and its parents, once empty) goes when the child is
//!   reaped ([`release`]);
//! * at start and stop a supervisor removes the groups whose owner is
//!   provably dead — same pid namespace, and that pid no longer runs with
//!   that start time — and its own ([`sweep`]); another supervisor's live
//!   groups are never touched, and the kernel refuses to remove one that
//!   still holds a process;
//! * an empty `<agent>/<role>` removed while a live supervisor is between
//!   making it and making its child's group under it is made again
//!   ([`prepare`] retries).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::profile::Limits;
use super::report::CgroupInfo;

/// The CPU bandwidth period: the quota is `cpu_percent` of it.
const CPU_PERIOD_US: u64 = 100_000;
/// Attempts at making a child's group while another supervisor's sweep may
/// remove the empty parent under it.
const MAKE_ATTEMPTS: u32 = 8;

/// The supervisor that made a child's group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Owner {
    pid: u32,
    /// Field 22 of `/proc/<pid>/stat`: a reused pid has another.
    started: u64,
    /// The inode of its pid namespace: a pid means nothing in another.
    pidns: u64,
}

impl Owner {
    /// This process, `None` when `/proc` does not say.
    fn current() -> Option<Owner> {
        static ME: OnceLock<Option<Owner>> = OnceLock::new();
        *ME.get_or_init(|| {
            let pid = std::process::id();
            Some(Owner {
                pid,
                started: super::identity::process_start_time(pid)?,
                pidns: pid_namespace()?,
            })
        })
    }

    /// Whether this owner has certainly exited (a zombie counts): seen
    /// from the same pid namespace, its pid is gone or belongs to a
    /// process started at another time.
    fn provably_dead(&self, me: &Owner) -> bool {
        self.pidns == me.pidns
            && super::identity::process_start_time(self.pid) != Some(self.started)
    }
}

/// The inode of this process's pid namespace (`pid:[4026531836]`).
fn pid_namespace() -> Option<u64> {
    let link = std::fs::read_link("/proc/self/ns/pid").ok()?;
    let text = link.to_str()?;
    text.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

/// The name of a child's group made by `owner`.
fn leaf_name(owner: &Owner, seq: u64) -> String {
    format!("c{seq}-s{}-{}-n{}", owner.pid, owner.started, owner.pidns)
}

/// The owner a child's group is named after; `None` for any other name.
fn owner_of(leaf: &str) -> Option<Owner> {
    let rest = leaf.strip_prefix('c')?;
    let (seq, rest) = rest.split_once("-s")?;
    let (pid, rest) = rest.split_once('-')?;
    let (started, pidns) = rest.split_once("-n")?;
    seq.parse::<u64>().ok()?;
    Some(Owner {
        pid: pid.parse().ok()?,
        started: started.parse().ok()?,
        pidns: pidns.parse().ok()?,
    })
}

/// Create a group for one child of `agent`/`role` under every root, below
/// the role's group, and set the role's limits (v1 memory: on the child's
/// group too). Returns the `cgroup.procs`
/// files the child joins; hand them to [`release`] once it is reaped.
pub fn prepare(
    info: &CgroupInfo,
    agent: &str,
    role: &str,
    limits: &Limits,
) -> std::io::Result<Vec<PathBuf>> {
    static SEQ: AtomicU64 = AtomicU64::new(1);
    let owner = Owner::current().ok_or_else(|| {
        std::io::Error::other("cannot name this supervisor's cgroups: /proc/self is unreadable")
    })?;
    let name = leaf_name(&owner, SEQ.fetch_add(1, Ordering::Relaxed));
    let mut procs = Vec::new();
    for root in &info.roots {
        let made = prepare_under(info, root, agent, role, &name, limits);
        match made {
            Ok(p) => procs.push(p),
            Err(e) => {
                release(&procs);
                return Err(e);
            }
        }
    }
    Ok(procs)
}

/// [`prepare`] under one root.
fn prepare_under(
    info: &CgroupInfo,
    root: &Path,
    agent: &str,
    role: &str,
    name: &str,
    limits: &Limits,
) -> std::io::Result<PathBuf> {
    let role_dir = root.join(agent).join(role);
    let leaf = role_dir.join(name);
    make_leaf(&leaf)?;
    // From here the role's group holds a child group: nobody can remove it.
    let controller = root
        .parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .unwrap_or("");
    if info.version == "v2" {
        // The limit files of `<agent>/<role>` exist once `<agent>` hands
        // the controllers down (processes only ever sit in the leaves).
        let agent_dir = root.join(agent);
        let _ = write(&agent_dir, "cgroup.subtree_control", "+pids +memory");
        let _ = write(&agent_dir, "cgroup.subtree_control", "+cpu");
        set_limits(&role_dir, "v2", limits)?;
    } else {
        set_limits(&role_dir, controller, limits)?;
        // pids and cpu limits bind a v1 group's descendants always; a
        // memory limit only with `memory.use_hierarchy` (not on every
        // kernel), so the child's own group gets it too.
        if controller == "memory" {
            set_limits(&leaf, controller, limits)?;
        }
    }
    Ok(leaf.join("cgroup.procs"))
}

/// Make `leaf` and its parents; an empty parent removed meanwhile by a
/// sweep is made again.
fn make_leaf(leaf: &Path) -> std::io::Result<()> {
    let once = || {
        std::fs::create_dir_all(leaf)?;
        match leaf.is_dir() {
            true => Ok(()),
            false => Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
        }
    };
    crate::retry::Policy::immediate(MAKE_ATTEMPTS)
        .run(|e| e.kind() == std::io::ErrorKind::NotFound, once)
        .map_err(|e| with_path(leaf, e))
}

/// Write the limits a group of `kind` (`v2`, or the v1 controller) has.
fn set_limits(dir: &Path, kind: &str, limits: &Limits) -> std::io::Result<()> {
    let memory = limits.memory_mb.saturating_mul(1024 * 1024).to_string();
    let quota = (limits.cpu_percent.max(1) * CPU_PERIOD_US / 100).to_string();
    match kind {
        "v2" => {
            write(dir, "pids.max", &limits.pids.to_string())?;
            write(dir, "memory.max", &memory)?;
            let _ = write(dir, "memory.swap.max", "0");
            // Present only when the cpu controller could be enabled.
            if dir.join("cpu.max").exists() {
                write(dir, "cpu.max", &format!("{quota} {CPU_PERIOD_US}"))?;
            }
        }
        "pids" => write(dir, "pids.max", &limits.pids.to_string())?,
        "memory" => write(dir, "memory.limit_in_bytes", &memory)?,
        "cpu" => {
            write(dir, "cpu.cfs_period_us", &CPU_PERIOD_US.to_string())?;
            write(dir, "cpu.cfs_quota_us", &quota)?;
        }
        _ => {}
    }
    Ok(())
}

/// Remove a reaped child's groups (the parents of `procs`, as [`prepare`]
/// returned them) and then its role's and agent's groups where they are
/// left empty. Whether every child group is gone: one still holding a
/// process stays (the kernel refuses with `EBUSY`), for a later try.
pub fn release(procs: &[PathBuf]) -> bool {
    let mut gone = true;
    for leaf in procs.iter().filter_map(|p| p.parent()) {
        match std::fs::remove_dir(leaf) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) => {
                gone = false;
                continue;
            }
        }
        // Not empty (another child, another supervisor's) is fine.
        for parent in leaf.ancestors().skip(1).take(2) {
            if std::fs::remove_dir(parent).is_err() {
                break;
            }
        }
    }
    gone
}

/// Remove the child groups this supervisor or a provably dead one left
/// under every root, and the role and agent groups left empty by that;
/// for `agents` (this home's), also their empty groups of older layouts.
/// Returns how many groups were removed.
pub fn sweep(info: &CgroupInfo, agents: &[String]) -> usize {
    let Some(me) = Owner::current() else {
        return 0;
    };
    let mut removed = 0;
    for root in &info.roots {
        for agent_dir in subdirs(root) {
            let ours = agent_dir
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| agents.iter().any(|a| a == n));
            let mut touched = false;
            for role_dir in subdirs(&agent_dir) {
                let n = sweep_role(&role_dir, &me);
                removed += n;
                if (ours || n > 0) && std::fs::remove_dir(&role_dir).is_ok() {
                    removed += 1;
                    touched = true;
                }
                touched |= n > 0;
            }
            if (ours || touched) && std::fs::remove_dir(&agent_dir).is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

/// Remove the child groups under `role_dir` owned by `me` or by a provably
/// dead supervisor; how many.
fn sweep_role(role_dir: &Path, me: &Owner) -> usize {
    subdirs(role_dir)
        .into_iter()
        .filter(|leaf| {
            leaf.file_name()
                .and_then(|n| n.to_str())
                .and_then(owner_of)
                .is_some_and(|o| o == *me || o.provably_dead(me))
        })
        .filter(|leaf| remove_emptied(leaf))
        .count()
}

/// Remove a child group whose processes are gone. The kernel keeps a
/// group busy for a moment after its last process was killed (the pids
/// controller until the task is released), so a sweep right after a stop
/// waits briefly for it — never for a group that still lists a process.
/// (A fault soak left a pids group behind that a retry a few ms later
/// removes.)
fn remove_emptied(leaf: &Path) -> bool {
    const EMPTIED: crate::retry::Policy =
        crate::retry::Policy::backoff(25, Duration::from_millis(20), Duration::from_millis(20));
    let busy_but_empty = |e: &std::io::Error| {
        e.raw_os_error() == Some(libc::EBUSY)
            && std::fs::read_to_string(leaf.join("cgroup.procs")).is_ok_and(|p| p.trim().is_empty())
    };
    EMPTIED
        .run(busy_but_empty, || std::fs::remove_dir(leaf))
        .is_ok()
}

/// The directories in `dir` (a cgroup's child groups).
fn subdirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

fn with_path(path: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

fn write(dir: &Path, file: &str, value: &str) -> std::io::Result<()> {
    std::fs::write(dir.join(file), value)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}/{file}: {e}", dir.display())))
}

/// What a child's groups say it used so far (each figure when some
/// group's files give it): CPU µs, memory now and at its peak, bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupUsage {
    pub cpu_us: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub peak_memory_bytes: Option<u64>,
}

/// Open the file through which a forked child joins the group whose
/// `cgroup.procs` is `procs` by writing `0` (itself): on a v1 hierarchy its
/// `tasks` file, else `procs`. Why: the kernel moves a process written to
/// `cgroup.procs` under a global lock whose first taker waits out an RCU
/// grace period (7–35 ms seen on a 2-CPU VM, on the first child of a
/// process); a thread moving itself through `tasks` takes no such lock,
/// and a child just forked has one thread, so it is the same move.
pub fn open_for_joining(procs: &Path) -> std::io::Result<std::fs::File> {
    let write = |p: &Path| std::fs::OpenOptions::new().write(true).open(p);
    match write(&procs.with_file_name("tasks")) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => write(procs),
        other => other,
    }
}

/// Read a child's groups (the `cgroup.procs` files [`prepare`] returned),
/// before they are released.
pub fn usage(procs: &[PathBuf]) -> GroupUsage {
    let read =
        |dir: &Path, file: &str| -> Option<String> { std::fs::read_to_string(dir.join(file)).ok() };
    let number = |dir: &Path, file: &str| -> Option<u64> { read(dir, file)?.trim().parse().ok() };
    let mut u = GroupUsage::default();
    for leaf in procs.iter().filter_map(|p| p.parent()) {
        let cpu = read(leaf, "cpu.stat")
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))
                    .and_then(|v| v.trim().parse().ok())
            })
            .or_else(|| number(leaf, "cpuacct.usage").map(|ns: u64| ns / 1000));
        u.cpu_us = u.cpu_us.max(cpu);
        let now = number(leaf, "memory.current").or_else(|| number(leaf, "memory.usage_in_bytes"));
        u.memory_bytes = u.memory_bytes.max(now);
        let peak =
            number(leaf, "memory.peak").or_else(|| number(leaf, "memory.max_usage_in_bytes"));
        u.peak_memory_bytes = u.peak_memory_bytes.max(peak);
    }
    u
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_group_names_its_owner() {
        let me = Owner::current().unwrap();
        let name = leaf_name(&me, 42);
        assert_eq!(owner_of(&name), Some(me));
        for other in [
            "tool",
            "c-s1-2-n3",
            "c1-s1-2",
            "x1-s1-2-n3",
            "c1-sx-2-n3",
            "",
        ] {
            assert_eq!(owner_of(other), None, "{other}");
        }
    }

    #[test]
    fn only_a_provably_dead_owner_is_dead() {
        let me = Owner::current().unwrap();
        assert!(!me.provably_dead(&me));
        // An exited process of ours: its start time is known, it is gone.
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let pid = child.id();
        let started = crate::identity::process_start_time(pid).unwrap();
        let gone = Owner {
            pid,
            started,
            pidns: me.pidns,
        };
        assert!(!gone.provably_dead(&me), "still running");
        child.wait().unwrap();
        assert!(gone.provably_dead(&me));
        // A live pid with another start time: reused, so dead too.
        let reused = Owner {
            started: me.started + 1,
            ..me
        };
        assert!(reused.provably_dead(&me));
        // Another pid namespace: nothing can be proved.
        let elsewhere = Owner {
            pidns: me.pidns + 1,
            ..gone
        };
        assert!(!elsewhere.provably_dead(&me));
    }

    #[test]
    fn sweep_and_release_on_a_plain_tree() {
        // A plain directory tree stands in for a hierarchy: the removal
        // rules, not the kernel's, are under test.
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("mini-letta");
        let me = Owner::current().unwrap();
        let mut dead = std::process::Command::new("true").spawn().unwrap();
        let pid = dead.id();
        let started = crate::identity::process_start_time(pid).unwrap_or(1);
        dead.wait().unwrap();
        let dead = Owner {
            pid,
            started,
            pidns: me.pidns,
        };
        let live_other = Owner {
            pid: 1,
            started: crate::identity::process_start_time(1).unwrap_or(0),
            pidns: me.pidns,
        };
        let dead_leaf = root.join("agent-x/tool").join(leaf_name(&dead, 1));
        let live_leaf = root.join("agent-y/tool").join(leaf_name(&live_other, 1));
        let legacy = root.join("agent-z/tool");
        let mine_legacy = root.join("agent-mine/agent");
        for d in [&dead_leaf, &live_leaf, &legacy, &mine_legacy] {
            std::fs::create_dir_all(d).unwrap();
        }
        let info = CgroupInfo {
            version: "v1".into(),
            roots: vec![root.clone()],
        };
        let n = sweep(&info, &["agent-mine".to_string()]);
        assert!(!root.join("agent-x").exists(), "a dead owner's groups stay");
        assert!(live_leaf.is_dir(), "a live owner's group was removed");
        assert!(legacy.is_dir(), "another home's unnamed group was removed");
        assert!(!root.join("agent-mine").exists());
        assert_eq!(n, 5);
        // Release: the child's group, then its parents once empty.
        let procs = vec![live_leaf.join("cgroup.procs")];
        assert!(release(&procs));
        assert!(!root.join("agent-y").exists());
    }
}
