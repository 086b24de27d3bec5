//! What a sync lets through: the validator run on the tree it would push,
//! and on a tree from the remote that `main` would move to.

use git2::{Oid, Repository};

use super::error::SyncError;
use crate::memfs::commit::CommitOptions;
use crate::memfs::validate::{TreeSnapshot, constraints_update_approved_from_env, validate};

/// The tree of commit `id`, as the validator reads it.
pub(super) fn snapshot(repo: &Repository, id: Oid) -> Result<TreeSnapshot, SyncError> {
    Ok(crate::memfs::worktree::merge::snapshot_of(repo, id)?)
}

/// Validate the tree of `candidate` (what would be pushed) against the
/// remote tree it lands on. Config changes were approved when each side
/// committed them, so the approval rule is not re-asked here; everything
/// else (frontmatter, structure, budgets, the tree's shape) is judged on
/// the combined tree.
pub(super) fn check(
    repo: &Repository,
    candidate: Oid,
    remote: Option<Oid>,
) -> Result<Option<String>, SyncError> {
    judge(repo, candidate, remote, true)
}

/// Validate `target`, a tree from the remote that `main` would move to,
/// against local `main` (`local`; `None` for a clone, which has nothing
/// of its own) as a local commit would be judged: a change to
/// `.memfs.config.json` needs the approval of the process that syncs.
/// The violations, or `None` when `main` may move there.
pub fn accept_from_remote(
    repo: &Repository,
    target: Oid,
    local: Option<Oid>,
) -> Result<Option<String>, SyncError> {
    let approved = local.is_none() || constraints_update_approved_from_env();
    judge(repo, target, local, approved)
}

/// The validator's violations of `candidate`'s tree against `accepted`'s,
/// one indented line each, or `None` when it passes.
fn judge(
    repo: &Repository,
    candidate: Oid,
    accepted: Option<Oid>,
    approved: bool,
) -> Result<Option<String>, SyncError> {
    let new = snapshot(repo, candidate)?;
    let accepted = match accepted {
        Some(r) => Some(snapshot(repo, r)?),
        None => None,
    };
    let opts = CommitOptions::for_repo(repo, approved);
    let report = validate(repo, &new, accepted.as_ref(), &opts.validate)?;
    // The violations alone: the commit-hook wording ("staged changes")
    // would be wrong for committed history.
    Ok((!report.is_ok()).then(|| {
        report
            .messages()
            .iter()
            .map(|m| format!("  {m}"))
            .collect::<Vec<_>>()
            .join("\n")
    }))
}
