//! Palace (book chapter 20): a read-only window into agents' memory, served
//! on loopback (`palace serve`) or exported as static pages that work from
//! `file://` (`palace export`).
//!
//! What it shows: the agents; an agent's memory at `HEAD` (system files
//! against deferred ones, sizes against limits); any file at any revision;
//! history (up to [`MAX_HISTORY`] commits) with diffs; per conversation its
//! messages (summaries and evicted ones marked), the system prompt it really
//! uses, context usage, compaction, reflection state; recall search (served).
//!
//! Nothing here writes. Memory is read from `memory.git` with libgit2 only
//! (objects, never the child-writable checkout or its `.git` pointer);
//! conversations through the descriptor-based readers that refuse symlinks.
//! Every request parameter is checked before use ([`check_sha`],
//! [`check_memory_path`], [`check_agent_id`]) and every string from memory
//! reaches HTML through maud, which escapes it.

pub mod data;
pub mod export;
pub mod pages;
pub mod serve;

use std::path::PathBuf;

use crate::paths::Home;

/// History pages list at most this many commits.
pub const MAX_HISTORY: usize = 500;

/// Diffs are shown in full up to this many bytes each.
pub const MAX_DIFF_BYTES: usize = 100 * 1024;

/// A file page shows at most this many bytes.
pub const MAX_FILE_BYTES: usize = 1024 * 1024;

/// Why a page cannot be produced; each maps to an HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum PalaceError {
    /// The request itself is malformed (a bad `sha`, a path with `..`).
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("{0}")]
    Internal(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl PalaceError {
    pub fn status(&self) -> u16 {
        match self {
            Self::BadRequest(_) => 400,
            Self::NotFound(_) => 404,
            Self::Internal(_) | Self::Io { .. } => 500,
        }
    }
}

impl From<git2::Error> for PalaceError {
    fn from(e: git2::Error) -> Self {
        if e.code() == git2::ErrorCode::NotFound {
            Self::NotFound(e.message().to_string())
        } else {
            Self::Internal(e.message().to_string())
        }
    }
}

/// A commit id as a request names it: exactly 40 hexadecimal digits.
pub(crate) fn check_sha(sha: &str) -> Result<git2::Oid, PalaceError> {
    if sha.len() != 40 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(PalaceError::BadRequest(
            "sha must be 40 hexadecimal characters".into(),
        ));
    }
    git2::Oid::from_str(&sha.to_ascii_lowercase())
        .map_err(|_| PalaceError::BadRequest("sha must be 40 hexadecimal characters".into()))
}

/// A path inside the memory tree as a request names it: relative, plain
/// components only (no `.`, `..`, empty component, backslash or NUL).
pub(crate) fn check_memory_path(path: &str) -> Result<(), PalaceError> {
    let bad = |why: &str| Err(PalaceError::BadRequest(format!("path {path:?}: {why}")));
    if path.is_empty() {
        return bad("empty");
    }
    if path.starts_with('/') {
        return bad("absolute paths are not memory paths");
    }
    if path.len() > 4096 || path.contains(['\0', '\\']) {
        return bad("not a memory path");
    }
    for c in path.split('/') {
        if c.is_empty() || c == "." || c == ".." {
            return bad("only plain components below the memory root");
        }
    }
    Ok(())
}

/// An agent id as a request names it, which must be an agent of `home`.
pub(crate) fn check_agent_id(home: &Home, id: &str) -> Result<(), PalaceError> {
    if !crate::paths::is_valid_agent_id(id) {
        return Err(PalaceError::BadRequest(format!(
            "{id:?} is not an agent id"
        )));
    }
    let paths = home
        .agent(id)
        .map_err(|e| PalaceError::BadRequest(e.to_string()))?;
    // `agent.json` is the supervisor's (children cannot write it), and
    // symlink_metadata never follows anything.
    match std::fs::symlink_metadata(paths.agent_json()) {
        Ok(m) if m.is_file() => Ok(()),
        _ => Err(PalaceError::NotFound(format!("no agent {id}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shas_are_forty_hex_digits() {
        assert!(check_sha(&"a".repeat(40)).is_ok());
        assert!(check_sha(&"A".repeat(40)).is_ok());
        for bad in [
            "",
            "abc",
            &"a".repeat(39),
            &"a".repeat(41),
            &"g".repeat(40),
            "HEAD",
            "main",
        ] {
            assert_eq!(check_sha(bad).unwrap_err().status(), 400, "{bad}");
        }
        let dotted = format!("{}..", "a".repeat(38));
        assert_eq!(check_sha(&dotted).unwrap_err().status(), 400);
    }

    #[test]
    fn memory_paths_stay_below_the_root() {
        for ok in ["human.md", "projects/x.md", "skills/a/SKILL.md"] {
            assert!(check_memory_path(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../secret",
            "a/../../b",
            "a//b",
            "./human.md",
            "a\\b",
            "a\0b",
            "projects/",
        ] {
            assert_eq!(check_memory_path(bad).unwrap_err().status(), 400, "{bad:?}");
        }
    }
}

#[cfg(test)]
mod site_tests;
