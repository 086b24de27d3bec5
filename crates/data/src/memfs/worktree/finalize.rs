//! Ending a memory worktree: the reflection ladder (spec §4.2), memory
//! worker integration (§4.3), discarding and crash cleanup.

use git2::{Oid, Repository, Signature};

use super::error::{WorktreeError, git, io};
use super::heads::{branch_tip, main_head};
use super::merge::{diff_paths, snapshot_of};
use super::merge_commit::{MergeOutcome, merge_into_main};
use super::naming::{Label, MemoryWorktree, admin_dir};
use super::open::list;
use super::outcome::{FinalizeOptions, FinalizeStatus, Finalized};
use crate::memfs::lock::RepoLock;
use crate::memfs::repo;
use crate::memfs::status::worktree_status;
use crate::paths::{AgentPaths, MemoryGitDir};

pub const NO_COMMITS: &str = "Reflection made no memory commits.";
pub const DIRTY_UNCOMMITTED: &str = "Reflection memory worktree had uncommitted changes; it was cleaned up so the transcript can be retried.";
pub const FAILED: &str = "Reflection subagent did not complete successfully; the worktree was cleaned up so the transcript can be retried.";
pub const PARENT_DIRTY: &str = "Reflection produced memory updates, but the parent memory repo had uncommitted changes; the worktree was cleaned up so the transcript can be retried.";
pub const REFRESH_FAILED: &str = "Reflection produced memory updates, but the parent memory repo could not be refreshed; the worktree was cleaned up so the transcript can be retried.";
pub const NOT_MERGED_BY_AGENT: &str = "The primary-agent integration conversation did not merge the reflection branch; the worktree was cleaned up so the transcript can be retried.";
pub const MERGE_CONFLICT: &str = "Reflection produced memory updates, but merging them into the parent memory repo conflicted; the worktree was cleaned up so the transcript can be retried.";
/// mini-letta addition (status `invalid`).
pub const INVALID: &str = "Reflection produced memory updates, but the merged memory failed validation; the worktree was cleaned up so the transcript can be retried.";

fn integrated_by_agent(n: usize) -> String {
    format!("Primary agent integrated {n} reflection memory commit(s).")
}

fn merged(n: usize) -> String {
    format!("Merged {n} reflection memory commit(s) into parent memory main.")
}

/// Commits reachable from `tip` but not from `from`.
fn commits_between(repo: &Repository, from: Oid, tip: Oid) -> Result<usize, WorktreeError> {
    if from == tip {
        return Ok(0);
    }
    let mut walk = repo.revwalk().map_err(git("walk history"))?;
    walk.push(tip).map_err(git("walk history"))?;
    if !from.is_zero() {
        walk.hide(from).map_err(git("walk history"))?;
    }
    Ok(walk.count())
}

/// `ancestor` is `descendant` or one of its ancestors.
fn is_ancestor(repo: &Repository, ancestor: Oid, descendant: Oid) -> Result<bool, WorktreeError> {
    Ok(ancestor == descendant
        || repo
            .graph_descendant_of(descendant, ancestor)
            .map_err(git("compare history"))?)
}

/// Remove the worktree directory (a symlink at its name is unlinked, one
/// inside is never followed: `remove_dir_all` does not follow links) and
/// its admin directory, so git no longer sees the worktree.
fn remove_worktree(agent: &AgentPaths, wt: &MemoryWorktree) -> Result<(), WorktreeError> {
    let admin = admin_dir(agent, &wt.name)?;
    for path in [&wt.dir, &admin] {
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(path).map_err(io(path))?,
            Ok(_) => std::fs::remove_file(path).map_err(io(path))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(path)(e)),
        }
    }
    Ok(())
}

fn delete_branch(repo: &Repository, wt: &MemoryWorktree) -> Result<(), WorktreeError> {
    match repo.find_reference(&wt.branch_ref()) {
        Ok(mut r) => r.delete().map_err(git("delete the worktree branch")),
        Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(()),
        Err(e) => Err(git("read the worktree branch")(e)),
    }
}

/// `worktree remove --force` + `branch -D`.
fn force_cleanup(
    repo: &Repository,
    agent: &AgentPaths,
    wt: &MemoryWorktree,
) -> Result<(), WorktreeError> {
    remove_worktree(agent, wt)?;
    delete_branch(repo, wt)
}

/// `worktree remove` + `branch -d`: the branch goes only when `main`
/// contains it. Returns whether the branch was kept.
fn clean_cleanup(
    repo: &Repository,
    agent: &AgentPaths,
    wt: &MemoryWorktree,
) -> Result<bool, WorktreeError> {
    remove_worktree(agent, wt)?;
    let Some(tip) = branch_tip(repo, &wt.branch_ref())? else {
        return Ok(false);
    };
    if is_ancestor(repo, tip, main_head(repo)?)? {
        delete_branch(repo, wt)?;
        Ok(false)
    } else {
        tracing::warn!(
            "kept branch {}: its commits are not in main (refusing to delete unmerged work)",
            wt.branch
        );
        Ok(true)
    }
}

/// The primary agent's own merge of a reflection branch in the explicit
/// mode (spec §5.5), made for it by the supervisor (`memory.merge`): a real
/// merge commit `merge(reflection): <summary>` on `main`, the merged tree
/// validated first. A checkout with uncommitted changes is left alone
/// (`parent_dirty`); a conflict or an invalid tree changes nothing. The
/// worktree and branch stay: the finalize that follows checks, by git
/// ancestry alone, whether the branch was merged.
pub fn merge_for_integration(
    agent: &AgentPaths,
    wt: &MemoryWorktree,
    summary: &str,
    sig: &Signature<'_>,
) -> Result<Finalized, WorktreeError> {
    let repo = repo::open_agent(agent)?;
    let _lock = RepoLock::acquire(&agent.memory_git_dir())?;
    let tip = branch_tip(&repo, &wt.branch_ref())?;
    let head = main_head(&repo)?;
    let commit_count = match tip {
        Some(t) => commits_between(&repo, head, t)?,
        None => 0,
    };
    let out = Outcome {
        wt,
        commit_count,
        changed_paths: Vec::new(),
    };
    let Some(tip) = tip.filter(|_| commit_count > 0) else {
        return Ok(out.done(
            FinalizeStatus::NoChanges,
            "The reflection branch has nothing main does not already have.",
        ));
    };
    match parent_dirty_paths(&repo) {
        Some(dirty) if dirty.is_empty() => {}
        _ => return Ok(out.done(FinalizeStatus::ParentDirty, PARENT_DIRTY)),
    }
    let message = format!("merge(reflection): {summary}");
    match merge_into_main(&repo, agent, tip, &message, &[], sig)? {
        MergeOutcome::Merged { commit, changed } => {
            let mut f = out.done(FinalizeStatus::Merged, integrated_by_agent(commit_count));
            f.merge_commit = Some(commit.to_string());
            f.changed_paths = changed;
            Ok(f)
        }
        MergeOutcome::Conflict { paths, sides, .. } => {
            let mut f = out.done(FinalizeStatus::MergeConflict, MERGE_CONFLICT);
            f.changed_paths = paths;
            f.conflicts = sides;
            Ok(f)
        }
        MergeOutcome::Invalid { message } => {
            let mut f = out.done(FinalizeStatus::Invalid, INVALID);
            f.error = Some(message);
            Ok(f)
        }
    }
}

/// Builder of results for one worktree.
struct Outcome<'a> {
    wt: &'a MemoryWorktree,
    commit_count: usize,
    changed_paths: Vec<String>,
}

impl Outcome<'_> {
    fn done(&self, status: FinalizeStatus, summary: impl Into<String>) -> Finalized {
        Finalized {
            status,
            summary: summary.into(),
            commit_count: self.commit_count,
            merge_commit: None,
            branch: self.wt.branch.clone(),
            branch_kept: false,
            changed_paths: self.changed_paths.clone(),
            error: None,
            checkout_dirty: false,
            kept_tip: None,
            conflicts: Vec::new(),
        }
    }
}

/// Whether the worktree directory exists (a symlink planted at its name
/// counts as existing, and is then judged dirty).
fn dir_exists(wt: &MemoryWorktree) -> bool {
    std::fs::symlink_metadata(&wt.dir).is_ok()
}

/// Uncommitted changes in the worktree, by descriptor walk; a tree that
/// cannot be walked (a symlink at its root, a FIFO, too large) counts as
/// dirty, which only ever discards.
fn worktree_dirty(agent: &AgentPaths, wt: &MemoryWorktree) -> bool {
    match super::open::open(agent, &wt.name) {
        Ok((_, wrepo)) => match worktree_status(&wrepo) {
            Ok(s) => !s.dirty.is_empty(),
            Err(e) => {
                tracing::warn!("{}: cannot read worktree status: {e}", wt.dir.display());
                true
            }
        },
        Err(e) => {
            tracing::warn!("{}: cannot open the worktree: {e}", wt.dir.display());
            true
        }
    }
}

/// Dirty paths of the main checkout (`memory/`); `None` when they cannot be
/// determined.
fn parent_dirty_paths(repo: &Repository) -> Option<Vec<String>> {
    match worktree_status(repo) {
        Ok(s) => Some(s.dirty),
        Err(e) => {
            tracing::warn!("cannot read the memory checkout's status: {e}");
            None
        }
    }
}

/// Finalize a reflection worktree (spec §4.2): the first matching row of
/// the ladder decides.
///
/// | row | condition | cleanup | status |
/// |---|---|---|---|
/// | 0 | directory missing and `known_no_changes` | force (error if the branch advanced) | `no_changes` |
/// | 1 | uncommitted changes in the worktree | force | `dirty_uncommitted` |
/// | 2 | `!should_merge` | force | `failed` |
/// | 3 | no commits since base | clean | `no_changes` |
/// | 4 | main checkout dirty | force | `parent_dirty` |
/// | 5 | refresh from `origin` fails | force | `failed` (`error` set) |
/// | 6 | `require_already_merged`, branch not in `main` | force | `failed` |
/// | 6' | `require_already_merged`, branch in `main` | clean | `merged` |
/// | 7 | merge conflicts (`invalid`: merged tree refused) | force | `merge_conflict` / `invalid` |
/// | 8 | merged | clean | `merged` |
///
/// Everything runs under the repository lock.
pub fn finalize_reflection_worktree(
    agent: &AgentPaths,
    wt: &MemoryWorktree,
    opts: &FinalizeOptions,
    sig: &Signature<'_>,
) -> Result<Finalized, WorktreeError> {
    let repo = repo::open_agent(agent)?;
    let _lock = RepoLock::acquire(&agent.memory_git_dir())?;
    let tip = branch_tip(&repo, &wt.branch_ref())?;
    let commit_count = match tip {
        Some(t) => commits_between(&repo, wt.base, t)?,
        None => 0,
    };
    let changed_paths = match tip {
        Some(t) if commit_count > 0 => {
            diff_paths(&snapshot_of(&repo, wt.base)?, &snapshot_of(&repo, t)?)
        }
        _ => Vec::new(),
    };
    let reflection = Reflection {
        repo: &repo,
        agent,
        out: Outcome {
            wt,
            commit_count,
            changed_paths,
        },
    };
    let out = &reflection.out;

    // Row 0.
    if !dir_exists(wt) && opts.known_no_changes {
        if let Some(head) = tip
            && head != wt.base
        {
            return Err(WorktreeError::MissingAdvanced {
                dir: wt.dir.clone(),
                branch: wt.branch.clone(),
                base: wt.base,
                head,
            });
        }
        force_cleanup(&repo, agent, wt)?;
        return Ok(out.done(FinalizeStatus::NoChanges, NO_COMMITS));
    }
    // Row 1: a missing directory holds nothing uncommitted.
    if dir_exists(wt) && worktree_dirty(agent, wt) {
        force_cleanup(&repo, agent, wt)?;
        return Ok(out.done(FinalizeStatus::DirtyUncommitted, DIRTY_UNCOMMITTED));
    }
    // Row 2.
    if !opts.should_merge {
        force_cleanup(&repo, agent, wt)?;
        let summary = opts.failure_summary.as_deref().unwrap_or(FAILED);
        return Ok(out.done(FinalizeStatus::Failed, summary));
    }
    // Row 3.
    let Some(tip) = tip.filter(|_| commit_count > 0) else {
        let kept = clean_cleanup(&repo, agent, wt)?;
        let mut f = out.done(FinalizeStatus::NoChanges, NO_COMMITS);
        f.branch_kept = kept;
        return Ok(f);
    };
    // Row 4.
    let dirty = parent_dirty_paths(&repo);
    if dirty.as_ref().is_none_or(|d| !d.is_empty()) {
        force_cleanup(&repo, agent, wt)?;
        return Ok(out.done(FinalizeStatus::ParentDirty, PARENT_DIRTY));
    }
    // Rows 6 / 6'.
    if opts.require_already_merged {
        return reflection.already_merged(tip, opts);
    }
    // Row 5.
    if let Err(e) = refresh_from_origin(&repo, agent, sig) {
        force_cleanup(&repo, agent, wt)?;
        let mut f = out.done(FinalizeStatus::Failed, REFRESH_FAILED);
        f.error = Some(e.to_string());
        return Ok(f);
    }
    // Rows 7 / 8.
    reflection.merge(tip, opts, sig)
}

/// One reflection worktree being finalized under the repository lock:
/// what the later rows of the ladder clean up and report with.
struct Reflection<'a> {
    repo: &'a Repository,
    agent: &'a AgentPaths,
    out: Outcome<'a>,
}

impl Reflection<'_> {
    /// Rows 6 / 6': ancestry alone decides, never the agent's report.
    fn already_merged(&self, tip: Oid, opts: &FinalizeOptions) -> Result<Finalized, WorktreeError> {
        let (repo, agent, out) = (self.repo, self.agent, &self.out);
        if is_ancestor(repo, tip, main_head(repo)?)? {
            let kept = clean_cleanup(repo, agent, out.wt)?;
            let mut f = out.done(
                FinalizeStatus::Merged,
                integrated_by_agent(out.commit_count),
            );
            f.branch_kept = kept;
            return Ok(f);
        }
        force_cleanup(repo, agent, out.wt)?;
        let summary = opts
            .failure_summary
            .as_deref()
            .unwrap_or(NOT_MERGED_BY_AGENT);
        Ok(out.done(FinalizeStatus::Failed, summary))
    }

    /// Rows 7 / 8: merge `tip` into `main`; on a conflict or a refused
    /// merged tree the worktree and branch go and `main` is unchanged.
    fn merge(
        &self,
        tip: Oid,
        opts: &FinalizeOptions,
        sig: &Signature<'_>,
    ) -> Result<Finalized, WorktreeError> {
        let (repo, agent, out) = (self.repo, self.agent, &self.out);
        let wt = out.wt;
        let message = format!("merge(reflection): {}", opts.summary);
        match merge_into_main(repo, agent, tip, &message, &[], sig)? {
            MergeOutcome::Merged { commit, changed } => {
                let kept = clean_cleanup(repo, agent, wt)?;
                let mut f = out.done(FinalizeStatus::Merged, merged(out.commit_count));
                f.merge_commit = Some(commit.to_string());
                f.changed_paths = changed;
                f.branch_kept = kept;
                Ok(f)
            }
            MergeOutcome::Conflict { sides, .. } => {
                force_cleanup(repo, agent, wt)?;
                let mut f = out.done(FinalizeStatus::MergeConflict, MERGE_CONFLICT);
                f.conflicts = sides;
                Ok(f)
            }
            MergeOutcome::Invalid { message } => {
                force_cleanup(repo, agent, wt)?;
                let mut f = out.done(FinalizeStatus::Invalid, INVALID);
                f.error = Some(message);
                Ok(f)
            }
        }
    }
}

/// Row 5: bring `main` up to date with `origin`'s `main` before merging.
///
/// Without a remote named `origin` (sync configures it) this does nothing.
/// With one: fetch its `main`; nothing to do when it is
/// already contained in `HEAD`; a fast-forward when `HEAD` is contained in
/// it; otherwise `main`'s own commits are rebased onto it *in memory*
/// (merge commits are dropped, as `git rebase` does), so a conflict — the
/// "abort" — leaves everything as it was. The checkout, known clean at this
/// point, is then updated path by path.
fn refresh_from_origin(
    repo: &Repository,
    agent: &AgentPaths,
    sig: &Signature<'_>,
) -> Result<(), WorktreeError> {
    let remote = match repo.find_remote("origin") {
        Ok(r) => r,
        Err(e) if e.code() == git2::ErrorCode::NotFound => return Ok(()),
        Err(e) => return Err(git("read the origin remote")(e)),
    };
    let Ok(url) = remote.url() else {
        return Ok(());
    };
    // Through the git CLI, as every network git of the supervisor's is (the
    // operator's credential helpers and ssh configuration apply).
    let fetched = crate::memfs::gitcli::fetch(
        repo.commondir(),
        url,
        &["+refs/heads/main:refs/remotes/origin/main"],
    )
    .map_err(|e| git("fetch origin main")(git2::Error::from_str(&e.to_string())))?;
    if !fetched.ok {
        // A remote made but never pushed to has no main: nothing to refresh.
        if fetched.stderr.contains("couldn't find remote ref") {
            return Ok(());
        }
        return Err(git("fetch origin main")(git2::Error::from_str(
            fetched.stderr.trim(),
        )));
    }
    let theirs = repo
        .find_reference("refs/remotes/origin/main")
        .and_then(|r| r.peel_to_commit())
        .map_err(git("read origin/main"))?
        .id();
    let ours = main_head(repo)?;
    if is_ancestor(repo, theirs, ours)? {
        return Ok(());
    }
    let target = if is_ancestor(repo, ours, theirs)? {
        theirs
    } else {
        rebase_in_memory(repo, ours, theirs, sig)?
    };
    // Only from the commit we looked at (a writer that slipped in makes
    // this fail instead of being lost), and never ahead of the checkout.
    super::advance::advance_main(
        repo,
        &agent.memory_dir(),
        ours,
        target,
        "refresh from origin/main",
    )
    .map(|_| ())
}

/// Replay the commits of `ours` missing from `theirs` on top of `theirs`,
/// creating only new commit objects (no ref, index or working tree is
/// touched); returns the new tip. A conflict is an error.
fn rebase_in_memory(
    repo: &Repository,
    ours: Oid,
    theirs: Oid,
    sig: &Signature<'_>,
) -> Result<Oid, WorktreeError> {
    let what = "rebase main onto origin/main";
    let branch = repo.find_annotated_commit(ours).map_err(git(what))?;
    let upstream = repo.find_annotated_commit(theirs).map_err(git(what))?;
    let mut opts = git2::RebaseOptions::new();
    opts.inmemory(true);
    let mut rebase = repo
        .rebase(Some(&branch), Some(&upstream), None, Some(&mut opts))
        .map_err(git(what))?;
    let mut tip = theirs;
    while let Some(op) = rebase.next() {
        let op = op.map_err(git(what))?;
        let index = rebase.inmemory_index().map_err(git(what))?;
        if index.has_conflicts() {
            let _ = rebase.abort();
            return Err(WorktreeError::Git {
                what,
                source: git2::Error::from_str(&format!("commit {} conflicts", op.id())),
            });
        }
        let original = repo.find_commit(op.id()).map_err(git(what))?;
        match rebase.commit(Some(&original.author()), sig, None) {
            Ok(id) => tip = id,
            // Already in origin/main: nothing to replay.
            Err(e) if e.code() == git2::ErrorCode::Applied => {}
            Err(e) => {
                let _ = rebase.abort();
                return Err(git(what)(e));
            }
        }
    }
    rebase.finish(None).map_err(git(what))?;
    Ok(tip)
}

/// Integrate a memory worker's worktree (spec §4.3).
///
/// * `cancelled` → worktree and branch removed, `discarded`.
/// * Uncommitted edits in the worktree are dropped with it.
/// * No commits → removed, `no_changes`.
/// * Otherwise a merge into `main` with no dirty pre-check: a content
///   conflict, or merged paths overlapping dirty checkout paths, is
///   `merge_conflict` with the worktree removed and the **branch kept**;
///   success deletes the branch (`merged`). Dirty checkout files the merge
///   does not touch stay as they are. An invalid merged tree also keeps the
///   branch (`invalid`).
pub fn integrate_worker(
    agent: &AgentPaths,
    wt: &MemoryWorktree,
    cancelled: bool,
    sig: &Signature<'_>,
) -> Result<Finalized, WorktreeError> {
    let repo = repo::open_agent(agent)?;
    let _lock = RepoLock::acquire(&agent.memory_git_dir())?;
    let tip = branch_tip(&repo, &wt.branch_ref())?;
    let commit_count = match tip {
        Some(t) => commits_between(&repo, main_head(&repo)?, t)?,
        None => 0,
    };
    let out = Outcome {
        wt,
        commit_count,
        changed_paths: Vec::new(),
    };
    if cancelled {
        force_cleanup(&repo, agent, wt)?;
        return Ok(out.done(
            FinalizeStatus::Discarded,
            "Memory worker was cancelled; its changes were discarded.",
        ));
    }
    let Some(tip) = tip.filter(|_| commit_count > 0) else {
        force_cleanup(&repo, agent, wt)?;
        return Ok(out.done(
            FinalizeStatus::NoChanges,
            "Memory worker made no memory commits.",
        ));
    };
    // Committed work lives on the branch; the directory (and anything
    // uncommitted in it) goes now whatever the merge does.
    remove_worktree(agent, wt)?;
    let message = format!(
        "merge(memory-worker): {commit_count} commit(s) from {}",
        wt.branch
    );
    // From here on the commits exist only on the branch: an error keeps it
    // and is reported as `failed`, not lost in an `Err`.
    let attempt = parent_dirty_paths(&repo)
        .ok_or_else(|| WorktreeError::Git {
            what: "read the memory checkout's status",
            source: git2::Error::from_str("status unavailable"),
        })
        .and_then(|dirty| merge_into_main(&repo, agent, tip, &message, &dirty, sig));
    worker_outcome(&repo, &out, tip, attempt)
}

/// What a worker's merge attempt (`attempt`, of branch tip `tip`) comes
/// to: the branch is deleted once merged and kept otherwise, an error
/// included, so its commits are never lost.
fn worker_outcome(
    repo: &Repository,
    out: &Outcome<'_>,
    tip: Oid,
    attempt: Result<MergeOutcome, WorktreeError>,
) -> Result<Finalized, WorktreeError> {
    let (wt, commit_count) = (out.wt, out.commit_count);
    let outcome = match attempt {
        Ok(o) => o,
        Err(e) => {
            let mut f = out.done(
                FinalizeStatus::Failed,
                format!(
                    "Memory changes could not be merged; {commit_count} commit(s) kept on {}",
                    wt.branch
                ),
            );
            f.branch_kept = true;
            f.error = Some(e.to_string());
            return Ok(f);
        }
    };
    match outcome {
        MergeOutcome::Merged { commit, changed } => {
            delete_branch(repo, wt)?;
            let mut f = out.done(
                FinalizeStatus::Merged,
                format!("Merged {commit_count} memory-worker commit(s) into parent memory main."),
            );
            f.merge_commit = Some(commit.to_string());
            f.changed_paths = changed;
            Ok(f)
        }
        MergeOutcome::Conflict {
            paths,
            checkout_only,
            sides,
        } => {
            let summary = format!(
                "Memory changes conflict with the checkout; {commit_count} commit(s) kept on {}",
                wt.branch
            );
            let mut f = out.done(FinalizeStatus::MergeConflict, summary);
            f.branch_kept = true;
            f.changed_paths = paths;
            f.conflicts = sides;
            f.checkout_dirty = checkout_only;
            f.kept_tip = Some(tip.to_string());
            Ok(f)
        }
        MergeOutcome::Invalid { message } => {
            let mut f = out.done(
                FinalizeStatus::Invalid,
                format!(
                    "Memory changes failed validation when merged; {commit_count} commit(s) kept on {}",
                    wt.branch
                ),
            );
            f.branch_kept = true;
            f.error = Some(message);
            Ok(f)
        }
    }
}

/// Throw a worktree away: directory, admin directory and branch, merged or
/// not (force cleanup).
pub fn discard(agent: &AgentPaths, wt: &MemoryWorktree) -> Result<(), WorktreeError> {
    let repo = repo::open_agent(agent)?;
    let _lock = RepoLock::acquire(&agent.memory_git_dir())?;
    force_cleanup(&repo, agent, wt)
}

/// After a supervisor crash: remove every memory worktree whose name is not
/// in `keep` (directory and admin directory) and its branch — except a
/// `memory-worker` branch holding commits `main` lacks, which is kept so
/// the work is not lost. Staging leftovers are removed too. Returns the
/// names cleaned up.
pub fn cleanup_orphans(agent: &AgentPaths, keep: &[String]) -> Result<Vec<String>, WorktreeError> {
    let all = list(agent)?;
    let repo = repo::open_agent(agent)?;
    let _lock = RepoLock::acquire(&agent.memory_git_dir())?;
    let staging = MemoryGitDir::new(&agent.memory_git_dir()).worktree_staging_dir();
    match std::fs::remove_dir_all(&staging) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&staging)(e)),
        _ => {}
    }
    let head = main_head(&repo)?;
    let mut cleaned = Vec::new();
    for wt in all.iter().filter(|wt| !keep.contains(&wt.name)) {
        remove_worktree(agent, wt)?;
        let unmerged = match branch_tip(&repo, &wt.branch_ref())? {
            Some(tip) => !is_ancestor(&repo, tip, head)?,
            None => false,
        };
        if wt.label == Label::MemoryWorker && unmerged {
            tracing::info!("kept unmerged memory-worker branch {}", wt.branch);
        } else {
            delete_branch(&repo, wt)?;
        }
        cleaned.push(wt.name.clone());
    }
    Ok(cleaned)
}
