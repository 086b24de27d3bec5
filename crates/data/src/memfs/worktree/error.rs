//! Failures of worktree operations ([`WorktreeError`]) and the small
//! adapters that wrap git and I/O errors into it.

use std::path::{Path, PathBuf};

use git2::Oid;

use crate::agentfs::FsError;
use crate::memfs::lock::LockError;
use crate::memfs::repo::RepoError;
use crate::memfs::status::StatusError;
use crate::memfs::validate::ValidateError;

/// Failures of worktree operations (as opposed to the outcomes a
/// finalizer reports in [`Finalized`](super::outcome::Finalized)).
#[derive(Debug, thiserror::Error)]
pub enum WorktreeError {
    #[error("Unable to create reflection memory worktree: {} has no HEAD", .0.display())]
    NoHead(PathBuf),
    #[error(
        "Cannot finalize missing reflection worktree {} as no-op: {branch} advanced from {base} to {head}",
        .dir.display()
    )]
    MissingAdvanced {
        dir: PathBuf,
        branch: String,
        base: Oid,
        head: Oid,
    },
    #[error("{0:?}: not a memory worktree name (<label>-<YYYYMMDDHHMMSS>-<8 hex>)")]
    BadName(String),
    #[error("{0}: no such memory worktree")]
    NotFound(String),
    #[error("{0}: the memory worktree's branch is missing")]
    NoBranch(String),
    #[error(transparent)]
    Repo(#[from] RepoError),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Status(#[from] StatusError),
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("{}", .0.render().trim_end())]
    Validate(#[from] ValidateError),
    #[error("cannot {what}: {source}")]
    Git {
        what: &'static str,
        source: git2::Error,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub fn git(what: &'static str) -> impl FnOnce(git2::Error) -> WorktreeError {
    move |source| WorktreeError::Git { what, source }
}

pub(super) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WorktreeError + '_ {
    move |source| WorktreeError::Io {
        path: path.to_path_buf(),
        source,
    }
}
