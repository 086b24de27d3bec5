//! The refs a sync reads and moves: local `main`, the remote's as last
//! fetched, and the backup refs kept before local history is rewritten.

use git2::{Oid, Repository};

use super::error::{SyncError, git};
use crate::memfs::worktree::advance::advance_main;
use crate::paths::AgentPaths;

/// Where the fetched remote `main` is kept in `memory.git`.
pub const REMOTE_TRACKING_REF: &str = "refs/remotes/origin/main";

/// Prefix of the refs saved before local history is rewritten.
pub const BACKUP_REF_PREFIX: &str = "refs/mini-letta/backup/";

/// Local `main`, by its full ref name.
pub(super) const LOCAL_MAIN: &str = "refs/heads/main";

/// The commit local `main` is at.
pub(super) fn main_tip(repo: &Repository) -> Result<Oid, SyncError> {
    repo.refname_to_id(LOCAL_MAIN)
        .map_err(git("read the local main"))
}

/// Commits reachable from `tip` but not from `base`.
pub(super) fn count_between(
    repo: &Repository,
    tip: Oid,
    base: Option<Oid>,
) -> Result<usize, SyncError> {
    let mut walk = repo.revwalk().map_err(git("walk history"))?;
    walk.push(tip).map_err(git("walk history"))?;
    if let Some(b) = base {
        walk.hide(b).map_err(git("walk history"))?;
    }
    Ok(walk.count())
}

/// A backup ref already at `at`, if any.
pub(super) fn existing_backup(repo: &Repository, at: Oid) -> Option<String> {
    let refs = repo
        .references_glob(&format!("{BACKUP_REF_PREFIX}*"))
        .ok()?;
    refs.flatten()
        .find(|r| r.target() == Some(at))
        .and_then(|r| r.name().ok().map(str::to_string))
}

/// Write `refs/mini-letta/backup/<UTC YYYYMMDDHHMMSS>` (suffixed `-<n>` if
/// taken this second) at `at`.
pub(super) fn write_backup(repo: &Repository, at: Oid) -> Result<String, SyncError> {
    let stamp = crate::clock::compact(crate::clock::now());
    for n in 0..100 {
        let name = if n == 0 {
            format!("{BACKUP_REF_PREFIX}{stamp}")
        } else {
            format!("{BACKUP_REF_PREFIX}{stamp}-{n}")
        };
        match repo.reference(&name, at, false, "mini-letta sync: backup before rebase") {
            Ok(_) => return Ok(name),
            Err(e) if e.code() == git2::ErrorCode::Exists => continue,
            Err(e) => return Err(git("write the backup ref")(e)),
        }
    }
    Err(SyncError::Git {
        what: "write the backup ref",
        source: git2::Error::from_str("too many backups this second"),
    })
}

/// Move local `main` from `old` to `new` together with `memory/` and its
/// index ([`advance_main`]): on failure neither moved, and the next sync
/// tries again.
pub(super) fn move_main(
    repo: &Repository,
    agent: &AgentPaths,
    old: Oid,
    new: Oid,
    why: &str,
) -> Result<(), SyncError> {
    advance_main(repo, &agent.memory_dir(), old, new, why)?;
    Ok(())
}
