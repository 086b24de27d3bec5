//! `reflection.lock`: at most one reflection per agent at a time, across
//! processes (spec §5.4 [B], modelled on the checkout lease of §8.2).
//!
//! The lock is a JSON record `{pid, started, token, label?, child?}` in the
//! agent directory. `started` is the owner's start time, field 22 of
//! `/proc/<pid>/stat` (clock ticks since boot, so no time zone or clock
//! change moves it): a pid alone could have been reused by an unrelated
//! process since the owner died.
//!
//! Publishing is atomic: the record is written to
//! `reflection.lock.<token>.tmp`, hard-linked to `reflection.lock` (which
//! fails if the lock exists) and the temporary name removed. A lock whose
//! owner is gone, whose pid now belongs to another process, or whose content
//! is malformed is stale: it is removed and the link tried once more.
//! Judging and removing a stale lock, and releasing, happen under an
//! `flock` on `reflection.lock.guard`, so two launchers can never both
//! remove a stale lock and then each think they own the fresh one.

use std::io::ErrorKind;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{MAX_SMALL_JSON_BYTES, ReflectionError};
use crate::agentfs::Dir;
use crate::paths::{AgentPaths, REFLECTION_LOCK_FILE_NAME, reflection_lock_temp_name};
use crate::sandbox::identity::process_start_time;

/// Longest wait for another launcher's short critical section.
const GUARD_WAIT: Duration = Duration::from_secs(5);
/// Permission bits of the lock (status tools may read it).
const LOCK_FILE_MODE: u32 = 0o644;

/// The lock file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockRecord {
    /// The launcher holding the lock (the supervisor, normally).
    pub pid: u32,
    /// The launcher's start time (see the module doc).
    pub started: u64,
    /// Proof of ownership for [`release`] and [`set_child`].
    pub token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The reflection child's pid, once it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child: Option<u32>,
}

/// What a status tool is told about the lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LockInfo {
    pub pid: u32,
    pub started: u64,
    /// Whether the owner still runs (same pid, same start time).
    pub alive: bool,
    pub label: Option<String>,
    pub child: Option<u32>,
    /// The file does not hold a lock record (it would be reclaimed).
    pub malformed: bool,
}

/// The outcome of [`try_acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    /// The lock is ours; keep the token to release it.
    Acquired { token: String },
    /// A live launcher holds it.
    Held { owner: LockInfo },
}

fn is_alive(pid: u32, started: u64) -> bool {
    process_start_time(pid) == Some(started)
}

fn info_of(record: &LockRecord) -> LockInfo {
    LockInfo {
        pid: record.pid,
        started: record.started,
        alive: is_alive(record.pid, record.started),
        label: record.label.clone(),
        child: record.child,
        malformed: false,
    }
}

fn malformed_info() -> LockInfo {
    LockInfo {
        pid: 0,
        started: 0,
        alive: false,
        label: None,
        child: None,
        malformed: true,
    }
}

/// What is at the lock path now.
enum Found {
    Missing,
    Record(LockRecord),
    /// Unreadable as a record (garbage, too large, not a regular file).
    Malformed,
}

fn read_lock(dir: &Dir) -> Result<Found, ReflectionError> {
    match dir.read_file_capped(REFLECTION_LOCK_FILE_NAME, MAX_SMALL_JSON_BYTES) {
        Ok((bytes, _)) => Ok(match serde_json::from_slice::<LockRecord>(&bytes) {
            Ok(r) => Found::Record(r),
            Err(_) => Found::Malformed,
        }),
        Err(e) if e.is_not_found() => Ok(Found::Missing),
        // The directory is the supervisor's; anything odd at the lock's
        // name is stale state, not an attack to stop for.
        Err(
            crate::agentfs::FsError::TooLarge { .. }
            | crate::agentfs::FsError::NotRegular { .. }
            | crate::agentfs::FsError::Symlink { .. },
        ) => Ok(Found::Malformed),
        Err(e) => Err(e.into()),
    }
}

/// Hold the guard `flock` for a short critical section.
fn guard(agent: &AgentPaths) -> Result<nix::fcntl::Flock<std::fs::File>, ReflectionError> {
    let path = agent.reflection_lock_guard();
    let io = |source| ReflectionError::Io {
        path: path.clone(),
        source,
    };
    let file = crate::fsutil::open_lock_file(&path, 0o600).map_err(io)?;
    crate::fsutil::flock_bounded(file, GUARD_WAIT, "the reflection lock guard").map_err(io)
}

fn new_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Take the agent's reflection lock for process `owner_pid` (normally
/// `std::process::id()`).
pub fn try_acquire(agent: &AgentPaths, owner_pid: u32) -> Result<Acquire, ReflectionError> {
    try_acquire_labeled(agent, owner_pid, None)
}

/// [`try_acquire`], recording a label (e.g. the launch id) for status tools.
pub(crate) fn try_acquire_labeled(
    agent: &AgentPaths,
    owner_pid: u32,
    label: Option<&str>,
) -> Result<Acquire, ReflectionError> {
    let started = process_start_time(owner_pid).ok_or_else(|| ReflectionError::Io {
        path: format!("/proc/{owner_pid}/stat").into(),
        source: std::io::Error::new(ErrorKind::NotFound, "the lock owner is not running"),
    })?;
    let token = new_token();
    let record = LockRecord {
        pid: owner_pid,
        started,
        token: token.clone(),
        label: label.map(str::to_string),
        child: None,
    };
    let bytes = super::to_pretty_json(&record, agent.reflection_lock())?;
    let dir = super::open_agent_dir(agent)?;
    let _guard = guard(agent)?;
    let tmp_name = reflection_lock_temp_name(&token);
    dir.create_file(&tmp_name, &bytes, LOCK_FILE_MODE)?;
    let outcome = publish(agent, &dir, &token);
    // The temporary name goes whatever happened; the lock (if ours) is
    // the other name of the same file.
    let _ = dir.remove_file(&tmp_name);
    outcome
}

/// Link the temporary record to the lock name, reclaiming a stale lock once.
fn publish(agent: &AgentPaths, dir: &Dir, token: &str) -> Result<Acquire, ReflectionError> {
    let tmp = agent.reflection_lock_temp(token);
    let lock = agent.reflection_lock();
    let mut reclaimed = false;
    loop {
        match std::fs::hard_link(&tmp, &lock) {
            Ok(()) => {
                return Ok(Acquire::Acquired {
                    token: token.to_string(),
                });
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(source) => return Err(ReflectionError::Io { path: lock, source }),
        }
        let owner = match read_lock(dir)? {
            // Released between our link and our look: just try again
            // (counts as the one retry, so this cannot spin).
            Found::Missing => None,
            Found::Record(r) => {
                let info = info_of(&r);
                if info.alive {
                    return Ok(Acquire::Held { owner: info });
                }
                Some(info)
            }
            Found::Malformed => Some(malformed_info()),
        };
        if reclaimed {
            return Ok(Acquire::Held {
                owner: owner.unwrap_or_else(malformed_info),
            });
        }
        if let Some(stale) = &owner {
            tracing::warn!(
                "{}: reclaiming a stale reflection lock (pid {}, malformed: {})",
                lock.display(),
                stale.pid,
                stale.malformed
            );
            match dir.remove_file(REFLECTION_LOCK_FILE_NAME) {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        reclaimed = true;
    }
}

/// Release the lock if `token` is the one it was taken with; `false` (and
/// the lock left alone) otherwise.
pub fn release(agent: &AgentPaths, token: &str) -> Result<bool, ReflectionError> {
    let dir = super::open_agent_dir(agent)?;
    let _guard = guard(agent)?;
    match read_lock(&dir)? {
        Found::Record(r) if r.token == token => {
            dir.remove_file(REFLECTION_LOCK_FILE_NAME)?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Record the reflection child's pid in the lock (if `token` still owns it).
#[cfg(test)]
pub(crate) fn set_child(
    agent: &AgentPaths,
    token: &str,
    child: u32,
) -> Result<bool, ReflectionError> {
    let dir = super::open_agent_dir(agent)?;
    let _guard = guard(agent)?;
    match read_lock(&dir)? {
        Found::Record(mut r) if r.token == token => {
            r.child = Some(child);
            let bytes = super::to_pretty_json(&r, agent.reflection_lock())?;
            dir.replace_file(REFLECTION_LOCK_FILE_NAME, &bytes, LOCK_FILE_MODE)?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// The lock as it is now, for status and doctor (`None`: not held).
pub fn inspect(agent: &AgentPaths) -> Result<Option<LockInfo>, ReflectionError> {
    let dir = super::open_agent_dir(agent)?;
    Ok(match read_lock(&dir)? {
        Found::Missing => None,
        Found::Record(r) => Some(info_of(&r)),
        Found::Malformed => Some(malformed_info()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reflection::testutil;

    fn me() -> u32 {
        std::process::id()
    }

    fn plant(agent: &AgentPaths, record: &LockRecord) {
        std::fs::write(
            agent.reflection_lock(),
            serde_json::to_vec(record).expect("json"),
        )
        .expect("plant");
    }

    fn leftovers(agent: &AgentPaths) -> Vec<String> {
        std::fs::read_dir(agent.dir())
            .expect("ls")
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.ends_with(".tmp"))
            .collect()
    }

    fn acquired(a: Acquire) -> String {
        match a {
            Acquire::Acquired { token } => token,
            Acquire::Held { owner } => panic!("held by {owner:?}"),
        }
    }

    #[test]
    fn own_start_time_is_read_and_stable() {
        let a = process_start_time(me());
        assert!(a.is_some());
        assert_eq!(a, process_start_time(me()));
        assert_eq!(process_start_time(0), None);
    }

    #[test]
    fn second_acquire_is_held_until_released() {
        let (_t, agent) = testutil::agent();
        let token = acquired(try_acquire_labeled(&agent, me(), Some("launch-1")).expect("first"));
        match try_acquire(&agent, me()).expect("second") {
            Acquire::Held { owner } => {
                assert_eq!(owner.pid, me());
                assert!(owner.alive);
                assert_eq!(owner.label.as_deref(), Some("launch-1"));
            }
            other => panic!("expected Held, got {other:?}"),
        }
        assert!(leftovers(&agent).is_empty(), "temp files removed");
        let on_disk: LockRecord =
            serde_json::from_slice(&std::fs::read(agent.reflection_lock()).expect("read"))
                .expect("record");
        assert_eq!(on_disk.token, token);
        assert_eq!(Some(on_disk.started), process_start_time(me()));

        assert!(!release(&agent, "not-the-token").expect("wrong release"));
        assert!(agent.reflection_lock().exists(), "a wrong token leaves it");
        assert!(release(&agent, &token).expect("release"));
        assert!(!agent.reflection_lock().exists());
        acquired(try_acquire(&agent, me()).expect("again"));
    }

    #[test]
    fn a_dead_owner_is_reclaimed() {
        let (_t, agent) = testutil::agent();
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let pid = child.id();
        child.wait().expect("wait");
        plant(
            &agent,
            &LockRecord {
                pid,
                started: 1,
                token: "old".into(),
                label: None,
                child: None,
            },
        );
        assert!(!inspect(&agent).expect("inspect").expect("some").alive);
        let token = acquired(try_acquire(&agent, me()).expect("acquire"));
        let info = inspect(&agent).expect("inspect").expect("some");
        assert_eq!(info.pid, me());
        assert!(info.alive);
        assert!(release(&agent, &token).expect("release"));
    }

    #[test]
    fn a_reused_pid_is_reclaimed() {
        let (_t, agent) = testutil::agent();
        let started = process_start_time(me()).expect("start");
        plant(
            &agent,
            &LockRecord {
                pid: me(),
                started: started + 1,
                token: "old".into(),
                label: None,
                child: None,
            },
        );
        acquired(try_acquire(&agent, me()).expect("acquire"));
    }

    #[test]
    fn a_malformed_lock_is_reclaimed() {
        let (_t, agent) = testutil::agent();
        std::fs::write(agent.reflection_lock(), b"{\"pid\": \"many\"").expect("write");
        let info = inspect(&agent).expect("inspect").expect("some");
        assert!(info.malformed && !info.alive);
        acquired(try_acquire(&agent, me()).expect("acquire"));
    }

    #[test]
    fn set_child_needs_the_token() {
        let (_t, agent) = testutil::agent();
        let token = acquired(try_acquire(&agent, me()).expect("acquire"));
        assert!(!set_child(&agent, "other", 42).expect("wrong"));
        assert!(set_child(&agent, &token, 42).expect("right"));
        assert_eq!(
            inspect(&agent).expect("inspect").expect("some").child,
            Some(42)
        );
        assert!(release(&agent, &token).expect("release"));
        assert_eq!(inspect(&agent).expect("inspect"), None);
    }

    #[test]
    fn a_dead_owner_pid_cannot_acquire() {
        let (_t, agent) = testutil::agent();
        assert!(try_acquire(&agent, 0).is_err());
    }
}
