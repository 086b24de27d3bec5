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
//!
//! The parts: `dir/` (the [`Dir`] and [`Entry`] handles: reading in
//! `dir/mod.rs`, writing in `dir/write.rs`), `beneath.rs` (resolving below a
//! descriptor, following nothing), `stat.rs` (what an inode is) and
//! `error.rs` ([`FsError`]).

mod beneath;
mod dir;
mod error;
mod stat;
pub mod temp_name;

pub use dir::{Dir, Entry};
pub use error::FsError;
pub use stat::{Kind, Stat};
