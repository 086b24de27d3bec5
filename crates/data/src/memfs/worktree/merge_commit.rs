//! Merging a branch tip into `main` with a real merge commit, the merged
//! tree validated first, shared by every way a worktree is folded back.

use git2::{Oid, Repository, Signature};

use super::error::{WorktreeError, git};
use super::merge::{diff_paths, overlaps, resolve_appends};
use super::outcome::ConflictSides;
use crate::memfs::commit::CommitOptions;
use crate::memfs::validate::{TreeSnapshot, validate};
use crate::paths::AgentPaths;

/// What [`merge_into_main`] did.
#[derive(Debug)]
pub(super) enum MergeOutcome {
    /// A merge commit was made on `main`; the paths it changed there.
    Merged { commit: Oid, changed: Vec<String> },
    /// Git content conflicts, or (with a dirty guard) merged paths
    /// overlapping dirty checkout paths (`checkout_only`: the merge itself
    /// was clean); nothing changed.
    Conflict {
        paths: Vec<String>,
        checkout_only: bool,
        /// The conflicted files' three versions (empty for
        /// `checkout_only`).
        sides: Vec<ConflictSides>,
    },
    /// The merged tree failed validation; nothing changed.
    Invalid { message: String },
}

/// Merge `tip` into `main` with a real merge commit (parents: `main`'s
/// `HEAD`, `tip`; never a fast-forward) whose message is `message`, made
/// as `sig` (the caller's: memfs knows no agent).
///
/// The merged tree is computed in memory; on a conflict, or when a path it
/// changes overlaps one of `dirty` (paths dirty in the main checkout), or
/// when the validator refuses the tree, nothing is written anywhere. After
/// the commit the main checkout and its index are updated for exactly the
/// paths the merge changed.
pub(super) fn merge_into_main(
    repo: &Repository,
    agent: &AgentPaths,
    tip: Oid,
    message: &str,
    dirty: &[String],
    sig: &Signature<'_>,
) -> Result<MergeOutcome, WorktreeError> {
    let head = repo
        .head()
        .and_then(|h| h.peel_to_commit())
        .map_err(git("read the memory HEAD"))?;
    let theirs = repo.find_commit(tip).map_err(git("read the branch tip"))?;
    let mut index = repo
        .merge_commits(&head, &theirs, None)
        .map_err(git("merge the branch"))?;
    if index.has_conflicts() {
        let genuine = resolve_appends(repo, &mut index)?;
        if index.has_conflicts() {
            return Ok(MergeOutcome::Conflict {
                paths: genuine.iter().map(|c| c.path.clone()).collect(),
                checkout_only: false,
                sides: genuine,
            });
        }
    }
    let tree_id = index
        .write_tree_to(repo)
        .map_err(git("write the merged tree"))?;
    let tree = repo
        .find_tree(tree_id)
        .map_err(git("read the merged tree"))?;
    let old_tree = head.tree().map_err(git("read the HEAD tree"))?;
    let old = TreeSnapshot::from_tree(repo, &old_tree)?;
    let new = TreeSnapshot::from_tree(repo, &tree)?;
    let changed = diff_paths(&old, &new);

    let overlapping: Vec<String> = changed
        .iter()
        .filter(|c| dirty.iter().any(|d| overlaps(c, d)))
        .cloned()
        .collect();
    if !overlapping.is_empty() {
        return Ok(MergeOutcome::Conflict {
            paths: overlapping,
            checkout_only: true,
            sides: Vec::new(),
        });
    }

    // The same validator, options and approval rule as `commit_paths`: the
    // merged tree is judged against `main` before any commit exists.
    let opts = CommitOptions::for_repo(repo, false);
    let report = validate(repo, &new, Some(&old), &opts.validate)?;
    if !report.is_ok() {
        return Ok(MergeOutcome::Invalid {
            message: report.render_block().trim_end().to_string(),
        });
    }

    let message = if message.ends_with('\n') {
        message.to_string()
    } else {
        format!("{message}\n")
    };
    // The commit object first, then the checkout, then `main`: a checkout
    // that cannot follow (a full or read-only disk) leaves `main` unmoved.
    let commit = repo
        .commit(None, sig, sig, &message, &tree, &[&head, &theirs])
        .map_err(git("write the merge commit"))?;
    let first_line = message.lines().next().unwrap_or("merge");
    super::advance::advance_main(
        repo,
        &agent.memory_dir(),
        head.id(),
        commit,
        &format!("commit (merge): {first_line}"),
    )?;
    Ok(MergeOutcome::Merged { commit, changed })
}
