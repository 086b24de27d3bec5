//! Failures that stop a sync before it can report a status
//! ([`SyncError`]), and the adapter that wraps a git error into one.

use std::path::PathBuf;

use crate::memfs::gitcli::GitCliError;
use crate::memfs::lock::LockError;
use crate::memfs::remote_repo::RemoteRefused;
use crate::memfs::remote_root::RootRefused;
use crate::memfs::repo::RepoError;
use crate::memfs::status::StatusError;
use crate::memfs::transport::TransportError;
use crate::memfs::validate::ValidateError;
use crate::memfs::worktree::WorktreeError;
use crate::paths::PathsError;

/// Failures that stop a sync before it can report a status.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error(transparent)]
    Paths(#[from] PathsError),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Repo(#[from] RepoError),
    #[error(transparent)]
    Status(#[from] StatusError),
    #[error("{}", .0.render().trim_end())]
    Validate(#[from] ValidateError),
    #[error(transparent)]
    Worktree(#[from] WorktreeError),
    #[error("cannot {what}: {source}")]
    Git {
        what: &'static str,
        source: git2::Error,
    },
    #[error(transparent)]
    Command(#[from] GitCliError),
    /// A directory remote's repository that may not be touched.
    #[error(transparent)]
    Refused(#[from] RemoteRefused),
    /// What the remote offers was refused before it was fetched.
    #[error("{0}")]
    Fetch(String),
    /// A remote root of no allowed form.
    #[error(transparent)]
    RootRefused(#[from] RootRefused),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl From<TransportError> for SyncError {
    fn from(e: TransportError) -> Self {
        match e {
            TransportError::Repo(e) => SyncError::Repo(e),
            TransportError::Git { what, source } => SyncError::Git { what, source },
            TransportError::Command(e) => SyncError::Command(e),
            e @ TransportError::TooLarge { .. } => SyncError::Fetch(e.to_string()),
            TransportError::Claim(crate::memfs::push_claim::ClaimError::Io { path, source }) => {
                SyncError::Io { path, source }
            }
            TransportError::Claim(e) => SyncError::Fetch(e.to_string()),
        }
    }
}

pub(super) fn git(what: &'static str) -> impl FnOnce(git2::Error) -> SyncError {
    move |source| SyncError::Git { what, source }
}
