//! What recall can fail with, and the helpers the index uses to make its
//! file-system and I/O errors.

#[derive(Debug, thiserror::Error)]
pub enum RecallError {
    #[error(transparent)]
    Fs(#[from] crate::agentfs::FsError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Conversation(#[from] crate::store::conversation::ConversationError),
    /// A log is shorter than the index says it covered.
    #[error("the recall index is stale")]
    Stale,
    /// A piece of the index failed its check (it is rebuilt).
    #[error("the recall index is corrupt")]
    Corrupt,
    #[error("{0}")]
    Invalid(String),
}

/// A descriptor-level file-system error, as a [`RecallError`].
pub(super) fn fs(e: crate::agentfs::FsError) -> RecallError {
    RecallError::Fs(e)
}

/// An I/O error while doing `what`, as a [`RecallError`].
pub(super) fn io(what: &str) -> impl FnOnce(std::io::Error) -> RecallError + '_ {
    move |source| RecallError::Io {
        what: what.to_string(),
        source,
    }
}
