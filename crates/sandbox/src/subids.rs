//! Per-agent uids for an ordinary user, from the subordinate ids
//! `/etc/subuid` and `/etc/subgid` grant it (as rootless container engines
//! use them). At start, before any thread exists, the CLI process enters a
//! user namespace of its own mapped by the setuid helpers `newuidmap` and
//! `newgidmap`: its own uid and gid as 0, and the range as the agent uids
//! [`UID_BASE`]`..`. Inside it the process holds the
//! capabilities over those ids that root holds over all of them — it can
//! switch a child to an agent uid, give an agent's directories to it and
//! still read and write them — so the root code paths run unchanged, and
//! on the host each agent's children run as a uid of their own from the
//! range.
//!
//! Entering is irrevocable, so it is first tried on a throw-away process;
//! anything missing (no range, no helpers, a kernel or policy refusing user
//! namespaces, a home other uids cannot reach) leaves the process as it
//! was, and [`status`] says why.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// First uid handed to agents (inside a user's namespace, the first of
/// its subordinate range).
pub const UID_BASE: u32 = 200_000;
/// How many agent uids there are as root (a user has those of its range,
/// at most this many).
pub const UID_COUNT: u32 = 100_000;

/// The helpers, at fixed locations (never looked up in `PATH`: they are
/// setuid root).
pub const NEWUIDMAP: &str = "/usr/bin/newuidmap";
pub const NEWGIDMAP: &str = "/usr/bin/newgidmap";

/// Fewest subordinate ids worth entering for: the probe's uid and agents.
pub const MIN_RANGE: u32 = 16;

/// Layers an operator may switch off for testing the fallbacks
/// (`MINI_LETTA_SANDBOX_DISABLE=namespaces,landlock,seccomp,cgroup,uid` in the
/// *supervisor's* environment; never read by children). Switching a layer
/// off lowers the reported level, so strict mode still refuses when the
/// remainder is not enough. (`subids` keeps a user's process out of its
/// namespace of per-agent uids.)
pub const DISABLE_ENV: &str = "MINI_LETTA_SANDBOX_DISABLE";

/// `MINI_LETTA_SANDBOX_DISABLE` word that keeps a user's process out of
/// the namespace (agents then share the user's uid).
pub const DISABLE_WORD: &str = "subids";

/// One subordinate range: host ids `start..start + count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub start: u32,
    pub count: u32,
}

/// What this process got.
#[derive(Debug, Clone)]
pub enum Status {
    /// Root on the host: agent uids are real ones.
    HostRoot,
    /// In a namespace mapping agent uids from `uids`/`gids`; `registry`
    /// records which agent has which, for every home of this user (each
    /// uid of the range is handed out once, whatever the home).
    Mapped {
        uids: Range,
        gids: Range,
        registry: PathBuf,
    },
    /// Agents share the user's uid, for this reason.
    Shared(String),
}

static STATUS: OnceLock<Status> = OnceLock::new();

/// What [`enter`] decided (a process that never called it: root is
/// [`Status::HostRoot`], anyone else shares its uid).
pub fn status() -> &'static Status {
    STATUS.get_or_init(|| {
        if nix::unistd::geteuid().is_root() {
            Status::HostRoot
        } else {
            Status::Shared("per-agent uids were not set up for this process".into())
        }
    })
}

/// Whether this process is root of the host (not of a namespace of ours).
pub(crate) fn host_root() -> bool {
    matches!(status(), Status::HostRoot)
}

/// How many agent uids exist here (the probe's included).
pub(crate) fn agent_uid_count() -> u32 {
    match status() {
        Status::Mapped { uids, gids, .. } => uids.count.min(gids.count),
        _ => UID_COUNT,
    }
}

/// Where this user records its agent uids: its state directory
/// (`$XDG_STATE_HOME`, else `$HOME/.local/state`), which must be its own.
/// Without one, no uid could be handed out once per user: every home would
/// count from the start of the range, and two homes' agents would share
/// uids (and one supervisor would kill the other's children as leftovers).
fn user_state_dir() -> Result<PathBuf, String> {
    use std::os::unix::fs::MetadataExt;
    let absolute = |v: Option<std::ffi::OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    let state = absolute(std::env::var_os("XDG_STATE_HOME"))
        .or_else(|| absolute(std::env::var_os("HOME")).map(|h| h.join(".local/state")))
        .ok_or("neither XDG_STATE_HOME nor HOME names a directory to record agent uids in")?;
    // The nearest existing directory on the way must be this user's.
    let me = nix::unistd::getuid().as_raw();
    let existing = state
        .ancestors()
        .find(|p| p.exists())
        .ok_or("no state directory")?;
    let owner = std::fs::metadata(existing)
        .map_err(|e| format!("{}: {e}", existing.display()))?
        .uid();
    if owner != me {
        return Err(format!(
            "{} belongs to uid {owner}, not to this user: set XDG_STATE_HOME or HOME to a \
             directory of yours, where agent uids are recorded",
            existing.display()
        ));
    }
    Ok(state)
}

/// The range `/etc/subuid`-style `text` grants user `name` (uid `uid`):
/// its first line naming the user by name or number.
pub(crate) fn range_in(text: &str, name: &str, uid: u32) -> Option<Range> {
    text.lines().find_map(|line| {
        let mut f = line.trim().splitn(3, ':');
        let who = f.next()?;
        if who != name && who.parse::<u32>().ok() != Some(uid) {
            return None;
        }
        let start = f.next()?.trim().parse().ok()?;
        let count: u32 = f.next()?.trim().parse().ok()?;
        (count > 0).then_some(Range { start, count })
    })
}

/// Enter the namespace, when this user can have one and its home is
/// reachable by other uids (`home_reachable`, else why not). Call once,
/// while the process is single-threaded; the outcome is kept for
/// [`status`].
pub fn enter(home_reachable: Result<(), String>) -> &'static Status {
    let decided = decide(home_reachable);
    STATUS.get_or_init(|| decided)
}

fn decide(home_reachable: Result<(), String>) -> Status {
    if nix::unistd::geteuid().is_root() {
        return Status::HostRoot;
    }
    let disabled = std::env::var(DISABLE_ENV).unwrap_or_default();
    if disabled.split(',').any(|w| w.trim() == DISABLE_WORD) {
        return Status::Shared(format!("disabled by {}", DISABLE_ENV));
    }
    match try_enter(home_reachable) {
        Ok(s) => s,
        Err(why) => Status::Shared(why),
    }
}

fn try_enter(home_reachable: Result<(), String>) -> Result<Status, String> {
    let uid = nix::unistd::getuid();
    let gid = nix::unistd::getgid();
    let name = nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map(|u| u.name)
        .ok_or_else(|| format!("uid {uid} has no user name (getpwuid)"))?;
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let uids = range_in(&read("/etc/subuid"), &name, uid.as_raw())
        .ok_or_else(|| format!("/etc/subuid grants {name} no subordinate uids"))?;
    let group = nix::unistd::Group::from_gid(gid)
        .ok()
        .flatten()
        .map(|g| g.name)
        .unwrap_or_default();
    let gids = range_in(&read("/etc/subgid"), &name, uid.as_raw())
        .or_else(|| range_in(&read("/etc/subgid"), &group, gid.as_raw()))
        .ok_or_else(|| format!("/etc/subgid grants {name} no subordinate gids"))?;
    let count = uids.count.min(gids.count).min(UID_COUNT);
    if count < MIN_RANGE {
        return Err(format!(
            "{name}'s subordinate range holds {count} ids, fewer than {MIN_RANGE}"
        ));
    }
    for helper in [NEWUIDMAP, NEWGIDMAP] {
        if !Path::new(helper).exists() {
            return Err(format!(
                "{helper} is not installed (Debian package uidmap), so {name}'s subordinate \
                 ids cannot be mapped"
            ));
        }
    }
    // Agent uids must reach the home, as under root.
    home_reachable?;
    let state = user_state_dir()?;
    let registry = crate::paths::user_agent_uid_registry(&state);
    let uids = Range {
        start: uids.start,
        count,
    };
    let gids = Range {
        start: gids.start,
        count,
    };
    let maps = Maps {
        uid: format!("0 {uid} 1 {UID_BASE} {} {count}", uids.start),
        gid: format!("0 {gid} 1 {UID_BASE} {} {count}", gids.start),
    };
    // First on a throw-away process: a failure there costs nothing. A
    // trial that passed with this very configuration is not repeated
    // (it costs two helper runs per command).
    let proven = crate::paths::user_subids_proven(&state);
    let key = trial_key(&maps);
    let known_good = std::fs::read_to_string(&proven).is_ok_and(|k| k == key);
    if !known_good {
        trial(&maps)?;
        // Unrecorded only costs the next command the trial again.
        let _ = std::fs::create_dir_all(proven.parent().unwrap_or(Path::new("/")));
        let _ = std::fs::write(&proven, &key);
    }
    become_mapped(&maps, || {
        let _ = std::fs::remove_file(&proven);
    })?;
    Ok(Status::Mapped {
        uids,
        gids,
        registry,
    })
}

/// What a passed trial held for: the maps, and the files and helpers that
/// decide whether they can be made (any change makes the trial run again).
fn trial_key(maps: &Maps) -> String {
    use std::os::unix::fs::MetadataExt;
    let stamp = |p: &str| {
        std::fs::metadata(p)
            .map(|m| format!("{}:{}:{}.{}", m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
            .unwrap_or_else(|_| "-".into())
    };
    format!(
        "{}\n{}\n{}\n{}\n{}\n{}\n",
        maps.uid,
        maps.gid,
        stamp("/etc/subuid"),
        stamp("/etc/subgid"),
        stamp(NEWUIDMAP),
        stamp(NEWGIDMAP)
    )
}

/// The `newuidmap`/`newgidmap` arguments after the pid.
struct Maps {
    uid: String,
    gid: String,
}

/// Map process `pid`'s new user namespace.
fn map(pid: i32, maps: &Maps) -> Result<(), String> {
    for (helper, map) in [(NEWUIDMAP, &maps.uid), (NEWGIDMAP, &maps.gid)] {
        let o = std::process::Command::new(helper)
            .arg(pid.to_string())
            .args(map.split(' '))
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("{helper}: {e}"))?;
        if !o.status.success() {
            return Err(format!(
                "{helper} {pid} {map}: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
    }
    Ok(())
}

fn pipe() -> Result<(OwnedFd, OwnedFd), String> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))
}

/// A child unshares, is mapped from here, and checks it is uid 0 inside.
fn trial(maps: &Maps) -> Result<(), String> {
    let (ready_r, ready_w) = pipe()?;
    let (go_r, go_w) = pipe()?;
    // SAFETY: single-threaded (the caller's promise); the child makes only
    // raw calls before `_exit`.
    match unsafe { nix::unistd::fork() }.map_err(|e| format!("fork: {e}"))? {
        nix::unistd::ForkResult::Child => {
            drop(ready_r);
            drop(go_w);
            let ok = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).is_ok();
            let _ = nix::unistd::write(&ready_w, &[u8::from(ok)]);
            let mut b = [0u8; 1];
            let _ = nix::unistd::read(&go_r, &mut b);
            let mapped = nix::unistd::geteuid().is_root();
            // SAFETY: leaving the forked child at once.
            unsafe { libc::_exit(if ok && mapped { 0 } else { 1 }) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(ready_w);
            drop(go_r);
            let mut b = [0u8; 1];
            let unshared = matches!(std::fs::File::from(ready_r).read(&mut b), Ok(1)) && b[0] == 1;
            let mapped = if unshared {
                map(child.as_raw(), maps)
            } else {
                Err("user namespaces are refused to this user (unshare(CLONE_NEWUSER))".into())
            };
            let _ = std::fs::File::from(go_w).write_all(b"g");
            let status = nix::sys::wait::waitpid(child, None);
            mapped?;
            match status {
                Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(()),
                other => Err(format!(
                    "a mapped namespace did not make its process root ({other:?})"
                )),
            }
        }
    }
}

/// This process unshares; a helper process maps it. Should the mapping
/// fail once unshared, `doomed` runs and the process exits: there is no
/// way back out of the namespace.
fn become_mapped(maps: &Maps, doomed: impl FnOnce()) -> Result<(), String> {
    let me = nix::unistd::getpid().as_raw();
    let (go_r, go_w) = pipe()?;
    let (done_r, done_w) = pipe()?;
    // SAFETY: single-threaded (the caller's promise).
    match unsafe { nix::unistd::fork() }.map_err(|e| format!("fork: {e}"))? {
        nix::unistd::ForkResult::Child => {
            drop(go_w);
            drop(done_r);
            let mut b = [0u8; 1];
            let ok =
                matches!(std::fs::File::from(go_r).read(&mut b), Ok(1)) && map(me, maps).is_ok();
            let _ = nix::unistd::write(&done_w, &[u8::from(ok)]);
            // SAFETY: leaving the forked helper at once.
            unsafe { libc::_exit(0) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(go_r);
            drop(done_w);
            if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER) {
                // Closing the pipe releases the helper.
                drop(go_w);
                let _ = nix::sys::wait::waitpid(child, None);
                return Err(format!("unshare(CLONE_NEWUSER): {e}"));
            }
            let _ = std::fs::File::from(go_w).write_all(b"g");
            let mut b = [0u8; 1];
            let ok = matches!(std::fs::File::from(done_r).read(&mut b), Ok(1)) && b[0] == 1;
            let _ = nix::sys::wait::waitpid(child, None);
            if !ok || !nix::unistd::geteuid().is_root() {
                // Past the point of return: an unmapped namespace leaves
                // this process as nobody, which nothing below can use.
                doomed();
                eprintln!(
                    "mini-letta: error: mapping this process's subordinate ids failed after a \
                     successful trial; run the command again (it tries on a throw-away process \
                     first), or set {DISABLE_ENV}={DISABLE_WORD} to run without per-agent uids"
                );
                std::process::exit(1);
            }
            Ok(())
        }
    }
}

/// The agent uid registry of this user, when it has a namespace of them.
pub(crate) fn user_registry_path() -> Option<&'static Path> {
    match status() {
        Status::Mapped { registry, .. } => Some(registry),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_range_is_found_by_name_or_number() {
        let text = "alice:100000:65536\n1001:300000:1000\nbob:200000:0\n";
        assert_eq!(
            range_in(text, "alice", 1000),
            Some(Range {
                start: 100_000,
                count: 65_536
            })
        );
        assert_eq!(
            range_in(text, "carol", 1001),
            Some(Range {
                start: 300_000,
                count: 1000
            })
        );
        assert_eq!(range_in(text, "bob", 7), None, "an empty range is none");
        assert_eq!(range_in(text, "dave", 9), None);
        assert_eq!(range_in("garbage\n:::\n", "dave", 9), None);
    }
}
