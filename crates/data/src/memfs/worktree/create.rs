//! Creating a memory worktree (spec §4.1).

use git2::{Repository, WorktreeAddOptions};

use super::error::{WorktreeError, git, io};
use super::naming::{Label, MemoryWorktree, admin_dir};
use crate::agentfs::Dir;
use crate::memfs::lock::RepoLock;
use crate::memfs::repo;
use crate::paths::{AgentPaths, MemoryGitDir, WORKTREES_DIR_NAME};

/// Create a memory worktree of `agent`'s `memory.git` for `label`: a new
/// branch `mini-letta/<label>/<id>` at `main`'s `HEAD`, checked out as a
/// linked git worktree in `<agent>/memory-worktrees/<label>-<id>/`
/// (`git worktree list` shows it).
pub fn create(agent: &AgentPaths, label: Label) -> Result<MemoryWorktree, WorktreeError> {
    let repo = repo::open_agent(agent)?;
    let git_dir = agent.memory_git_dir();
    let _lock = RepoLock::acquire(&git_dir)?;
    let head = repo
        .head()
        .and_then(|h| h.peel_to_commit())
        .map_err(|_| WorktreeError::NoHead(agent.memory_dir()))?;

    // `memory-worktrees/` belongs to the agent (made on demand, given to
    // the agent's uid like the directory around it).
    let agent_dir = Dir::open(agent.dir())?;
    let worktrees = agent_dir.create_dir(WORKTREES_DIR_NAME, 0o755)?;

    // A taken name (same second, same random digits) is simply redrawn.
    let wt = loop {
        let id = crate::names::stamped_id(time::OffsetDateTime::now_utc());
        let name = format!("{}-{id}", label.as_str());
        let wt = MemoryWorktree::from_name(agent, &name, head.id())?;
        let taken = admin_dir(agent, &name)?.exists()
            || repo.find_reference(&wt.branch_ref()).is_ok()
            || worktrees.stat_at(&name)?.is_some();
        if !taken {
            break wt;
        }
    };

    let branch = repo
        .branch(&wt.branch, &head, false)
        .map_err(git("create the worktree branch"))?;
    let made = add_worktree(&repo, agent, &worktrees, &wt, branch.get());
    if made.is_err() {
        // Leave nothing half-made behind.
        let admin = admin_dir(agent, &wt.name)?;
        let _ = std::fs::remove_dir_all(&admin);
        let _ = std::fs::remove_dir_all(staging_path(agent, &wt.name)?);
        let _ = std::fs::remove_dir_all(&wt.dir);
        drop(branch);
        if let Ok(mut r) = repo.find_reference(&wt.branch_ref()) {
            let _ = r.delete();
        }
    }
    made.map(|()| wt)
}

fn staging_path(agent: &AgentPaths, name: &str) -> Result<std::path::PathBuf, WorktreeError> {
    MemoryGitDir::new(&agent.memory_git_dir())
        .worktree_staging(name)
        .ok_or_else(|| WorktreeError::BadName(name.into()))
}

/// Check `wt` out in the staging directory, then move it into
/// `memory-worktrees/` and point its admin directory at the new place.
fn add_worktree(
    repo: &Repository,
    agent: &AgentPaths,
    worktrees: &Dir,
    wt: &MemoryWorktree,
    branch: &git2::Reference<'_>,
) -> Result<(), WorktreeError> {
    let staging_root = MemoryGitDir::new(&agent.memory_git_dir()).worktree_staging_dir();
    std::fs::create_dir_all(&staging_root).map_err(io(&staging_root))?;
    let staged = staging_path(agent, &wt.name)?;
    let mut opts = WorktreeAddOptions::new();
    opts.reference(Some(branch));
    repo.worktree(&wt.name, &staged, Some(&opts))
        .map_err(git("add the memory worktree"))?;

    let git_dir = MemoryGitDir::new(&agent.memory_git_dir());
    let bad = || WorktreeError::BadName(wt.name.clone());
    let base_file = git_dir.worktree_base_file(&wt.name).ok_or_else(bad)?;
    std::fs::write(&base_file, format!("{}\n", wt.base)).map_err(io(&base_file))?;

    // The move is one rename between descriptors: an entry a child put at
    // the name first makes it fail (a non-empty directory, a symlink) or is
    // replaced (an empty directory), never followed.
    let staging = Dir::open(&staging_root)?;
    give_to_owner(worktrees, &staging, &wt.name)?;
    staging.rename_to(&wt.name, worktrees, &wt.name)?;

    let gitdir_file = git_dir.worktree_gitdir_file(&wt.name).ok_or_else(bad)?;
    let dotgit = agent.memory_worktree_dotgit(&wt.name).ok_or_else(bad)?;
    std::fs::write(&gitdir_file, format!("{}\n", dotgit.display())).map_err(io(&gitdir_file))?;
    Ok(())
}

/// Running as root, hand the new checkout (still in the staging
/// directory, out of children's reach) to the owner of `memory-worktrees/`
/// (the agent's uid), so its child can write it.
fn give_to_owner(worktrees: &Dir, staging: &Dir, name: &str) -> Result<(), WorktreeError> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let owner = worktrees.stat()?;
    if owner.uid == 0 {
        return Ok(());
    }
    chown_tree(staging, name, owner.uid, owner.gid, 64)
}

fn chown_tree(
    parent: &Dir,
    name: &str,
    uid: u32,
    gid: u32,
    depth: usize,
) -> Result<(), WorktreeError> {
    let Some(entry) = parent.entry(name)? else {
        return Ok(());
    };
    entry.chown(Some(uid), Some(gid))?;
    if entry.stat().kind == crate::agentfs::Kind::Dir && depth > 0 {
        let dir = parent.open_dir(name)?;
        for child in dir.list(crate::memfs::status::MAX_STATUS_ENTRIES)? {
            if let Some(child) = child.to_str() {
                chown_tree(&dir, child, uid, gid, depth - 1)?;
            }
        }
    }
    Ok(())
}
