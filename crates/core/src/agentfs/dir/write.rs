//! What a [`Dir`] writes: entries created with `O_EXCL | O_NOFOLLOW`,
//! replaced by renaming a fresh temporary file over them, appended to only
//! when regular and singly linked, removed with `unlinkat`; whatever root
//! makes in an agent's directory given to its owner.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::{Gid, Uid};

use super::Dir;
use crate::agentfs::beneath::single;
use crate::agentfs::error::{FsError, refuse_kind};
use crate::agentfs::stat::{Kind, Stat};
use crate::agentfs::temp_name;

impl Dir {
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

    /// [`Dir::replace_file`] for bytes made while they are written (too
    /// many to hold at once): `write` fills the new file from its start.
    pub fn replace_file_streamed(
        &self,
        name: impl AsRef<OsStr>,
        perm: u32,
        write: impl FnOnce(&mut File) -> std::io::Result<()>,
    ) -> Result<(), FsError> {
        self.replace_file_flushing(name.as_ref(), write, perm, true)?;
        nix::unistd::fsync(&self.fd).map_err(|e| FsError::from_errno(self.shown.clone(), e))
    }

    fn replace_file_with(
        &self,
        name: &OsStr,
        bytes: &[u8],
        perm: u32,
        durable: bool,
    ) -> Result<(), FsError> {
        let write = |f: &mut File| std::io::Write::write_all(f, bytes);
        self.replace_file_flushing(name, write, perm, durable)?;
        if !durable {
            return Ok(());
        }
        // Persist the rename itself.
        nix::unistd::fsync(&self.fd).map_err(|e| FsError::from_errno(self.shown.clone(), e))
    }

    /// Write the bytes `write` makes beside `name`, flush them when
    /// `flush`, and rename them over `name`.
    fn replace_file_flushing(
        &self,
        name: &OsStr,
        write: impl FnOnce(&mut File) -> std::io::Result<()>,
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
            write(&mut file).map_err(io)?;
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
}
