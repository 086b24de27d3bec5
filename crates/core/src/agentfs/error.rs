//! [`FsError`]: why an operation below a directory descriptor was refused
//! or failed, and how an errno or an inode's kind becomes one.

use std::path::PathBuf;

use nix::errno::Errno;

use super::stat::Kind;

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

    pub(crate) fn from_errno(path: PathBuf, e: Errno) -> Self {
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

pub(crate) fn refuse_kind(path: PathBuf, kind: Kind) -> FsError {
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
