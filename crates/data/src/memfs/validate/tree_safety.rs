//! [B] The shape a memory tree may have, whoever made it: a local commit, a
//! merge, an import, or a remote a sync would move `main` to. A tree is
//! checked out by root into a directory an agent reads and writes, so none
//! of these may pass:
//!
//! * a path component `.git` (any case): it would overwrite the checkout's
//!   gitdir pointer, or be one;
//! * `.gitmodules` or `.gitattributes` anywhere: submodules, filters and
//!   merge drivers are git's, not memory's;
//! * a gitlink: never checked out, it keeps the checkout dirty for ever;
//! * a symlink whose target leaves the tree or enters `.git` (judged
//!   lexically, as the commit path does: [`link_stays_inside`]);
//! * two paths equal but for case (a case-insensitive checkout would hold
//!   one of them): [`CaseIndex`];
//! * a name with a character that drives a terminal or reads backwards
//!   ([`crate::names`]).

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use git2::Repository;

use super::error::{Stage, ValidateError, read_blob};
use super::report::{Rule, Violation};
use super::snapshot::TreeSnapshot;

/// Longest symlink target a tree may hold (Linux's `PATH_MAX`).
const MAX_LINK_TARGET: usize = 4096;

/// Git's own files, never memory.
const GIT_METADATA: [&str; 2] = [".gitmodules", ".gitattributes"];

/// The violations of `tree`, in path order.
pub(crate) fn violations(
    repo: &Repository,
    tree: &TreeSnapshot,
) -> Result<Vec<Violation>, ValidateError> {
    let mut out = Vec::new();
    let mut cases = CaseIndex::default();
    for (path, entry) in tree.iter() {
        let shown = shown(path);
        let mut push = |rule, what: String| {
            out.push(Violation::new(Some(path), rule, format!("{shown}: {what}")));
        };
        if let Err(why) = crate::names::check(path) {
            push(Rule::UnsafeName, format!("name {why}"));
        }
        let segments: Vec<&str> = path.split('/').collect();
        if segments.iter().any(|s| s.eq_ignore_ascii_case(".git")) {
            push(
                Rule::GitPath,
                "a path inside .git is not memory and is never checked out".into(),
            );
        }
        let leaf = segments.last().copied().unwrap_or(path);
        if GIT_METADATA.iter().any(|m| leaf.eq_ignore_ascii_case(m)) {
            push(
                Rule::GitMetadata,
                "git metadata (.gitmodules, .gitattributes) is not allowed in memory".into(),
            );
        }
        if entry.is_gitlink() {
            push(
                Rule::Gitlink,
                "gitlinks (submodules) are not allowed in memory".into(),
            );
        }
        if entry.is_symlink() {
            let target = read_blob(repo, path, entry.oid, Stage::Constraints)?;
            let dirs = &segments[..segments.len().saturating_sub(1)];
            if target.len() > MAX_LINK_TARGET
                || target.contains(&0)
                || !link_stays_inside(dirs, Path::new(std::ffi::OsStr::from_bytes(&target)))
            {
                push(
                    Rule::SymlinkOutside,
                    "symbolic link points outside the memory directory".into(),
                );
            }
        }
        if let Some(other) = cases.collides(path) {
            push(
                Rule::CaseCollision,
                format!("differs only in case from {}", self::shown(&other)),
            );
        }
        cases.insert(path);
    }
    Ok(out)
}

/// `found` without the symlink and gitlink violations of paths `earlier`
/// already refused as memory Markdown that is not a regular file: one
/// problem, one line (letta-code's line, which the golden tests hold).
pub(crate) fn without_repeats(found: Vec<Violation>, earlier: &[Violation]) -> Vec<Violation> {
    found
        .into_iter()
        .filter(|v| {
            !matches!(v.rule, Rule::SymlinkOutside | Rule::Gitlink)
                || !earlier
                    .iter()
                    .any(|e| e.rule == Rule::NotRegular && e.path == v.path)
        })
        .collect()
}

/// A path for a message: characters [`crate::names`] refuses are shown as
/// `\u{…}` escapes, so the message itself never drives a terminal.
fn shown(path: &str) -> String {
    path.chars()
        .map(|c| {
            if crate::names::is_unsafe(c) {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Whether a relative symlink in directory `dir` (segments below the memory
/// root) resolves, lexically, to a path below the root and outside `.git`.
pub(crate) fn link_stays_inside(dir: &[&str], target: &Path) -> bool {
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

/// Paths compared case-insensitively (by `to_lowercase`, every prefix:
/// `a`, `a/b`, `a/b/c.md`), remembering the first spelling of each.
#[derive(Debug, Default)]
pub struct CaseIndex {
    seen: HashMap<String, String>,
}

impl CaseIndex {
    /// Remember every prefix of `path`.
    pub fn insert(&mut self, path: &str) {
        for prefix in prefixes(path) {
            self.seen
                .entry(prefix.to_lowercase())
                .or_insert_with(|| prefix.to_string());
        }
    }

    /// A remembered path (or prefix) that equals a prefix of `path` but for
    /// case, spelled differently.
    pub(crate) fn collides(&self, path: &str) -> Option<String> {
        prefixes(path).find_map(|prefix| {
            self.seen
                .get(&prefix.to_lowercase())
                .filter(|other| other.as_str() != prefix)
                .cloned()
        })
    }
}

/// `a`, `a/b`, `a/b/c.md` for `a/b/c.md`.
fn prefixes(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/')
        .map(move |(i, _)| &path[..i])
        .chain(std::iter::once(path))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::memfs::validate::Entry;

    #[test]
    fn symlink_targets_are_resolved_lexically() {
        assert!(link_stays_inside(&[], Path::new("persona.md")));
        assert!(link_stays_inside(&["a"], Path::new("../persona.md")));
        assert!(!link_stays_inside(&["a"], Path::new("../../x")));
        assert!(!link_stays_inside(&[], Path::new("/etc/passwd")));
        assert!(!link_stays_inside(&[], Path::new(".")));
        assert!(!link_stays_inside(&[], Path::new(".git/config")));
        assert!(!link_stays_inside(&["a"], Path::new("../.GIT")));
    }

    #[test]
    fn case_collisions_compare_every_prefix() {
        let mut index = CaseIndex::default();
        index.insert("projects/MEMORY.md");
        index.insert("persona.md");
        assert_eq!(index.collides("Persona.md").as_deref(), Some("persona.md"));
        assert_eq!(index.collides("Projects/x.md").as_deref(), Some("projects"));
        assert_eq!(index.collides("projects/x.md"), None);
        assert_eq!(index.collides("persona.md"), None);
    }

    fn rules_of(files: &[(&str, u32, &[u8])]) -> Vec<(Rule, String)> {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(dir.path()).unwrap();
        let mut tree = TreeSnapshot::new();
        for (path, mode, content) in files {
            let oid = if *mode == 0o160000 {
                git2::Oid::from_str("1234567890123456789012345678901234567890").unwrap()
            } else {
                repo.blob(content).unwrap()
            };
            tree.insert(path, Entry::new(*mode, oid));
        }
        violations(&repo, &tree)
            .unwrap()
            .into_iter()
            .map(|v| (v.rule, v.message))
            .collect()
    }

    #[test]
    fn every_dangerous_shape_is_named_with_its_path() {
        let found = rules_of(&[
            (".git", 0o100644, b"gitdir: /etc"),
            ("a/.GIT/config", 0o100644, b"x"),
            ("d/.gitattributes", 0o100644, b"* filter=x"),
            (".gitmodules", 0o100644, b""),
            ("sub", 0o160000, b""),
            ("out", 0o120000, b"../x"),
            ("in", 0o120000, b"persona.md"),
            ("nul", 0o120000, b"a\0b"),
            ("Notes.md", 0o100644, b"a"),
            ("notes.md", 0o100644, b"b"),
            ("e\u{1b}[2J.md", 0o100644, b"x"),
            ("persona.md", 0o100644, b"x"),
        ]);
        let has = |rule: Rule, text: &str| found.iter().any(|(r, m)| *r == rule && m == text);
        assert!(has(
            Rule::GitPath,
            ".git: a path inside .git is not memory and is never checked out"
        ));
        assert!(has(
            Rule::GitPath,
            "a/.GIT/config: a path inside .git is not memory and is never checked out"
        ));
        assert!(has(
            Rule::GitMetadata,
            "d/.gitattributes: git metadata (.gitmodules, .gitattributes) is not allowed in memory"
        ));
        assert!(
            found
                .iter()
                .any(|(r, m)| *r == Rule::GitMetadata && m.starts_with(".gitmodules: "))
        );
        assert!(has(
            Rule::Gitlink,
            "sub: gitlinks (submodules) are not allowed in memory"
        ));
        assert!(has(
            Rule::SymlinkOutside,
            "out: symbolic link points outside the memory directory"
        ));
        assert!(
            found
                .iter()
                .any(|(r, m)| *r == Rule::SymlinkOutside && m.starts_with("nul: "))
        );
        assert!(has(
            Rule::CaseCollision,
            "notes.md: differs only in case from Notes.md"
        ));
        assert!(has(
            Rule::UnsafeName,
            "e\\u{1b}[2J.md: name contains the control character U+001B"
        ));
        // The link inside and the plain files are fine.
        assert!(
            !found
                .iter()
                .any(|(_, m)| m.starts_with("in: ") || m.starts_with("persona.md"))
        );
        assert_eq!(found.len(), 9, "{found:#?}");
    }
}
