//! After a sync `conflict`: the local commits set aside for a repair
//! worker, and the check that a repair carried every local change over.

use git2::{Oid, Repository};

use super::error::{SyncError, git};
use super::judge::{accept_from_remote, snapshot};
use super::refs::{REMOTE_TRACKING_REF, main_tip, move_main, write_backup};
use crate::memfs::lock::RepoLock;
use crate::memfs::repo::open_agent;
use crate::memfs::status::worktree_status;
use crate::paths::AgentPaths;

/// Local commits set aside for a repair ([`set_aside_for_repair`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetAside {
    /// The memory-worker branch holding local `main` as it was.
    pub branch: String,
    /// The backup ref holding it too.
    pub backup_ref: String,
    /// Local `main` before: what the repair must carry over.
    pub local: Oid,
    /// The remote's `main`, where `main` moved.
    pub remote: Oid,
}

/// What [`set_aside_for_repair`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Aside {
    /// Nothing to set aside (a dirty checkout, no fetched remote, or local
    /// `main` already contains it).
    Nothing,
    /// The remote's memory is refused (the violations); nothing moved.
    Refused(String),
    Set(SetAside),
}

/// After a `conflict`: set the local commits aside for a repair worker.
/// Local `main` is kept under a backup ref and on a new memory-worker
/// branch, and `main` moves to the remote's `main` as last fetched —
/// validated first, as any move to what the remote has — so the repair
/// re-applies the local change onto the memory every other host has and
/// the next sync is a fast-forward. Nothing is lost: the branch and the
/// backup ref both hold the local history.
pub fn set_aside_for_repair(agent: &AgentPaths) -> Result<Aside, SyncError> {
    let git_dir = agent.memory_git_dir();
    let _lock = RepoLock::acquire(&git_dir)?;
    let repo = open_agent(agent)?;
    if !worktree_status(&repo)?.dirty.is_empty() {
        return Ok(Aside::Nothing);
    }
    let local = main_tip(&repo)?;
    let Ok(remote) = repo.refname_to_id(REMOTE_TRACKING_REF) else {
        return Ok(Aside::Nothing);
    };
    if local == remote
        || repo
            .graph_descendant_of(local, remote)
            .map_err(git("compare histories"))?
    {
        return Ok(Aside::Nothing);
    }
    if let Some(why) = accept_from_remote(&repo, remote, Some(local))? {
        return Ok(Aside::Refused(why));
    }
    let backup_ref = write_backup(&repo, local)?;
    let branch = crate::memfs::worktree::keep_as_worker_branch(&repo, local)?;
    move_main(
        &repo,
        agent,
        local,
        remote,
        "mini-letta sync: local commits set aside for a repair",
    )?;
    Ok(Aside::Set(SetAside {
        branch,
        backup_ref,
        local,
        remote,
    }))
}

/// After a repair of `aside`: the paths whose local change is not on
/// `main`, in path order (empty: everything was carried over). The rule,
/// over the net change of the local commits (merge base → local tip): a
/// path they deleted is gone from `main`; a path they added or changed is
/// on `main`, with every line their version has that the merge base's
/// lacked (lines compared without surrounding blanks; blank lines do not
/// count); a file that is not UTF-8 text must be on `main` byte for byte.
pub fn not_carried_over(agent: &AgentPaths, aside: &SetAside) -> Result<Vec<String>, SyncError> {
    let repo = open_agent(agent)?;
    let base = repo
        .merge_base(aside.local, aside.remote)
        .map_err(git("find the merge base"))?;
    let (before, mine) = (snapshot(&repo, base)?, snapshot(&repo, aside.local)?);
    let now = snapshot(&repo, main_tip(&repo)?)?;
    let mut missing = Vec::new();
    for path in crate::memfs::worktree::merge::diff_paths(&before, &mine) {
        let carried = match (mine.get(&path), now.get(&path)) {
            (None, now) => now.is_none(),
            (Some(_), None) => false,
            (Some(m), Some(n)) if m == n => true,
            (Some(m), Some(n)) => {
                let old = before.get(&path).map(|e| e.oid);
                lines_carried(&repo, old, m.oid, n.oid)?
            }
        };
        if !carried {
            missing.push(path);
        }
    }
    Ok(missing)
}

/// Whether every line of blob `mine` that blob `old` lacks is a line of
/// blob `now` (see [`not_carried_over`]).
fn lines_carried(
    repo: &Repository,
    old: Option<Oid>,
    mine: Oid,
    now: Oid,
) -> Result<bool, SyncError> {
    let text = |id: Oid| -> Result<Option<String>, SyncError> {
        let blob = repo.find_blob(id).map_err(git("read a blob"))?;
        Ok(std::str::from_utf8(blob.content()).ok().map(str::to_string))
    };
    let (Some(mine), Some(now)) = (text(mine)?, text(now)?) else {
        return Ok(false);
    };
    let old = match old {
        Some(id) => text(id)?.unwrap_or_default(),
        None => String::new(),
    };
    let set = |t: &str| -> std::collections::HashSet<String> {
        t.lines().map(|l| l.trim().to_string()).collect()
    };
    let (old, now) = (set(&old), set(&now));
    Ok(mine
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !old.contains(*l))
        .all(|l| now.contains(l)))
}
