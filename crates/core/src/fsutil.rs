//! Small filesystem helpers shared by every writer.

use std::fs::File;
use std::io::Write;
use std::path::Path;

/// Write `contents` to `path` atomically: a uniquely named temporary file
/// in the same directory, fsynced, then renamed over the target, so a crash
/// leaves either the old or the new file, never a torn one, and concurrent
/// writers (threads or processes) never share a temporary file.
pub fn atomic_write(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    atomic_write_mode(path, contents, 0o644)
}

/// [`atomic_write`] with the file's mode (the temporary file is created
/// private and given `mode` before it is renamed into place).
pub fn atomic_write_mode(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Dropped (and removed) on any error below.
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .tempfile_in(dir)?;
    tmp.write_all(contents)?;
    tmp.as_file()
        .set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    // Persist the rename itself.
    File::open(dir)?.sync_all()
}

/// Open (creating with `mode`) a file that only carries an `flock`, never
/// through a symbolic link: whoever can write its directory could plant
/// one there.
pub fn open_lock_file(path: &Path, mode: u32) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Lock `file` exclusively, waiting at most `wait` (any process of the
/// same uid can hold such a lock, so a holder that never lets go costs a
/// bounded wait, then a `TimedOut` error naming `what` it held).
pub fn flock_bounded(
    file: std::fs::File,
    wait: std::time::Duration,
    what: &str,
) -> std::io::Result<nix::fcntl::Flock<std::fs::File>> {
    use nix::errno::Errno;
    use nix::fcntl::{Flock, FlockArg};
    // `Flock::lock` takes the file and hands it back on failure.
    let mut file = Some(file);
    let once = || {
        let f = file.take().ok_or(Errno::EBADF)?;
        Flock::lock(f, FlockArg::LockExclusiveNonblock).map_err(|(f, e)| {
            file = Some(f);
            e
        })
    };
    let policy = crate::retry::Policy::polling(std::time::Duration::from_millis(5), wait);
    match policy.run(|e| *e == Errno::EWOULDBLOCK, once) {
        Ok(locked) => Ok(locked),
        Err(Errno::EWOULDBLOCK) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("another process held {what} for {wait:?}"),
        )),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_lock_file_is_never_opened_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "keep").unwrap();
        let lock = dir.path().join("lock");
        std::os::unix::fs::symlink(&target, &lock).unwrap();
        let err = open_lock_file(&lock, 0o600).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP), "{err}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        let fresh = dir.path().join("fresh");
        open_lock_file(&fresh, 0o600).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&fresh).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
    }
    use super::*;

    #[test]
    fn replaces_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.json");
        atomic_write(&p, b"one").unwrap();
        atomic_write(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&p).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o644);
    }

    /// Threads writing the same file at once never tear it nor leave
    /// temporary files behind (a name per process would be shared).
    #[test]
    fn concurrent_writers_in_one_process() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("index.json");
        std::thread::scope(|s| {
            for t in 0..8u8 {
                let p = &p;
                s.spawn(move || {
                    let body = vec![b'a' + t; 64 * 1024];
                    for _ in 0..20 {
                        atomic_write(p, &body).unwrap();
                    }
                });
            }
        });
        let got = std::fs::read(&p).unwrap();
        assert_eq!(got.len(), 64 * 1024);
        assert!(got.iter().all(|b| *b == got[0]), "torn file");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    /// A lock held elsewhere is waited for while it is let go in time, and
    /// turns into a `TimedOut` naming what was held when it is not.
    #[test]
    fn a_held_lock_is_waited_for_within_the_bound() {
        use std::time::{Duration, Instant};
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lock");
        let open = || File::options().create(true).append(true).open(&p).unwrap();
        let held = flock_bounded(open(), Duration::ZERO, "x").unwrap();
        let began = Instant::now();
        let e = flock_bounded(open(), Duration::from_millis(50), "the test lock").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("the test lock"), "{e}");
        let took = began.elapsed();
        assert!(
            took >= Duration::from_millis(50) && took < Duration::from_secs(2),
            "{took:?}"
        );
        let letting_go = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            drop(held);
        });
        assert!(flock_bounded(open(), Duration::from_secs(5), "x").is_ok());
        letting_go.join().unwrap();
    }
}
