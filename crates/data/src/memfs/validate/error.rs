//! Failures to judge at all ([`ValidateError`]), and the blob read whose
//! failure is worded by the stage that made it.

use git2::{Oid, Repository};

/// Failures to judge at all (as opposed to violations).
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    /// A blob of the per-file stage could not be read.
    #[error("Memory validation could not read Git contents. No files were committed.")]
    ReadContents {
        path: String,
        #[source]
        source: git2::Error,
    },
    /// A blob of the constraints stage could not be read.
    #[error("{path}: cannot read Git object: {source}")]
    ConstraintsRead {
        path: String,
        #[source]
        source: git2::Error,
    },
    /// `readOnlyFiles` is configured but there is no accepted tree.
    #[error("readOnlyFiles requires the accepted memory tree")]
    MissingAcceptedTree,
    /// Listing a tree or revision failed.
    #[error("cannot list the memory tree: {0}")]
    Snapshot(#[source] git2::Error),
    /// The revision to audit could not be resolved.
    #[error(transparent)]
    Revision(#[from] crate::memfs::revision::RevisionError),
    /// The index has conflict-stage entries.
    #[error("{path}: the index has unmerged entries")]
    Unmerged { path: String },
}

impl ValidateError {
    /// The text the hook prints for this failure (newline-terminated).
    pub fn render(&self) -> String {
        match self {
            ValidateError::ReadContents { .. }
            | ValidateError::Snapshot(_)
            | ValidateError::Unmerged { .. } => {
                "Memory validation could not read Git contents. No files were committed.\n"
                    .to_string()
            }
            ValidateError::Revision(e) => format!("{e}\n"),
            other => format!("Memory constraints failed:\n  {other}\n"),
        }
    }
}

/// Which stage a blob read belongs to (decides the error's wording).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    MemoryFiles,
    Constraints,
}

pub(super) fn read_blob(
    repo: &Repository,
    path: &str,
    oid: Oid,
    stage: Stage,
) -> Result<Vec<u8>, ValidateError> {
    repo.find_blob(oid)
        .map(|b| b.content().to_vec())
        .map_err(|source| match stage {
            Stage::MemoryFiles => ValidateError::ReadContents {
                path: path.to_string(),
                source,
            },
            Stage::Constraints => ValidateError::ConstraintsRead {
                path: path.to_string(),
                source,
            },
        })
}
