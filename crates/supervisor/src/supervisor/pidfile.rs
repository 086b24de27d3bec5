//! The supervisor's pid file: one supervisor per home.
//!
//! `<home>/run/supervisor.pid` is held with an exclusive `flock` for the
//! supervisor's whole life. The kernel drops the lock when the process dies,
//! however it dies, so a pid file left by a killed supervisor is simply
//! reclaimed by the next one.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum PidFileError {
    #[error("a supervisor is already running for this home (pid {pid})")]
    Running { pid: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The held pid file; dropping it releases the lock.
#[derive(Debug)]
pub struct PidFile {
    path: PathBuf,
    file: File,
    /// True when an earlier supervisor's file was found and taken over.
    pub reclaimed: bool,
}

/// Create `dir` (mode 0700) if needed and refuse one another user can write.
pub(crate) fn ensure_private_dir(dir: &Path) -> Result<(), PidFileError> {
    let io = |source| PidFileError::Io {
        path: dir.to_path_buf(),
        source,
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io)?;
    let meta = fs::metadata(dir).map_err(io)?;
    if meta.permissions().mode() & 0o077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io)?;
    }
    Ok(())
}

impl PidFile {
    /// Take the pid file or report the running supervisor.
    pub fn acquire(path: &Path) -> Result<Self, PidFileError> {
        // A departing supervisor unlinks the file under its lock; if we
        // locked such an unlinked inode, try again on the new file.
        // (`None`: the file was replaced under us.)
        let once = || Self::try_acquire(path).map_err(Some)?.ok_or(None);
        crate::retry::Policy::immediate(100)
            .run(Option::is_none, once)
            .map_err(|e| {
                e.unwrap_or_else(|| PidFileError::Io {
                    path: path.to_path_buf(),
                    source: std::io::Error::other("pid file keeps being replaced"),
                })
            })
    }

    fn try_acquire(path: &Path) -> Result<Option<Self>, PidFileError> {
        use std::os::unix::fs::MetadataExt;
        let io = |source| PidFileError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let pid = text.lines().next().unwrap_or("?").trim().to_string();
                return Err(PidFileError::Running { pid });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
        let ours = file.metadata().map_err(io)?;
        match fs::metadata(path) {
            Ok(now) if now.ino() == ours.ino() && now.dev() == ours.dev() => {}
            _ => return Ok(None),
        }
        let mut old = String::new();
        let _ = file.read_to_string(&mut old);
        let reclaimed = !old.trim().is_empty();
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(Some(Self {
            path: path.to_path_buf(),
            file,
            reclaimed,
        }))
    }

    /// Pid recorded in the file at `path` when that process is alive. Read
    /// without taking the lock, so polling never makes a concurrent start
    /// think the home is taken.
    pub fn holder(path: &Path) -> Option<u32> {
        let text = fs::read_to_string(path).ok()?;
        let pid: u32 = text.lines().next()?.trim().parse().ok()?;
        let alive = fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                !s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(false);
        // A recycled pid must never be mistaken for (and signalled as) ours.
        let ours = fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| String::from_utf8_lossy(&c).contains("supervisor"))
            .unwrap_or(false);
        (alive && ours).then_some(pid)
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        // Remove the file while still holding the lock so a new supervisor
        // never sees our pid after we are gone.
        let _ = fs::remove_file(&self.path);
        let _ = self.file.unlock();
    }
}
