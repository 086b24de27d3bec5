//! What a conversation's files can fail with, and the helper that names
//! the path an I/O error met.

use std::path::PathBuf;

use crate::agentfs::FsError;
use crate::paths::PathsError;

#[derive(Debug, thiserror::Error)]
pub enum ConversationError {
    #[error(transparent)]
    Paths(#[from] PathsError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error(transparent)]
    Fs(#[from] FsError),
}

/// An I/O error at `path`, as a [`ConversationError`].
pub(super) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> ConversationError + '_ {
    move |source| ConversationError::Io {
        path: path.to_path_buf(),
        source,
    }
}
