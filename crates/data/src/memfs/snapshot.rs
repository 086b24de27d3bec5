//! Read-only access to the committed `HEAD` tree of a memory repository.
//!
//! The compiler, `memory show` and `memory tree` read only what is committed:
//! never the working tree, never the index, and never through a git
//! subprocess. Blobs are read by object id, so a path's spelling (non-ASCII,
//! quotes, control characters) never decides whether it can be read.

use std::path::PathBuf;

use git2::{ObjectType, Oid, Repository, Tree};

use super::repo::RepoError;

/// One blob entry of the HEAD tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Repository-relative path with `/` separators (lossily decoded when the
    /// stored name is not UTF-8).
    pub path: String,
    /// Git file mode (`0o100644`, `0o100755`, `0o120000` for a symlink).
    pub mode: i32,
    pub oid: Oid,
}

impl Entry {
    pub fn is_symlink(&self) -> bool {
        self.mode == 0o120000
    }
}

/// The committed HEAD of a repository.
pub struct Head<'r> {
    repo: &'r Repository,
    workdir: PathBuf,
    revision: Oid,
    tree: Tree<'r>,
}

/// HEAD of `repo`, or `None` when the repository has no commit yet.
pub fn read_head(repo: &Repository) -> Result<Option<Head<'_>>, RepoError> {
    let location = repo.workdir().unwrap_or_else(|| repo.path()).to_path_buf();
    let head = match repo.head() {
        Ok(h) => h,
        Err(e)
            if matches!(
                e.code(),
                git2::ErrorCode::UnbornBranch | git2::ErrorCode::NotFound
            ) =>
        {
            return Ok(None);
        }
        Err(e) => return Err(RepoError::git(&location, e)),
    };
    let unreadable = |what: &str, source| RepoError::UnreadableObject {
        path: location.clone(),
        what: what.to_string(),
        source,
    };
    let commit = head
        .peel_to_commit()
        .map_err(|e| unreadable("HEAD commit", e))?;
    commit_snapshot(repo, commit, location).map(Some)
}

/// The tree of commit `id`, read the same way as HEAD's (the last valid
/// revision when HEAD's tree fails the validator).
pub(crate) fn read_commit(repo: &Repository, id: Oid) -> Result<Head<'_>, RepoError> {
    let location = repo.workdir().unwrap_or_else(|| repo.path()).to_path_buf();
    let commit = repo
        .find_commit(id)
        .map_err(|e| RepoError::UnreadableObject {
            path: location.clone(),
            what: format!("commit {id}"),
            source: e,
        })?;
    commit_snapshot(repo, commit, location)
}

fn commit_snapshot<'r>(
    repo: &'r Repository,
    commit: git2::Commit<'r>,
    location: PathBuf,
) -> Result<Head<'r>, RepoError> {
    let unreadable = |what: &str, source| RepoError::UnreadableObject {
        path: location.clone(),
        what: what.to_string(),
        source,
    };
    let tree = commit
        .tree()
        .map_err(|e| unreadable(&format!("tree of {}", commit.id()), e))?;
    Ok(Head {
        repo,
        revision: commit.id(),
        tree,
        workdir: location,
    })
}

impl<'r> Head<'r> {
    /// The commit id (what `git rev-parse --verify HEAD` prints).
    pub fn revision(&self) -> Oid {
        self.revision
    }

    /// Every blob in the tree, recursively, in `git ls-tree -r` order.
    /// Submodule entries (gitlinks) have no blob here and are left out.
    pub fn all_blobs(&self) -> Result<Vec<Entry>, RepoError> {
        let mut out = Vec::new();
        self.walk(&self.tree, "", &mut out)?;
        Ok(out)
    }

    // Our own recursion (not git2's walk) so that non-UTF-8 names are decoded
    // lossily instead of aborting the walk.
    fn walk(&self, tree: &Tree<'_>, prefix: &str, out: &mut Vec<Entry>) -> Result<(), RepoError> {
        for entry in tree.iter() {
            let path = format!("{prefix}{}", String::from_utf8_lossy(entry.name_bytes()));
            match entry.kind() {
                Some(ObjectType::Blob) => out.push(Entry {
                    path,
                    mode: entry.filemode(),
                    oid: entry.id(),
                }),
                Some(ObjectType::Tree) => {
                    let sub = self
                        .repo
                        .find_tree(entry.id())
                        .map_err(|e| self.unreadable(&format!("tree {path}/"), e))?;
                    self.walk(&sub, &format!("{path}/"), out)?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Blobs directly in the root tree, plus the `MEMORY.md` blob of every
    /// first-level directory that has one. This is all memfs-v2 compilation
    /// needs, and its cost does not grow with the number of nested files.
    pub(crate) fn root_and_child_indexes(&self) -> Result<(Vec<Entry>, Vec<Entry>), RepoError> {
        let mut root = Vec::new();
        let mut indexes = Vec::new();
        for entry in self.tree.iter() {
            let name = String::from_utf8_lossy(entry.name_bytes()).into_owned();
            match entry.kind() {
                Some(ObjectType::Blob) => root.push(Entry {
                    path: name,
                    mode: entry.filemode(),
                    oid: entry.id(),
                }),
                Some(ObjectType::Tree) => {
                    let sub = self
                        .repo
                        .find_tree(entry.id())
                        .map_err(|e| self.unreadable(&format!("tree {name}/"), e))?;
                    if let Some(idx) = sub.get_name("MEMORY.md")
                        && idx.kind() == Some(ObjectType::Blob)
                    {
                        indexes.push(Entry {
                            path: format!("{name}/MEMORY.md"),
                            mode: idx.filemode(),
                            oid: idx.id(),
                        });
                    }
                }
                _ => {}
            }
        }
        Ok((root, indexes))
    }

    /// Whether the root tree has a blob named exactly `MEMORY.md`.
    pub fn has_root_index(&self) -> bool {
        self.tree
            .get_name("MEMORY.md")
            .is_some_and(|e| e.kind() == Some(ObjectType::Blob))
    }

    /// The blob at `path` (`/`-separated), if the tree has one there.
    pub fn find(&self, path: &str) -> Result<Option<Entry>, RepoError> {
        match self.tree.get_path(std::path::Path::new(path)) {
            Ok(e) if e.kind() == Some(ObjectType::Blob) => Ok(Some(Entry {
                path: path.to_string(),
                mode: e.filemode(),
                oid: e.id(),
            })),
            Ok(_) => Ok(None),
            Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
            Err(e) => Err(self.unreadable(path, e)),
        }
    }

    /// The raw bytes of a blob.
    pub fn read_bytes(&self, entry: &Entry) -> Result<Vec<u8>, RepoError> {
        let blob = self
            .repo
            .find_blob(entry.oid)
            .map_err(|e| self.unreadable(&format!("{} ({})", entry.path, entry.oid), e))?;
        Ok(blob.content().to_vec())
    }

    /// A blob as text; invalid UTF-8 becomes U+FFFD (as letta-code's `git
    /// show` decoding does).
    pub(crate) fn read_text(&self, entry: &Entry) -> Result<String, RepoError> {
        let bytes = self.read_bytes(entry)?;
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    fn unreadable(&self, what: &str, source: git2::Error) -> RepoError {
        RepoError::UnreadableObject {
            path: self.workdir.clone(),
            what: what.to_string(),
            source,
        }
    }
}
