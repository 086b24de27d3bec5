//! Reading history: `log` (HEAD's commits, optionally those touching one
//! path) and `diff` (the working tree against a revision), both through git2
//! so paths are never re-parsed from a subprocess's output.

use std::path::Path;

use git2::{Commit, Delta, DiffFormat, DiffOptions, Oid, Repository, Sort};
use serde::Serialize;
use time::OffsetDateTime;

use super::error::OpError;
use crate::memfs::commit::CommitError;
use crate::memfs::revision::resolve_tree;

fn git(what: &'static str) -> impl FnOnce(git2::Error) -> OpError {
    move |source| OpError::Commit(CommitError::Git { what, source })
}

/// One commit of `log`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct LogEntry {
    pub id: String,
    pub parents: Vec<String>,
    pub author: String,
    pub email: String,
    /// Author time, ISO 8601 UTC with milliseconds.
    pub time: String,
    pub summary: String,
    pub message: String,
}

/// Whether `commit` changed `path` (a file or a directory) relative to its
/// first parent (or added it, for a root commit).
fn touches(commit: &Commit<'_>, path: &Path) -> Result<bool, git2::Error> {
    let here = commit.tree()?.get_path(path).ok().map(|e| e.id());
    let before: Option<Oid> = match commit.parents().next() {
        Some(p) => p.tree()?.get_path(path).ok().map(|e| e.id()),
        None => None,
    };
    Ok(here != before)
}

/// `HEAD`'s history, newest first; only commits touching `path` when given;
/// at most `limit` entries when given. Empty for an unborn branch.
pub fn log(
    repo: &Repository,
    path: Option<&str>,
    limit: Option<usize>,
) -> Result<Vec<LogEntry>, OpError> {
    let mut walk = repo.revwalk().map_err(git("walk history"))?;
    walk.set_sorting(Sort::TOPOLOGICAL | Sort::TIME)
        .map_err(git("walk history"))?;
    match walk.push_head() {
        Ok(()) => {}
        Err(e)
            if matches!(
                e.code(),
                git2::ErrorCode::UnbornBranch | git2::ErrorCode::NotFound
            ) =>
        {
            return Ok(Vec::new());
        }
        Err(e) => return Err(git("read HEAD")(e)),
    }
    let mut out = Vec::new();
    for id in walk {
        if limit.is_some_and(|n| out.len() >= n) {
            break;
        }
        let id = id.map_err(git("walk history"))?;
        let commit = repo.find_commit(id).map_err(git("read a commit"))?;
        if let Some(p) = path
            && !touches(&commit, Path::new(p)).map_err(git("read a commit's tree"))?
        {
            continue;
        }
        let author = commit.author();
        let time = OffsetDateTime::from_unix_timestamp(author.when().seconds())
            .unwrap_or(OffsetDateTime::UNIX_EPOCH);
        out.push(LogEntry {
            id: id.to_string(),
            parents: commit.parent_ids().map(|p| p.to_string()).collect(),
            author: String::from_utf8_lossy(author.name_bytes()).into_owned(),
            email: String::from_utf8_lossy(author.email_bytes()).into_owned(),
            time: crate::clock::js_iso(time),
            summary: String::from_utf8_lossy(commit.summary_bytes().unwrap_or_default())
                .into_owned(),
            message: String::from_utf8_lossy(commit.message_bytes()).into_owned(),
        });
    }
    Ok(out)
}

/// One changed path of `diff`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DiffFile {
    pub path: String,
    /// `added`, `deleted`, `modified`, `typechange`, `renamed`, ….
    pub status: &'static str,
}

/// The working tree against a revision.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DiffOutput {
    pub revision: String,
    pub files: Vec<DiffFile>,
    /// Unified diff text (`git diff` style).
    pub patch: String,
}

fn status_name(d: Delta) -> &'static str {
    match d {
        Delta::Added | Delta::Untracked => "added",
        Delta::Deleted => "deleted",
        Delta::Modified => "modified",
        Delta::Renamed => "renamed",
        Delta::Copied => "copied",
        Delta::Typechange => "typechange",
        Delta::Unmodified => "unmodified",
        Delta::Ignored => "ignored",
        Delta::Unreadable => "unreadable",
        Delta::Conflicted => "conflicted",
    }
}

/// Paths that differ between two committed revisions (`git diff
/// --name-only OLD NEW`), old and new names of a rename both included.
pub fn changed_paths(repo: &Repository, old: &str, new: &str) -> Result<Vec<String>, OpError> {
    let (_, old_tree) = resolve_tree(repo, old)?;
    let (_, new_tree) = resolve_tree(repo, new)?;
    let d = repo
        .diff_tree_to_tree(Some(&old_tree), Some(&new_tree), None)
        .map_err(git("diff two revisions"))?;
    let mut paths: Vec<String> = Vec::new();
    for delta in d.deltas() {
        for file in [delta.old_file(), delta.new_file()] {
            if let Some(p) = file.path() {
                let p = p.to_string_lossy().into_owned();
                if !paths.contains(&p) {
                    paths.push(p);
                }
            }
        }
    }
    Ok(paths)
}

/// Unified diff of the working tree (through the index, like `git diff
/// REV`) against `rev` (default `HEAD`). Untracked files are included as
/// additions, since a new memory file is exactly what one wants to review
/// before `memory commit`.
pub fn diff(repo: &Repository, rev: Option<&str>) -> Result<DiffOutput, OpError> {
    let (revision, tree) = resolve_tree(repo, rev.unwrap_or("HEAD"))?;
    let mut opts = DiffOptions::new();
    opts.include_untracked(true)
        .recurse_untracked_dirs(true)
        .show_untracked_content(true);
    let d = repo
        .diff_tree_to_workdir_with_index(Some(&tree), Some(&mut opts))
        .map_err(git("diff the working tree"))?;
    let files = d
        .deltas()
        .map(|delta| DiffFile {
            path: delta
                .new_file()
                .path()
                .or_else(|| delta.old_file().path())
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
            status: status_name(delta.status()),
        })
        .collect();
    let mut patch: Vec<u8> = Vec::new();
    d.print(DiffFormat::Patch, |_, _, line| {
        if matches!(line.origin(), '+' | '-' | ' ') {
            patch.push(line.origin() as u8);
        }
        patch.extend_from_slice(line.content());
        true
    })
    .map_err(git("render the diff"))?;
    Ok(DiffOutput {
        revision: revision.to_string(),
        files,
        patch: String::from_utf8_lossy(&patch).into_owned(),
    })
}
