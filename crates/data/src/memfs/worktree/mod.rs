//! Memory worktrees: linked git worktrees of an agent's `memory.git`, one
//! per reflection or memory-worker run (spec `memfs-git.md` §4).
//!
//! A run gets its own checkout (`memory-worktrees/<label>-<id>/`) on its own
//! branch (`mini-letta/<label>/<id>`) started at `main`'s `HEAD`; the child
//! commits there, and the supervisor later folds the branch back into
//! `main` with a real merge commit ([`finalize_reflection_worktree`],
//! [`integrate_worker`]) or throws it away ([`discard`],
//! [`cleanup_orphans`]).
//!
//! The worktree directories and `memory/` are the child's to write, so:
//! * a worktree is opened from its admin directory in `memory.git/worktrees/`
//!   with the working tree set explicitly; the `.git` pointer file the child
//!   can rewrite is never read ([`open`]);
//! * whether a worktree or the main checkout is dirty is decided by the
//!   descriptor walk of [`crate::memfs::status`], never by libgit2
//!   status on a child-writable directory;
//! * the main checkout is updated after a merge through [`crate::agentfs`]
//!   (no symlink followed, files replaced atomically);
//! * removal uses `remove_dir_all`, which unlinks symlinks rather than
//!   following them;
//! * a new worktree is checked out in a staging directory inside the git
//!   directory and only then moved into `memory-worktrees/`, so a child
//!   cannot plant a symlink where libgit2 writes the checkout.

pub mod advance;
mod create;
mod error;
mod finalize;
mod heads;
mod kept;
pub(crate) mod merge;
mod merge_commit;
mod naming;
mod open;
mod outcome;
#[cfg(test)]
mod tests;

pub use create::create;
pub use error::{WorktreeError, git};
pub use finalize::{
    DIRTY_UNCOMMITTED, FAILED, INVALID, MERGE_CONFLICT, NO_COMMITS, NOT_MERGED_BY_AGENT,
    PARENT_DIRTY, REFRESH_FAILED, cleanup_orphans, discard, finalize_reflection_worktree,
    integrate_worker, merge_for_integration,
};
pub use kept::{KeptChange, drop_kept_branch, keep_as_worker_branch, kept_change};
pub use naming::{BRANCH_PREFIX, Label, MemoryWorktree, parse_name};
pub use open::{list, open};
pub use outcome::{ConflictSides, FinalizeOptions, FinalizeStatus, Finalized};
