//! Resolving a relative path below a directory descriptor, following
//! nothing: `openat2` where the kernel has it, else one component at a
//! time; and the open flags every handle uses.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU8, Ordering};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;

use super::stat::Kind;

/// Whether `openat2` works here: 0 not yet known, 1 yes, 2 no (ENOSYS:
/// older kernels; EPERM or ENOSYS: a seccomp filter that hides it).
static OPENAT2: AtomicU8 = AtomicU8::new(0);

/// The components of a relative path: each non-empty, not `.` or `..`.
pub(crate) fn components(rel: &OsStr) -> Option<Vec<&OsStr>> {
    let bytes = rel.as_bytes();
    if bytes.is_empty() || bytes.contains(&0) {
        return None;
    }
    let parts: Vec<&OsStr> = bytes.split(|b| *b == b'/').map(OsStr::from_bytes).collect();
    let ok = parts
        .iter()
        .all(|p| !p.is_empty() && p.as_bytes() != b"." && p.as_bytes() != b"..");
    ok.then_some(parts)
}

fn resolve_flags() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS
}

/// Open `rel` below `dir` with `flags` (which must hold `O_NOFOLLOW`),
/// following nothing. Uses `openat2` when the kernel has it.
pub(crate) fn open_beneath(
    dir: BorrowedFd<'_>,
    rel: &OsStr,
    flags: OFlag,
) -> Result<OwnedFd, Errno> {
    if components(rel).is_none() {
        // `..`, `.`, empty or absolute: never opened.
        return Err(Errno::EXDEV);
    }
    if OPENAT2.load(Ordering::Relaxed) != 2 {
        let how = OpenHow::new().flags(flags).resolve(resolve_flags());
        // EAGAIN: the kernel saw a concurrent rename and could not prove the
        // walk stayed beneath; a few retries, then it counts as a refusal.
        for _ in 0..4 {
            match nix::fcntl::openat2(dir, rel, how) {
                // ENOSYS: an old kernel; EPERM: a seccomp filter (container
                // runtimes) refusing a syscall it does not know. Our opens
                // never fail with EPERM otherwise, and the walk below is as
                // strict, only slower.
                Err(Errno::ENOSYS | Errno::EPERM) => {
                    OPENAT2.store(2, Ordering::Relaxed);
                    break;
                }
                Err(Errno::EAGAIN) => continue,
                r => {
                    OPENAT2.store(1, Ordering::Relaxed);
                    return r;
                }
            }
        }
        if OPENAT2.load(Ordering::Relaxed) != 2 {
            return Err(Errno::EXDEV);
        }
    }
    open_beneath_walk(dir, rel, flags)
}

/// [`open_beneath`] without `openat2`: one component at a time, each
/// directory pinned with `O_PATH | O_NOFOLLOW` from the previous one's
/// descriptor and checked to be a directory, the leaf opened with `flags`
/// (plus `O_NOFOLLOW`). A symlink at any step fails with `ELOOP`, as with
/// `openat2`; `..`, `.`, empty components and absolute paths with `EXDEV`.
pub(crate) fn open_beneath_walk(
    dir: BorrowedFd<'_>,
    rel: &OsStr,
    flags: OFlag,
) -> Result<OwnedFd, Errno> {
    let parts = components(rel).ok_or(Errno::EXDEV)?;
    let Some((leaf, dirs)) = parts.split_last() else {
        return Err(Errno::EXDEV);
    };
    let mut held: Option<OwnedFd> = None;
    for part in dirs {
        let at = held.as_ref().map(|f| f.as_fd()).unwrap_or(dir);
        // O_PATH: nothing is opened for real (a FIFO cannot block us), and
        // O_NOFOLLOW hands back a symlink itself, which we then refuse.
        let next = nix::fcntl::openat(at, *part, PATH_FLAGS, Mode::empty())?;
        match Kind::of(nix::sys::stat::fstat(&next)?.st_mode as u32) {
            Kind::Dir => {}
            Kind::Symlink => return Err(Errno::ELOOP),
            _ => return Err(Errno::ENOTDIR),
        }
        held = Some(next);
    }
    let at = held.as_ref().map(|f| f.as_fd()).unwrap_or(dir);
    nix::fcntl::openat(at, *leaf, flags | OFlag::O_NOFOLLOW, Mode::empty())
}

/// A handle on an inode without opening it for I/O.
pub(crate) const PATH_FLAGS: OFlag = OFlag::O_PATH
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

pub(crate) const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// `O_NONBLOCK`: opening a FIFO raced in after the type check must not wait
/// for a writer. `O_NOCTTY`: a terminal never becomes ours.
pub(crate) const FILE_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_NONBLOCK)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC)
    .union(OFlag::O_NOCTTY);

pub(crate) fn single(name: &OsStr) -> Option<()> {
    components(name).filter(|c| c.len() == 1).map(|_| ())
}
