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
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Condvar, LazyLock, Mutex};

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
}

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
    /// Block until this thread holds the writer lock of the repository whose
    /// (common) git directory is `git_dir`.
    pub fn acquire(git_dir: &Path) -> Result<RepoLock, LockError> {
        let key = std::fs::canonicalize(git_dir).unwrap_or_else(|_| git_dir.to_path_buf());
        acquire_in_process(&key);
        // From here on, a failure must release the in-process slot.
        let path = MemoryGitDir::new(&key).write_lock_file();
        let file = match OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
        {
            Ok(f) => f,
            Err(source) => {
                release_in_process(&key);
                return Err(LockError::Open { path, source });
            }
        };
        if let Err(source) = file.lock() {
            release_in_process(&key);
            return Err(LockError::Lock { path, source });
        }
        Ok(RepoLock { key, _file: file })
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

fn acquire_in_process(key: &Path) {
    let (lock, cvar) = &*HELD;
    // A poisoned table only means a holder panicked; the set is still valid.
    let mut held = lock.lock().unwrap_or_else(|e| e.into_inner());
    while held.contains(key) {
        held = cvar.wait(held).unwrap_or_else(|e| e.into_inner());
    }
    held.insert(key.to_path_buf());
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
}
