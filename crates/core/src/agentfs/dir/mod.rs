//! The handles: [`Dir`], an open directory everything below is reached
//! from, and [`Entry`], one pinned entry; here what reads and inspects,
//! in `write.rs` what creates, replaces and removes.

mod write;

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::{Gid, Uid};

use super::beneath::{DIR_FLAGS, FILE_FLAGS, PATH_FLAGS, components, open_beneath, single};
use super::error::{FsError, refuse_kind};
use super::stat::{Kind, Stat};

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

#[cfg(test)]
mod tests;
