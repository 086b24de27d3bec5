//! What an export or an import can fail with, and the helpers that make
//! its I/O and repository errors.

use std::io;
use std::path::{Path, PathBuf};

use crate::agentfs::FsError;
use crate::memfs::hook;
use crate::memfs::repo;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// (`file` is left out of the message: callers name the archive.)
    #[error("not a readable gzip-compressed tar archive: {source}")]
    Corrupt { file: PathBuf, source: io::Error },
    #[error("archive entry {entry:?}: {why}; refusing the archive")]
    BadEntry { entry: String, why: String },
    #[error("the archive has more than {max} entries; refusing it (a tar bomb?)")]
    TooManyEntries { max: u64 },
    #[error(
        "the archive's files add up to more than {max} bytes uncompressed; refusing it (a tar bomb?)"
    )]
    TooLarge { max: u64 },
    #[error("not a mini-letta agent export: {0}")]
    NotAnExport(String),
    #[error("the archive's agent.json is invalid: {0}")]
    BadRecord(String),
    #[error("the archive's agent names model {model:?}, which cannot be used: {why}")]
    BadModel { model: String, why: String },
    #[error(
        "an agent with id {id} already exists ({name}); an import keeps the agent's id, so \
         delete that agent first (`mini-letta agent delete`) to replace it"
    )]
    IdTaken { id: String, name: String },
    #[error("an agent named {0:?} already exists; import under another name with --name NEW_NAME")]
    NameTaken(String),
    #[error("the archive's memory repository is damaged: {0}")]
    BadRepository(String),
    #[error("the archive's memory does not pass the validator: {0}")]
    InvalidMemory(String),
    #[error("{path}: {why}")]
    Export { path: PathBuf, why: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error(transparent)]
    Repo(#[from] repo::RepoError),
    #[error(transparent)]
    Hook(#[from] hook::HookError),
    #[error(transparent)]
    Lock(#[from] crate::memfs::lock::LockError),
}

pub(super) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ArchiveError + '_ {
    move |source| ArchiveError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub(super) fn bad_repo(e: impl std::fmt::Display) -> ArchiveError {
    ArchiveError::BadRepository(e.to_string())
}
