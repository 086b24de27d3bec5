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
//! of the tree. The last two are the validator's rules (`validate::
//! tree_safety`), checked here early on the working tree; the validator
//! applies them again to the whole candidate tree, as to every other tree.

use crate::protocol::timings::mark;
use std::collections::{BTreeSet, HashMap};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use git2::{Index, IndexEntry, IndexTime, ObjectType, Odb, Oid, Repository, Signature};

use crate::agentfs::{Dir, FsError, Kind, Stat};
use crate::retry::Policy;

use super::hook::{self, EnsureMode, HookError};
use super::lock::{LockError, RepoLock};
use super::pathrules::{self, PathRuleError};
use super::validate::{
    CaseIndex, Report, TreeSnapshot, ValidateError, ValidateOptions,
    constraints_update_approved_from_env, link_stays_inside, validate,
};

/// Entries one commit may walk (a directory spec over a huge tree is
/// refused rather than walked without end).
pub const MAX_WALK_ENTRIES: usize = 100_000;
/// Bytes one commit reads from the working tree at most, all files
/// together: a directory spec over a child-filled tree stays bounded in time
/// and memory (contents are held until validation).
pub const MAX_COMMIT_BYTES: u64 = 128 << 20;
/// Per-file read cap when the validator's byte limit is switched off
/// (letta parity): reads from a child-writable tree are always bounded.
pub const HARD_READ_CAP: u64 = 64 << 20;

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
    /// Refused before reading; the same words as the validator's byte rule.
    #[error("{path}: {size} bytes exceeds the {max}-byte file limit")]
    TooLarge { path: String, size: u64, max: u64 },
    /// The working tree changed under the commit in a way that would have
    /// meant following a symlink; nothing was read through it.
    #[error("{0:?}: changed while being committed; try again")]
    Changed(String),
    #[error("the named paths hold more than {max} bytes; commit fewer at a time")]
    TooMuch { max: u64 },
    #[error(transparent)]
    Fs(#[from] FsError),
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
///
/// The working tree is the child's to change, so it is inspected through
/// descriptors ([`crate::agentfs`]): each component is looked at with
/// `fstatat` in the directory descriptor of its parent, never by a path
/// string that could be re-resolved through a symlink swapped in.
pub(crate) fn check_path(work_tree: &Path, path: &str) -> Result<String, CommitError> {
    let root = Dir::open(work_tree)?;
    locate(&root, path).map(|(path, _)| path)
}

/// Where a checked path is in the working tree.
enum Located {
    /// A component (maybe the last) does not exist.
    Missing,
    /// The last component exists: its parent directory, name and `lstat`.
    At {
        parent: Dir,
        leaf: String,
        stat: Stat,
    },
}

/// [`check_path`] below an open working-tree root, keeping what it found.
fn locate(root: &Dir, path: &str) -> Result<(String, Located), CommitError> {
    let path = pathrules::check_relative(path)?;
    if path.split('/').any(|s| s.eq_ignore_ascii_case(".git")) {
        return Err(CommitError::GitDirPath(path));
    }
    let segments: Vec<String> = path.split('/').map(str::to_string).collect();
    let mut parent: Option<Dir> = None;
    for (i, seg) in segments.iter().enumerate() {
        let dir = parent.as_ref().unwrap_or(root);
        let last = i + 1 == segments.len();
        let shown = || segments[..=i].join("/");
        let Some(stat) = dir.stat_at(seg)? else {
            return Ok((path, Located::Missing));
        };
        if last {
            if stat.kind == Kind::Symlink {
                let target = dir.read_link(seg).map_err(|e| changed(&path, e))?;
                let dirs: Vec<&str> = segments[..i].iter().map(String::as_str).collect();
                if !link_stays_inside(&dirs, Path::new(&target)) {
                    return Err(CommitError::SymlinkOutside { path });
                }
            }
            let parent = match parent {
                Some(p) => p,
                None => root.try_clone()?,
            };
            let leaf = seg.clone();
            return Ok((path, Located::At { parent, leaf, stat }));
        }
        match stat.kind {
            Kind::Symlink => {
                return Err(CommitError::ThroughSymlink {
                    through: shown(),
                    path,
                });
            }
            Kind::Dir => {}
            _ => {
                return Err(CommitError::NotADirectory {
                    through: shown(),
                    path,
                });
            }
        }
        // Opened with RESOLVE_NO_SYMLINKS: a symlink swapped in since the
        // `fstatat` is refused here, never followed.
        let next = dir.open_dir(seg).map_err(|e| match e {
            FsError::Symlink { .. } => CommitError::ThroughSymlink {
                through: shown(),
                path: path.clone(),
            },
            FsError::NotADirectory { .. } => CommitError::NotADirectory {
                through: shown(),
                path: path.clone(),
            },
            e => CommitError::Fs(e),
        })?;
        parent = Some(next);
    }
    Ok((path, Located::Missing))
}

/// A symlink met where the tree held something else a moment ago.
fn changed(path: &str, e: FsError) -> CommitError {
    match e {
        FsError::Symlink { .. } | FsError::Changed { .. } => CommitError::Changed(path.to_string()),
        e => CommitError::Fs(e),
    }
}

/// Every path in `paths` compared case-insensitively (the validator's
/// [`CaseIndex`]) against `existing`; the first collision with a different
/// spelling is an error.
pub(crate) fn check_case_collision<'a>(
    existing: impl IntoIterator<Item = &'a str>,
    paths: &[String],
) -> Result<(), CommitError> {
    let mut seen = CaseIndex::default();
    for p in existing {
        seen.insert(p);
    }
    for p in paths {
        if let Some(other) = seen.collides(p) {
            return Err(CommitError::CaseCollision {
                path: p.clone(),
                existing: other,
            });
        }
    }
    Ok(())
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
    let root = Dir::open(&work_tree)?;
    let specs = named_specs(&root, paths)?;
    let git_dir = hook::common_git_dir(repo).to_path_buf();
    if let Some(bin) = &opts.hook_binary {
        hook::ensure(&git_dir, bin, EnsureMode::InstallOrRefresh)?;
    }

    mark("commit.hook_checked");
    let _lock = RepoLock::acquire(&git_dir)?;
    mark("commit.locked");

    let (head_commit, head_tree) = read_head(repo)?;
    let mut index = Index::new().map_err(git("create an in-memory index"))?;
    if let Some(t) = &head_tree {
        index.read_tree(t).map_err(git("read the HEAD tree"))?;
    }
    let Walk {
        staged, pending, ..
    } = stage_specs(&mut index, &root, &specs, opts)?;
    mark("commit.staged");

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
    check_new_paths_case(&candidate, head_snapshot.as_ref(), &changed)?;
    mark("commit.compared");

    let report = validate_pending(repo, &pending, &candidate, head_snapshot.as_ref(), opts)?;
    if !report.is_ok() {
        return Err(CommitError::Rejected(Box::new(report)));
    }
    mark("commit.validated");
    let id = write_commit(
        repo,
        &pending,
        &mut index,
        message,
        author,
        head_commit.as_ref(),
    )?;
    mark("commit.written");

    // The commit is made; the index only gets the same entries for the
    // named paths. A failure here cannot undo the commit, so it is logged.
    if let Err(e) = replace_index_entries(repo, &specs, unstage_tree, &staged) {
        tracing::warn!(
            "committed {id}, but could not update the index for {:?}: {e}",
            specs
        );
    }
    mark("commit.index_updated");
    crate::memfs::mirror::head_committed(repo);
    mark("commit.mirrored");
    Ok(CommitOutcome {
        commit: Some(id),
        changed,
    })
}

/// The named paths, checked and in repository form (blank ones ignored;
/// none left is an error).
fn named_specs(root: &Dir, paths: &[String]) -> Result<BTreeSet<String>, CommitError> {
    let specs: BTreeSet<String> = paths
        .iter()
        .filter(|p| !p.trim().is_empty())
        .map(|p| locate(root, p).map(|(p, _)| p))
        .collect::<Result<_, _>>()?;
    if specs.is_empty() {
        return Err(CommitError::NoPaths);
    }
    Ok(specs)
}

/// `HEAD`'s commit and tree; both `None` on an unborn branch.
fn read_head(
    repo: &Repository,
) -> Result<(Option<git2::Commit<'_>>, Option<git2::Tree<'_>>), CommitError> {
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
    Ok((head_commit, head_tree))
}

/// Take every named path from the working tree into `index`. Contents stay
/// in memory (the walk's `pending`) until the validator has accepted the
/// tree: nothing a child planted enters the object database before that.
fn stage_specs(
    index: &mut Index,
    root: &Dir,
    specs: &BTreeSet<String>,
    opts: &CommitOptions,
) -> Result<Walk, CommitError> {
    let mut walk = Walk {
        cap: opts
            .validate
            .max_file_bytes
            .unwrap_or(HARD_READ_CAP)
            .min(HARD_READ_CAP),
        budget: MAX_WALK_ENTRIES,
        bytes_left: MAX_COMMIT_BYTES,
        staged: Vec::new(),
        pending: HashMap::new(),
    };
    for spec in specs {
        let known = index.get_path(Path::new(spec), 0).is_some()
            || index.find_prefix(format!("{spec}/")).is_ok();
        unstage_tree(index, spec).map_err(git("update the in-memory index"))?;
        let found = walk.collect(root, spec)?;
        if !found && !known {
            return Err(CommitError::NoSuchPath(spec.clone()));
        }
    }
    for entry in &walk.staged {
        index
            .add(entry)
            .map_err(git("update the in-memory index"))?;
    }
    Ok(walk)
}

/// A path the change creates may not differ only in case from another
/// path of the candidate tree.
fn check_new_paths_case(
    candidate: &TreeSnapshot,
    head: Option<&TreeSnapshot>,
    changed: &[String],
) -> Result<(), CommitError> {
    let new_paths: Vec<String> = changed
        .iter()
        .filter(|p| candidate.contains(p) && !head.is_some_and(|h| h.contains(p)))
        .cloned()
        .collect();
    check_case_collision(
        candidate
            .iter()
            .map(|(p, _)| p)
            .filter(|p| !new_paths.iter().any(|n| n == p)),
        &new_paths,
    )
}

/// The accepted tree as a commit on `HEAD`: now, and only now, the new
/// contents become objects.
fn write_commit(
    repo: &Repository,
    pending: &HashMap<Oid, Vec<u8>>,
    index: &mut Index,
    message: &str,
    author: &Signature<'_>,
    head_commit: Option<&git2::Commit<'_>>,
) -> Result<Oid, CommitError> {
    for (id, bytes) in pending {
        let written = repo.blob(bytes).map_err(git("write a blob"))?;
        debug_assert_eq!(written, *id);
    }

    mark("commit.blobs_written");
    let tree_id = index.write_tree_to(repo).map_err(git("write the tree"))?;
    mark("commit.tree_written");
    let tree = repo.find_tree(tree_id).map_err(git("read the new tree"))?;
    let message = if message.ends_with('\n') {
        message.to_string()
    } else {
        format!("{message}\n")
    };
    let parents: Vec<&git2::Commit<'_>> = head_commit.into_iter().collect();
    let commit = || repo.commit(Some("HEAD"), author, author, &message, &tree, &parents);
    match commit() {
        Err(e) if e.code() == git2::ErrorCode::Locked && clear_stale_head_lock(repo) => {
            commit().map_err(git("write the commit"))
        }
        done => done.map_err(git("write the commit")),
    }
}

/// A ref lock older than this was left by a process that died while
/// updating the ref (or by a file system remounted read-only under it,
/// where libgit2 could not remove it): a live update holds one for
/// milliseconds.
const STALE_REF_LOCK: std::time::Duration = std::time::Duration::from_secs(30);

/// Remove the lock of the branch `HEAD` names when it is stale; whether it
/// was (the caller tries once more). Commits to an agent's repository are
/// the supervisor's, one at a time, so a stale lock has no owner to wait for.
fn clear_stale_head_lock(repo: &Repository) -> bool {
    let Ok(head) = repo.find_reference("HEAD") else {
        return false;
    };
    let Ok(Some(target)) = head.symbolic_target() else {
        return false;
    };
    // A name libgit2 accepted for HEAD; never a path out of the git dir.
    if !target.starts_with("refs/heads/") || target.split('/').any(|p| p == ".." || p.is_empty()) {
        return false;
    }
    let lock = repo.path().join(format!("{target}.lock"));
    let Ok(meta) = std::fs::symlink_metadata(&lock) else {
        return false;
    };
    let age = meta
        .modified()
        .ok()
        .and_then(|m| m.elapsed().ok())
        .unwrap_or_default();
    if !meta.is_file() || age < STALE_REF_LOCK {
        return false;
    }
    match std::fs::remove_file(&lock) {
        Ok(()) => {
            tracing::warn!(
                lock = %lock.display(),
                age_secs = age.as_secs(),
                "removed a stale ref lock left by an interrupted update"
            );
            true
        }
        Err(e) => {
            tracing::warn!(lock = %lock.display(), "cannot remove a stale ref lock: {e}");
            false
        }
    }
}

/// Remove `path`'s entries at every stage (a conflict leaves up to three).
pub(crate) fn unstage(index: &mut Index, path: &str) -> Result<(), git2::Error> {
    for stage in 0..=3 {
        match index.remove(Path::new(path), stage) {
            Ok(()) => {}
            Err(e) if e.code() == git2::ErrorCode::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// [`unstage`] `spec` and everything below it.
fn unstage_tree(index: &mut Index, spec: &str) -> Result<(), git2::Error> {
    unstage(index, spec)?;
    for stage in 0..=3 {
        index.remove_dir(Path::new(spec), stage)?;
    }
    Ok(())
}

/// Validate `candidate`, whose new blobs are only in `pending`, against
/// `head`. The validator reads blobs through a repository; when some are not
/// in the object database yet it is given a view: an in-memory object store
/// holding them in front of the repository's own objects (read-only, as an
/// alternate), so judging a tree writes nothing to disk.
fn validate_pending(
    repo: &Repository,
    pending: &HashMap<Oid, Vec<u8>>,
    candidate: &TreeSnapshot,
    head: Option<&TreeSnapshot>,
    opts: &CommitOptions,
) -> Result<Report, CommitError> {
    let odb = repo.odb().map_err(git("open the object database"))?;
    let missing: Vec<&Vec<u8>> = pending
        .iter()
        .filter(|(id, _)| !odb.exists(**id))
        .map(|(_, b)| b)
        .collect();
    if missing.is_empty() {
        return Ok(validate(repo, candidate, head, &opts.validate)?);
    }
    let objects = crate::paths::MemoryGitDir::new(hook::common_git_dir(repo)).objects_dir();
    let view_odb = Odb::new().map_err(git("create an object view"))?;
    // The repository's own objects only: never its `info/alternates`.
    crate::memfs::repo::add_own_backends(&view_odb, &objects, true)
        .map_err(git("create an object view"))?;
    // Writes go to the highest-priority backend that is not an alternate:
    // the in-memory one.
    view_odb
        .add_new_mempack_backend(1000)
        .map_err(git("create an object view"))?;
    for bytes in missing {
        view_odb
            .write(ObjectType::Blob, bytes)
            .map_err(git("hold a blob in memory"))?;
    }
    let view = Repository::from_odb(view_odb).map_err(git("create an object view"))?;
    Ok(validate(&view, candidate, head, &opts.validate)?)
}

/// What a commit takes from the working tree.
struct Walk {
    /// Per-file byte cap.
    cap: u64,
    /// Entries left to look at.
    budget: usize,
    /// Bytes left to read.
    bytes_left: u64,
    staged: Vec<IndexEntry>,
    /// New contents by blob id, written only after validation.
    pending: HashMap<Oid, Vec<u8>>,
}

impl Walk {
    /// Stage the working-tree file, symlink or directory at `spec`.
    /// Returns whether anything exists there.
    fn collect(&mut self, root: &Dir, spec: &str) -> Result<bool, CommitError> {
        let (spec, located) = locate(root, spec)?;
        let Located::At { parent, leaf, stat } = located else {
            return Ok(false);
        };
        self.entry(&parent, &leaf, &spec, stat)?;
        Ok(true)
    }

    /// Stage `name` of `parent` (whose repository path is `spec`), found by
    /// `lstat` to be `stat`.
    fn entry(
        &mut self,
        parent: &Dir,
        name: &str,
        spec: &str,
        stat: Stat,
    ) -> Result<(), CommitError> {
        self.budget = self.budget.checked_sub(1).ok_or_else(|| {
            CommitError::Fs(FsError::TooManyEntries {
                path: parent.path().join(name),
                max: MAX_WALK_ENTRIES,
            })
        })?;
        let (mode, bytes, stat) = match stat.kind {
            Kind::Dir => {
                // RESOLVE_NO_SYMLINKS: a symlink swapped in is refused.
                let dir = parent.open_dir(name).map_err(|e| changed(spec, e))?;
                for child in dir.list(self.budget)? {
                    let Some(child) = child.to_str() else {
                        return Err(CommitError::Path(PathRuleError::BadCharacter(format!(
                            "{spec}/{}",
                            child.to_string_lossy()
                        ))));
                    };
                    if child.eq_ignore_ascii_case(".git") {
                        continue;
                    }
                    let path = pathrules::check_relative(&format!("{spec}/{child}"))?;
                    // Gone since the listing: nothing to take.
                    let Some(st) = dir.stat_at(child)? else {
                        continue;
                    };
                    self.entry(&dir, child, &path, st)?;
                }
                return Ok(());
            }
            Kind::Symlink => {
                // The target read once, checked, and that same value kept.
                let target = parent.read_link(name).map_err(|e| changed(spec, e))?;
                let segments: Vec<&str> = spec.split('/').collect();
                let dirs = &segments[..segments.len().saturating_sub(1)];
                if !link_stays_inside(dirs, Path::new(&target)) {
                    return Err(CommitError::SymlinkOutside {
                        path: spec.to_string(),
                    });
                }
                (MODE_LINK, target.as_bytes().to_vec(), stat)
            }
            Kind::File => {
                // The stat kept is the descriptor's, so it describes exactly
                // the bytes read.
                let (bytes, st) = parent
                    .read_file_capped(name, self.cap)
                    .map_err(|e| match e {
                        FsError::TooLarge { size, max, .. } => CommitError::TooLarge {
                            path: spec.to_string(),
                            size,
                            max,
                        },
                        FsError::NotRegular { .. } => CommitError::NotAFile(spec.to_string()),
                        e => changed(spec, e),
                    })?;
                self.bytes_left = self.bytes_left.checked_sub(bytes.len() as u64).ok_or(
                    CommitError::TooMuch {
                        max: MAX_COMMIT_BYTES,
                    },
                )?;
                let mode = if st.perm & 0o111 != 0 {
                    MODE_EXEC
                } else {
                    MODE_FILE
                };
                (mode, bytes, st)
            }
            _ => return Err(CommitError::NotAFile(spec.to_string())),
        };
        let id = Oid::hash_object(ObjectType::Blob, &bytes).map_err(git("hash a blob"))?;
        self.pending.entry(id).or_insert(bytes);
        // Index stat fields are 32-bit in git's format; truncation is what
        // git itself does, and only makes a later stat comparison re-hash.
        let time = |(s, ns): (i64, i64)| IndexTime::new(s as i32, ns as u32);
        self.staged.push(IndexEntry {
            ctime: time(stat.ctime),
            mtime: time(stat.mtime),
            dev: stat.dev as u32,
            ino: stat.ino as u32,
            mode,
            uid: stat.uid,
            gid: stat.gid,
            file_size: stat.size as u32,
            id,
            flags: 0,
            flags_extended: 0,
            path: spec.as_bytes().to_vec(),
        });
        Ok(())
    }
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

/// How long a writer waits for someone else's `index.lock` (a person's
/// `git add`): 25, 50, 100 and 200 ms, then the index is left as it is.
pub(crate) const INDEX_LOCK_WAIT: Policy =
    Policy::backoff(5, Duration::from_millis(25), Duration::from_millis(200));

/// Give the on-disk index `entries` in place of what it holds for `paths`
/// (each taken out by `remove`), read afresh and written whole; someone
/// else's `index.lock` is waited for ([`INDEX_LOCK_WAIT`]).
pub(crate) fn replace_index_entries<'p>(
    repo: &Repository,
    paths: impl IntoIterator<Item = &'p String> + Copy,
    remove: fn(&mut Index, &str) -> Result<(), git2::Error>,
    entries: &[IndexEntry],
) -> Result<(), git2::Error> {
    let once = || {
        let mut index = repo.index()?;
        index.read(true)?;
        for path in paths {
            remove(&mut index, path)?;
        }
        for entry in entries {
            index.add(entry)?;
        }
        index.write()
    };
    INDEX_LOCK_WAIT.run(|e| e.code() == git2::ErrorCode::Locked, once)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_collisions_compare_every_prefix() {
        let existing = ["projects/MEMORY.md", "persona.md"];
        assert!(check_case_collision(existing, &["Persona.md".into()]).is_err());
        assert!(check_case_collision(existing, &["Projects/x.md".into()]).is_err());
        assert!(check_case_collision(existing, &["projects/x.md".into()]).is_ok());
        assert!(check_case_collision(existing, &["persona.md".into()]).is_ok());
    }
}
