//! Finding memory worktrees: [`open`] one by name (never through the
//! child-writable `.git` file) and [`list`] them all.

use git2::{Oid, Repository};

use super::error::{WorktreeError, git, io};
use super::heads::{branch_tip, main_head};
use super::naming::{BRANCH_PREFIX, MemoryWorktree, admin_dir, parse_name};
use crate::memfs::repo;
use crate::paths::{AgentPaths, MemoryGitDir};

/// The base recorded at creation, else where the branch forked from `main`.
fn base_of(repo: &Repository, agent: &AgentPaths, name: &str, branch_ref: &str) -> Oid {
    let recorded = MemoryGitDir::new(&agent.memory_git_dir())
        .worktree_base_file(name)
        .and_then(|f| std::fs::read_to_string(f).ok())
        .and_then(|s| Oid::from_str(s.trim()).ok());
    if let Some(base) = recorded {
        return base;
    }
    let tip = branch_tip(repo, branch_ref).ok().flatten();
    let head = main_head(repo).ok();
    match (tip, head) {
        (Some(t), Some(h)) => repo.merge_base(t, h).unwrap_or(t),
        (Some(t), None) => t,
        (None, Some(h)) => h,
        (None, None) => Oid::ZERO_SHA1,
    }
}

/// Open memory worktree `name` of `agent`: the worktree and a repository
/// handle on it whose `HEAD` is the worktree's branch.
///
/// The handle is opened from the admin directory `memory.git/worktrees/
/// <name>` with the working tree set to `<agent>/memory-worktrees/<name>`;
/// the child-writable `<dir>/.git` file is never read, so rewriting it
/// cannot point the supervisor (or [`crate::memfs::commit::commit_paths`]
/// on this handle) at another repository.
pub fn open(agent: &AgentPaths, name: &str) -> Result<(MemoryWorktree, Repository), WorktreeError> {
    let admin = admin_dir(agent, name)?;
    if !std::fs::symlink_metadata(&admin).is_ok_and(|m| m.is_dir()) {
        return Err(WorktreeError::NotFound(name.to_string()));
    }
    let main = repo::open_agent(agent)?;
    let wt = {
        let probe = MemoryWorktree::from_name(agent, name, Oid::ZERO_SHA1)?;
        let base = base_of(&main, agent, name, &probe.branch_ref());
        MemoryWorktree { base, ..probe }
    };
    let repo = repo::open_bare(&admin)?;
    // The common directory comes from the admin dir's `commondir` file
    // (supervisor-owned); make sure it is this agent's repository.
    let common = std::fs::canonicalize(repo.commondir()).map_err(io(repo.commondir()))?;
    let expected = std::fs::canonicalize(agent.memory_git_dir()).map_err(io(&admin))?;
    if common != expected {
        return Err(WorktreeError::NotFound(name.to_string()));
    }
    repo.set_workdir(&wt.dir, false)
        .map_err(git("set the worktree's working tree"))?;
    Ok((wt, repo))
}

/// Every mini-letta memory worktree of `agent` that has an admin
/// directory, a `mini-letta/<label>/<id>` branch or a directory in
/// `memory-worktrees/` (by name, sorted).
pub fn list(agent: &AgentPaths) -> Result<Vec<MemoryWorktree>, WorktreeError> {
    let repo = repo::open_agent(agent)?;
    let mut names = std::collections::BTreeSet::new();
    let git_dir = MemoryGitDir::new(&agent.memory_git_dir());
    for dir in [git_dir.worktree_admin_root(), agent.worktrees_dir()] {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(&dir)(e)),
        };
        for entry in entries {
            let entry = entry.map_err(io(&dir))?;
            if let Some(name) = entry.file_name().to_str()
                && parse_name(name).is_some()
            {
                names.insert(name.to_string());
            }
        }
    }
    let refs = repo
        .references_glob(&format!("refs/heads/{BRANCH_PREFIX}*"))
        .map_err(git("list branches"))?;
    for r in refs.flatten() {
        let Some(rest) = r
            .name()
            .ok()
            .and_then(|n| n.strip_prefix("refs/heads/"))
            .and_then(|n| n.strip_prefix(BRANCH_PREFIX))
        else {
            continue;
        };
        // `<label>/<id>` → `<label>-<id>`.
        if let Some((label, id)) = rest.split_once('/') {
            let name = format!("{label}-{id}");
            if parse_name(&name).is_some() {
                names.insert(name);
            }
        }
    }
    names
        .into_iter()
        .map(|name| {
            let probe = MemoryWorktree::from_name(agent, &name, Oid::ZERO_SHA1)?;
            let base = base_of(&repo, agent, &name, &probe.branch_ref());
            Ok(MemoryWorktree { base, ..probe })
        })
        .collect()
}
