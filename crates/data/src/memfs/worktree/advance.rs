//! Moving `main` of an agent's memory together with its checkout
//! (`memory/`), so the checkout is never *behind* `main`.
//!
//! Why: the agent's memory tools edit files in the checkout and the
//! supervisor commits the paths they name. A checkout left with older
//! contents than `main` (a full or read-only disk, a kill at the wrong
//! moment) would make the next edit of such a file commit the old text
//! back, silently undoing whatever moved `main` — a merged memory worker,
//! a reflection, a sync. So every move of `main` here goes:
//!
//! 1. a journal `<old> <new>` is written in the git directory (children
//!    cannot write there); if that fails, nothing has changed;
//! 2. the checkout and its index are brought to `new` for the changed paths;
//! 3. `main` moves from `old` to `new` (compare-and-swap);
//! 4. the journal is removed.
//!
//! A failure in 2 or 3 puts the paths back as `old` (best effort: a path
//! that cannot be put back holds the new content, i.e. it is *ahead* of
//! `main` and shows as an uncommitted change, which loses nothing) and
//! leaves `main` where it was. A kill between 1 and 4 leaves the journal;
//! [`recover`] then finishes the move when the checkout holds only what
//! the move itself wrote.
//!
//! A move whose changed paths include one inside `.git` (any case) is
//! refused before step 1: the checkout's `.git` is its gitdir pointer, and
//! putting such a path "back" on a failure used to delete the pointer. The
//! validator refuses such trees too; this is the mover's own guard.

use std::path::{Path, PathBuf};

use git2::{Oid, Repository};

use super::error::{WorktreeError, git};
use super::merge::{diff_paths, snapshot_of as snapshot, update_checkout};
use crate::agentfs::temp_name::is_temp_name;
use crate::memfs::status::{checkout_blobs, worktree_status};
use crate::memfs::validate::TreeSnapshot;
use crate::paths::MemoryGitDir;

const MAIN: &str = "refs/heads/main";

#[cfg(test)]
thread_local! {
    /// Test-only fault injection, as a full or read-only disk would fail:
    /// the next move of the ref (step 3); the checkout's is
    /// `merge::FAIL_CHECKOUT_AFTER`.
    pub(crate) static FAIL_NEXT_REF_MOVE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Move `main` from `old` to `new` with the checkout at `work_tree` (see
/// the module docs). Returns the paths that changed.
pub fn advance_main(
    repo: &Repository,
    work_tree: &Path,
    old: Oid,
    new: Oid,
    why: &str,
) -> Result<Vec<String>, WorktreeError> {
    let before = snapshot(repo, old)?;
    let after = snapshot(repo, new)?;
    let changed = diff_paths(&before, &after);
    refuse_git_paths(work_tree, &changed)?;
    let journal = journal_path(repo);
    write_journal(&journal, old, new)?;
    let moved = update_checkout(repo, work_tree, &after, &changed)
        .and_then(|()| move_ref(repo, old, new, why));
    if let Err(e) = moved {
        if let Err(back) = update_checkout(repo, work_tree, &before, &changed) {
            tracing::warn!(
                "could not put the memory checkout back after a failed move of main ({e}): {back}; \
                 its paths hold the newer content and show as uncommitted changes"
            );
        }
        let _ = std::fs::remove_file(&journal);
        return Err(e);
    }
    let _ = std::fs::remove_file(&journal);
    crate::memfs::mirror::main_moved(repo.commondir());
    Ok(changed)
}

fn move_ref(repo: &Repository, old: Oid, new: Oid, why: &str) -> Result<(), WorktreeError> {
    #[cfg(test)]
    if FAIL_NEXT_REF_MOVE.with(|f| f.replace(false)) {
        return Err(git("move main")(git2::Error::from_str(
            "injected fault: no space left on device",
        )));
    }
    repo.reference_matching(MAIN, new, true, old, why)
        .map(|_| ())
        .map_err(git("move main"))
}

/// After a kill inside [`advance_main`] (its journal is still there):
/// finish that move when `main` is at either end of it, every path it
/// changes holds its old or its new content in the checkout, and nothing
/// else is dirty but the temporary files of writes the kill cut short.
/// Otherwise the journal is dropped and the checkout left to its owner (an
/// edit made since is never overwritten). Callers hold the repository lock.
pub fn recover(repo: &Repository, work_tree: &Path) -> Result<(), WorktreeError> {
    let journal = journal_path(repo);
    let Ok(text) = std::fs::read_to_string(&journal) else {
        return Ok(());
    };
    let mut ids = text.split_whitespace().map(Oid::from_str);
    let (Some(Ok(old)), Some(Ok(new))) = (ids.next(), ids.next()) else {
        let _ = std::fs::remove_file(&journal);
        return Ok(());
    };
    // The mover died holding them: a lock on `main` or on the index taken
    // after the journal was written is its own (a live git would have had
    // to take it in that same instant) and would stop every later commit.
    let written = std::fs::metadata(&journal).and_then(|m| m.modified()).ok();
    for name in [format!("{MAIN}.lock"), "index.lock".to_string()] {
        let lock = repo.path().join(name);
        let taken = std::fs::metadata(&lock).and_then(|m| m.modified()).ok();
        if let (Some(w), Some(t)) = (written, taken)
            && t >= w
        {
            let _ = std::fs::remove_file(&lock);
        }
    }
    let result = finish(repo, work_tree, old, new);
    let _ = std::fs::remove_file(&journal);
    result
}

fn finish(repo: &Repository, work_tree: &Path, old: Oid, new: Oid) -> Result<(), WorktreeError> {
    let main = repo.refname_to_id(MAIN).map_err(git("read main"))?;
    if main != old && main != new {
        return Ok(());
    }
    let (Ok(before), Ok(after)) = (snapshot(repo, old), snapshot(repo, new)) else {
        return Ok(());
    };
    let changed = diff_paths(&before, &after);
    if refuse_git_paths(work_tree, &changed).is_err() {
        tracing::warn!("an interrupted move of main ({old} -> {new}) touches .git: left as it is");
        return Ok(());
    }
    let found = checkout_blobs(repo)?;
    let side = |snap: &TreeSnapshot, p: &str| snap.get(p).map(|e| (e.mode, e.oid));
    let only_the_move = changed
        .iter()
        .all(|p| match found.get(p.as_bytes()).copied() {
            None => side(&before, p).is_none() || side(&after, p).is_none(),
            Some(Some(blob)) => side(&before, p) == Some(blob) || side(&after, p) == Some(blob),
            Some(None) => false,
        });
    let others: Vec<String> = worktree_status(repo)?
        .dirty
        .into_iter()
        .filter(|p| !changed.contains(p))
        .collect();
    if !only_the_move || !others.iter().all(|p| is_temp_of(p, &changed)) {
        tracing::warn!(
            "an interrupted move of main ({old} -> {new}) is left as it is: the checkout was edited since"
        );
        return Ok(());
    }
    let root = crate::agentfs::Dir::open(work_tree)?;
    for p in &others {
        if let Ok((dir, leaf)) = root.open_parent(std::ffi::OsStr::new(p)) {
            let _ = dir.remove_file(leaf);
        }
    }
    update_checkout(repo, work_tree, &after, &changed)?;
    if main == old {
        move_ref(
            repo,
            old,
            new,
            "mini-letta: finish an interrupted move of main",
        )?;
        crate::memfs::mirror::main_moved(repo.commondir());
    }
    tracing::info!("finished an interrupted move of main ({old} -> {new})");
    Ok(())
}

/// `Err` naming the first of `changed` with a `.git` component: a checkout
/// update never writes or removes one.
fn refuse_git_paths(work_tree: &Path, changed: &[String]) -> Result<(), WorktreeError> {
    match changed
        .iter()
        .find(|p| p.split('/').any(|s| s.eq_ignore_ascii_case(".git")))
    {
        None => Ok(()),
        Some(p) => Err(WorktreeError::Io {
            path: work_tree.join(p),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a path inside .git is never checked out; main was not moved",
            ),
        }),
    }
}

fn journal_path(repo: &Repository) -> PathBuf {
    MemoryGitDir::new(repo.commondir()).main_move_journal()
}

/// Whether a move of `main` was left unfinished (its journal is there).
pub fn interrupted(git_dir: &Path) -> bool {
    MemoryGitDir::new(git_dir).main_move_journal().exists()
}

/// Write the journal whole or not at all (a temporary file renamed over).
fn write_journal(path: &Path, old: Oid, new: Oid) -> Result<(), WorktreeError> {
    let tmp = path.with_extension("tmp");
    let io = |source| WorktreeError::Io {
        path: path.to_path_buf(),
        source,
    };
    std::fs::write(&tmp, format!("{old} {new}\n")).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Whether `path` is the temporary file a checkout write of one of
/// `changed` makes beside it (see [`write_temp_target`]).
fn is_temp_of(path: &str, changed: &[String]) -> bool {
    write_temp_target(path).is_some_and(|target| changed.contains(&target))
}

/// The path a write's temporary file (the shape of
/// [`crate::agentfs::temp_name`], the one every writer of ours uses) was to
/// replace.
pub(crate) fn write_temp_target(path: &str) -> Option<String> {
    let (dir, name) = match path.rsplit_once('/') {
        Some((d, n)) => (format!("{d}/"), n),
        None => (String::new(), path),
    };
    is_temp_name(name).map(|target| format!("{dir}{target}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A commit on top of `main` whose tree adds `name` (a blob), made
    /// with `git mktree`, which checks no names.
    fn commit_with(repo: &Repository, name: &str) -> Oid {
        use std::io::Write;
        let git = |args: &[&str], input: &str| {
            let mut child = std::process::Command::new("git")
                .arg("--git-dir")
                .arg(repo.path())
                .args(args)
                .env("GIT_AUTHOR_NAME", "t")
                .env("GIT_AUTHOR_EMAIL", "t@t")
                .env("GIT_COMMITTER_NAME", "t")
                .env("GIT_COMMITTER_EMAIL", "t@t")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "git {args:?}");
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        };
        let blob = git(&["hash-object", "-w", "--stdin"], "gitdir: /etc\n");
        let mut listing = git(&["ls-tree", "main"], "");
        listing.push_str(&format!("\n100644 blob {blob}\t{name}\n"));
        let tree = git(&["mktree"], &listing);
        let commit = git(&["commit-tree", &tree, "-p", "main", "-m", "x"], "");
        Oid::from_str(&commit).unwrap()
    }

    #[test]
    fn a_move_touching_dot_git_is_refused_before_anything_moves() {
        let tmp = tempfile::tempdir().unwrap();
        let home = crate::paths::Home::at(tmp.path());
        let record = crate::store::create(&home, "mover", None).unwrap();
        let paths = home.agent(&record.id).unwrap();
        let repo = crate::memfs::repo::open_agent(&paths).unwrap();
        let pointer = paths.memory_dir().join(".git");
        let before = std::fs::read(&pointer).unwrap();
        for name in [".git", ".Git"] {
            let old = repo.refname_to_id(MAIN).unwrap();
            let new = commit_with(&repo, name);
            let e = advance_main(&repo, &paths.memory_dir(), old, new, "test").unwrap_err();
            // (Before the guard, the failed move's roll-back deleted it.)
            assert_eq!(std::fs::read(&pointer).ok(), Some(before.clone()));
            assert_eq!(repo.refname_to_id(MAIN).unwrap(), old);
            assert!(e.to_string().contains("never checked out"), "{e}");
            assert!(!journal_path(&repo).exists());
            // A journal naming such a move is dropped, not finished.
            write_journal(&journal_path(&repo), old, new).unwrap();
            recover(&repo, &paths.memory_dir()).unwrap();
            assert_eq!(repo.refname_to_id(MAIN).unwrap(), old);
            assert_eq!(std::fs::read(&pointer).unwrap(), before);
        }
    }

    #[test]
    fn temporary_files_of_our_writers_are_recognised() {
        assert_eq!(
            write_temp_target("d/.x.md.tmp-12-00000000000000ff"),
            Some("d/x.md".into())
        );
        assert_eq!(write_temp_target(".tmp-12-00000000000000ff"), None);
        assert_eq!(write_temp_target("x.md"), None);
        let changed = vec!["x/a.md".to_string()];
        assert!(is_temp_of("x/.a.md.tmp-9-00000000000000ff", &changed));
        assert!(!is_temp_of("x/.a.md.tmp-9-0f", &changed));
        assert!(!is_temp_of(".a.md.tmp-9-00000000000000ff", &changed));
        assert!(!is_temp_of("x/.b.md.tmp-9-00000000000000ff", &changed));
    }
}
