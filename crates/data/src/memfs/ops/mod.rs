//! Memory operations: the edits an agent (or a person through the CLI) makes
//! to its memory, each ending in one validated commit whose message names the
//! operation (`memory create: projects/x.md`).
//!
//! Every operation checks its paths before touching the working tree, then
//! writes, then commits through [`commit_paths`]. If the commit is refused
//! (or fails in any other way) the working tree is put back exactly as it
//! was — the file rewritten with its old bytes and mode, a created file and
//! the directories made for it removed, a rename undone — so a refused write
//! never loses anything; the error carries the validator's block.
//!
//! The text operations follow letta-code's `memory` tool: they edit the body
//! below the frontmatter, `replace` changes the first occurrence, and (book
//! chapter 1) an empty replacement deletes every body line containing the
//! old text.

mod error;
mod history;

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use git2::{Repository, Signature};

pub use error::OpError;
pub use history::{DiffFile, DiffOutput, LogEntry, changed_paths, diff, log};

use super::commit::{
    CommitError, CommitOptions, CommitOutcome, HARD_READ_CAP, check_case_collision, check_path,
    commit_paths,
};
use super::template::name_from_label;
use super::validate::TreeSnapshot;
use crate::agentfs::{Dir, FsError, Kind};

/// A filesystem failure of an operation, with the path it concerns.
fn fs_err(e: FsError) -> OpError {
    match e {
        FsError::Io { path, source } => OpError::Io { path, source },
        e => OpError::Commit(CommitError::Fs(e)),
    }
}

/// [`fs_err`] for undo, which reports a path and an `io::Error`.
fn undo_err(e: FsError) -> (PathBuf, std::io::Error) {
    match e {
        FsError::Io { path, source } => (path, source),
        e => (PathBuf::new(), std::io::Error::other(e.to_string())),
    }
}

/// A commit made elsewhere: a confined child cannot write its git directory,
/// so its writer asks the supervisor (over the child's channel) to commit.
pub type RemoteCommit =
    Box<dyn Fn(&[String], &str) -> Result<CommitOutcome, OpError> + Send + Sync>;

/// Commits on behalf of one author into one memory repository.
pub struct Writer {
    repo: Repository,
    work_tree: PathBuf,
    author: Signature<'static>,
    opts: CommitOptions,
    remote: Option<RemoteCommit>,
}

/// What to do to the working tree if the commit does not happen. Every
/// entry is held by its parent directory's descriptor: the working tree may
/// belong to a confined agent that swaps directories for symlinks, and an
/// operator's edit (run as root) must not be redirected out of it.
enum Undo {
    /// Remove a file we created, then the directories we created (deepest
    /// first, only while empty).
    Remove {
        dir: Dir,
        name: OsString,
        made: Made,
    },
    /// Put old bytes and permissions back.
    Rewrite {
        dir: Dir,
        name: OsString,
        bytes: Vec<u8>,
        perm: u32,
    },
    /// Move a renamed file back.
    Rename {
        from_dir: Dir,
        from: OsString,
        to_dir: Dir,
        to: OsString,
        made: Made,
    },
}

impl Undo {
    fn run(self) -> Result<(), (PathBuf, std::io::Error)> {
        match self {
            Undo::Remove { dir, name, made } => {
                match dir.remove_file(&name) {
                    Ok(()) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(undo_err(e)),
                }
                remove_dirs(&made);
                Ok(())
            }
            Undo::Rewrite {
                dir,
                name,
                bytes,
                perm,
            } => dir.replace_file(&name, &bytes, perm).map_err(undo_err),
            Undo::Rename {
                from_dir,
                from,
                to_dir,
                to,
                made,
            } => {
                to_dir.rename_to(&to, &from_dir, &from).map_err(undo_err)?;
                remove_dirs(&made);
                Ok(())
            }
        }
    }
}

fn remove_dirs(made: &Made) {
    for (parent, name) in made.iter().rev() {
        // Only empty directories go; anything else is someone's file.
        let _ = parent.remove_dir(name);
    }
}

/// Directories an operation made, each as (its parent, its name).
type Made = Vec<(Dir, OsString)>;

/// Open the parent directory of `rel` below `root`, creating the missing
/// ones (outermost first, each from its parent's descriptor). Returns the
/// parent, the last component and the directories made.
fn make_parents<'a>(root: &Dir, rel: &'a str) -> Result<(Dir, &'a OsStr, Made), OpError> {
    let (dirs, leaf) = match rel.rsplit_once('/') {
        Some((d, l)) => (Some(d), l),
        None => (None, rel),
    };
    let mut here = root.try_clone().map_err(fs_err)?;
    let mut made: Made = Vec::new();
    for seg in dirs.into_iter().flat_map(|d| d.split('/')) {
        let step = (|| {
            let existed = here.stat_at(seg)?.is_some();
            // Refuses a symlink (even one raced in after the check).
            let next = here.create_dir(seg, 0o777)?;
            Ok::<_, FsError>((existed, next))
        })();
        let (existed, next) = match step {
            Ok(v) => v,
            Err(e) => {
                remove_dirs(&made);
                return Err(fs_err(e));
            }
        };
        let parent = std::mem::replace(&mut here, next);
        if !existed {
            made.push((parent, OsString::from(seg)));
        }
    }
    Ok((here, OsStr::new(leaf), made))
}

/// One-line, trimmed description (newlines become spaces, as letta-code).
fn one_line(text: &str) -> String {
    text.replace("\r\n", " ")
        .replace(['\n', '\r'], " ")
        .trim()
        .to_string()
}

/// `(frontmatter including its closing line, body)`; a file without a closed
/// `---` block is all body.
fn split_frontmatter(text: &str) -> (&str, &str) {
    if let Some(rest) = text.strip_prefix("---\n") {
        let mut offset = 4;
        for line in rest.split_inclusive('\n') {
            offset += line.len();
            if line == "---\n" || line == "---" {
                return text.split_at(offset);
            }
        }
    }
    ("", text)
}

impl Writer {
    /// A writer for `repo` (which must have a working tree).
    pub fn new(
        repo: Repository,
        author: Signature<'static>,
        opts: CommitOptions,
    ) -> Result<Self, OpError> {
        let work_tree = repo
            .workdir()
            .ok_or_else(|| CommitError::Bare(repo.path().to_path_buf()))?
            .to_path_buf();
        Ok(Writer {
            repo,
            work_tree,
            author,
            opts,
            remote: None,
        })
    }

    /// A writer whose commits are made by `commit` (e.g. the supervisor);
    /// edits, path checks and undo on refusal work as for [`Writer::new`].
    pub fn with_remote_commit(repo: Repository, commit: RemoteCommit) -> Result<Self, OpError> {
        let author = Signature::now("mini-letta", "agent@mini-letta.local").map_err(|source| {
            OpError::Commit(CommitError::Git {
                what: "make a signature",
                source,
            })
        })?;
        let opts = CommitOptions::for_repo(&repo, false);
        let mut w = Self::new(repo, author, opts)?;
        w.remote = Some(commit);
        Ok(w)
    }

    pub fn repo(&self) -> &Repository {
        &self.repo
    }

    pub fn work_tree(&self) -> &Path {
        &self.work_tree
    }

    /// Commit edits already made in the working tree (files, deletions or
    /// whole directories); nothing is written or restored.
    pub fn commit(&self, paths: &[String], message: &str) -> Result<CommitOutcome, OpError> {
        if let Some(remote) = &self.remote {
            return remote(paths, message);
        }
        Ok(commit_paths(
            &self.repo,
            paths,
            message,
            &self.author,
            &self.opts,
        )?)
    }

    /// Commit `paths`, undoing the working-tree change when that fails.
    fn commit_or_undo(
        &self,
        paths: &[String],
        message: &str,
        undo: Undo,
    ) -> Result<CommitOutcome, OpError> {
        crate::protocol::timings::mark("op.edited");
        match self.commit(paths, message) {
            Ok(o) => Ok(o),
            Err(e) => match undo.run() {
                Ok(()) => Err(e),
                Err((path, restore)) => Err(OpError::RestoreFailed {
                    path,
                    source: Box::new(e),
                    restore,
                }),
            },
        }
    }

    /// Paths of `HEAD` and of the on-disk index, for collision checks.
    fn known_paths(&self) -> Result<Vec<String>, OpError> {
        let mut out: Vec<String> = TreeSnapshot::from_head(&self.repo)
            .map_err(CommitError::from)?
            .map(|s| s.iter().map(|(p, _)| p.to_string()).collect())
            .unwrap_or_default();
        if let Ok(index) = self.repo.index() {
            out.extend(index.iter().filter_map(|e| String::from_utf8(e.path).ok()));
        }
        Ok(out)
    }

    /// The working tree, opened (the root is the supervisor's or the
    /// operator's path; everything below is reached by descriptor).
    fn root(&self) -> Result<Dir, OpError> {
        Dir::open(&self.work_tree).map_err(fs_err)
    }

    /// Per-file read cap: the validator's byte limit, always bounded.
    fn read_cap(&self) -> u64 {
        self.opts
            .validate
            .max_file_bytes
            .unwrap_or(HARD_READ_CAP)
            .min(HARD_READ_CAP)
    }

    /// A path that must not exist yet: rules, absence, case collisions.
    fn check_new(&self, path: &str, exists: fn(String) -> OpError) -> Result<String, OpError> {
        let path = check_path(&self.work_tree, path)?;
        let present = match self.root()?.open_parent(OsStr::new(&path)) {
            Ok((dir, leaf)) => dir.stat_at(leaf).map_err(fs_err)?.is_some(),
            // The parent does not exist yet, so neither does the path.
            Err(e) if e.is_not_found() => false,
            Err(e) => return Err(fs_err(e)),
        };
        if present {
            return Err(exists(path));
        }
        let known = self.known_paths()?;
        check_case_collision(
            known.iter().map(String::as_str),
            std::slice::from_ref(&path),
        )?;
        Ok(path)
    }

    /// An existing regular file: `(path, its directory, its name, bytes,
    /// permission bits)`, read through descriptors (never through a
    /// symlink, never a FIFO, never beyond the byte limit).
    fn existing(&self, path: &str) -> Result<(String, Dir, OsString, Vec<u8>, u32), OpError> {
        let path = check_path(&self.work_tree, path)?;
        let (dir, leaf) = match self.root()?.open_parent(OsStr::new(&path)) {
            Ok(v) => v,
            Err(e) if e.is_not_found() => return Err(OpError::NotFound(path)),
            Err(e) => return Err(fs_err(e)),
        };
        match dir.stat_at(leaf).map_err(fs_err)? {
            None => return Err(OpError::NotFound(path)),
            Some(st) if st.kind != Kind::File => return Err(OpError::NotAFile(path)),
            Some(_) => {}
        }
        let (bytes, st) = match dir.read_file_capped(leaf, self.read_cap()) {
            Ok(v) => v,
            Err(FsError::NotRegular { .. } | FsError::Symlink { .. }) => {
                return Err(OpError::NotAFile(path));
            }
            Err(FsError::TooLarge { size, max, .. }) => {
                return Err(OpError::Commit(CommitError::TooLarge { path, size, max }));
            }
            Err(e) if e.is_not_found() => return Err(OpError::NotFound(path)),
            Err(e) => return Err(fs_err(e)),
        };
        let leaf = leaf.to_os_string();
        Ok((path, dir, leaf, bytes, st.perm))
    }

    /// Rewrite an existing text file through `edit`, commit, or restore.
    fn edit_text(
        &self,
        op: &str,
        path: &str,
        edit: impl FnOnce(&str, &str) -> Result<String, OpError>,
    ) -> Result<CommitOutcome, OpError> {
        let (path, dir, name, bytes, perm) = self.existing(path)?;
        let text = std::str::from_utf8(&bytes).map_err(|_| OpError::NotUtf8(path.clone()))?;
        let new_text = edit(&path, text)?;
        // Replaced by rename in the directory's descriptor, with the old
        // permission bits: the name is never followed if swapped.
        dir.replace_file(&name, new_text.as_bytes(), perm)
            .map_err(fs_err)?;
        let undo = Undo::Rewrite {
            dir,
            name,
            bytes,
            perm,
        };
        self.commit_or_undo(
            std::slice::from_ref(&path),
            &format!("memory {op}: {path}"),
            undo,
        )
    }

    /// Create a memory file: frontmatter with the name derived from the file
    /// name (`project_conventions.md` → `Project Conventions`) and
    /// `description`, then `body` (given a final newline). A `MEMORY.md`
    /// index gets no frontmatter: a heading, the description, the body.
    pub fn create(
        &self,
        path: &str,
        description: &str,
        body: &str,
    ) -> Result<CommitOutcome, OpError> {
        let description = one_line(description);
        if description.is_empty() {
            return Err(OpError::Empty {
                op: "create",
                field: "description",
            });
        }
        let path = self.check_new(path, OpError::AlreadyExists)?;
        if !path.ends_with(".md") {
            return Err(OpError::NotMarkdown(path));
        }
        let mut body = body.to_string();
        if !body.is_empty() && !body.ends_with('\n') {
            body.push('\n');
        }
        let (dir, file) = path.rsplit_once('/').unwrap_or(("", path.as_str()));
        let content = if file == "MEMORY.md" {
            let title = if dir.is_empty() {
                "Memory".to_string()
            } else {
                name_from_label(dir)
            };
            let sep = if body.is_empty() { "" } else { "\n" };
            format!("# {title}\n\n{description}\n{sep}{body}")
        } else {
            let name = name_from_label(&path);
            if name.is_empty() {
                return Err(OpError::NoName(path));
            }
            format!("---\nname: {name}\ndescription: {description}\n---\n{body}")
        };
        let (dir, name, made) = make_parents(&self.root()?, &path)?;
        let name = name.to_os_string();
        if let Err(e) = dir.create_file(&name, content.as_bytes(), 0o666) {
            remove_dirs(&made);
            return Err(fs_err(e));
        }
        let undo = Undo::Remove { dir, name, made };
        self.commit_or_undo(
            std::slice::from_ref(&path),
            &format!("memory create: {path}"),
            undo,
        )
    }

    /// Replace the first occurrence of `old` in the body with `new`; an
    /// empty `new` deletes every body line containing `old` (chapter 1).
    pub fn replace(&self, path: &str, old: &str, new: &str) -> Result<CommitOutcome, OpError> {
        if old.is_empty() {
            return Err(OpError::Empty {
                op: "replace",
                field: "old",
            });
        }
        self.edit_text("replace", path, |path, text| {
            let (front, body) = split_frontmatter(text);
            if !body.contains(old) {
                return Err(OpError::TextNotFound(path.to_string()));
            }
            let body = if new.is_empty() {
                body.split('\n')
                    .filter(|l| !l.contains(old))
                    .collect::<Vec<_>>()
                    .join("\n")
            } else {
                body.replacen(old, new, 1)
            };
            Ok(format!("{front}{body}"))
        })
    }

    /// Set the whole body of `path` to `body`, keeping its frontmatter (a
    /// block's value given when an agent is made).
    pub fn set_body(&self, path: &str, body: &str) -> Result<CommitOutcome, OpError> {
        self.edit_text("set-body", path, |_, text| {
            let (front, _) = split_frontmatter(text);
            let mut b = format!("\n{}", body.trim_start_matches('\n'));
            if !b.ends_with('\n') {
                b.push('\n');
            }
            Ok(format!("{front}{b}"))
        })
    }

    /// Insert `text` into the body before body line `line` (1-based; the
    /// line after the last appends; any other is refused), or append it as
    /// new lines at the end.
    pub fn insert(
        &self,
        path: &str,
        text: &str,
        line: Option<usize>,
    ) -> Result<CommitOutcome, OpError> {
        if text.is_empty() {
            return Err(OpError::Empty {
                op: "insert",
                field: "text",
            });
        }
        self.edit_text("insert", path, |rel, content| {
            let (front, body) = split_frontmatter(content);
            let body = match line {
                Some(n) => {
                    let mut lines: Vec<&str> = if body.is_empty() {
                        Vec::new()
                    } else {
                        body.split('\n').collect()
                    };
                    // A final newline ends the last line; it starts none.
                    let count = lines.len() - usize::from(body.ends_with('\n'));
                    if n == 0 || n > count + 1 {
                        return Err(OpError::LineOutOfRange {
                            path: rel.to_string(),
                            line: n,
                            lines: count,
                        });
                    }
                    let at = n - 1;
                    lines.splice(at..at, text.split('\n'));
                    lines.join("\n")
                }
                None => {
                    let mut b = body.to_string();
                    if !b.is_empty() && !b.ends_with('\n') {
                        b.push('\n');
                    }
                    b.push_str(text);
                    if !text.ends_with('\n') {
                        b.push('\n');
                    }
                    b
                }
            };
            Ok(format!("{front}{body}"))
        })
    }

    /// Set the `description` frontmatter field.
    pub fn set_description(&self, path: &str, description: &str) -> Result<CommitOutcome, OpError> {
        let description = one_line(description);
        if description.is_empty() {
            return Err(OpError::Empty {
                op: "set-description",
                field: "description",
            });
        }
        self.edit_text("set-description", path, |path, text| {
            let (front, body) = split_frontmatter(text);
            if front.is_empty() {
                return Err(OpError::NoFrontmatter(path.to_string()));
            }
            let line = format!("description: {description}");
            let mut lines: Vec<String> = front.lines().map(str::to_string).collect();
            match lines
                .iter()
                .position(|l| l.split(':').next().map(str::trim) == Some("description"))
            {
                Some(i) => lines[i] = line,
                // Before the closing `---`.
                None => lines.insert(lines.len().saturating_sub(1), line),
            }
            Ok(format!("{}\n{body}", lines.join("\n")))
        })
    }

    /// Delete a file.
    pub fn delete(&self, path: &str) -> Result<CommitOutcome, OpError> {
        let (path, dir, name, bytes, perm) = self.existing(path)?;
        dir.remove_file(&name).map_err(fs_err)?;
        let undo = Undo::Rewrite {
            dir,
            name,
            bytes,
            perm,
        };
        self.commit_or_undo(
            std::slice::from_ref(&path),
            &format!("memory delete: {path}"),
            undo,
        )
    }

    /// Move a file to a new path (creating directories as needed).
    pub fn rename(&self, from: &str, to: &str) -> Result<CommitOutcome, OpError> {
        let (from, from_dir, from_name, _, _) = self.existing(from)?;
        let to = self.check_new(to, OpError::DestinationExists)?;
        let (to_dir, to_name, made) = make_parents(&self.root()?, &to)?;
        let to_name = to_name.to_os_string();
        if let Err(e) = from_dir.rename_to(&from_name, &to_dir, &to_name) {
            remove_dirs(&made);
            return Err(fs_err(e));
        }
        let undo = Undo::Rename {
            from_dir,
            from: from_name,
            to_dir,
            to: to_name,
            made,
        };
        self.commit_or_undo(
            &[from.clone(), to.clone()],
            &format!("memory rename: {from} -> {to}"),
            undo,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frontmatter_split() {
        assert_eq!(
            split_frontmatter("---\nname: A\n---\nbody\n"),
            ("---\nname: A\n---\n", "body\n")
        );
        assert_eq!(split_frontmatter("---\nname: A\n"), ("", "---\nname: A\n"));
        assert_eq!(split_frontmatter("# Memory\n"), ("", "# Memory\n"));
        assert_eq!(split_frontmatter("---\nx: y\n---"), ("---\nx: y\n---", ""));
    }

    #[test]
    fn descriptions_are_one_line() {
        assert_eq!(one_line(" a\r\nb\nc "), "a b c");
    }
}
