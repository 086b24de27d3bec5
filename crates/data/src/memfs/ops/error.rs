//! Why a memory operation did nothing: [`OpError`], shared by the
//! operations and the history reads.

use std::path::PathBuf;

use crate::memfs::commit::CommitError;
use crate::memfs::validate::Report;

/// Why an operation did nothing.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// Path rules, validator refusal, lock or git failures of the commit.
    #[error(transparent)]
    Commit(#[from] CommitError),
    #[error("memory create: block already exists at {0}")]
    AlreadyExists(String),
    #[error("memory rename: destination already exists at {0}")]
    DestinationExists(String),
    #[error("{0}: no such memory file")]
    NotFound(String),
    #[error("{0}: not a regular file")]
    NotAFile(String),
    #[error("{0}: memory files are Markdown; the path must end in .md")]
    NotMarkdown(String),
    #[error("{0}: the file is not valid UTF-8 text; fix it by hand and use `memory commit`")]
    NotUtf8(String),
    #[error("{0}: the file has no closed frontmatter block")]
    NoFrontmatter(String),
    #[error("{0}: cannot derive a name from this path")]
    NoName(String),
    #[error("memory {op}: '{field}' must be a non-empty string")]
    Empty {
        op: &'static str,
        field: &'static str,
    },
    #[error(transparent)]
    Revision(#[from] crate::memfs::revision::RevisionError),
    /// `insert` before a body line that does not exist (0, or past the
    /// line after the last).
    #[error(
        "{}; use a line between 1 and {}",
        if *line == 0 { format!("line 0 is not a line of {path} (lines count from 1)") }
        else { format!("line {line} is past the end of {path} ({lines} body lines)") },
        lines + 1
    )]
    LineOutOfRange {
        path: String,
        line: usize,
        lines: usize,
    },
    #[error("memory replace: old text was not found in the target memory file {0}")]
    TextNotFound(String),
    /// The supervisor refused a remote commit; the text is its message
    /// (for a validation failure, the validator's block).
    #[error("{0}")]
    Refused(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The commit failed and putting the working tree back failed too.
    #[error("{source} (and restoring {path} failed: {restore})")]
    RestoreFailed {
        path: PathBuf,
        source: Box<OpError>,
        restore: std::io::Error,
    },
}

impl OpError {
    /// The validator's report when the commit was refused.
    pub fn report(&self) -> Option<&Report> {
        match self {
            OpError::Commit(c) => c.report(),
            OpError::RestoreFailed { source, .. } => source.report(),
            _ => None,
        }
    }
}
