//! What a merge into `main` is made of, below the merge itself
//! (`merge_commit::merge_into_main`) and the move of `main` (`advance`): how
//! two trees' conflicts are resolved (both sides only appended lines), which
//! paths differ, and the main checkout and its index brought to a tree.
//! Callers hold the [`RepoLock`].
//!
//! [`RepoLock`]: crate::memfs::lock::RepoLock

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use git2::{Index, IndexEntry, IndexTime, Oid, Repository};

use super::error::{WorktreeError, git};
use super::outcome::ConflictSides;
use crate::agentfs::{Dir, FsError, Kind};
use crate::memfs::commit::replace_index_entries;
use crate::memfs::validate::TreeSnapshot;

#[cfg(test)]
thread_local! {
    /// Test-only fault injection, as a full or read-only disk would fail:
    /// the next checkout update fails after this many files were written.
    pub(crate) static FAIL_CHECKOUT_AFTER: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

const MODE_FILE: u32 = 0o100644;
const MODE_EXEC: u32 = 0o100755;

/// The paths an in-memory merge or cherry-pick left conflicted, sorted.
pub(crate) fn conflict_paths(index: &Index) -> Result<Vec<String>, git2::Error> {
    let mut paths: Vec<String> = index
        .conflicts()?
        .flatten()
        .filter_map(|c| c.our.or(c.their).or(c.ancestor))
        .map(|e| String::from_utf8_lossy(&e.path).into_owned())
        .collect();
    paths.sort();
    paths.dedup();
    Ok(paths)
}

/// A conflicted file with its three blob ids.
fn sides_of(c: &git2::IndexConflict) -> Option<ConflictSides> {
    let id = |e: &Option<IndexEntry>| e.as_ref().map(|e| e.id.to_string());
    let path = c
        .our
        .as_ref()
        .or(c.their.as_ref())
        .or(c.ancestor.as_ref())?;
    Some(ConflictSides {
        path: String::from_utf8_lossy(&path.path).into_owned(),
        base: id(&c.ancestor),
        ours: id(&c.our),
        theirs: id(&c.their),
    })
}

/// Resolve, in `index`, every conflicted file that both sides only
/// appended lines to: the merge base's text, then `main`'s new lines, then
/// the branch's (one side's lines already ending the other's are not
/// repeated). All or nothing: when any file is a true conflict, `index` is
/// left as it was and the true conflicts are returned (the merge goes to
/// repair), by path. The merged tree is validated afterwards like any
/// other.
pub(super) fn resolve_appends(
    repo: &Repository,
    index: &mut Index,
) -> Result<Vec<ConflictSides>, WorktreeError> {
    let entries: Vec<git2::IndexConflict> = index
        .conflicts()
        .map_err(git("list merge conflicts"))?
        .flatten()
        .collect();
    let mut resolved = Vec::new();
    let mut genuine = Vec::new();
    for c in entries {
        match union_of(repo, &c)? {
            Some(entry) => resolved.push(entry),
            None => genuine.extend(sides_of(&c)),
        }
    }
    if !genuine.is_empty() {
        genuine.sort_by(|a, b| a.path.cmp(&b.path));
        return Ok(genuine);
    }
    for entry in resolved {
        let path = Path::new(OsStr::from_bytes(&entry.path)).to_path_buf();
        index
            .conflict_remove(&path)
            .and_then(|()| index.add(&entry))
            .map_err(git("record a line-wise merge"))?;
    }
    Ok(Vec::new())
}

/// The stage-0 entry of a conflicted file whose two sides only appended to
/// their base (same mode on all three, a regular file), with the merged
/// text written as a blob; `None` for any other conflict.
fn union_of(
    repo: &Repository,
    c: &git2::IndexConflict,
) -> Result<Option<IndexEntry>, WorktreeError> {
    let (Some(base), Some(ours), Some(theirs)) = (&c.ancestor, &c.our, &c.their) else {
        return Ok(None);
    };
    let regular = |m: u32| m == MODE_FILE || m == MODE_EXEC;
    if !regular(ours.mode) || ours.mode != theirs.mode || ours.mode != base.mode {
        return Ok(None);
    }
    let read = |id: Oid| {
        repo.find_blob(id)
            .map(|b| b.content().to_vec())
            .map_err(git("read a conflicted blob"))
    };
    let Some(text) = append_union(&read(base.id)?, &read(ours.id)?, &read(theirs.id)?) else {
        return Ok(None);
    };
    let id = repo.blob(&text).map_err(git("write a line-wise merge"))?;
    let zero = IndexTime::new(0, 0);
    Ok(Some(IndexEntry {
        ctime: zero,
        mtime: zero,
        dev: 0,
        ino: 0,
        mode: ours.mode,
        uid: 0,
        gid: 0,
        file_size: u32::try_from(text.len()).unwrap_or(u32::MAX),
        id,
        flags: 0,
        flags_extended: 0,
        path: ours.path.clone(),
    }))
}

/// What `side` appended to `base`, when that is all it did: `base` is a
/// prefix of it and an unterminated last line of `base` was not extended.
fn appended<'a>(base: &[u8], side: &'a [u8]) -> Option<&'a [u8]> {
    let tail = side.strip_prefix(base)?;
    let whole_lines =
        base.is_empty() || base.ends_with(b"\n") || tail.is_empty() || tail.starts_with(b"\n");
    whole_lines.then_some(tail)
}

/// Whether the lines of `short` begin `long` (both appended tails).
fn begins_with_lines(long: &[u8], short: &[u8]) -> bool {
    long.strip_prefix(short).is_some_and(|rest| {
        short.is_empty() || short.ends_with(b"\n") || rest.is_empty() || rest.starts_with(b"\n")
    })
}

/// The line-wise union of two sides that only appended lines to `base`:
/// `ours` (main), then the lines `theirs` (the branch) appended. `None`
/// when either side did anything but append.
pub(crate) fn append_union(base: &[u8], ours: &[u8], theirs: &[u8]) -> Option<Vec<u8>> {
    let (a, b) = (appended(base, ours)?, appended(base, theirs)?);
    if begins_with_lines(b, a) {
        return Some(theirs.to_vec());
    }
    if begins_with_lines(a, b) {
        return Some(ours.to_vec());
    }
    // Both tails are non-empty here. Where `base` ended without a newline,
    // each tail starts with the one that ends it; `ours` has it already.
    let b = match b.strip_prefix(b"\n") {
        Some(rest) if !base.is_empty() && !base.ends_with(b"\n") => rest,
        _ => b,
    };
    let mut out = ours.to_vec();
    if !out.ends_with(b"\n") {
        out.push(b'\n');
    }
    out.extend_from_slice(b);
    Some(out)
}

/// Paths whose entry differs between two snapshots, in byte order.
pub(crate) fn diff_paths(old: &TreeSnapshot, new: &TreeSnapshot) -> Vec<String> {
    let mut out: Vec<String> = new
        .iter()
        .filter(|(p, e)| old.get(p) != Some(e))
        .map(|(p, _)| p.to_string())
        .chain(
            old.iter()
                .filter(|(p, _)| !new.contains(p))
                .map(|(p, _)| p.to_string()),
        )
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The snapshot of commit `id`'s tree.
pub(crate) fn snapshot_of(repo: &Repository, id: Oid) -> Result<TreeSnapshot, WorktreeError> {
    let tree = repo
        .find_commit(id)
        .and_then(|c| c.tree())
        .map_err(git("read a commit tree"))?;
    Ok(TreeSnapshot::from_tree(repo, &tree)?)
}

/// Whether `a` and `b` are the same path or one lies below the other.
pub(super) fn overlaps(a: &str, b: &str) -> bool {
    let below = |x: &str, y: &str| x.strip_prefix(y).is_some_and(|r| r.starts_with('/'));
    a == b || below(a, b) || below(b, a)
}

/// Bring the working tree `work_tree` and the on-disk index of `repo` to
/// `new` for exactly `changed` (deletions first, then writes), through
/// descriptors: no symlink in the child-writable tree is followed.
pub(crate) fn update_checkout(
    repo: &Repository,
    work_tree: &Path,
    new: &TreeSnapshot,
    changed: &[String],
) -> Result<(), WorktreeError> {
    let root = Dir::open(work_tree)?;
    for path in changed.iter().filter(|p| !new.contains(p)) {
        remove_path(&root, path)?;
    }
    let mut entries = Vec::new();
    for path in changed {
        let Some(entry) = new.get(path) else { continue };
        if !entry.is_blob() {
            // Gitlinks are never checked out.
            continue;
        }
        let blob = repo
            .find_blob(entry.oid)
            .map_err(git("read a merged blob"))?;
        #[cfg(test)]
        if let Some(n) = FAIL_CHECKOUT_AFTER.with(|f| f.get()) {
            if n == 0 {
                FAIL_CHECKOUT_AFTER.with(|f| f.set(None));
                return Err(WorktreeError::Io {
                    path: work_tree.join(path),
                    source: std::io::Error::from_raw_os_error(28),
                });
            }
            FAIL_CHECKOUT_AFTER.with(|f| f.set(Some(n - 1)));
        }
        let (parent, leaf) = make_parents(&root, path)?;
        // A directory standing where a file now goes (its files all deleted
        // above) is removed if empty; anything else there is an error.
        if let Some(st) = parent.stat_at(leaf)?
            && st.kind == Kind::Dir
        {
            parent.remove_dir(leaf)?;
        }
        if entry.is_symlink() {
            parent.replace_symlink(leaf, OsStr::from_bytes(blob.content()))?;
        } else {
            let perm = if entry.mode == MODE_EXEC {
                0o755
            } else {
                0o644
            };
            parent.replace_file(leaf, blob.content(), perm)?;
        }
        let st = parent.stat_at(leaf)?.ok_or_else(|| FsError::Changed {
            path: parent.path().join(leaf),
        })?;
        let time = |(s, ns): (i64, i64)| IndexTime::new(s as i32, ns as u32);
        entries.push(IndexEntry {
            ctime: time(st.ctime),
            mtime: time(st.mtime),
            dev: st.dev as u32,
            ino: st.ino as u32,
            mode: entry.mode,
            uid: st.uid,
            gid: st.gid,
            file_size: st.size as u32,
            id: entry.oid,
            flags: 0,
            flags_extended: 0,
            path: path.as_bytes().to_vec(),
        });
    }
    replace_index_entries(repo, changed, crate::memfs::commit::unstage, &entries)
        .map_err(git("update the memory index"))
}

/// Remove the file or symlink at `path` (if any) and then every parent
/// directory left empty.
fn remove_path(root: &Dir, path: &str) -> Result<(), WorktreeError> {
    let (parent, leaf) = match root.open_parent(OsStr::new(path)) {
        Ok(p) => p,
        Err(e) if e.is_not_found() || matches!(e, FsError::NotADirectory { .. }) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    match parent.stat_at(leaf)? {
        Some(st) if st.kind != Kind::Dir => parent.remove_file(leaf)?,
        _ => {}
    }
    // Parents from the deepest up; the first that is not empty stops it.
    let segments: Vec<&str> = path.split('/').collect();
    for n in (1..segments.len()).rev() {
        let dir = segments[..n].join("/");
        let Ok((p, name)) = root.open_parent(OsStr::new(&dir)) else {
            break;
        };
        if p.remove_dir(name).is_err() {
            break;
        }
    }
    Ok(())
}

/// Open (making as needed) the parent directories of `path` below `root`.
fn make_parents<'a>(root: &Dir, path: &'a str) -> Result<(Dir, &'a str), WorktreeError> {
    let mut segments: Vec<&str> = path.split('/').collect();
    let leaf = segments.pop().unwrap_or(path);
    let mut dir = root.try_clone()?;
    for seg in segments {
        // `create_dir` refuses a symlink standing there.
        dir = dir.create_dir(seg, 0o755)?;
    }
    Ok((dir, leaf))
}

#[cfg(test)]
mod unit {
    use super::{append_union, overlaps};

    fn union(base: &str, ours: &str, theirs: &str) -> Option<String> {
        append_union(base.as_bytes(), ours.as_bytes(), theirs.as_bytes())
            .map(|v| String::from_utf8(v).unwrap())
    }

    #[test]
    fn appends_are_merged_main_first() {
        let u = |b, o, t| union(b, o, t);
        assert_eq!(u("h\n", "h\na\n", "h\nb\n").as_deref(), Some("h\na\nb\n"));
        assert_eq!(u("", "a\n", "b\n").as_deref(), Some("a\nb\n"));
        // Unterminated lines: a newline is added where one is missing,
        // never a blank line.
        assert_eq!(u("h\n", "h\na", "h\nb\n").as_deref(), Some("h\na\nb\n"));
        assert_eq!(u("h", "h\na", "h\nb").as_deref(), Some("h\na\nb"));
        assert_eq!(u("h", "h\na\n", "h\nb").as_deref(), Some("h\na\nb"));
        // Lines one side added first and the other too are not repeated.
        assert_eq!(
            u("h\n", "h\na\n", "h\na\nb\n").as_deref(),
            Some("h\na\nb\n")
        );
        assert_eq!(
            u("h\n", "h\na\nb\n", "h\na\n").as_deref(),
            Some("h\na\nb\n")
        );
        // ... but only whole lines: `a` does not begin `ab`.
        assert_eq!(u("h\n", "h\na", "h\nab\n").as_deref(), Some("h\na\nab\n"));
    }

    #[test]
    fn anything_but_an_append_is_refused() {
        let u = |b, o, t| union(b, o, t);
        // An edit, a deletion, an insertion before the end.
        assert_eq!(u("h\nx\n", "h\ny\n", "h\nx\nb\n"), None);
        assert_eq!(u("h\nx\n", "h\n", "h\nx\nb\n"), None);
        assert_eq!(u("h\nx\n", "h\nx\nb\n", "h\na\nx\n"), None);
        // Text added to an unterminated last line changes that line.
        assert_eq!(u("h", "hx", "h\nb"), None);
        assert_eq!(u("h", "h\nb", "hx\n"), None);
    }

    #[test]
    fn overlap_is_by_path_component() {
        assert!(overlaps("a.md", "a.md"));
        assert!(overlaps("a/b.md", "a"));
        assert!(overlaps("a", "a/b.md"));
        assert!(!overlaps("ab.md", "a"));
        assert!(!overlaps("a.md", "b.md"));
    }
}
