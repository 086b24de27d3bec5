//! `memory.status` computed without letting libgit2 open working-tree files.
//!
//! libgit2's status opens every working-tree file (and every `.gitignore`)
//! by path: in a tree a confined child writes, a FIFO at `.gitignore` blocks
//! the supervisor's thread forever, and a symlink swapped in is followed.
//! Here the working tree is walked through descriptors ([`crate::agentfs`]):
//! regular files are read (capped) and hashed, symlinks are hashed from
//! their target read with `readlinkat`, and anything else (FIFO, socket,
//! device, a file over the cap, an entry that changed under the walk) is
//! reported dirty without being read. The result is compared with `HEAD`'s
//! tree and the index, which live in the git directory the child cannot
//! write.
//!
//! A path is dirty when the index differs from `HEAD` (staged: new,
//! modified, deleted, mode change), when the working tree differs from the
//! index (modified, deleted, type change) or when it is untracked
//! (untracked directories are recursed, as `git status -uall`). Unlike
//! `git status`, `.gitignore` files are not applied: they are the child's
//! files, and reading them is what this module avoids. `.git` entries are
//! skipped at every level, as commits skip them.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use git2::{ObjectType, Oid, Repository};

use super::validate::MAX_FILE_BYTES;
use crate::agentfs::{Dir, FsError, Kind};

/// Entries walked at most; a larger tree is an error, not a long stall.
pub const MAX_STATUS_ENTRIES: usize = 20_000;
/// Bytes hashed at most over the whole tree.
pub const MAX_STATUS_BYTES: u64 = 64 << 20;
/// Directory levels descended at most (one descriptor held per level).
pub const MAX_STATUS_DEPTH: usize = 64;

const MODE_FILE: u32 = 0o100644;
const MODE_EXEC: u32 = 0o100755;
const MODE_LINK: u32 = 0o120000;
const MODE_GITLINK: u32 = 0o160000;

/// Why no status could be given.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("{0}: the repository has no working tree")]
    Bare(PathBuf),
    #[error("cannot {what}: {source}")]
    Git {
        what: &'static str,
        source: git2::Error,
    },
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error(
        "the memory working tree holds more than {max} bytes of files; refusing to hash it all"
    )]
    TooManyBytes { max: u64 },
}

fn git(what: &'static str) -> impl FnOnce(git2::Error) -> StatusError {
    move |source| StatusError::Git { what, source }
}

/// The answer to `memory.status`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WorktreeStatus {
    /// The commit `HEAD` names, if any.
    pub head: Option<String>,
    /// Dirty paths, sorted by bytes (non-UTF-8 bytes shown lossily).
    pub dirty: Vec<String>,
    /// Each dirty path with how it differs, in the same order.
    pub changes: Vec<Change>,
}

/// One uncommitted path and how it differs from `HEAD`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Change {
    pub path: String,
    /// `modified`, `added` (staged, not in `HEAD`), `deleted` or
    /// `untracked` (neither in `HEAD` nor staged).
    pub kind: &'static str,
}

/// What the walk found at a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// A blob: its git mode and id.
    Blob(u32, Oid),
    /// Something not read (FIFO, device, over the cap, changed): dirty.
    Unread,
    /// A directory standing where the index has a gitlink: not looked into.
    Gitlink,
}

/// `memory.status` of `repo` (a repository with a working tree).
pub fn worktree_status(repo: &Repository) -> Result<WorktreeStatus, StatusError> {
    let Scan {
        head_commit,
        head,
        index,
        mut dirty,
        found,
    } = scan(repo)?;

    // Staged: index against HEAD.
    for p in head.keys().chain(index.keys()) {
        if head.get(p) != index.get(p) {
            dirty.insert(p.clone());
        }
    }
    // Working tree against the index, and untracked paths.
    for (p, (mode, id)) in &index {
        match found.get(p) {
            Some(Found::Blob(m, i)) if m == mode && i == id => {}
            Some(Found::Gitlink) if *mode == MODE_GITLINK => {}
            _ => {
                dirty.insert(p.clone());
            }
        }
    }
    for p in found.keys() {
        if !index.contains_key(p) {
            dirty.insert(p.clone());
        }
    }

    let changes: Vec<Change> = dirty
        .iter()
        .map(|p| {
            let (in_head, staged, on_disk) = (
                head.contains_key(p),
                index.contains_key(p),
                found.contains_key(p),
            );
            let kind = match (in_head, staged, on_disk) {
                (true, _, false) | (false, true, false) => "deleted",
                (false, false, _) => "untracked",
                (false, true, true) => "added",
                (true, _, true) => "modified",
            };
            Change {
                path: String::from_utf8_lossy(p).into_owned(),
                kind,
            }
        })
        .collect();
    Ok(WorktreeStatus {
        head: head_commit.map(|c| c.to_string()),
        dirty: changes.iter().map(|c| c.path.clone()).collect(),
        changes,
    })
}

/// HEAD's entries, the index's, and what the working tree holds.
struct Scan {
    head_commit: Option<Oid>,
    head: BTreeMap<Vec<u8>, (u32, Oid)>,
    index: BTreeMap<Vec<u8>, (u32, Oid)>,
    /// Paths with conflict stages in the index.
    dirty: BTreeSet<Vec<u8>>,
    found: BTreeMap<Vec<u8>, Found>,
}

fn scan(repo: &Repository) -> Result<Scan, StatusError> {
    let work_tree = repo
        .workdir()
        .ok_or_else(|| StatusError::Bare(repo.path().to_path_buf()))?
        .to_path_buf();

    let head_commit = repo.head().ok().and_then(|h| h.peel_to_commit().ok());
    let mut head: BTreeMap<Vec<u8>, (u32, Oid)> = BTreeMap::new();
    if let Some(c) = &head_commit {
        let tree = c.tree().map_err(git("read the HEAD tree"))?;
        tree_entries(repo, &tree, &[], &mut head)?;
    }

    let mut dirty: BTreeSet<Vec<u8>> = BTreeSet::new();
    let mut index: BTreeMap<Vec<u8>, (u32, Oid)> = BTreeMap::new();
    let mut cached: BTreeMap<Vec<u8>, Cached> = BTreeMap::new();
    let idx = repo.index().map_err(git("read the index"))?;
    for e in idx.iter() {
        // Conflict stages (bits 12-13 of the flags) are dirty by nature.
        if (e.flags >> 12) & 0x3 != 0 {
            dirty.insert(e.path.clone());
            continue;
        }
        index.insert(e.path.clone(), (e.mode, e.id));
        cached.insert(
            e.path.clone(),
            Cached {
                ctime: (e.ctime.seconds(), e.ctime.nanoseconds()),
                mtime: (e.mtime.seconds(), e.mtime.nanoseconds()),
                ino: e.ino,
                size: e.file_size,
                id: e.id,
            },
        );
    }
    // Git's "racy" rule: a stat match proves nothing for a file changed in
    // the same instant the index was written, so only entries older than
    // the index file may be trusted without reading. The index is in the
    // git directory, which children cannot write.
    let index_written = std::fs::metadata(repo.path().join("index")).ok().map(|m| {
        use std::os::unix::fs::MetadataExt;
        (m.mtime(), m.mtime_nsec())
    });

    let gitlinks: BTreeSet<Vec<u8>> = index
        .iter()
        .filter(|(_, (mode, _))| *mode == MODE_GITLINK)
        .map(|(p, _)| p.clone())
        .collect();
    let mut walk = Walk {
        found: BTreeMap::new(),
        gitlinks: &gitlinks,
        cached: &cached,
        index_written,
        entries: MAX_STATUS_ENTRIES,
        bytes: MAX_STATUS_BYTES,
    };
    let root = Dir::open(&work_tree)?;
    walk.dir(&root, &[], 0)?;
    Ok(Scan {
        head_commit: head_commit.map(|c| c.id()),
        head,
        index,
        dirty,
        found: walk.found,
    })
}

/// A working-tree path (bytes) and the blob found there, `None` when not read.
pub(crate) type CheckoutBlobs = BTreeMap<Vec<u8>, Option<(u32, Oid)>>;

/// What the working tree of `repo` holds, path by path (walked as
/// [`worktree_status`] does): a blob's mode and id, or `None` for an entry
/// that was not read (FIFO, device, over the cap, a gitlink directory).
pub(crate) fn checkout_blobs(repo: &Repository) -> Result<CheckoutBlobs, StatusError> {
    Ok(scan(repo)?
        .found
        .into_iter()
        .map(|(p, f)| {
            let blob = match f {
                Found::Blob(mode, id) => Some((mode, id)),
                Found::Unread | Found::Gitlink => None,
            };
            (p, blob)
        })
        .collect())
}

/// The stat data the index keeps for an entry (git's 32-bit fields).
struct Cached {
    ctime: (i32, u32),
    mtime: (i32, u32),
    ino: u32,
    size: u32,
    id: Oid,
}

struct Walk<'a> {
    found: BTreeMap<Vec<u8>, Found>,
    gitlinks: &'a BTreeSet<Vec<u8>>,
    cached: &'a BTreeMap<Vec<u8>, Cached>,
    /// `mtime` of the index file, when known.
    index_written: Option<(i64, i64)>,
    /// Entries left.
    entries: usize,
    /// Bytes left to hash.
    bytes: u64,
}

impl Walk<'_> {
    /// Record everything below `dir`, whose repository path is `prefix`.
    fn dir(&mut self, dir: &Dir, prefix: &[u8], depth: usize) -> Result<(), StatusError> {
        for name in dir.list(self.entries)? {
            self.entries = self.entries.checked_sub(1).ok_or_else(|| {
                StatusError::Fs(FsError::TooManyEntries {
                    path: dir.path().to_path_buf(),
                    max: MAX_STATUS_ENTRIES,
                })
            })?;
            if name.as_bytes().eq_ignore_ascii_case(b".git") {
                continue;
            }
            let mut path = prefix.to_vec();
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(name.as_bytes());
            // Gone since the listing: absent, like a deleted file.
            let Some(st) = dir.stat_at(&name)? else {
                continue;
            };
            let cached = match st.kind {
                Kind::File => self.unchanged(&path, &st),
                _ => None,
            };
            let found = match st.kind {
                // Unchanged since the index recorded it (ctime included,
                // which no one can set): the index's id, nothing read. A
                // child faking this only misleads its own status.
                Kind::File if st.size <= MAX_FILE_BYTES && cached.is_some() => {
                    cached.map_or(Found::Unread, |id| Found::Blob(file_mode(st.perm), id))
                }
                Kind::Dir if self.gitlinks.contains(&path) => Found::Gitlink,
                Kind::Dir if depth + 1 >= MAX_STATUS_DEPTH => Found::Unread,
                Kind::Dir => match dir.open_dir(&name) {
                    Ok(sub) => {
                        self.dir(&sub, &path, depth + 1)?;
                        continue;
                    }
                    // Swapped for a symlink or a file under us: dirty.
                    Err(_) => Found::Unread,
                },
                Kind::Symlink => match dir.read_link(&name) {
                    Ok(target) => Found::Blob(MODE_LINK, hash(target.as_bytes())?),
                    Err(_) => Found::Unread,
                },
                Kind::File if st.size > MAX_FILE_BYTES => Found::Unread,
                Kind::File => match dir.read_file_capped(&name, MAX_FILE_BYTES) {
                    Ok((bytes, st)) => {
                        self.bytes = self.bytes.checked_sub(bytes.len() as u64).ok_or(
                            StatusError::TooManyBytes {
                                max: MAX_STATUS_BYTES,
                            },
                        )?;
                        Found::Blob(file_mode(st.perm), hash(&bytes)?)
                    }
                    // A FIFO or symlink raced in, grown past the cap: dirty,
                    // never read.
                    Err(_) => Found::Unread,
                },
                _ => Found::Unread,
            };
            self.found.insert(path, found);
        }
        Ok(())
    }
}

impl Walk<'_> {
    /// The index's blob id for `path` when `st` matches its stat data and
    /// the entry is older than the index file.
    fn unchanged(&self, path: &[u8], st: &crate::agentfs::Stat) -> Option<Oid> {
        let c = self.cached.get(path)?;
        // The index stores these truncated to 32 bits, as git does.
        let t = |(s, ns): (i64, i64)| (s as i32, ns as u32);
        let same = c.ctime == t(st.ctime)
            && c.mtime == t(st.mtime)
            && c.ino == st.ino as u32
            && c.size == st.size as u32;
        let written = self.index_written?;
        (same && st.mtime < written).then_some(c.id)
    }
}

fn file_mode(perm: u32) -> u32 {
    if perm & 0o111 != 0 {
        MODE_EXEC
    } else {
        MODE_FILE
    }
}

/// Every non-tree entry of `tree`, by full path in bytes (git2's `walk`
/// gives up on a non-UTF-8 directory name; this does not).
fn tree_entries(
    repo: &Repository,
    tree: &git2::Tree<'_>,
    prefix: &[u8],
    out: &mut BTreeMap<Vec<u8>, (u32, Oid)>,
) -> Result<(), StatusError> {
    for entry in tree.iter() {
        let mut path = prefix.to_vec();
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(entry.name_bytes());
        if entry.kind() == Some(ObjectType::Tree) {
            let sub = repo
                .find_tree(entry.id())
                .map_err(git("read a HEAD subtree"))?;
            tree_entries(repo, &sub, &path, out)?;
        } else {
            out.insert(path, (entry.filemode() as u32, entry.id()));
        }
    }
    Ok(())
}

fn hash(bytes: &[u8]) -> Result<Oid, StatusError> {
    Oid::hash_object(ObjectType::Blob, bytes).map_err(git("hash a blob"))
}
