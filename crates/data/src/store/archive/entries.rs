//! What an archive entry may be: judged by its header (type and path)
//! before anything of it is read, and where it goes; which history and
//! refs an import keeps; what `HEAD` may say.

use std::path::PathBuf;

use super::error::{ArchiveError, bad_repo};
use super::format::{MANIFEST_NAME, MAX_DEPTH, RECORD_NAME};
use crate::paths::{
    CONVERSATIONS_DIR_NAME, LAYOUT_POLICY_FILE_NAME, MEMORY_DIR_NAME, MEMORY_GIT_DIR_NAME,
};

/// Longest path accepted (in bytes).
const MAX_PATH_BYTES: usize = 4096;

/// Where an archive entry goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Place {
    Manifest,
    Record,
    /// `memory.git/HEAD`: checked, then written over the fresh one.
    Head,
    /// `memory.git/packed-refs`: only the lines of kept refs are written.
    PackedRefs,
    /// Unpacked at this relative path.
    Keep(PathBuf),
    /// Not taken (rebuilt on import, or not ours to take).
    Skip,
}

/// Judge one entry by its header: type, path and where it goes.
pub(super) fn classify(raw: &[u8], kind: tar::EntryType) -> Result<Place, ArchiveError> {
    let shown = String::from_utf8_lossy(raw).into_owned();
    let bad = |why: &str| ArchiveError::BadEntry {
        entry: shown.clone(),
        why: why.to_string(),
    };
    let is_dir = kind.is_dir();
    if !kind.is_file() && !is_dir {
        let what = match kind {
            tar::EntryType::Symlink => "a symbolic link",
            tar::EntryType::Link => "a hard link",
            tar::EntryType::Char => "a character device",
            tar::EntryType::Block => "a block device",
            tar::EntryType::Fifo => "a FIFO",
            _ => "not a regular file or directory",
        };
        return Err(bad(&format!(
            "is {what}; only regular files and directories are accepted"
        )));
    }
    let text = std::str::from_utf8(raw).map_err(|_| bad("path is not valid UTF-8"))?;
    if text.len() > MAX_PATH_BYTES {
        return Err(bad("path is too long"));
    }
    if text.starts_with('/') {
        return Err(bad("absolute path"));
    }
    let text = text.strip_prefix("./").unwrap_or(text);
    let text = if is_dir {
        text.trim_end_matches('/')
    } else {
        text
    };
    if text.is_empty() || text == "." {
        return if is_dir {
            Ok(Place::Skip)
        } else {
            Err(bad("empty path"))
        };
    }
    let parts: Vec<&str> = text.split('/').collect();
    if parts.contains(&"..") {
        return Err(bad("path contains `..`"));
    }
    if parts.iter().any(|p| p.is_empty() || *p == ".") {
        return Err(bad("path has empty or `.` components"));
    }
    if parts
        .iter()
        .any(|p| p.contains('\\') || p.chars().any(char::is_control))
    {
        return Err(bad("path has control characters or backslashes"));
    }
    if parts.len() > MAX_DEPTH {
        return Err(bad("path is too deep"));
    }
    let keep = || Ok(Place::Keep(parts.iter().collect()));
    let want_dir = |is: bool| {
        if is == is_dir {
            Ok(())
        } else if is {
            Err(bad("must be a directory"))
        } else {
            Err(bad("must be a regular file"))
        }
    };
    match parts.as_slice() {
        [MANIFEST_NAME] => want_dir(false).map(|()| Place::Manifest),
        [RECORD_NAME] => want_dir(false).map(|()| Place::Record),
        [MEMORY_DIR_NAME | CONVERSATIONS_DIR_NAME | MEMORY_GIT_DIR_NAME] => {
            want_dir(true).and_then(|()| keep())
        }
        // The working tree's `.git` pointer is rebuilt.
        [MEMORY_DIR_NAME, ".git", ..] => Ok(Place::Skip),
        [MEMORY_DIR_NAME | CONVERSATIONS_DIR_NAME, ..] => keep(),
        [MEMORY_GIT_DIR_NAME, rest @ ..] => match rest {
            // Stale lock files would stop the next commit.
            _ if parts.last().is_some_and(|l| l.ends_with(".lock")) => Ok(Place::Skip),
            ["HEAD"] => want_dir(false).map(|()| Place::Head),
            ["packed-refs"] => want_dir(false).map(|()| Place::PackedRefs),
            [LAYOUT_POLICY_FILE_NAME] => want_dir(false).and_then(|()| keep()),
            _ if is_kept_git_entry(rest, is_dir) => keep(),
            // config, hooks, index, info, shallow, objects/info, refs other
            // than branches and ours, …: made fresh or not ours to take.
            _ => Ok(Place::Skip),
        },
        _ => Err(bad(
            "is not part of an agent export (expected mini-letta-export.json, agent.json, \
             memory/, memory.git/, conversations/)",
        )),
    }
}

/// Whether `rest` (a path inside `memory.git/`) is history the imported
/// repository needs: the object store's loose objects and packs, and
/// branches and mini-letta's own refs (with their reflogs). Nothing else
/// — `objects/info/alternates` would read another repository's objects,
/// `refs/replace/` swap objects for the git CLI, `refs/remotes/` name a
/// remote of the host that made the archive.
fn is_kept_git_entry(rest: &[&str], is_dir: bool) -> bool {
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    let kept_ref = |r: &[&str]| matches!(r, ["heads" | "mini-letta", ..]);
    match rest {
        ["objects"] | ["objects", "pack"] | ["refs"] | ["logs"] | ["logs", "refs"] => is_dir,
        ["objects", dir] => is_dir && hex(dir, 2),
        ["objects", "pack", file] => {
            let stem = file
                .strip_prefix("pack-")
                .and_then(|f| f.rsplit_once('.'))
                .filter(|(_, ext)| matches!(*ext, "pack" | "idx" | "rev"));
            !is_dir && stem.is_some_and(|(h, _)| hex(h, 40) || hex(h, 64))
        }
        ["objects", dir, file] => !is_dir && hex(dir, 2) && (hex(file, 38) || hex(file, 62)),
        ["refs", r @ ..] => kept_ref(r),
        ["logs", "HEAD"] => !is_dir,
        ["logs", "refs", r @ ..] => kept_ref(r),
        _ => false,
    }
}

/// Whether a ref of the archive's `packed-refs` is kept (see
/// [`is_kept_git_entry`]).
fn is_kept_ref(name: &str) -> bool {
    (name.starts_with("refs/heads/") || name.starts_with("refs/mini-letta/"))
        && git2::Reference::is_valid_name(name)
}

/// `packed-refs` with only the lines of kept refs: the header, each kept
/// `<oid> <ref>` line and the `^<oid>` peel line that follows it.
pub(super) fn filter_packed_refs(text: &str) -> String {
    let mut out = String::new();
    let mut last_kept = false;
    for line in text.lines() {
        let keep = if line.starts_with('#') {
            last_kept = false;
            out.is_empty()
        } else if line.starts_with('^') {
            last_kept
        } else {
            let kept = line
                .split_once(' ')
                .is_some_and(|(oid, name)| git2::Oid::from_str(oid).is_ok() && is_kept_ref(name));
            last_kept = kept;
            kept
        };
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// `HEAD`'s contents: a symbolic ref to a branch, or a commit id.
pub(super) fn check_head(bytes: &[u8]) -> Result<(), ArchiveError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| bad_repo("memory.git/HEAD is not text"))?
        .trim_end_matches('\n');
    let ok = match text.strip_prefix("ref: ") {
        Some(r) => r.starts_with("refs/heads/") && git2::Reference::is_valid_name(r),
        None => {
            (text.len() == 40 || text.len() == 64) && text.bytes().all(|b| b.is_ascii_hexdigit())
        }
    };
    if ok {
        Ok(())
    } else {
        Err(bad_repo(format!(
            "memory.git/HEAD is neither a branch nor a commit id: {text:?}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    fn place(path: &str, kind: tar::EntryType) -> Result<Place, String> {
        classify(path.as_bytes(), kind).map_err(|e| e.to_string())
    }

    #[test]
    fn entries_are_judged_by_type_and_path() {
        use tar::EntryType::{Block, Char, Directory, Fifo, Link, Regular, Symlink};
        assert_eq!(place("agent.json", Regular), Ok(Place::Record));
        assert_eq!(
            place("./mini-letta-export.json", Regular),
            Ok(Place::Manifest)
        );
        assert_eq!(place("memory.git/HEAD", Regular), Ok(Place::Head));
        assert_eq!(
            place("memory/human.md", Regular),
            Ok(Place::Keep("memory/human.md".into()))
        );
        assert_eq!(
            place("memory.git/objects/ab/", Directory),
            Ok(Place::Keep("memory.git/objects/ab".into()))
        );
        let loose = format!("memory.git/objects/ab/{}", "c".repeat(38));
        let pack = format!("memory.git/objects/pack/pack-{}.idx", "d".repeat(40));
        for kept in [
            "memory.git/refs/heads/main",
            "memory.git/refs/heads/mini-letta/reflection/x",
            "memory.git/refs/mini-letta/agent",
            "memory.git/logs/HEAD",
            "memory.git/logs/refs/heads/main",
            &loose,
            &pack,
        ] {
            assert_eq!(place(kept, Regular), Ok(Place::Keep(kept.into())), "{kept}");
        }
        assert_eq!(
            place("memory.git/packed-refs", Regular),
            Ok(Place::PackedRefs)
        );
        for skipped in [
            "memory.git/config",
            "memory.git/hooks/pre-commit",
            "memory.git/index",
            "memory.git/refs/heads/main.lock",
            "memory/.git",
            "memory.git/objects/info/alternates",
            "memory.git/objects/info/http-alternates",
            "memory.git/objects/info/commit-graph",
            "memory.git/objects/info/packs",
            "memory.git/objects/stray",
            "memory.git/objects/ab/short",
            "memory.git/objects/pack/multi-pack-index",
            "memory.git/info/grafts",
            "memory.git/shallow",
            "memory.git/refs/replace/0123",
            "memory.git/refs/remotes/origin/main",
            "memory.git/refs/tags/v1",
            "memory.git/logs/refs/remotes/origin/main",
        ] {
            assert_eq!(place(skipped, Regular), Ok(Place::Skip), "{skipped}");
        }
        assert_eq!(place("./", Directory), Ok(Place::Skip));
        for (path, kind, why) in [
            ("../evil", Regular, "`..`"),
            ("memory/../../evil", Regular, "`..`"),
            ("/etc/passwd", Regular, "absolute"),
            ("memory/a.md", Symlink, "symbolic link"),
            ("memory/a.md", Link, "hard link"),
            ("memory/a", Char, "character device"),
            ("memory/a", Block, "block device"),
            ("memory/a", Fifo, "FIFO"),
            ("tmp/x", Regular, "not part of an agent export"),
            ("agent.json", Directory, "regular file"),
            ("memory", Regular, "directory"),
            ("memory//a", Regular, "empty"),
            ("memory/./a", Regular, "empty"),
        ] {
            let e = place(path, kind).unwrap_err();
            assert!(e.contains(why), "{path}: {e}");
        }
    }

    #[test]
    fn packed_refs_keep_only_branches_and_ours() {
        let (a, b) = ("a".repeat(40), "b".repeat(40));
        let text = format!(
            "# pack-refs with: peeled fully-peeled sorted \n\
             {a} refs/heads/main\n\
             {b} refs/mini-letta/agent\n\
             {b} refs/remotes/origin/main\n\
             {b} refs/replace/{a}\n\
             {a} refs/tags/v1\n\
             ^{b}\n\
             # a second header\n\
             junk\n"
        );
        assert_eq!(
            filter_packed_refs(&text),
            format!(
                "# pack-refs with: peeled fully-peeled sorted \n\
                 {a} refs/heads/main\n\
                 {b} refs/mini-letta/agent\n"
            )
        );
    }

    #[test]
    fn head_must_name_a_branch_or_commit() {
        assert!(check_head(b"ref: refs/heads/main\n").is_ok());
        assert!(check_head(b"0123456789012345678901234567890123456789\n").is_ok());
        for bad in [
            &b"ref: ../../x"[..],
            b"ref: refs/heads/..",
            b"hello",
            b"\xff",
        ] {
            assert!(check_head(bad).is_err(), "{bad:?}");
        }
    }
}
