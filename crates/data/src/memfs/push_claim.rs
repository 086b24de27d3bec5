//! A directory remote's push claim: who is pushing to it, and what a
//! pusher that died mid-push left locked.
//!
//! Why: a push to a directory remote takes git's ref locks
//! (`refs/heads/main.lock`, …) in the remote itself. A supervisor killed
//! between taking them and releasing them leaves them behind, and git's
//! lock files name no owner: every later push would be refused ("being
//! updated") for good. So every in-process push first takes an `flock`
//! on the remote's claim file (the kernel drops it when its holder dies)
//! and writes there the refs it is about to lock, clearing them when it is
//! done. A claimant that finds names written has proof their writer died
//! while holding those locks — any live pusher would still hold the
//! claim — and removes exactly those locks. A lock with no name written
//! belongs to someone else (a `git receive-pack`) and is left alone.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The claim file, inside the remote repository (a bare git directory
/// ignores a file it does not know).
const CLAIM_FILE: &str = "mini-letta-push";

/// How long a pusher waits for another to finish (a push of a memory
/// repository takes milliseconds to seconds).
pub const CLAIM_WAIT: Duration = Duration::from_secs(20);

/// A written claim is a few ref names; more is not ours.
const MAX_CLAIM_BYTES: u64 = 4096;

/// Why a claim could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// Another pusher held the claim for the whole wait.
    #[error("another push to {} held it for {:?}", .0.display(), .1)]
    Busy(PathBuf, Duration),
    #[error("cannot claim {} for a push: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// This process's claim on one directory remote; released (and its
/// written names cleared) when dropped.
pub struct Claim {
    file: nix::fcntl::Flock<File>,
    path: PathBuf,
    /// Lock files a dead pusher left, removed when the claim was taken.
    pub cleared: Vec<String>,
}

/// Take the claim on the remote at `remote_dir`, waiting at most `wait`
/// (zero: one try), and remove the ref locks a dead claimant named.
pub fn take(remote_dir: &Path, wait: Duration) -> Result<Claim, ClaimError> {
    let path = remote_dir.join(CLAIM_FILE);
    let io = |source| ClaimError::Io {
        path: path.clone(),
        source,
    };
    let file = crate::fsutil::open_lock_file(&path, 0o644).map_err(io)?;
    let mut file = match crate::fsutil::flock_bounded(file, wait, "the push claim") {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
            return Err(ClaimError::Busy(remote_dir.to_path_buf(), wait));
        }
        Err(e) => return Err(io(e)),
    };
    let mut written = String::new();
    (&mut *file)
        .take(MAX_CLAIM_BYTES)
        .read_to_string(&mut written)
        .map_err(io)?;
    let cleared = written
        .lines()
        .filter(|name| is_ref_name(name))
        .filter_map(|name| remove_lock(remote_dir, name))
        .collect();
    let mut claim = Claim {
        file,
        path: path.clone(),
        cleared,
    };
    claim.write(&[]).map_err(io)?;
    Ok(claim)
}

impl Claim {
    /// Record that the refs `names` are about to be locked; durable before
    /// the first lock exists, so a lock can never outlive its record.
    pub fn locking(&mut self, names: &[&str]) -> Result<(), ClaimError> {
        self.write(names).map_err(|source| ClaimError::Io {
            path: self.path.clone(),
            source,
        })
    }

    fn write(&mut self, names: &[&str]) -> std::io::Result<()> {
        let file: &mut File = &mut self.file;
        file.set_len(0)?;
        file.rewind()?;
        if names.is_empty() {
            return Ok(());
        }
        let mut text = names.join("\n");
        text.push('\n');
        file.write_all(text.as_bytes())?;
        file.sync_data()
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        // Every path out of a push released its ref locks (a git2
        // transaction unlocks when dropped); only death skips this.
        if let Err(e) = self.write(&[]) {
            tracing::warn!(path = %self.path.display(), error = %e, "could not clear a push claim");
        }
    }
}

/// A ref name as this module writes them: under `refs/`, plain components.
fn is_ref_name(name: &str) -> bool {
    name.starts_with("refs/")
        && name.split('/').all(|c| {
            !c.is_empty()
                && c != ".."
                && c != "."
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        })
}

/// Remove `<remote>/<name>.lock` when it is a regular file; its name.
fn remove_lock(remote_dir: &Path, name: &str) -> Option<String> {
    let lock = remote_dir.join(format!("{name}.lock"));
    let is_file = std::fs::symlink_metadata(&lock).is_ok_and(|m| m.file_type().is_file());
    if is_file && std::fs::remove_file(&lock).is_ok() {
        tracing::warn!(lock = %lock.display(), "removed a ref lock a pusher that died left in the remote");
        return Some(format!("{name}.lock"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_written_by_a_dead_claimant_are_unlocked_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let remote = dir.path();
        std::fs::create_dir_all(remote.join("refs/heads")).unwrap();
        std::fs::create_dir_all(remote.join("refs/tags")).unwrap();
        std::fs::write(remote.join("refs/heads/main.lock"), "x").unwrap();
        std::fs::write(remote.join("refs/tags/other.lock"), "x").unwrap();
        std::fs::write(remote.join("outside.lock"), "x").unwrap();
        // As a claimant killed after writing its names leaves the file.
        std::fs::write(
            remote.join(CLAIM_FILE),
            "refs/heads/main\n../outside\nrefs/../outside\n",
        )
        .unwrap();
        let claim = take(remote, CLAIM_WAIT).unwrap();
        assert_eq!(claim.cleared, vec!["refs/heads/main.lock".to_string()]);
        assert!(!remote.join("refs/heads/main.lock").exists());
        assert!(remote.join("refs/tags/other.lock").exists(), "not named");
        assert!(remote.join("outside.lock").exists(), "not a ref name");
        assert_eq!(std::fs::read(remote.join(CLAIM_FILE)).unwrap(), b"");
    }

    #[test]
    fn a_claim_records_its_names_until_dropped_and_excludes_others() {
        let dir = tempfile::tempdir().unwrap();
        let remote = dir.path();
        let mut claim = take(remote, CLAIM_WAIT).unwrap();
        claim.locking(&["refs/heads/main"]).unwrap();
        assert_eq!(
            std::fs::read_to_string(remote.join(CLAIM_FILE)).unwrap(),
            "refs/heads/main\n"
        );
        // A second open file description cannot take it while held.
        let other = File::open(remote.join(CLAIM_FILE)).unwrap();
        assert!(
            nix::fcntl::Flock::lock(other, nix::fcntl::FlockArg::LockExclusiveNonblock).is_err()
        );
        assert!(matches!(
            take(remote, Duration::ZERO),
            Err(ClaimError::Busy(_, _))
        ));
        drop(claim);
        assert_eq!(std::fs::read(remote.join(CLAIM_FILE)).unwrap(), b"");
        assert!(take(remote, Duration::ZERO).is_ok());
    }

    #[test]
    fn a_planted_symlink_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "keep").unwrap();
        let remote = dir.path().join("remote");
        std::fs::create_dir(&remote).unwrap();
        std::os::unix::fs::symlink(&target, remote.join(CLAIM_FILE)).unwrap();
        assert!(matches!(
            take(&remote, CLAIM_WAIT),
            Err(ClaimError::Io { .. })
        ));
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
    }
}
