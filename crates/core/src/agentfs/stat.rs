//! What an inode is ([`Kind`]) and the `stat` fields callers use
//! ([`Stat`]).

use nix::sys::stat::{FileStat, SFlag};

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
    pub(crate) fn of(mode: u32) -> Kind {
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
