//! Published heads: the chain anchored outside the log.
//!
//! The chain alone shows that records were edited, removed or reordered
//! — unless whoever edits also recomputes every later link. A head kept
//! where the log's writers cannot reach catches that: its record must
//! still hash to it. The operator names a file in `config.toml`:
//!
//! ```toml
//! [audit]
//! publish = "/var/lib/mini-letta/audit-heads"   # an absolute path outside the home
//! ```
//!
//! and the supervisor appends `SEQ:HEX TIME` to it when it starts (the
//! head it found, before its own start record), every
//! [`PUBLISH_EVERY`] while the log grows, and when it stops. `audit head
//! --publish FILE` appends one by hand; `audit verify --against FILE`
//! checks the log against the file's latest head.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::error::AuditError;
use super::verify::SavedHead;
use crate::paths::Home;

/// How often a running supervisor publishes a head that moved.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(60);
/// A heads file larger than this is not read (it is one short line per
/// publication: years of minutes).
const MAX_FILE: u64 = 64 << 20;

#[derive(Debug, Default, Deserialize)]
struct File {
    #[serde(default)]
    audit: Option<Section>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Section {
    publish: Option<PathBuf>,
}

/// `[audit] publish` of the home's `config.toml`: where heads go, if
/// anywhere. An error for a relative path, a path inside the home (which
/// the supervisor's own writers reach), or an unknown key.
pub fn target(home: &Home) -> Result<Option<PathBuf>, AuditError> {
    let path = home.config_file();
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(AuditError::Io { path, source }),
    };
    let bad = |detail: String| AuditError::Config {
        path: path.clone(),
        detail,
    };
    let file: File = toml::from_str(&text).map_err(|e| {
        bad(format!(
            "[audit]: {}",
            e.message().trim().replace('\n', " ")
        ))
    })?;
    let Some(to) = file.audit.and_then(|s| s.publish) else {
        return Ok(None);
    };
    if !to.is_absolute() {
        return Err(bad(format!(
            "[audit] publish = {:?}: name an absolute path",
            to.display()
        )));
    }
    if to.starts_with(home.root()) {
        return Err(bad(format!(
            "[audit] publish = {:?} is inside the home: a head kept beside the log anchors nothing",
            to.display()
        )));
    }
    Ok(Some(to))
}

/// Append `seq:head` with the time to `path`: created 0600 if missing,
/// never through a symlink, made durable before returning.
pub fn append(path: &Path, seq: u64, head: &str) -> Result<(), AuditError> {
    let io = |source| AuditError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(io)?;
    if !f.metadata().map_err(io)?.is_file() {
        return Err(AuditError::Corrupt {
            path: path.to_path_buf(),
            detail: "not a regular file".into(),
        });
    }
    let at = super::record::now();
    f.write_all(format!("{seq}:{head} {at}\n").as_bytes())
        .map_err(io)?;
    f.sync_data().map_err(io)
}

/// The latest head of a heads file (the highest record number), and how
/// many it holds. Every line must be `SEQ:HEX [TIME]`: a file that is not
/// is an error naming the line, not a silent pass.
pub fn latest(path: &Path) -> Result<(SavedHead, usize), AuditError> {
    let bad = |detail: String| AuditError::Corrupt {
        path: path.to_path_buf(),
        detail,
    };
    let size = std::fs::metadata(path)
        .map_err(|source| AuditError::Io {
            path: path.to_path_buf(),
            source,
        })?
        .len();
    if size > MAX_FILE {
        return Err(bad(format!(
            "{size} bytes: larger than a heads file can be"
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|source| AuditError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut best: Option<SavedHead> = None;
    let mut n = 0;
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let first = line.split_whitespace().next().unwrap_or("");
        let head = SavedHead::parse(first)
            .filter(|h| h.seq.is_some())
            .ok_or_else(|| bad(format!("line {} is not SEQ:HEX", i + 1)))?;
        n += 1;
        if best.is_none_or(|b| head.seq >= b.seq) {
            best = Some(head);
        }
    }
    best.map(|b| (b, n))
        .ok_or_else(|| bad("no head published yet".into()))
}

/// Publish `home`'s current head to its `[audit] publish` file, if one is
/// named and the head is not `last` (what this caller published before).
/// Returns the head published (or already there).
pub fn publish_if_moved(
    home: &Home,
    last: Option<&(u64, String)>,
) -> Result<Option<(u64, String)>, AuditError> {
    let Some(to) = target(home)? else {
        return Ok(None);
    };
    let Some(now) = super::verify::head(home)? else {
        return Ok(None);
    };
    if last != Some(&now) {
        append(&to, now.0, &now.1)?;
    }
    Ok(Some(now))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_head_is_the_highest_record_and_garbage_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("heads");
        let a = "a".repeat(64);
        let b = "b".repeat(64);
        append(&p, 7, &a).unwrap();
        append(&p, 12, &b).unwrap();
        let (h, n) = latest(&p).unwrap();
        assert_eq!((h.seq, n), (Some(12), 2));
        assert_eq!(h.hash, [0xbb; 32]);
        std::fs::write(&p, format!("7:{a}\nnot a head\n")).unwrap();
        let e = latest(&p).unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
        // A symlink is not followed.
        let q = dir.path().join("link");
        std::os::unix::fs::symlink(&p, &q).unwrap();
        assert!(append(&q, 1, &a).is_err());
    }
}
