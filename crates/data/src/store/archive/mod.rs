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
//! The parts: `format.rs` (the manifest, names and limits), `error.rs`,
//! `export.rs` (writing an archive), `entries.rs` (what each
//! entry may be and where it goes), `reader.rs` (reading an archive: the
//! raw prescan, the walk both passes use, pass one), `import.rs` (pass
//! two and putting the agent in place) and `repository.rs` (the unpacked
//! repository checked and made usable).

mod entries;
mod error;
mod export;
mod format;
mod import;
mod reader;
mod repository;

pub use error::ArchiveError;
pub use export::{Exported, export};
pub use format::{FORMAT, FORMAT_VERSION, Limits, MANIFEST_NAME, Manifest};
pub use import::{ImportOptions, ModelCheck, import};
pub use repository::finish_repository;
