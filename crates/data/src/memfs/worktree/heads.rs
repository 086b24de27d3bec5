//! The commits `main` and a worktree branch point at.

use git2::{Oid, Repository};

use super::error::{WorktreeError, git};

/// The commit a branch names, if the branch exists.
pub(super) fn branch_tip(
    repo: &Repository,
    branch_ref: &str,
) -> Result<Option<Oid>, WorktreeError> {
    match repo.find_reference(branch_ref) {
        Ok(r) => Ok(Some(
            r.peel_to_commit().map_err(git("read a branch tip"))?.id(),
        )),
        Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
        Err(e) => Err(git("read a branch")(e)),
    }
}

/// The commit `main` (the memory repository's `HEAD`) is at.
pub(super) fn main_head(repo: &Repository) -> Result<Oid, WorktreeError> {
    repo.head()
        .and_then(|h| h.peel_to_commit())
        .map(|c| c.id())
        .map_err(git("read the memory HEAD"))
}
