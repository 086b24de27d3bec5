//! Replaying local commits onto the remote's `main`, in memory: the
//! rebase of a sync whose histories diverged.

use git2::{Oid, Repository, Signature, Sort};

use super::error::{SyncError, git};

/// What a rebase came to: the replayed tip, or the paths that conflicted.
pub(super) enum Rebased {
    Tip(Oid),
    Conflict(Vec<String>),
}

/// Replay local's non-merge commits since the merge base onto `onto`, in
/// memory (objects only; no ref moves). Merge commits are dropped, as
/// `git rebase` does: their changes arrive through the replayed commits.
pub(super) fn rebase(
    repo: &Repository,
    committer: &Signature<'_>,
    local: Oid,
    onto: Oid,
) -> Result<Rebased, SyncError> {
    let mut walk = repo.revwalk().map_err(git("walk history"))?;
    walk.set_sorting(Sort::TOPOLOGICAL | Sort::REVERSE)
        .map_err(git("walk history"))?;
    walk.push(local).map_err(git("walk history"))?;
    walk.hide(onto).map_err(git("walk history"))?;
    let mut base = repo
        .find_commit(onto)
        .map_err(git("read the remote main"))?;
    for id in walk {
        let commit = repo
            .find_commit(id.map_err(git("walk history"))?)
            .map_err(git("read a local commit"))?;
        if commit.parent_count() != 1 {
            continue;
        }
        let mut index = repo
            .cherrypick_commit(&commit, &base, 0, None)
            .map_err(git("replay a local commit"))?;
        if index.has_conflicts() {
            let paths = crate::memfs::worktree::merge::conflict_paths(&index)
                .map_err(git("list conflicts"))?;
            return Ok(Rebased::Conflict(paths));
        }
        let tree_id = index
            .write_tree_to(repo)
            .map_err(git("write a replayed tree"))?;
        // Already on the remote (same change made there): drop it.
        if tree_id == base.tree_id() {
            continue;
        }
        let tree = repo.find_tree(tree_id).map_err(git("read a tree"))?;
        let message = String::from_utf8_lossy(commit.message_bytes()).into_owned();
        let new = repo
            .commit(None, &commit.author(), committer, &message, &tree, &[&base])
            .map_err(git("write a replayed commit"))?;
        base = repo
            .find_commit(new)
            .map_err(git("read a replayed commit"))?;
    }
    Ok(Rebased::Tip(base.id()))
}
