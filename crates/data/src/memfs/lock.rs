//! The per-repository writer lock.
//!
//! Every writer of a memory repository (validated commits, the memory
//! operations, later merges) takes this lock around its index and commit
//! updates, so two writers never build commits on the same parent or
//! overwrite each other's index. It has two layers:
//!
//! * an in-process table keyed by the canonical git directory, because a
//!   supervisor serves many agents from many threads and `flock` alone would
//!   make each thread open its own descriptor and spin in the kernel;
//! * an exclusive `flock` on `<git dir>/mini-letta-memory.lock`, so two
//!   *processes* (two CLIs, a CLI and a supervisor) cannot interleave.
//!
//! The lock file is never deleted: removing a file someone else is blocked on
//! would let a third writer lock a fresh inode and run concurrently.

use std::collections::HashSet;
use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::{Condvar, LazyLock, Mutex};
use std::time::{Duration, Instant};

use crate::paths::MemoryGitDir;

/// Failures to take the lock.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("{path}: cannot open the memory lock file: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: cannot lock the memory lock file: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Another writer held the lock for the whole wait.
    #[error(
        "{path}: the memory repository lock ({holder}) was still held after waiting {waited:?}; try again"
    )]
    Timeout {
        path: PathBuf,
        /// `another thread of this process` or `another process`.
        holder: &'static str,
        waited: Duration,
    },
}

/// How long a writer waits for the repository lock by default. Every wait
/// is bounded: a writer stuck while holding it (or a process holding the
/// flock) must not pile up the supervisor's blocking threads forever.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// Git directories currently locked by a thread of this process.
static HELD: LazyLock<(Mutex<HashSet<PathBuf>>, Condvar)> =
    LazyLock::new(|| (Mutex::new(HashSet::new()), Condvar::new()));

/// Holding this value means holding the repository's writer lock; dropping
/// it releases both layers.
#[derive(Debug)]
pub struct RepoLock {
    key: PathBuf,
    // Closing the descriptor releases the flock.
    _file: File,
}

impl RepoLock {
    /// Wait (at most [`DEFAULT_LOCK_TIMEOUT`]) until this thread holds the
    /// writer lock of the repository whose (common) git directory is
    /// `git_dir`.
    pub fn acquire(git_dir: &Path) -> Result<RepoLock, LockError> {
        Self::acquire_timeout(git_dir, DEFAULT_LOCK_TIMEOUT)
    }

    /// [`Self::acquire`], waiting at most `timeout` in all (both layers).
    pub(crate) fn acquire_timeout(
        git_dir: &Path,
        timeout: Duration,
    ) -> Result<RepoLock, LockError> {
        let deadline = Instant::now() + timeout;
        let key = std::fs::canonicalize(git_dir).unwrap_or_else(|_| git_dir.to_path_buf());
        let path = MemoryGitDir::new(&key).write_lock_file();
        if !acquire_in_process(&key, deadline) {
            return Err(LockError::Timeout {
                path,
                holder: "another thread of this process",
                waited: timeout,
            });
        }
        // From here on, a failure must release the in-process slot.
        match flock_until(&key, &path, deadline) {
            Ok(file) => Ok(RepoLock { key, _file: file }),
            Err(e) => {
                release_in_process(&key);
                Err(match e {
                    FlockError::Open(source) => LockError::Open { path, source },
                    FlockError::Lock(source) => LockError::Lock { path, source },
                    FlockError::Timeout => LockError::Timeout {
                        path,
                        holder: "another process",
                        waited: timeout,
                    },
                })
            }
        }
    }
}

enum FlockError {
    Open(std::io::Error),
    Lock(std::io::Error),
    Timeout,
}

/// The flock half of one repository, shared by this process's attempts.
///
/// `flock` has no timed wait, and polling `try_lock` is unfair: a process
/// committing in a loop re-takes the lock before a poller wakes, starving
/// it. So a contended wait is handed to a helper thread blocked in
/// `flock` (the kernel queues waiters fairly) while the caller waits on a
/// condition variable with its deadline. When the caller gives up, the
/// helper stays parked in the kernel and the next attempt waits on it
/// rather than starting another: at most one helper per repository, however
/// long another process (or a child that opened the lock file) holds it.
#[derive(Default)]
struct Flocker {
    state: Mutex<FlockState>,
    cv: Condvar,
}

#[derive(Default)]
struct FlockState {
    /// A helper is blocked in `flock`.
    helper: bool,
    /// A caller is waiting for the helper's result.
    waiting: bool,
    /// The helper's result, handed to the waiting caller.
    done: Option<std::io::Result<File>>,
}

static FLOCKERS: LazyLock<Mutex<std::collections::HashMap<PathBuf, std::sync::Arc<Flocker>>>> =
    LazyLock::new(|| Mutex::new(std::collections::HashMap::new()));

fn open_lock_file(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        // Only the supervisor's uid may open it: a process that can open
        // the file can flock it and stall every writer.
        .mode(0o600)
        .open(path)?;
    // Tighten a looser file left by an older version; best effort, since a
    // repository shared with other users may hold a lock file we do not own.
    if let Ok(meta) = file.metadata()
        && meta.permissions().mode() & 0o077 != 0
    {
        let mode = meta.permissions().mode() & 0o7700;
        let _ = file.set_permissions(std::fs::Permissions::from_mode(mode));
    }
    Ok(file)
}

/// Take the flock on `path` (the lock file of `key`) by `deadline`.
fn flock_until(key: &Path, path: &Path, deadline: Instant) -> Result<File, FlockError> {
    let flocker = {
        let mut all = FLOCKERS.lock().unwrap_or_else(|e| e.into_inner());
        all.entry(key.to_path_buf()).or_default().clone()
    };
    let mut st = flocker.state.lock().unwrap_or_else(|e| e.into_inner());
    if !st.helper {
        // Uncontended, the usual case: no thread.
        let file = open_lock_file(path).map_err(FlockError::Open)?;
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(e)) => return Err(FlockError::Lock(e)),
        }
        st.helper = true;
        let f = flocker.clone();
        let spawned = std::thread::Builder::new()
            .name("memory-flock".into())
            .spawn(move || {
                let result = file.lock().map(|()| file);
                let mut st = f.state.lock().unwrap_or_else(|e| e.into_inner());
                st.helper = false;
                // Nobody waiting: drop the file, which releases the flock
                // at once instead of keeping other processes out.
                if st.waiting {
                    st.done = Some(result);
                }
                f.cv.notify_all();
            });
        if let Err(e) = spawned {
            st.helper = false;
            return Err(FlockError::Lock(e));
        }
    }
    st.waiting = true;
    loop {
        if let Some(result) = st.done.take() {
            st.waiting = false;
            return result.map_err(FlockError::Lock);
        }
        if !st.helper {
            // The helper finished while no one waited (and let go); try
            // again from the top, with what is left of the deadline.
            st.waiting = false;
            drop(st);
            return flock_until(key, path, deadline);
        }
        let now = Instant::now();
        if now >= deadline {
            st.waiting = false;
            return Err(FlockError::Timeout);
        }
        st = flocker
            .cv
            .wait_timeout(st, deadline - now)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

impl Drop for RepoLock {
    fn drop(&mut self) {
        // The flock goes with the descriptor after this; releasing the
        // in-process slot first is fine because the next in-process holder
        // simply waits for the flock in the kernel.
        release_in_process(&self.key);
    }
}

/// Take the in-process slot for `key`, waiting until `deadline` at most;
/// returns whether it was taken.
fn acquire_in_process(key: &Path, deadline: Instant) -> bool {
    let (lock, cvar) = &*HELD;
    // A poisoned table only means a holder panicked; the set is still valid.
    let mut held = lock.lock().unwrap_or_else(|e| e.into_inner());
    while held.contains(key) {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        held = cvar
            .wait_timeout(held, deadline - now)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    held.insert(key.to_path_buf());
    true
}

fn release_in_process(key: &Path) {
    let (lock, cvar) = &*HELD;
    let mut held = lock.lock().unwrap_or_else(|e| e.into_inner());
    held.remove(key);
    cvar.notify_all();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn threads_are_serialized() {
        let dir = tempfile::tempdir().unwrap();
        let inside = Arc::new(AtomicUsize::new(0));
        let max = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (dir, inside, max) = (dir.path().to_path_buf(), inside.clone(), max.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let _g = RepoLock::acquire(&dir).unwrap();
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        max.fetch_max(now, Ordering::SeqCst);
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(max.load(Ordering::SeqCst), 1);
        assert!(dir.path().join("mini-letta-memory.lock").is_file());
    }

    #[test]
    fn waits_are_bounded_and_say_which_lock() {
        let dir = tempfile::tempdir().unwrap();
        let held = RepoLock::acquire(dir.path()).unwrap();
        let d = dir.path().to_path_buf();
        let started = Instant::now();
        let err = std::thread::spawn(move || {
            RepoLock::acquire_timeout(&d, Duration::from_millis(200)).unwrap_err()
        })
        .join()
        .unwrap();
        assert!(started.elapsed() < Duration::from_secs(2));
        let msg = err.to_string();
        assert!(
            msg.contains("mini-letta-memory.lock") && msg.contains("200ms"),
            "{msg}"
        );
        assert!(msg.contains("another thread"), "{msg}");
        drop(held);
        // Another process holding the flock (simulated by a second open
        // file description in this process, outside the in-process table).
        let path = dir.path().join("mini-letta-memory.lock");
        let other = OpenOptions::new().write(true).open(&path).unwrap();
        other.lock().unwrap();
        let err = RepoLock::acquire_timeout(dir.path(), Duration::from_millis(100)).unwrap_err();
        assert!(err.to_string().contains("another process"), "{err}");
        // Attempts that time out share one parked helper thread instead of
        // leaving one each behind.
        for _ in 0..5 {
            assert!(RepoLock::acquire_timeout(dir.path(), Duration::from_millis(20)).is_err());
        }
        let helpers = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter(|t| {
                let comm = t.as_ref().unwrap().path().join("comm");
                std::fs::read_to_string(comm).is_ok_and(|c| c.trim() == "memory-flock")
            })
            .count();
        assert_eq!(helpers, 1);
        // The in-process slot was released on that failure.
        drop(other);
        assert!(RepoLock::acquire_timeout(dir.path(), Duration::from_millis(100)).is_ok());
    }
}
