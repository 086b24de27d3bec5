//! Descriptor-based access to directories a confined child can write.
//!
//! The supervisor runs as root and works inside agent directories whose
//! contents a hostile child controls and can change at any instant (swap a
//! directory for a symlink with `RENAME_EXCHANGE`, plant a FIFO, grow a file
//! without bound). A path string checked and then used is resolved twice,
//! and the second resolution is the child's to choose. So nothing here
//! resolves more than it has to, and nothing is ever followed:
//!
//! * a [`Dir`] is an open directory descriptor; everything below it is
//!   reached from it with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//!   RESOLVE_NO_MAGICLINKS)` (or, where `openat2` is missing or filtered,
//!   one component at a time with `openat(O_PATH | O_NOFOLLOW)` and a type
//!   check), so a symlink anywhere in the path is a refusal, never a
//!   detour;
//! * files are opened `O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY`,
//!   looked at with `fstat` on the descriptor actually read, read only when
//!   regular, and never beyond a size cap;
//! * symlinks are read with `readlinkat`, never followed;
//! * ownership changes go through a descriptor pinning the inode that was
//!   inspected ([`Entry`]), so the inode judged is the inode changed;
//! * writes create with `O_EXCL | O_NOFOLLOW`, replace by `renameat` of a
//!   fresh temporary file in the same directory descriptor, remove with
//!   `unlinkat`: a symlink in the way is replaced or refused, never written
//!   through.
//!
//! This module owns those primitives; [`crate::paths`] still owns where
//! things are. The only path strings opened here by string are the roots
//! handed to [`Dir::open`], which the caller builds from `paths` and which
//! sit in directories a child cannot write.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::{Gid, Uid};

pub mod temp_name;

/// Why an operation below a directory descriptor was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A symlink (or a `..`, an absolute path, a magic link) was met while
    /// resolving: nothing is followed in a child-writable tree.
    #[error("{path}: is or passes through a symbolic link; refusing to follow it")]
    Symlink { path: PathBuf },
    #[error("{path}: not a regular file ({kind}); refusing to read it")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{path}: {size} bytes exceeds the {max}-byte file limit")]
    TooLarge { path: PathBuf, size: u64, max: u64 },
    #[error("{path}: not a plain relative path below the directory")]
    BadName { path: PathBuf },
    #[error("{path}: more than {max} entries; refusing to go on")]
    TooManyEntries { path: PathBuf, max: usize },
    #[error("{path}: not a directory")]
    NotADirectory { path: PathBuf },
    /// A file with several names: writing into it could change a file
    /// elsewhere (a hard link planted by a child).
    #[error("{path}: has {links} hard links; refusing to write into it")]
    HardLinked { path: PathBuf, links: u64 },
    /// Its type changed between two looks at it (a child racing us).
    #[error("{path}: changed while being read; try again")]
    Changed { path: PathBuf },
}

impl FsError {
    /// Whether the thing named does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, FsError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }

    fn from_errno(path: PathBuf, e: Errno) -> Self {
        match e {
            // ELOOP: a symlink met under RESOLVE_NO_SYMLINKS or O_NOFOLLOW;
            // EXDEV: resolution tried to leave the directory.
            Errno::ELOOP | Errno::EXDEV => FsError::Symlink { path },
            Errno::ENOTDIR => FsError::NotADirectory { path },
            e => FsError::Io {
                path,
                source: std::io::Error::from(e),
            },
        }
    }
}

/// What an inode is, from its `st_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
    Unknown,
}

impl Kind {
    fn of(mode: u32) -> Kind {
        let fmt = SFlag::from_bits_truncate(mode & SFlag::S_IFMT.bits());
        match fmt {
            SFlag::S_IFREG => Kind::File,
            SFlag::S_IFDIR => Kind::Dir,
            SFlag::S_IFLNK => Kind::Symlink,
            SFlag::S_IFIFO => Kind::Fifo,
            SFlag::S_IFSOCK => Kind::Socket,
            SFlag::S_IFCHR => Kind::CharDevice,
            SFlag::S_IFBLK => Kind::BlockDevice,
            _ => Kind::Unknown,
        }
    }

    /// A word for error messages.
    pub fn describe(self) -> &'static str {
        match self {
            Kind::File => "regular file",
            Kind::Dir => "directory",
            Kind::Symlink => "symbolic link",
            Kind::Fifo => "FIFO",
            Kind::Socket => "socket",
            Kind::CharDevice => "character device",
            Kind::BlockDevice => "block device",
            Kind::Unknown => "unknown file type",
        }
    }
}

/// The `stat` fields callers use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub kind: Kind,
    /// Permission bits (`st_mode & 0o7777`).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u64,
    pub size: u64,
    pub dev: u64,
    pub ino: u64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

impl From<FileStat> for Stat {
    fn from(s: FileStat) -> Self {
        // Field widths differ between architectures; these conversions are
        // lossless on Linux's 64-bit layouts and saturate elsewhere.
        #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
        Stat {
            kind: Kind::of(s.st_mode as u32),
            perm: s.st_mode as u32 & 0o7777,
            uid: s.st_uid as u32,
            gid: s.st_gid as u32,
            nlink: s.st_nlink as u64,
            size: u64::try_from(s.st_size).unwrap_or(0),
            dev: s.st_dev as u64,
            ino: s.st_ino as u64,
            mtime: (s.st_mtime as i64, s.st_mtime_nsec as i64),
            ctime: (s.st_ctime as i64, s.st_ctime_nsec as i64),
        }
    }
}

/// Whether `openat2` works here: 0 not yet known, 1 yes, 2 no (ENOSYS:
/// older kernels; EPERM or ENOSYS: a seccomp filter that hides it).
static OPENAT2: AtomicU8 = AtomicU8::new(0);

/// An open directory. Everything below it is reached from its descriptor.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    /// For messages only; never opened.
    shown: PathBuf,
}

/// One entry of a directory pinned by an `O_PATH` descriptor: inspecting
/// and changing it act on the same inode whatever the name points at later.
#[derive(Debug)]
pub struct Entry {
    fd: OwnedFd,
    stat: Stat,
    shown: PathBuf,
}

/// The components of a relative path: each non-empty, not `.` or `..`.
fn components(rel: &OsStr) -> Option<Vec<&OsStr>> {
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
fn open_beneath(dir: BorrowedFd<'_>, rel: &OsStr, flags: OFlag) -> Result<OwnedFd, Errno> {
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
const PATH_FLAGS: OFlag = OFlag::O_PATH
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// `O_NONBLOCK`: opening a FIFO raced in after the type check must not wait
/// for a writer. `O_NOCTTY`: a terminal never becomes ours.
const FILE_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_NONBLOCK)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC)
    .union(OFlag::O_NOCTTY);

impl Dir {
    /// Open the directory at `path`, a path the supervisor built (from
    /// [`crate::paths`]) in a directory no child can write. Its last
    /// component is not followed.
    pub fn open(path: &Path) -> Result<Dir, FsError> {
        // Rebuilt from its components: a trailing slash (libgit2's workdir
        // has one) would make the kernel follow a symlink despite
        // O_NOFOLLOW.
        let path: PathBuf = path.components().collect();
        let fd = nix::fcntl::open(&path, DIR_FLAGS, Mode::empty())
            .map_err(|e| FsError::from_errno(path.clone(), e))?;
        Ok(Dir { fd, shown: path })
    }

    /// Another descriptor for this same directory (a fresh open of "."
    /// from this descriptor, not of a path).
    pub fn try_clone(&self) -> Result<Dir, FsError> {
        let fd = nix::fcntl::openat(&self.fd, ".", DIR_FLAGS, Mode::empty())
            .map_err(|e| FsError::from_errno(self.shown.clone(), e))?;
        Ok(Dir {
            fd,
            shown: self.shown.clone(),
        })
    }

    /// The path this directory was reached by, for messages.
    pub fn path(&self) -> &Path {
        &self.shown
    }

    fn shown(&self, rel: impl AsRef<OsStr>) -> PathBuf {
        self.shown.join(rel.as_ref())
    }

    pub fn stat(&self) -> Result<Stat, FsError> {
        nix::sys::stat::fstat(&self.fd)
            .map(Stat::from)
            .map_err(|e| FsError::from_errno(self.shown.clone(), e))
    }

    /// `lstat` of one entry of this directory (a single name), or `None`
    /// when there is none.
    pub fn stat_at(&self, name: impl AsRef<OsStr>) -> Result<Option<Stat>, FsError> {
        let name = name.as_ref();
        single(name).ok_or_else(|| FsError::BadName {
            path: self.shown(name),
        })?;
        match nix::sys::stat::fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(s) => Ok(Some(Stat::from(s))),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(FsError::from_errno(self.shown(name), e)),
        }
    }

    /// Open the directory `rel` (one or more components) below this one;
    /// a symlink anywhere on the way is refused.
    pub fn open_dir(&self, rel: impl AsRef<OsStr>) -> Result<Dir, FsError> {
        let rel = rel.as_ref();
        let shown = self.shown(rel);
        // Reached as O_PATH first so that what is there is known before it
        // is opened: a symlink as the last component comes back as itself
        // (and is refused as a symlink, not as "not a directory").
        let handle = open_beneath(self.fd.as_fd(), rel, PATH_FLAGS)
            .map_err(|e| FsError::from_errno(shown.clone(), e))?;
        let st =
            nix::sys::stat::fstat(&handle).map_err(|e| FsError::from_errno(shown.clone(), e))?;
        match Kind::of(st.st_mode as u32) {
            Kind::Dir => {}
            Kind::Symlink => return Err(FsError::Symlink { path: shown }),
            _ => return Err(FsError::NotADirectory { path: shown }),
        }
        let fd = nix::fcntl::openat(&handle, ".", DIR_FLAGS, Mode::empty())
            .map_err(|e| FsError::from_errno(shown.clone(), e))?;
        Ok(Dir { fd, shown })
    }

    /// Open the regular file `rel` below this directory for reading. The
    /// type is checked before opening (a FIFO or device is never opened)
    /// and again on the descriptor (in case it was swapped in between).
    pub fn open_file(&self, rel: impl AsRef<OsStr>) -> Result<(File, Stat), FsError> {
        let rel = rel.as_ref();
        let shown = self.shown(rel);
        let (parent, leaf) = self.parent_of(rel)?;
        let parent = parent.as_ref().unwrap_or(self);
        match parent.stat_at(leaf)? {
            None => {
                return Err(FsError::Io {
                    path: shown,
                    source: std::io::ErrorKind::NotFound.into(),
                });
            }
            Some(s) if s.kind != Kind::File => {
                return Err(refuse_kind(shown, s.kind));
            }
            Some(_) => {}
        }
        let fd = open_beneath(parent.fd.as_fd(), leaf, FILE_FLAGS)
            .map_err(|e| FsError::from_errno(shown.clone(), e))?;
        let st = Stat::from(
            nix::sys::stat::fstat(&fd).map_err(|e| FsError::from_errno(shown.clone(), e))?,
        );
        if st.kind != Kind::File {
            return Err(refuse_kind(shown, st.kind));
        }
        Ok((File::from(fd), st))
    }

    /// The bytes of the regular file `rel` and the `stat` of the very
    /// descriptor they were read from. Files over `max` bytes are refused
    /// before reading, and at most `max + 1` bytes are ever read, so a file
    /// growing under the read is caught too.
    pub fn read_file_capped(
        &self,
        rel: impl AsRef<OsStr>,
        max: u64,
    ) -> Result<(Vec<u8>, Stat), FsError> {
        let rel = rel.as_ref();
        let (file, st) = self.open_file(rel)?;
        let too_large = |size| FsError::TooLarge {
            path: self.shown(rel),
            size,
            max,
        };
        if st.size > max {
            return Err(too_large(st.size));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(st.size).unwrap_or(0));
        file.take(max.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|source| FsError::Io {
                path: self.shown(rel),
                source,
            })?;
        let got = bytes.len() as u64;
        if got > max {
            return Err(too_large(got.max(st.size)));
        }
        Ok((bytes, st))
    }

    /// The target of the symlink `name` (one entry of this directory), read
    /// without following it.
    pub fn read_link(&self, name: impl AsRef<OsStr>) -> Result<OsString, FsError> {
        let name = name.as_ref();
        single(name).ok_or_else(|| FsError::BadName {
            path: self.shown(name),
        })?;
        nix::fcntl::readlinkat(&self.fd, name).map_err(|e| match e {
            // Not a symlink (any more): say what it is instead of EINVAL.
            Errno::EINVAL => FsError::Changed {
                path: self.shown(name),
            },
            e => FsError::from_errno(self.shown(name), e),
        })
    }

    /// The names in this directory (without `.` and `..`), sorted by
    /// bytes; more than `max` is an error rather than an unbounded list.
    pub fn list(&self, max: usize) -> Result<Vec<OsString>, FsError> {
        // A fresh open file description of the same directory ("." from
        // its descriptor, not a path), so listings never share a position.
        let fd = nix::fcntl::openat(&self.fd, ".", DIR_FLAGS, Mode::empty())
            .map_err(|e| FsError::from_errno(self.shown.clone(), e))?;
        let mut d =
            nix::dir::Dir::from_fd(fd).map_err(|e| FsError::from_errno(self.shown.clone(), e))?;
        let mut out = Vec::new();
        for entry in d.iter() {
            let entry = entry.map_err(|e| FsError::from_errno(self.shown.clone(), e))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            if out.len() >= max {
                return Err(FsError::TooManyEntries {
                    path: self.shown.clone(),
                    max,
                });
            }
            out.push(OsString::from_vec(name.to_vec()));
        }
        out.sort();
        Ok(out)
    }

    /// Pin the entry `name` (any type, symlinks included, never followed)
    /// with an `O_PATH` descriptor; `None` when there is none.
    pub fn entry(&self, name: impl AsRef<OsStr>) -> Result<Option<Entry>, FsError> {
        let name = name.as_ref();
        let shown = self.shown(name);
        single(name).ok_or_else(|| FsError::BadName {
            path: shown.clone(),
        })?;
        let fd = match nix::fcntl::openat(
            &self.fd,
            name,
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(FsError::from_errno(shown, e)),
        };
        let stat = Stat::from(
            nix::sys::stat::fstat(&fd).map_err(|e| FsError::from_errno(shown.clone(), e))?,
        );
        Ok(Some(Entry { fd, stat, shown }))
    }

    /// Make the directory `name` (one entry) if it is missing, with `mode`
    /// when made; open it either way (a symlink there is refused).
    pub fn create_dir(&self, name: impl AsRef<OsStr>, mode: u32) -> Result<Dir, FsError> {
        let name = name.as_ref();
        single(name).ok_or_else(|| FsError::BadName {
            path: self.shown(name),
        })?;
        // Open first: the usual case, and no mkdir (which a read-only or
        // landlocked view might answer with an error of its own).
        match self.open_dir(name) {
            Err(e) if e.is_not_found() => {}
            r => return r,
        }
        let made = match nix::sys::stat::mkdirat(&self.fd, name, Mode::from_bits_truncate(mode)) {
            Ok(()) => true,
            Err(Errno::EEXIST) => false,
            Err(e) => return Err(FsError::from_errno(self.shown(name), e)),
        };
        let dir = self.open_dir(name)?;
        if made {
            self.inherit_owner(dir.fd.as_fd(), &dir.shown)?;
        }
        Ok(dir)
    }

    /// Running as root in a directory that belongs to someone else (an
    /// agent), give a new entry to that owner, as if they had made it: the
    /// agent can then change what the operator's CLI or the supervisor
    /// wrote for it, and no ownership pass over its tree is needed later.
    fn inherit_owner(&self, fd: BorrowedFd<'_>, shown: &Path) -> Result<(), FsError> {
        if !nix::unistd::geteuid().is_root() {
            return Ok(());
        }
        let st = self.stat()?;
        if st.uid == 0 {
            return Ok(());
        }
        nix::unistd::fchown(fd, Some(Uid::from_raw(st.uid)), Some(Gid::from_raw(st.gid)))
            .map_err(|e| FsError::from_errno(shown.to_path_buf(), e))
    }

    /// The parent directory of `rel` (opened; a new descriptor of this
    /// directory when `rel` is a single name) and its last component.
    pub fn open_parent<'a>(&self, rel: &'a OsStr) -> Result<(Dir, &'a OsStr), FsError> {
        let (parent, leaf) = self.parent_of(rel)?;
        let parent = match parent {
            Some(p) => p,
            None => self.try_clone()?,
        };
        Ok((parent, leaf))
    }

    /// Create the regular file `name`, which must not exist (a symlink
    /// there is not followed: `O_EXCL`), holding `bytes`, with permission
    /// bits `perm` (less the umask).
    pub fn create_file(
        &self,
        name: impl AsRef<OsStr>,
        bytes: &[u8],
        perm: u32,
    ) -> Result<(), FsError> {
        let name = name.as_ref();
        single(name).ok_or_else(|| FsError::BadName {
            path: self.shown(name),
        })?;
        let fd = nix::fcntl::openat(
            &self.fd,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(perm),
        )
        .map_err(|e| FsError::from_errno(self.shown(name), e))?;
        let mut file = File::from(fd);
        let written = self
            .inherit_owner(file.as_fd(), &self.shown(name))
            .and_then(|()| {
                std::io::Write::write_all(&mut file, bytes).map_err(|source| FsError::Io {
                    path: self.shown(name),
                    source,
                })
            });
        if let Err(e) = written {
            // Do not leave a half-written file behind.
            let _ = self.remove_file(name);
            return Err(e);
        }
        Ok(())
    }

    /// Replace (or create) the regular file `name` atomically: a new file
    /// beside it, written, given `perm`, fsynced, then renamed over the
    /// name (which replaces a symlink there rather than following it), and
    /// the directory fsynced, so a crash leaves the old or the new bytes.
    pub fn replace_file(
        &self,
        name: impl AsRef<OsStr>,
        bytes: &[u8],
        perm: u32,
    ) -> Result<(), FsError> {
        self.replace_file_with(name.as_ref(), bytes, perm, true)
    }

    /// [`Dir::replace_file`] for a file nothing depends on after a crash (a
    /// record kept for operators): as atomic for readers, but neither the
    /// file nor the rename is synced — two fewer disk flushes on a turn.
    pub fn replace_file_unsynced(
        &self,
        name: impl AsRef<OsStr>,
        bytes: &[u8],
        perm: u32,
    ) -> Result<(), FsError> {
        self.replace_file_with(name.as_ref(), bytes, perm, false)
    }

    fn replace_file_with(
        &self,
        name: &OsStr,
        bytes: &[u8],
        perm: u32,
        durable: bool,
    ) -> Result<(), FsError> {
        self.replace_file_flushing(name, bytes, perm, durable)?;
        if !durable {
            return Ok(());
        }
        // Persist the rename itself.
        nix::unistd::fsync(&self.fd).map_err(|e| FsError::from_errno(self.shown.clone(), e))
    }

    /// Write `bytes` beside `name`, flush them when `flush`, and rename
    /// them over `name`.
    fn replace_file_flushing(
        &self,
        name: &OsStr,
        bytes: &[u8],
        perm: u32,
        flush: bool,
    ) -> Result<(), FsError> {
        single(name).ok_or_else(|| FsError::BadName {
            path: self.shown(name),
        })?;
        let tmp = temp_name::temp_name(name);
        let io = |source| FsError::Io {
            path: self.shown(&tmp),
            source,
        };
        let fd = nix::fcntl::openat(
            &self.fd,
            tmp.as_os_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| FsError::from_errno(self.shown(&tmp), e))?;
        let mut file = File::from(fd);
        let written = (|| {
            self.inherit_owner(file.as_fd(), &self.shown(&tmp))?;
            std::io::Write::write_all(&mut file, bytes).map_err(io)?;
            nix::sys::stat::fchmod(&file, Mode::from_bits_truncate(perm))
                .map_err(|e| FsError::from_errno(self.shown(&tmp), e))?;
            if flush {
                file.sync_all().map_err(io)?;
            }
            nix::fcntl::renameat(&self.fd, tmp.as_os_str(), &self.fd, name)
                .map_err(|e| FsError::from_errno(self.shown(name), e))
        })();
        if let Err(e) = written {
            let _ = self.remove_file(&tmp);
            return Err(e);
        }
        Ok(())
    }

    /// Replace (or create) `name` with a symlink to `target` atomically: the
    /// link is made under a temporary name and renamed over `name` (an
    /// existing entry is replaced, never followed). The target is stored,
    /// not resolved.
    pub fn replace_symlink(
        &self,
        name: impl AsRef<OsStr>,
        target: impl AsRef<OsStr>,
    ) -> Result<(), FsError> {
        let name = name.as_ref();
        single(name).ok_or_else(|| FsError::BadName {
            path: self.shown(name),
        })?;
        let tmp = temp_name::temp_name(name);
        nix::unistd::symlinkat(target.as_ref(), &self.fd, tmp.as_os_str())
            .map_err(|e| FsError::from_errno(self.shown(&tmp), e))?;
        let done = (|| {
            if nix::unistd::geteuid().is_root() {
                let st = self.stat()?;
                if st.uid != 0 {
                    // The link's own owner (AT_SYMLINK_NOFOLLOW), as for
                    // files made here.
                    nix::unistd::fchownat(
                        &self.fd,
                        tmp.as_os_str(),
                        Some(Uid::from_raw(st.uid)),
                        Some(Gid::from_raw(st.gid)),
                        AtFlags::AT_SYMLINK_NOFOLLOW,
                    )
                    .map_err(|e| FsError::from_errno(self.shown(&tmp), e))?;
                }
            }
            nix::fcntl::renameat(&self.fd, tmp.as_os_str(), &self.fd, name)
                .map_err(|e| FsError::from_errno(self.shown(name), e))
        })();
        if let Err(e) = done {
            let _ = self.remove_file(&tmp);
            return Err(e);
        }
        Ok(())
    }

    /// Open the regular file `name` for appending (created with `perm`,
    /// less the umask, when missing), readable too so its tail can be
    /// checked. A symlink there is refused, a FIFO or device is refused
    /// after a non-blocking open, and so is a file with several hard links
    /// (appending to it would write wherever its other name is).
    pub fn open_append(&self, name: impl AsRef<OsStr>, perm: u32) -> Result<File, FsError> {
        let name = name.as_ref();
        let shown = self.shown(name);
        single(name).ok_or_else(|| FsError::BadName {
            path: shown.clone(),
        })?;
        let flags = OFlag::O_RDWR
            | OFlag::O_APPEND
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC;
        let mode = Mode::from_bits_truncate(perm);
        // Existing, or made here (O_EXCL, so we know it is ours to give to
        // the directory's owner); a racing creator just means another try.
        let mut tries = 0;
        let (fd, made) = loop {
            match nix::fcntl::openat(&self.fd, name, flags, mode) {
                Ok(fd) => break (fd, false),
                Err(Errno::ENOENT) => {}
                Err(e) => return Err(FsError::from_errno(shown, e)),
            }
            match nix::fcntl::openat(&self.fd, name, flags | OFlag::O_CREAT | OFlag::O_EXCL, mode) {
                Ok(fd) => break (fd, true),
                Err(Errno::EEXIST) if tries < 3 => tries += 1,
                Err(e) => return Err(FsError::from_errno(shown, e)),
            }
        };
        let st = Stat::from(
            nix::sys::stat::fstat(&fd).map_err(|e| FsError::from_errno(shown.clone(), e))?,
        );
        if st.kind != Kind::File {
            return Err(refuse_kind(shown, st.kind));
        }
        if st.nlink > 1 {
            return Err(FsError::HardLinked {
                path: shown,
                links: st.nlink,
            });
        }
        if made {
            self.inherit_owner(fd.as_fd(), &shown)?;
        }
        Ok(File::from(fd))
    }

    /// Remove the non-directory `name` (a symlink itself, never its target).
    pub fn remove_file(&self, name: impl AsRef<OsStr>) -> Result<(), FsError> {
        let name = name.as_ref();
        single(name).ok_or_else(|| FsError::BadName {
            path: self.shown(name),
        })?;
        nix::unistd::unlinkat(&self.fd, name, nix::unistd::UnlinkatFlags::NoRemoveDir)
            .map_err(|e| FsError::from_errno(self.shown(name), e))
    }

    /// Remove the empty directory `name`.
    pub fn remove_dir(&self, name: impl AsRef<OsStr>) -> Result<(), FsError> {
        let name = name.as_ref();
        single(name).ok_or_else(|| FsError::BadName {
            path: self.shown(name),
        })?;
        nix::unistd::unlinkat(&self.fd, name, nix::unistd::UnlinkatFlags::RemoveDir)
            .map_err(|e| FsError::from_errno(self.shown(name), e))
    }

    /// Rename the entry `name` of this directory to `to_name` in `to_dir`
    /// (neither followed if a symlink).
    pub fn rename_to(
        &self,
        name: impl AsRef<OsStr>,
        to_dir: &Dir,
        to_name: impl AsRef<OsStr>,
    ) -> Result<(), FsError> {
        let (name, to_name) = (name.as_ref(), to_name.as_ref());
        for (d, n) in [(self, name), (to_dir, to_name)] {
            single(n).ok_or_else(|| FsError::BadName { path: d.shown(n) })?;
        }
        nix::fcntl::renameat(&self.fd, name, &to_dir.fd, to_name)
            .map_err(|e| FsError::from_errno(to_dir.shown(to_name), e))
    }

    /// Change this directory's owner.
    pub fn chown(&self, uid: Option<u32>, gid: Option<u32>) -> Result<(), FsError> {
        nix::unistd::fchown(&self.fd, uid.map(Uid::from_raw), gid.map(Gid::from_raw))
            .map_err(|e| FsError::from_errno(self.shown.clone(), e))
    }

    /// Change this directory's permission bits.
    pub fn chmod(&self, mode: u32) -> Result<(), FsError> {
        nix::sys::stat::fchmod(&self.fd, Mode::from_bits_truncate(mode))
            .map_err(|e| FsError::from_errno(self.shown.clone(), e))
    }

    /// Split `rel` into its parent directory (opened, `None` for this one)
    /// and its last component.
    fn parent_of<'a>(&self, rel: &'a OsStr) -> Result<(Option<Dir>, &'a OsStr), FsError> {
        let bad = || FsError::BadName {
            path: self.shown(rel),
        };
        let parts = components(rel).ok_or_else(bad)?;
        let leaf = *parts.last().ok_or_else(bad)?;
        let bytes = rel.as_bytes();
        let parent_len = bytes.len() - leaf.len();
        if parent_len == 0 {
            return Ok((None, leaf));
        }
        let parent = OsStr::from_bytes(&bytes[..parent_len - 1]);
        Ok((Some(self.open_dir(parent)?), leaf))
    }
}

impl Entry {
    pub fn stat(&self) -> &Stat {
        &self.stat
    }

    pub fn path(&self) -> &Path {
        &self.shown
    }

    /// Change the owner of the pinned inode (a symlink's own owner for a
    /// symlink: `AT_EMPTY_PATH` on an `O_PATH` descriptor never follows).
    pub fn chown(&self, uid: Option<u32>, gid: Option<u32>) -> Result<(), FsError> {
        nix::unistd::fchownat(
            &self.fd,
            "",
            uid.map(Uid::from_raw),
            gid.map(Gid::from_raw),
            AtFlags::AT_EMPTY_PATH | AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|e| FsError::from_errno(self.shown.clone(), e))
    }

    /// The pinned directory, opened for listing (the same inode that was
    /// inspected, whatever its name points at now).
    pub fn open_dir(&self) -> Result<Dir, FsError> {
        if self.stat.kind != Kind::Dir {
            return Err(FsError::NotADirectory {
                path: self.shown.clone(),
            });
        }
        let fd = nix::fcntl::openat(&self.fd, ".", DIR_FLAGS, Mode::empty())
            .map_err(|e| FsError::from_errno(self.shown.clone(), e))?;
        Ok(Dir {
            fd,
            shown: self.shown.clone(),
        })
    }
}

fn single(name: &OsStr) -> Option<()> {
    components(name).filter(|c| c.len() == 1).map(|_| ())
}

fn refuse_kind(path: PathBuf, kind: Kind) -> FsError {
    match kind {
        Kind::Symlink => FsError::Symlink { path },
        Kind::Dir => FsError::NotRegular {
            path,
            kind: "directory",
        },
        k => FsError::NotRegular {
            path,
            kind: k.describe(),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn tree() -> (tempfile::TempDir, Dir) {
        let t = tempfile::tempdir().unwrap();
        let p = t.path();
        std::fs::create_dir_all(p.join("in/a")).unwrap();
        std::fs::write(p.join("in/a/f.md"), "hello").unwrap();
        std::fs::write(p.join("outside.txt"), "secret").unwrap();
        std::os::unix::fs::symlink("../outside.txt", p.join("in/up")).unwrap();
        std::os::unix::fs::symlink("a", p.join("in/alias")).unwrap();
        std::os::unix::fs::symlink("f.md", p.join("in/a/same")).unwrap();
        let c = std::ffi::CString::new(p.join("in/fifo").as_os_str().as_bytes()).unwrap();
        nix::unistd::mkfifo(c.as_c_str(), Mode::from_bits_truncate(0o600)).unwrap();
        let d = Dir::open(&p.join("in")).unwrap();
        (t, d)
    }

    #[test]
    fn reads_below_and_refuses_every_symlink() {
        let (_t, d) = tree();
        assert_eq!(d.read_file_capped("a/f.md", 100).unwrap().0, b"hello");
        for rel in [
            "up",
            "alias/f.md",
            "a/same",
            "../outside.txt",
            "/etc/passwd",
            "a/../a/f.md",
        ] {
            let e = d.read_file_capped(rel, 100).unwrap_err();
            assert!(
                matches!(e, FsError::Symlink { .. } | FsError::BadName { .. }),
                "{rel}: {e}"
            );
        }
        assert!(matches!(d.open_dir("alias"), Err(FsError::Symlink { .. })));
        assert_eq!(d.read_link("up").unwrap(), "../outside.txt");
    }

    #[test]
    fn fifos_devices_and_large_files_are_refused_without_blocking() {
        let (t, d) = tree();
        let e = d.read_file_capped("fifo", 100).unwrap_err();
        assert!(e.to_string().contains("not a regular file (FIFO)"), "{e}");
        let dev = Dir::open(Path::new("/dev")).unwrap();
        let e = dev.read_file_capped("zero", 100).unwrap_err();
        assert!(matches!(e, FsError::NotRegular { .. }), "{e}");
        std::fs::write(t.path().join("in/big"), vec![b'x'; 101]).unwrap();
        let e = d.read_file_capped("big", 100).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{}: 101 bytes exceeds the 100-byte file limit",
                t.path().join("in/big").display()
            )
        );
        assert_eq!(d.read_file_capped("big", 101).unwrap().0.len(), 101);
    }

    #[test]
    fn the_component_walk_refuses_what_openat2_refuses() {
        let (_t, d) = tree();
        let ok = open_beneath_walk(d.fd.as_fd(), OsStr::new("a/f.md"), FILE_FLAGS);
        assert!(ok.is_ok());
        for rel in [
            "up",
            "alias/f.md",
            "a/same",
            "../outside.txt",
            "/etc/passwd",
            "a//f.md",
        ] {
            let e = open_beneath_walk(d.fd.as_fd(), OsStr::new(rel), FILE_FLAGS).unwrap_err();
            assert!(
                matches!(e, Errno::ELOOP | Errno::ENOTDIR | Errno::EXDEV),
                "{rel}: {e}"
            );
        }
    }

    #[test]
    fn the_root_is_not_followed_even_with_a_trailing_slash() {
        let (t, _d) = tree();
        let link = t.path().join("in/alias");
        let mut slashed = link.clone().into_os_string();
        slashed.push("/");
        for p in [link.clone(), PathBuf::from(slashed)] {
            assert!(
                matches!(
                    Dir::open(&p),
                    Err(FsError::Symlink { .. } | FsError::NotADirectory { .. })
                ),
                "{}",
                p.display()
            );
        }
    }

    #[test]
    fn writes_replace_entries_and_never_follow() {
        let (t, d) = tree();
        d.create_file("new.md", b"one", 0o644).unwrap();
        assert!(d.create_file("up", b"x", 0o644).is_err());
        d.replace_file("new.md", b"two", 0o600).unwrap();
        let (bytes, st) = d.read_file_capped("new.md", 10).unwrap();
        assert_eq!((bytes.as_slice(), st.perm), (&b"two"[..], 0o600));
        // Replacing a symlink replaces the link, not its target.
        d.replace_file("up", b"mine", 0o644).unwrap();
        assert_eq!(
            std::fs::read(t.path().join("outside.txt")).unwrap(),
            b"secret"
        );
        assert_eq!(d.read_file_capped("up", 10).unwrap().0, b"mine");
        // The unsynced kind is as atomic and as careful with links.
        d.replace_file_unsynced("up", b"again", 0o640).unwrap();
        let (bytes, st) = d.read_file_capped("up", 10).unwrap();
        assert_eq!((bytes.as_slice(), st.perm), (&b"again"[..], 0o640));
        assert_eq!(
            std::fs::read(t.path().join("outside.txt")).unwrap(),
            b"secret"
        );
        assert!(d.replace_file_unsynced("../x", b"no", 0o600).is_err());
        let a = d.open_dir("a").unwrap();
        d.rename_to("new.md", &a, "moved.md").unwrap();
        assert!(d.stat_at("new.md").unwrap().is_none());
        a.remove_file("moved.md").unwrap();
        a.remove_file("same").unwrap();
        assert_eq!(std::fs::read(t.path().join("in/a/f.md")).unwrap(), b"hello");
        a.remove_file("f.md").unwrap();
        d.remove_dir("a").unwrap();
        assert_eq!(d.list(10).unwrap(), ["alias", "fifo", "up"]);
    }

    #[test]
    fn root_writes_in_an_agents_directory_belong_to_the_agent() {
        if !nix::unistd::geteuid().is_root() {
            let msg = "SKIPPED (loudly): root_writes_in_an_agents_directory_belong_to_the_agent needs root to chown";
            assert!(
                std::env::var_os("MINI_LETTA_REQUIRE_SANDBOX").is_none_or(|v| v != "1"),
                "{msg}, and MINI_LETTA_REQUIRE_SANDBOX=1 forbids skipping"
            );
            eprintln!("{msg}");
            return;
        }
        let (t, d) = tree();
        std::os::unix::fs::chown(t.path().join("in/a"), Some(4242), Some(4343)).unwrap();
        let a = d.open_dir("a").unwrap();
        a.create_file("c.md", b"c", 0o644).unwrap();
        a.replace_file("r.md", b"r", 0o644).unwrap();
        drop(a.open_append("log", 0o644).unwrap());
        let sub = a.create_dir("sub", 0o755).unwrap();
        for name in ["c.md", "r.md", "log", "sub"] {
            let st = a.stat_at(name).unwrap().unwrap();
            assert_eq!((st.uid, st.gid), (4242, 4343), "{name}");
        }
        // In root's own directory, nothing changes hands.
        d.create_file("mine", b"m", 0o644).unwrap();
        assert_eq!(d.stat_at("mine").unwrap().unwrap().uid, 0);
        drop(sub);
        // A hard-linked log is not appended to.
        std::fs::hard_link(t.path().join("in/a/log"), t.path().join("in/a/log2")).unwrap();
        assert!(matches!(
            a.open_append("log", 0o644),
            Err(FsError::HardLinked { links: 2, .. })
        ));
    }

    #[test]
    fn listing_entries_and_caps() {
        let (_t, d) = tree();
        let names = d.list(10).unwrap();
        assert_eq!(names, ["a", "alias", "fifo", "up"]);
        // Listing twice gives the same answer (no shared position).
        assert_eq!(d.list(10).unwrap(), names);
        assert!(matches!(d.list(3), Err(FsError::TooManyEntries { .. })));
        let e = d.entry("alias").unwrap().unwrap();
        assert_eq!(e.stat().kind, Kind::Symlink);
        assert!(e.open_dir().is_err());
        let a = d.entry("a").unwrap().unwrap();
        assert_eq!(a.open_dir().unwrap().list(10).unwrap(), ["f.md", "same"]);
        assert!(d.entry("nope").unwrap().is_none());
        let made = d.create_dir("new", 0o700).unwrap();
        assert_eq!(made.stat().unwrap().perm, 0o700);
        assert!(d.create_dir("alias", 0o700).is_err());
    }
}
