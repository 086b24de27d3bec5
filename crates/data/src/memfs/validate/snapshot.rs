//! `TreeSnapshot`: a flat path → (mode, object id) listing of one tree.
//!
//! The validator judges a *snapshot* (the staged index, a commit's tree, a
//! revision), never the working tree, so it needs only this listing; blob
//! bytes are read lazily through the repository by object id. Paths are
//! kept in byte order, which is `git ls-files` order, so messages come out
//! in the order the hook prints them.

use std::collections::BTreeMap;

use git2::{Index, Oid, Repository, Tree};

use super::error::ValidateError;

/// File-type bits of a git mode.
const TYPE_MASK: u32 = 0o170000;
const TYPE_REGULAR: u32 = 0o100000;
const TYPE_SYMLINK: u32 = 0o120000;
const TYPE_GITLINK: u32 = 0o160000;
const TYPE_TREE: u32 = 0o040000;

/// One non-directory entry: git mode (`0o100644`, `0o100755`, `0o120000`
/// symlink, `0o160000` gitlink) and object id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub mode: u32,
    pub oid: Oid,
}

impl Entry {
    pub fn new(mode: u32, oid: Oid) -> Self {
        Entry { mode, oid }
    }
    /// Mode starts with `100` (what letta-code calls a regular file).
    pub fn is_regular(&self) -> bool {
        self.mode & TYPE_MASK == TYPE_REGULAR
    }
    pub fn is_symlink(&self) -> bool {
        self.mode & TYPE_MASK == TYPE_SYMLINK
    }
    /// Blob-backed entries (regular files and symlinks); gitlinks point at
    /// commits that are usually not in this repository.
    pub fn is_blob(&self) -> bool {
        self.is_regular() || self.is_symlink()
    }
    pub(crate) fn is_gitlink(&self) -> bool {
        self.mode & TYPE_MASK == TYPE_GITLINK
    }
}

/// The entries of one tree. UTF-8 paths are addressable by `&str`; paths
/// that are not valid UTF-8 are kept aside so the validator can reject them
/// with a message instead of failing to read the tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreeSnapshot {
    entries: BTreeMap<String, Entry>,
    non_utf8: BTreeMap<Vec<u8>, Entry>,
}

impl TreeSnapshot {
    /// An empty snapshot (e.g. the accepted tree before the first commit).
    pub fn new() -> Self {
        Self::default()
    }

    /// Flatten a git tree (recursively; directories are not entries).
    pub fn from_tree(repo: &Repository, tree: &Tree<'_>) -> Result<Self, ValidateError> {
        let mut snapshot = TreeSnapshot::new();
        snapshot.add_tree(repo, tree, &mut Vec::new())?;
        Ok(snapshot)
    }

    /// The staged snapshot of an index. Unmerged (conflict-stage) entries are
    /// an error: there is no single candidate content to judge.
    pub fn from_index(index: &Index) -> Result<Self, ValidateError> {
        let mut snapshot = TreeSnapshot::new();
        for entry in index.iter() {
            // GIT_INDEX_ENTRY_STAGEMASK = 0x3000.
            if (entry.flags >> 12) & 0x3 != 0 {
                return Err(ValidateError::Unmerged {
                    path: display_path(&entry.path),
                });
            }
            snapshot.insert_bytes(&entry.path, Entry::new(entry.mode, entry.id));
        }
        Ok(snapshot)
    }

    /// The tree of any revision (`HEAD`, a commit id, `main~2`, a tree id).
    pub fn from_revision(repo: &Repository, rev: &str) -> Result<Self, ValidateError> {
        let (_, tree) = crate::memfs::revision::resolve_tree(repo, rev)?;
        Self::from_tree(repo, &tree)
    }

    /// The `HEAD` tree, or `None` on an unborn branch (first commit).
    pub fn from_head(repo: &Repository) -> Result<Option<Self>, ValidateError> {
        let head = match repo.head() {
            Ok(head) => head,
            Err(e)
                if e.code() == git2::ErrorCode::UnbornBranch
                    || e.code() == git2::ErrorCode::NotFound =>
            {
                return Ok(None);
            }
            Err(e) => return Err(ValidateError::Snapshot(e)),
        };
        let tree = head.peel_to_tree().map_err(ValidateError::Snapshot)?;
        Self::from_tree(repo, &tree).map(Some)
    }

    /// Add or replace one entry by raw path bytes.
    pub(crate) fn insert_bytes(&mut self, path: &[u8], entry: Entry) {
        match std::str::from_utf8(path) {
            Ok(p) => {
                self.entries.insert(p.to_string(), entry);
            }
            Err(_) => {
                self.non_utf8.insert(path.to_vec(), entry);
            }
        }
    }

    /// Add or replace one entry.
    pub fn insert(&mut self, path: &str, entry: Entry) {
        self.entries.insert(path.to_string(), entry);
    }

    pub fn get(&self, path: &str) -> Option<&Entry> {
        self.entries.get(path)
    }

    pub fn contains(&self, path: &str) -> bool {
        self.entries.contains_key(path)
    }

    /// UTF-8 entries in byte order of their paths.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.entries.iter().map(|(p, e)| (p.as_str(), e))
    }

    /// Entries whose path is not valid UTF-8 (raw bytes, byte order).
    pub(crate) fn non_utf8_paths(&self) -> impl Iterator<Item = (&[u8], &Entry)> {
        self.non_utf8.iter().map(|(p, e)| (p.as_slice(), e))
    }

    /// Number of entries, UTF-8 or not.
    pub fn len(&self) -> usize {
        self.entries.len() + self.non_utf8.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn add_tree(
        &mut self,
        repo: &Repository,
        tree: &Tree<'_>,
        prefix: &mut Vec<u8>,
    ) -> Result<(), ValidateError> {
        for item in tree.iter() {
            let mode = u32::try_from(item.filemode()).unwrap_or(0);
            let start = prefix.len();
            prefix.extend_from_slice(item.name_bytes());
            if mode & TYPE_MASK == TYPE_TREE {
                let sub = repo.find_tree(item.id()).map_err(ValidateError::Snapshot)?;
                prefix.push(b'/');
                self.add_tree(repo, &sub, prefix)?;
            } else {
                self.insert_bytes(prefix, Entry::new(mode, item.id()));
            }
            prefix.truncate(start);
        }
        Ok(())
    }
}

/// A path for messages: UTF-8 as is, other bytes as `\xNN` escapes, so the
/// text shows exactly which bytes are wrong.
pub fn display_path(path: &[u8]) -> String {
    let mut out = String::new();
    for chunk in path.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}
