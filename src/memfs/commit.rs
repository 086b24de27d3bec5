//! Validated, path-limited commits: the only way mini-letta writes history.
//!
//! [`commit_paths`] has `git commit -- <paths>` semantics (book chapter 6):
//! the named paths are taken from the working tree (added, modified or
//! deleted) into an *in-memory* index built from `HEAD`'s tree, so nothing
//! else that happens to be staged rides along. The resulting tree is judged
//! by the validator against `HEAD`; only a valid tree becomes a commit, and
//! only then are the named paths updated in the on-disk index. On any
//! failure the on-disk index and the working tree are exactly as before, and
//! a refusal carries the validator's [`Report`] (its block is what agents and
//! people see, the same text the `pre-commit` hook prints).
//!
//! Writers are serialized by [`RepoLock`], held only around reading `HEAD`,
//! building the tree, committing and updating the index.
//!
//! Path rules (chapter 4) are checked before anything is read: relative, no
//! `.`/`..`/empty segments, nothing inside `.git`, no component of the
//! working-tree path that is a symlink, no symlink pointing outside the
//! memory directory, and no path that differs only in case from another path
//! of the tree.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use git2::{Index, IndexEntry, IndexTime, Oid, Repository, Signature};

use super::hook::{self, EnsureMode, HookError};
use super::lock::{LockError, RepoLock};
use super::pathrules::{self, PathRuleError};
use super::validate::{
    Report, TreeSnapshot, ValidateError, ValidateOptions, constraints_update_approved_from_env,
    validate,
};

/// Git modes of the entries we write.
const MODE_FILE: u32 = 0o100644;
const MODE_EXEC: u32 = 0o100755;
const MODE_LINK: u32 = 0o120000;

/// Why a commit was not made.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("no paths to commit")]
    NoPaths,
    #[error(transparent)]
    Path(#[from] PathRuleError),
    #[error("{0:?}: memory paths must not name the .git directory")]
    GitDirPath(String),
    #[error(
        "{path:?}: {through:?} is a symbolic link; memory paths must not pass through symlinks"
    )]
    ThroughSymlink { path: String, through: String },
    #[error("{path:?}: symbolic link points outside the memory directory")]
    SymlinkOutside { path: String },
    #[error("{path:?}: {through:?} is not a directory")]
    NotADirectory { path: String, through: String },
    #[error("{path:?}: differs only in case from existing path {existing:?}")]
    CaseCollision { path: String, existing: String },
    #[error("{0:?}: no such file in the working tree or at HEAD")]
    NoSuchPath(String),
    #[error("{0:?}: not a regular file, directory or symlink")]
    NotAFile(String),
    #[error("{0}: the repository has no working tree")]
    Bare(PathBuf),
    /// The validator refused the tree. Display is its block.
    #[error("{}", .0.render_block().trim_end())]
    Rejected(Box<Report>),
    #[error("{}", .0.render().trim_end())]
    Validate(#[from] ValidateError),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Hook(#[from] HookError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot {what}: {source}")]
    Git {
        what: &'static str,
        source: git2::Error,
    },
}

impl CommitError {
    /// The validator's report when this is a refusal.
    pub fn report(&self) -> Option<&Report> {
        match self {
            CommitError::Rejected(r) => Some(r),
            _ => None,
        }
    }
}

fn git(what: &'static str) -> impl FnOnce(git2::Error) -> CommitError {
    move |source| CommitError::Git { what, source }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CommitError + '_ {
    move |source| CommitError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// How to commit.
#[derive(Debug, Clone)]
pub struct CommitOptions {
    pub validate: ValidateOptions,
    /// Refresh the `pre-commit` hook for this binary first (writers started
    /// from the CLI pass their own executable; library users pass `None`).
    pub hook_binary: Option<PathBuf>,
}

impl CommitOptions {
    /// The repository's recorded layout policy, mini-letta's validator
    /// defaults, and the given approval of a `.memfs.config.json` change.
    pub fn for_repo(repo: &Repository, constraints_update_approved: bool) -> Self {
        let policy = hook::read_layout_policy(hook::common_git_dir(repo));
        CommitOptions {
            validate: ValidateOptions::new(policy).with_approval(constraints_update_approved),
            hook_binary: None,
        }
    }

    /// [`Self::for_repo`] with approval from `MINI_LETTA_CONSTRAINTS_UPDATE`
    /// and the hook refreshed for this process when it is the mini-letta
    /// binary.
    pub fn from_env(repo: &Repository) -> Self {
        CommitOptions {
            hook_binary: hook::self_binary(),
            ..Self::for_repo(repo, constraints_update_approved_from_env())
        }
    }
}

/// A successful call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitOutcome {
    /// The new commit, or `None` when the paths were unchanged.
    pub commit: Option<Oid>,
    /// Paths whose entry differs from `HEAD`'s, in byte order.
    pub changed: Vec<String>,
}

/// Check a repository-relative path before reading or writing it: the
/// chapter 4 rules plus the filesystem checks (no symlinked component, no
/// symlink pointing out). Case collisions need the tree; see
/// [`check_case_collision`].
pub fn check_path(work_tree: &Path, path: &str) -> Result<String, CommitError> {
    let path = pathrules::check_relative(path)?;
    if path.split('/').any(|s| s.eq_ignore_ascii_case(".git")) {
        return Err(CommitError::GitDirPath(path));
    }
    let segments: Vec<&str> = path.split('/').collect();
    let mut here = work_tree.to_path_buf();
    for (i, seg) in segments.iter().enumerate() {
        here.push(seg);
        let last = i + 1 == segments.len();
        let meta = match fs::symlink_metadata(&here) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
            Err(e) => return Err(io(&here)(e)),
        };
        let shown = || segments[..=i].join("/");
        if meta.file_type().is_symlink() {
            if !last {
                return Err(CommitError::ThroughSymlink {
                    through: shown(),
                    path,
                });
            }
            let target = fs::read_link(&here).map_err(io(&here))?;
            if !link_stays_inside(&segments[..i], &target) {
                return Err(CommitError::SymlinkOutside { path });
            }
        } else if !last && !meta.is_dir() {
            return Err(CommitError::NotADirectory {
                through: shown(),
                path,
            });
        }
    }
    Ok(path)
}

/// Whether a relative symlink in directory `dir` (segments below the memory
/// root) resolves, lexically, to a path below the root.
fn link_stays_inside(dir: &[&str], target: &Path) -> bool {
    let mut depth: Vec<&[u8]> = dir.iter().map(|s| s.as_bytes()).collect();
    for c in target.components() {
        match c {
            Component::Normal(s) => depth.push(s.as_bytes()),
            Component::CurDir => {}
            Component::ParentDir => {
                if depth.pop().is_none() {
                    return false;
                }
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    // A link to the root itself or into the git directory pointer is out.
    depth
        .first()
        .is_some_and(|first| !first.eq_ignore_ascii_case(b".git"))
}

/// Every path in `paths` compared case-insensitively (by `to_lowercase`, per
/// segment prefix) against `existing`; the first collision with a different
/// spelling is an error.
pub fn check_case_collision<'a>(
    existing: impl IntoIterator<Item = &'a str>,
    paths: &[String],
) -> Result<(), CommitError> {
    let mut seen: HashMap<String, String> = HashMap::new();
    for p in existing {
        for prefix in prefixes(p) {
            seen.entry(prefix.to_lowercase())
                .or_insert_with(|| prefix.to_string());
        }
    }
    for p in paths {
        for prefix in prefixes(p) {
            if let Some(other) = seen.get(&prefix.to_lowercase())
                && other != prefix
            {
                return Err(CommitError::CaseCollision {
                    path: p.clone(),
                    existing: other.clone(),
                });
            }
        }
    }
    Ok(())
}

/// `a`, `a/b`, `a/b/c.md` for `a/b/c.md`.
fn prefixes(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/')
        .map(move |(i, _)| &path[..i])
        .chain(std::iter::once(path))
}

/// Commit exactly `paths` (files or directories, as in the working tree) on
/// top of `HEAD` if the validator accepts the resulting tree.
pub fn commit_paths(
    repo: &Repository,
    paths: &[String],
    message: &str,
    author: &Signature<'_>,
    opts: &CommitOptions,
) -> Result<CommitOutcome, CommitError> {
    let work_tree = repo
        .workdir()
        .ok_or_else(|| CommitError::Bare(repo.path().to_path_buf()))?
        .to_path_buf();
    let specs: BTreeSet<String> = paths
        .iter()
        .filter(|p| !p.trim().is_empty())
        .map(|p| check_path(&work_tree, p))
        .collect::<Result<_, _>>()?;
    if specs.is_empty() {
        return Err(CommitError::NoPaths);
    }
    let git_dir = hook::common_git_dir(repo).to_path_buf();
    if let Some(bin) = &opts.hook_binary {
        hook::ensure(&git_dir, bin, EnsureMode::InstallOrRefresh)?;
    }

    let _lock = RepoLock::acquire(&git_dir)?;

    let head_commit = match repo.head() {
        Ok(h) => Some(h.peel_to_commit().map_err(git("read the HEAD commit"))?),
        Err(e)
            if matches!(
                e.code(),
                git2::ErrorCode::UnbornBranch | git2::ErrorCode::NotFound
            ) =>
        {
            None
        }
        Err(e) => return Err(git("read HEAD")(e)),
    };
    let head_tree = match &head_commit {
        Some(c) => Some(c.tree().map_err(git("read the HEAD tree"))?),
        None => None,
    };
    let mut index = Index::new().map_err(git("create an in-memory index"))?;
    if let Some(t) = &head_tree {
        index.read_tree(t).map_err(git("read the HEAD tree"))?;
    }

    // Take every named path from the working tree.
    let mut staged: Vec<IndexEntry> = Vec::new();
    for spec in &specs {
        let known = index.get_path(Path::new(spec), 0).is_some()
            || index.find_prefix(format!("{spec}/")).is_ok();
        remove_from_index(&mut index, spec).map_err(git("update the in-memory index"))?;
        let found = collect(repo, &work_tree, spec, &mut staged)?;
        if !found && !known {
            return Err(CommitError::NoSuchPath(spec.clone()));
        }
    }
    for entry in &staged {
        index
            .add(entry)
            .map_err(git("update the in-memory index"))?;
    }

    let head_snapshot = match &head_tree {
        Some(t) => Some(TreeSnapshot::from_tree(repo, t)?),
        None => None,
    };
    let candidate = TreeSnapshot::from_index(&index)?;
    let changed = changed_paths(&candidate, head_snapshot.as_ref(), &specs);
    if changed.is_empty() {
        return Ok(CommitOutcome {
            commit: None,
            changed,
        });
    }
    let new_paths: Vec<String> = changed
        .iter()
        .filter(|p| candidate.contains(p) && !head_snapshot.as_ref().is_some_and(|h| h.contains(p)))
        .cloned()
        .collect();
    check_case_collision(
        candidate
            .iter()
            .map(|(p, _)| p)
            .filter(|p| !new_paths.iter().any(|n| n == p)),
        &new_paths,
    )?;

    let report = validate(repo, &candidate, head_snapshot.as_ref(), &opts.validate)?;
    if !report.is_ok() {
        return Err(CommitError::Rejected(Box::new(report)));
    }

    let tree_id = index.write_tree_to(repo).map_err(git("write the tree"))?;
    let tree = repo.find_tree(tree_id).map_err(git("read the new tree"))?;
    let message = if message.ends_with('\n') {
        message.to_string()
    } else {
        format!("{message}\n")
    };
    let parents: Vec<&git2::Commit<'_>> = head_commit.iter().collect();
    let id = repo
        .commit(Some("HEAD"), author, author, &message, &tree, &parents)
        .map_err(git("write the commit"))?;

    // The commit is made; the index only gets the same entries for the
    // named paths. A failure here cannot undo the commit, so it is logged.
    if let Err(e) = update_disk_index(repo, &specs, &staged) {
        tracing::warn!(
            "committed {id}, but could not update the index for {:?}: {e}",
            specs
        );
    }
    Ok(CommitOutcome {
        commit: Some(id),
        changed,
    })
}

/// Remove `spec` and everything below it (all stages).
fn remove_from_index(index: &mut Index, spec: &str) -> Result<(), git2::Error> {
    for stage in 0..=3 {
        match index.remove(Path::new(spec), stage) {
            Ok(()) => {}
            Err(e) if e.code() == git2::ErrorCode::NotFound => {}
            Err(e) => return Err(e),
        }
        index.remove_dir(Path::new(spec), stage)?;
    }
    Ok(())
}

/// Stage the working-tree file, symlink or directory at `spec` into
/// `out`. Returns whether anything exists there.
fn collect(
    repo: &Repository,
    work_tree: &Path,
    spec: &str,
    out: &mut Vec<IndexEntry>,
) -> Result<bool, CommitError> {
    let full = work_tree.join(spec);
    // Stat before reading: if the file changes in between, the stat data no
    // longer matches and git re-hashes instead of trusting a stale entry.
    let meta = match fs::symlink_metadata(&full) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io(&full)(e)),
    };
    let ft = meta.file_type();
    if ft.is_dir() {
        let mut names: Vec<_> = fs::read_dir(&full)
            .map_err(io(&full))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(io(&full))?;
        names.sort();
        for name in names {
            let Some(name) = name.to_str() else {
                return Err(CommitError::Path(PathRuleError::BadCharacter(format!(
                    "{spec}/{}",
                    name.to_string_lossy()
                ))));
            };
            if name.eq_ignore_ascii_case(".git") {
                continue;
            }
            let child = check_path(work_tree, &format!("{spec}/{name}"))?;
            collect(repo, work_tree, &child, out)?;
        }
        return Ok(true);
    }
    let (mode, bytes) = if ft.is_symlink() {
        let target = fs::read_link(&full).map_err(io(&full))?;
        (MODE_LINK, target.as_os_str().as_bytes().to_vec())
    } else if ft.is_file() {
        let mode = if meta.mode() & 0o111 != 0 {
            MODE_EXEC
        } else {
            MODE_FILE
        };
        (mode, fs::read(&full).map_err(io(&full))?)
    } else {
        return Err(CommitError::NotAFile(spec.to_string()));
    };
    let id = repo.blob(&bytes).map_err(git("write a blob"))?;
    let time = |s: i64, ns: i64| IndexTime::new(s as i32, ns as u32);
    out.push(IndexEntry {
        ctime: time(meta.ctime(), meta.ctime_nsec()),
        mtime: time(meta.mtime(), meta.mtime_nsec()),
        dev: meta.dev() as u32,
        ino: meta.ino() as u32,
        mode,
        uid: meta.uid(),
        gid: meta.gid(),
        file_size: meta.size() as u32,
        id,
        flags: 0,
        flags_extended: 0,
        path: spec.as_bytes().to_vec(),
    });
    Ok(true)
}

/// Paths at or below a spec whose entry differs between `HEAD` and the
/// candidate.
fn changed_paths(
    candidate: &TreeSnapshot,
    head: Option<&TreeSnapshot>,
    specs: &BTreeSet<String>,
) -> Vec<String> {
    let under = |p: &str| {
        specs.iter().any(|s| {
            p == s
                || p.strip_prefix(s.as_str())
                    .is_some_and(|rest| rest.starts_with('/'))
        })
    };
    let mut out: BTreeSet<String> = BTreeSet::new();
    for (p, e) in candidate.iter() {
        if under(p) && head.and_then(|h| h.get(p)) != Some(e) {
            out.insert(p.to_string());
        }
    }
    if let Some(h) = head {
        for (p, _) in h.iter() {
            if under(p) && !candidate.contains(p) {
                out.insert(p.to_string());
            }
        }
    }
    out.into_iter().collect()
}

/// Give the on-disk index the committed entries for the named paths only,
/// retrying briefly while someone else (a person's `git add`) holds
/// `index.lock`.
fn update_disk_index(
    repo: &Repository,
    specs: &BTreeSet<String>,
    staged: &[IndexEntry],
) -> Result<(), git2::Error> {
    let mut delays = [25u64, 50, 100, 200].into_iter();
    loop {
        let result = (|| {
            let mut index = repo.index()?;
            index.read(true)?;
            for spec in specs {
                remove_from_index(&mut index, spec)?;
            }
            for entry in staged {
                index.add(entry)?;
            }
            index.write()
        })();
        match (result, delays.next()) {
            (Err(e), Some(ms)) if e.code() == git2::ErrorCode::Locked => {
                std::thread::sleep(Duration::from_millis(ms));
            }
            (r, _) => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlink_targets_are_resolved_lexically() {
        assert!(link_stays_inside(&[], Path::new("persona.md")));
        assert!(link_stays_inside(&["a"], Path::new("../persona.md")));
        assert!(!link_stays_inside(&["a"], Path::new("../../x")));
        assert!(!link_stays_inside(&[], Path::new("/etc/passwd")));
        assert!(!link_stays_inside(&[], Path::new(".")));
        assert!(!link_stays_inside(&[], Path::new(".git/config")));
    }

    #[test]
    fn case_collisions_compare_every_prefix() {
        let existing = ["projects/MEMORY.md", "persona.md"];
        assert!(check_case_collision(existing, &["Persona.md".into()]).is_err());
        assert!(check_case_collision(existing, &["Projects/x.md".into()]).is_err());
        assert!(check_case_collision(existing, &["projects/x.md".into()]).is_ok());
        assert!(check_case_collision(existing, &["persona.md".into()]).is_ok());
    }
}
