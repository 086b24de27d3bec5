//! Memory-worker branches kept after a conflicting merge: what they
//! propose (for the repair worker of chapter 17, exercise 3), and their
//! removal once the repair has re-applied it.

use git2::{DiffFormat, Oid};

use super::error::{WorktreeError, git};
use super::heads::{branch_tip, main_head};
use super::naming::{BRANCH_PREFIX, Label, parse_name};
use crate::memfs::repo;
use crate::paths::AgentPaths;

/// What a kept branch proposes against `main`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptChange {
    pub branch: String,
    /// The branch's tip and `main`'s head when this was read: together
    /// they name this conflict (a repair is attempted once per pair).
    pub tip: String,
    pub main: String,
    /// The patch from where the branch left `main` to its tip (capped).
    pub patch: String,
    /// Lines the branch added, as they read in the files.
    pub added: Vec<String>,
}

/// Longest patch text kept.
const MAX_PATCH: usize = 20_000;

/// The ref of a kept worker branch `branch` (only `mini-letta/memory-worker/<id>`).
fn worker_ref(branch: &str) -> Result<String, WorktreeError> {
    let id = branch
        .strip_prefix(&format!("{}memory-worker/", BRANCH_PREFIX))
        .ok_or_else(|| WorktreeError::BadName(branch.into()))?;
    match parse_name(&format!("memory-worker-{id}")) {
        Some((Label::MemoryWorker, _)) => Ok(format!("refs/heads/{branch}")),
        _ => Err(WorktreeError::BadName(branch.into())),
    }
}

/// What kept branch `branch` proposes; `None` when it is gone or has
/// nothing `main` lacks.
pub fn kept_change(agent: &AgentPaths, branch: &str) -> Result<Option<KeptChange>, WorktreeError> {
    let reference = worker_ref(branch)?;
    let repo = repo::open_agent(agent)?;
    let Some(tip) = branch_tip(&repo, &reference)? else {
        return Ok(None);
    };
    let main = main_head(&repo)?;
    let base = repo
        .merge_base(main, tip)
        .map_err(git("find where the branch left main"))?;
    if base == tip {
        return Ok(None);
    }
    let tree = |id: Oid| {
        repo.find_commit(id)
            .and_then(|c| c.tree())
            .map_err(git("read a commit tree"))
    };
    let diff = repo
        .diff_tree_to_tree(Some(&tree(base)?), Some(&tree(tip)?), None)
        .map_err(git("diff the kept branch"))?;
    let mut patch = String::new();
    let mut added = Vec::new();
    diff.print(DiffFormat::Patch, |_, _, line| {
        let text = String::from_utf8_lossy(line.content());
        if line.origin() == '+' {
            added.push(text.trim_end().to_string());
        }
        if patch.len() < MAX_PATCH {
            if matches!(line.origin(), '+' | '-' | ' ') {
                patch.push(line.origin());
            }
            patch.push_str(&text);
        }
        true
    })
    .map_err(git("print the kept branch's patch"))?;
    Ok(Some(KeptChange {
        branch: branch.to_string(),
        tip: tip.to_string(),
        main: main.to_string(),
        patch,
        added,
    }))
}

/// Delete kept branch `branch` if it still points at `tip` (a repair
/// re-applied it); true when deleted.
pub fn drop_kept_branch(
    agent: &AgentPaths,
    branch: &str,
    tip: &str,
) -> Result<bool, WorktreeError> {
    let reference = worker_ref(branch)?;
    let repo = repo::open_agent(agent)?;
    let _lock = crate::memfs::lock::RepoLock::acquire(&agent.memory_git_dir())?;
    match branch_tip(&repo, &reference)? {
        Some(t) if t.to_string() == tip => {
            repo.find_reference(&reference)
                .and_then(|mut r| r.delete())
                .map_err(git("delete a kept branch"))?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Keep commit `at` on a new memory-worker branch of its own (no worktree),
/// as a conflicted worker's branch is kept, so that a repair worker can
/// re-apply what it holds: how `sync --repair` sets local commits aside.
/// The caller holds the repository lock. Returns the branch name.
pub fn keep_as_worker_branch(repo: &git2::Repository, at: Oid) -> Result<String, WorktreeError> {
    let commit = repo
        .find_commit(at)
        .map_err(git("read the commit to keep"))?;
    for _ in 0..16 {
        let branch = format!(
            "{}{}/{}",
            BRANCH_PREFIX,
            Label::MemoryWorker.as_str(),
            crate::names::stamped_id(time::OffsetDateTime::now_utc())
        );
        match repo.branch(&branch, &commit, false) {
            Ok(_) => return Ok(branch),
            Err(e) if e.code() == git2::ErrorCode::Exists => continue,
            Err(e) => return Err(git("keep the local commits on a branch")(e)),
        }
    }
    Err(git("keep the local commits on a branch")(
        git2::Error::from_str("no free branch name"),
    ))
}
