//! At the supervisor's start: what a stopped supervisor left of each
//! agent's reflections — a half-done move of `main`, a stale lock, orphan
//! worktrees, payloads, modes an older version left open — is put right.

use super::{PRIVATE_DIR_MODE, PRIVATE_FILE_MODE, lock, payload};
use crate::memfs::worktree as wt;
use crate::paths::Home;

/// Make `path` and what it holds private to its owner (directories 0700,
/// files 0600), as an older supervisor did not. Symlinks are neither
/// followed nor changed; a tree deeper than a reflection's directory is
/// (a few levels) is not walked further. Returns how many entries changed.
fn make_private(path: &std::path::Path, depth: usize) -> usize {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    let want = if meta.is_dir() {
        PRIVATE_DIR_MODE
    } else if meta.is_file() {
        PRIVATE_FILE_MODE
    } else {
        return 0;
    };
    let mut changed = 0;
    if meta.permissions().mode() & 0o777 != want
        && std::fs::set_permissions(path, std::fs::Permissions::from_mode(want)).is_ok()
    {
        changed += 1;
    }
    if meta.is_dir()
        && depth > 0
        && let Ok(entries) = std::fs::read_dir(path)
    {
        for e in entries.flatten() {
            changed += make_private(&e.path(), depth - 1);
        }
    }
    changed
}

/// At start: what of agent `id` lies beside its directory is private
/// (modes an older supervisor left), and an agent's index of names too.
fn recover_privacy(home: &Home, id: &str) {
    if let Ok(dir) = home.reflection_agent_dir(id) {
        let changed = make_private(&dir, 6);
        if changed > 0 {
            tracing::info!(agent = %id, changed, "made the reflections' directory private");
        }
    }
}

/// A reflections' directory whose agent is gone (deleted by a version that
/// left it) goes too: it holds that agent's memory.
fn remove_orphan_sibling(home: &Home, owner: &str, path: &std::path::Path) {
    let Ok(agent) = home.agent(owner) else { return };
    if std::fs::symlink_metadata(agent.dir()).is_ok() {
        return;
    }
    match std::fs::remove_dir_all(path) {
        Ok(()) => {
            tracing::warn!(agent = %owner, "removed the reflections' directory of a deleted agent")
        }
        Err(e) => {
            tracing::warn!(agent = %owner, "cannot remove the reflections' directory of a deleted agent: {e}")
        }
    }
}

/// At start: what a crashed supervisor left of each agent's reflections —
/// a stale `reflection.lock` and orphan worktrees — is cleaned up (a
/// memory worker's branch with commits is kept).
///
/// Run before the first connection is accepted (so it never races a new
/// launch), and cheap when nothing was left: two directory probes per agent.
pub fn recover(home: &Home) {
    let Ok(entries) = std::fs::read_dir(home.agents_dir()) else {
        return;
    };
    // The index of names is root's alone (older ones were 0644).
    make_private(&home.agents_index(), 0);
    for entry in entries.flatten() {
        let Some(id) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if let Some(owner) = id.strip_suffix(crate::paths::REFLECTION_SIBLING_SUFFIX) {
            remove_orphan_sibling(home, owner, &entry.path());
            continue;
        }
        let Ok(agent) = home.agent(&id) else { continue };
        recover_privacy(home, &id);
        // First a move of `main` the stopped supervisor left half done (a
        // merge it was making), so the branch it merged reads as merged.
        if wt::advance::interrupted(&agent.memory_git_dir()) {
            let finished = crate::memfs::lock::RepoLock::acquire(&agent.memory_git_dir())
                .map_err(|e| e.to_string())
                .and_then(|_lock| {
                    let repo = crate::memfs::repo::open_agent(&agent).map_err(|e| e.to_string())?;
                    wt::advance::recover(&repo, &agent.memory_dir()).map_err(|e| e.to_string())
                });
            if let Err(e) = finished {
                tracing::warn!(agent = %id, "cannot finish an interrupted move of main: {e}");
            }
        }
        let stale_lock = lock::inspect(&agent)
            .ok()
            .flatten()
            .is_some_and(|l| !l.alive || l.malformed);
        let has_worktrees = std::fs::read_dir(agent.worktrees_dir())
            .map(|mut d| d.next().is_some())
            .unwrap_or(false);
        if !stale_lock && !has_worktrees {
            continue;
        }
        match wt::cleanup_orphans(&agent, &[]) {
            Ok(removed) if !removed.is_empty() => {
                tracing::warn!(agent = %id, ?removed, "removed worktrees a stopped supervisor left")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(agent = %id, "cannot clean up old worktrees: {e}"),
        }
        if stale_lock {
            // Acquiring reclaims a stale lock; releasing leaves it free.
            if let Ok(lock::Acquire::Acquired { token }) =
                lock::try_acquire(&agent, std::process::id())
            {
                let _ = lock::release(&agent, &token);
                tracing::warn!(agent = %id, "reclaimed a stale reflection lock");
            }
        }
        let _ = payload::remove_all(&agent);
    }
}
