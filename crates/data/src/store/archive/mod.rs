//! Moving an agent between homes and hosts: `agent export` writes its
//! directory as a gzip-compressed tar archive, `agent import` checks such an
//! archive whole before anything of it is used, then unpacks it beside the
//! other agents and renames it into place.
//!
//! What travels:
//!
//! ```text
//! mini-letta-export.json   what this is (format, agent id and name, when)
//! agent.json               the record, without its sandbox uid (a uid belongs to a host)
//! memory/                  the working tree, as it is (its `.git` pointer is rebuilt)
//! memory.git/              HEAD, packed-refs, refs/, logs/, objects/ (full history)
//!                          and the layout policy; never hooks or config
//!                          (an import takes only loose objects, packs,
//!                          branches and refs/mini-letta/, see below)
//! conversations/           every conversation
//! ```
//!
//! Runtime leftovers (`tmp/`, `memory-worktrees/`, `reflections/`, lock
//! files, the ownership marker) stay behind. The export reads the agent's
//! directory through descriptors (`crate::agentfs`): the agent's own trees
//! are a confined child's to change, so nothing there is followed, and
//! symlinks, FIFOs, sockets, devices and hard-linked files are skipped with
//! a warning, never archived. The memory repository is read under its
//! writer lock, so the history exported is one a commit left complete.
//!
//! An import is refused, with nothing left in the home, unless every entry
//! is a regular file or a directory under a plain relative path (no `..`,
//! no absolute path, no link or device), the entries and their declared
//! sizes stay within [`Limits`], `agent.json` parses and names a valid id,
//! no agent present has that id or name, and the memory repository's
//! `HEAD` resolves, every object any kept ref reaches is in the archive's
//! own object store (read with alternates ignored: `repo::seal`), and
//! `HEAD`'s tree passes the validator. The git configuration, hooks and
//! index are made fresh, never taken from the archive; nor is anything
//! that would make the repository read beyond itself or rewrite what it
//! reads: `objects/info/*` (alternates, commit-graph), `info/grafts`,
//! `shallow`, refs outside `refs/heads/` and `refs/mini-letta/` (replace
//! refs, remote-tracking refs, tags), and their `packed-refs` lines.

//!
//! The parts: `export.rs` (writing an archive), `entries.rs` (what each
//! entry may be and where it goes), `reader.rs` (reading an archive: the
//! raw prescan, the walk both passes use, pass one), `import.rs` (pass
//! two and putting the agent in place) and `repository.rs` (the unpacked
//! repository checked and made usable).

mod entries;
mod export;
mod import;
mod reader;
mod repository;

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::agentfs::FsError;
use crate::memfs::hook;
use crate::memfs::repo;
use crate::store::StoreError;

pub use export::{Exported, export};
pub use import::{ImportOptions, ModelCheck, import};
pub use repository::finish_repository;

/// Name of the manifest, the archive's first entry.
pub const MANIFEST_NAME: &str = "mini-letta-export.json";
/// The manifest's `format`.
pub const FORMAT: &str = "mini-letta-agent-export";
/// The manifest's `version`.
pub const FORMAT_VERSION: u32 = 1;

const RECORD_NAME: &str = "agent.json";

/// Deepest path accepted (in components).
const MAX_DEPTH: usize = 64;

/// Bounds on an archive, checked on the entries' headers before their
/// contents are read, on export and on import alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Entries (files and directories).
    pub max_entries: u64,
    /// Bytes of all files together, uncompressed.
    pub max_total_bytes: u64,
}

impl Default for Limits {
    /// 200 000 entries, 4 GiB.
    fn default() -> Self {
        Limits {
            max_entries: 200_000,
            max_total_bytes: 4 << 30,
        }
    }
}

/// What the first entry says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    pub agent_id: String,
    pub name: String,
    pub exported_at: String,
    /// The mini-letta version that wrote it.
    pub mini_letta: String,
}

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

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ArchiveError + '_ {
    move |source| ArchiveError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn bad_repo(e: impl std::fmt::Display) -> ArchiveError {
    ArchiveError::BadRepository(e.to_string())
}
