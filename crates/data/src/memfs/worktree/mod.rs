//! Memory worktrees: linked git worktrees of an agent's `memory.git`, one
//! per reflection or memory-worker run (spec `memfs-git.md` §4).
//!
//! A run gets its own checkout (`memory-worktrees/<label>-<id>/`) on its own
//! branch (`mini-letta/<label>/<id>`) started at `main`'s `HEAD`; the child
//! commits there, and the supervisor later folds the branch back into
//! `main` with a real merge commit ([`finalize_reflection_worktree`],
//! [`integrate_worker`]) or throws it away ([`discard`],
//! [`cleanup_orphans`]).
//!
//! The worktree directories and `memory/` are the child's to write, so:
//! * a worktree is opened from its admin directory in `memory.git/worktrees/`
//!   with the working tree set explicitly; the `.git` pointer file the child
//!   can rewrite is never read ([`open`]);
//! * whether a worktree or the main checkout is dirty is decided by the
//!   descriptor walk of [`crate::memfs::status`], never by libgit2
//!   status on a child-writable directory;
//! * the main checkout is updated after a merge through [`crate::agentfs`]
//!   (no symlink followed, files replaced atomically);
//! * removal uses `remove_dir_all`, which unlinks symlinks rather than
//!   following them;
//! * a new worktree is checked out in a staging directory inside the git
//!   directory and only then moved into `memory-worktrees/`, so a child
//!   cannot plant a symlink where libgit2 writes the checkout.

pub mod advance;
mod create;
mod finalize;
mod kept;
pub(crate) mod merge;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use git2::{Oid, Repository};

use super::lock::LockError;
use super::repo::RepoError;
use super::status::StatusError;
use super::validate::ValidateError;
use crate::agentfs::FsError;
use crate::paths::{AgentPaths, MemoryGitDir};

pub use create::create;
pub use finalize::{
    DIRTY_UNCOMMITTED, FAILED, INVALID, MERGE_CONFLICT, NO_COMMITS, NOT_MERGED_BY_AGENT,
    PARENT_DIRTY, REFRESH_FAILED, cleanup_orphans, discard, finalize_reflection_worktree,
    integrate_worker, merge_for_integration,
};
pub use kept::{KeptChange, drop_kept_branch, keep_as_worker_branch, kept_change};

/// Prefix of every branch this module makes (`mini-letta/<label>/<id>`).
pub const BRANCH_PREFIX: &str = "mini-letta/";

/// What a memory worktree is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Label {
    Reflection,
    MemoryWorker,
}

impl Label {
    pub fn as_str(self) -> &'static str {
        match self {
            Label::Reflection => "reflection",
            Label::MemoryWorker => "memory-worker",
        }
    }

    const ALL: [Label; 2] = [Label::Reflection, Label::MemoryWorker];
}

/// One memory worktree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryWorktree {
    pub label: Label,
    /// `YYYYMMDDHHMMSS-xxxxxxxx` (UTC time, 8 random hex digits).
    pub id: String,
    /// `<label>-<id>`: the directory and admin-directory name.
    pub name: String,
    /// `<agent>/memory-worktrees/<name>/`.
    pub dir: PathBuf,
    /// `mini-letta/<label>/<id>`.
    pub branch: String,
    /// The `main` commit the branch started at.
    pub base: Oid,
}

/// Failures of worktree operations (as opposed to the outcomes a
/// finalizer reports in [`Finalized`]).
#[derive(Debug, thiserror::Error)]
pub enum WorktreeError {
    #[error("Unable to create reflection memory worktree: {} has no HEAD", .0.display())]
    NoHead(PathBuf),
    #[error(
        "Cannot finalize missing reflection worktree {} as no-op: {branch} advanced from {base} to {head}",
        .dir.display()
    )]
    MissingAdvanced {
        dir: PathBuf,
        branch: String,
        base: Oid,
        head: Oid,
    },
    #[error("{0:?}: not a memory worktree name (<label>-<YYYYMMDDHHMMSS>-<8 hex>)")]
    BadName(String),
    #[error("{0}: no such memory worktree")]
    NotFound(String),
    #[error("{0}: the memory worktree's branch is missing")]
    NoBranch(String),
    #[error(transparent)]
    Repo(#[from] RepoError),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Status(#[from] StatusError),
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error("{}", .0.render().trim_end())]
    Validate(#[from] ValidateError),
    #[error("cannot {what}: {source}")]
    Git {
        what: &'static str,
        source: git2::Error,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub fn git(what: &'static str) -> impl FnOnce(git2::Error) -> WorktreeError {
    move |source| WorktreeError::Git { what, source }
}

pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WorktreeError + '_ {
    move |source| WorktreeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// How a finalizer ended. Serialized in snake_case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinalizeStatus {
    /// The branch is in `main` (merged now, or already by the integration
    /// agent).
    Merged,
    /// Nothing was committed; the worktree was removed.
    NoChanges,
    /// The worktree had uncommitted changes; everything was discarded.
    DirtyUncommitted,
    /// The child failed or the integration did not happen.
    Failed,
    /// The main checkout had uncommitted changes; nothing was merged.
    ParentDirty,
    /// A content conflict (or, for workers, changes overlapping dirty
    /// checkout files); `main` is unchanged.
    MergeConflict,
    /// A cancelled memory worker; everything was thrown away.
    Discarded,
    /// mini-letta addition: the merged tree was refused by the MemFS
    /// validator (each branch commit passed, their combination with `main`
    /// did not); `main` is unchanged and `error` holds the validator's text.
    Invalid,
}

/// What a finalizer did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Finalized {
    pub status: FinalizeStatus,
    pub summary: String,
    /// Commits the branch had on top of its base.
    pub commit_count: usize,
    /// The merge commit on `main`, when one was made.
    pub merge_commit: Option<String>,
    pub branch: String,
    /// The branch still exists (a worker's conflicting commits, or a branch
    /// a clean cleanup refused to delete because it was not merged).
    pub branch_kept: bool,
    /// Paths the merge changed in `main`; for a worker's `merge_conflict`,
    /// the conflicting paths; for other reflection outcomes, the paths the
    /// branch changed since its base (empty for other worker outcomes).
    pub changed_paths: Vec<String>,
    /// The underlying error, for `failed` (a refresh or worker merge that
    /// errored) and `invalid` (the validator's text).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A worker's `merge_conflict` met only uncommitted edits in the main
    /// checkout (the merge itself was clean): the same change applies once
    /// they are committed, so its instruction is run again rather than
    /// repaired (a repair would meet the same edits).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checkout_dirty: bool,
    /// The kept branch's tip, when a worker's branch was kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_tip: Option<String>,
    /// For `merge_conflict`: each conflicted file's three versions, so a
    /// reader (a repair, the reflection soak) can see what kind of
    /// conflict it was.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<ConflictSides>,
}

impl Finalized {
    /// As `memory.merge` answers it: the same fields, the ones a reader
    /// decides on typed.
    pub fn reply(&self) -> crate::protocol::replies::Merged {
        let mut rest = match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        };
        let status = rest
            .remove("status")
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_else(|| "failed".into());
        for typed in [
            "summary",
            "commit_count",
            "merge_commit",
            "changed_paths",
            "branch",
        ] {
            rest.remove(typed);
        }
        crate::protocol::replies::Merged {
            status,
            summary: self.summary.clone(),
            commit_count: self.commit_count,
            merge_commit: self.merge_commit.clone(),
            changed_paths: self.changed_paths.clone(),
            branch: self.branch.clone(),
            rest,
        }
    }
}

/// One file a merge left conflicted: the blob ids of its merge-base
/// version and of each side (`None` where that side has no such file).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ConflictSides {
    pub path: String,
    pub base: Option<String>,
    pub ours: Option<String>,
    pub theirs: Option<String>,
}

/// Inputs of [`finalize_reflection_worktree`] (spec §4.2).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FinalizeOptions {
    /// The reflection child succeeded.
    pub should_merge: bool,
    /// The caller knows the run changed nothing (a missing worktree may
    /// then be finalized as a no-op).
    pub known_no_changes: bool,
    /// Explicit integration: an agent was to merge the branch itself; only
    /// check (by ancestry) that it did.
    pub require_already_merged: bool,
    /// Replaces the default summary of the `failed` rows 2 and 6.
    pub failure_summary: Option<String>,
    /// The merge commit's text after `merge(reflection): `.
    pub summary: String,
}

/// Whether `name` has exactly the `<label>-<YYYYMMDDHHMMSS>-<8 hex>` shape;
/// its label and id when it does.
pub fn parse_name(name: &str) -> Option<(Label, &str)> {
    Label::ALL.into_iter().find_map(|label| {
        let id = name.strip_prefix(label.as_str())?.strip_prefix('-')?;
        is_valid_id(id).then_some((label, id))
    })
}

fn is_valid_id(id: &str) -> bool {
    let b = id.as_bytes();
    b.len() == 23
        && b[..14].iter().all(u8::is_ascii_digit)
        && b[14] == b'-'
        && b[15..]
            .iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
}

impl MemoryWorktree {
    /// The worktree named `name` (checked) with the given base.
    fn from_name(agent: &AgentPaths, name: &str, base: Oid) -> Result<Self, WorktreeError> {
        let (label, id) = parse_name(name).ok_or_else(|| WorktreeError::BadName(name.into()))?;
        let dir = agent
            .memory_worktree_dir(name)
            .ok_or_else(|| WorktreeError::BadName(name.into()))?;
        Ok(MemoryWorktree {
            label,
            id: id.to_string(),
            name: name.to_string(),
            dir,
            branch: format!("{BRANCH_PREFIX}{}/{id}", label.as_str()),
            base,
        })
    }

    fn branch_ref(&self) -> String {
        format!("refs/heads/{}", self.branch)
    }
}

/// The admin directory (`memory.git/worktrees/<name>`) of a checked name.
fn admin_dir(agent: &AgentPaths, name: &str) -> Result<PathBuf, WorktreeError> {
    parse_name(name).ok_or_else(|| WorktreeError::BadName(name.into()))?;
    MemoryGitDir::new(&agent.memory_git_dir())
        .worktree_admin_dir(name)
        .ok_or_else(|| WorktreeError::BadName(name.into()))
}

/// The commit a branch names, if the branch exists.
fn branch_tip(repo: &Repository, branch_ref: &str) -> Result<Option<Oid>, WorktreeError> {
    match repo.find_reference(branch_ref) {
        Ok(r) => Ok(Some(
            r.peel_to_commit().map_err(git("read a branch tip"))?.id(),
        )),
        Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
        Err(e) => Err(git("read a branch")(e)),
    }
}

/// The commit `main` (the memory repository's `HEAD`) is at.
fn main_head(repo: &Repository) -> Result<Oid, WorktreeError> {
    repo.head()
        .and_then(|h| h.peel_to_commit())
        .map(|c| c.id())
        .map_err(git("read the memory HEAD"))
}

/// The base recorded at creation, else where the branch forked from `main`.
fn base_of(repo: &Repository, agent: &AgentPaths, name: &str, branch_ref: &str) -> Oid {
    let recorded = MemoryGitDir::new(&agent.memory_git_dir())
        .worktree_base_file(name)
        .and_then(|f| std::fs::read_to_string(f).ok())
        .and_then(|s| Oid::from_str(s.trim()).ok());
    if let Some(base) = recorded {
        return base;
    }
    let tip = branch_tip(repo, branch_ref).ok().flatten();
    let head = main_head(repo).ok();
    match (tip, head) {
        (Some(t), Some(h)) => repo.merge_base(t, h).unwrap_or(t),
        (Some(t), None) => t,
        (None, Some(h)) => h,
        (None, None) => Oid::ZERO_SHA1,
    }
}

/// Open memory worktree `name` of `agent`: the worktree and a repository
/// handle on it whose `HEAD` is the worktree's branch.
///
/// The handle is opened from the admin directory `memory.git/worktrees/
/// <name>` with the working tree set to `<agent>/memory-worktrees/<name>`;
/// the child-writable `<dir>/.git` file is never read, so rewriting it
/// cannot point the supervisor (or [`crate::memfs::commit::commit_paths`]
/// on this handle) at another repository.
pub fn open(agent: &AgentPaths, name: &str) -> Result<(MemoryWorktree, Repository), WorktreeError> {
    let admin = admin_dir(agent, name)?;
    if !std::fs::symlink_metadata(&admin).is_ok_and(|m| m.is_dir()) {
        return Err(WorktreeError::NotFound(name.to_string()));
    }
    let main = super::repo::open_agent(agent)?;
    let wt = {
        let probe = MemoryWorktree::from_name(agent, name, Oid::ZERO_SHA1)?;
        let base = base_of(&main, agent, name, &probe.branch_ref());
        MemoryWorktree { base, ..probe }
    };
    let repo = super::repo::open_bare(&admin)?;
    // The common directory comes from the admin dir's `commondir` file
    // (supervisor-owned); make sure it is this agent's repository.
    let common = std::fs::canonicalize(repo.commondir()).map_err(io(repo.commondir()))?;
    let expected = std::fs::canonicalize(agent.memory_git_dir()).map_err(io(&admin))?;
    if common != expected {
        return Err(WorktreeError::NotFound(name.to_string()));
    }
    repo.set_workdir(&wt.dir, false)
        .map_err(git("set the worktree's working tree"))?;
    Ok((wt, repo))
}

/// Every mini-letta memory worktree of `agent` that has an admin
/// directory, a `mini-letta/<label>/<id>` branch or a directory in
/// `memory-worktrees/` (by name, sorted).
pub fn list(agent: &AgentPaths) -> Result<Vec<MemoryWorktree>, WorktreeError> {
    let repo = super::repo::open_agent(agent)?;
    let mut names = std::collections::BTreeSet::new();
    let git_dir = MemoryGitDir::new(&agent.memory_git_dir());
    for dir in [git_dir.worktree_admin_root(), agent.worktrees_dir()] {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(&dir)(e)),
        };
        for entry in entries {
            let entry = entry.map_err(io(&dir))?;
            if let Some(name) = entry.file_name().to_str()
                && parse_name(name).is_some()
            {
                names.insert(name.to_string());
            }
        }
    }
    let refs = repo
        .references_glob(&format!("refs/heads/{BRANCH_PREFIX}*"))
        .map_err(git("list branches"))?;
    for r in refs.flatten() {
        let Some(rest) = r
            .name()
            .ok()
            .and_then(|n| n.strip_prefix("refs/heads/"))
            .and_then(|n| n.strip_prefix(BRANCH_PREFIX))
        else {
            continue;
        };
        // `<label>/<id>` → `<label>-<id>`.
        if let Some((label, id)) = rest.split_once('/') {
            let name = format!("{label}-{id}");
            if parse_name(&name).is_some() {
                names.insert(name);
            }
        }
    }
    names
        .into_iter()
        .map(|name| {
            let probe = MemoryWorktree::from_name(agent, &name, Oid::ZERO_SHA1)?;
            let base = base_of(&repo, agent, &name, &probe.branch_ref());
            Ok(MemoryWorktree { base, ..probe })
        })
        .collect()
}
