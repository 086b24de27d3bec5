//! The network log: one JSON record per attempt, in
//! `<home>/network/<agent-id>/log.jsonl` (the supervisor's; rotated to
//! `log.1.jsonl` past [`ROTATE_AT`], so a child that floods the proxy
//! costs bounded disk). One writer thread appends; the proxy's tasks hand
//! it records over a bounded queue and wait when it is full, so a flood
//! slows its own sender and never grows memory.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::EgressError;
use crate::paths::Home;

/// A log file is rotated once it passes this size.
pub const ROTATE_AT: u64 = 8 * 1024 * 1024;
/// Records waiting for the writer at most.
const QUEUE: usize = 1024;

/// What the proxy decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Allowed,
    Denied,
}

/// One attempt: who (from the supervisor's child table), where to (the
/// host and port as the request wrote them), the verdict and what went
/// through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetRecord {
    /// When the attempt began (RFC 3339, UTC).
    pub time: String,
    pub agent: String,
    pub role: String,
    pub child: u64,
    /// `CONNECT`, `GET`, …; empty when no request line could be read.
    pub method: String,
    /// The host as written (empty when none could be read).
    pub host: String,
    pub port: Option<u16>,
    /// The address connected to, for an allowed attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    pub verdict: Verdict,
    /// Why it was refused (or why an allowed one ended early).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Bytes from the command to the server, and back.
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration_ms: u64,
}

/// The current time as a record stores it.
pub fn now() -> String {
    crate::clock::now_rfc3339()
}

/// Hands records to the writer thread.
#[derive(Clone)]
pub struct LogWriter {
    tx: tokio::sync::mpsc::Sender<NetRecord>,
}

impl LogWriter {
    /// Start the writer thread for `home`.
    pub fn start(home: Home) -> std::io::Result<Self> {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<NetRecord>(QUEUE);
        std::thread::Builder::new()
            .name("egress-log".into())
            .spawn(move || {
                while let Some(record) = rx.blocking_recv() {
                    if let Err(e) = append(&home, &record) {
                        tracing::warn!(agent = %record.agent, "cannot write the network log: {e}");
                    }
                }
            })?;
        Ok(Self { tx })
    }

    /// Record one attempt; a refusal also goes to the supervisor's log.
    pub async fn record(&self, record: NetRecord) {
        if record.verdict == Verdict::Denied {
            refused(&record);
        }
        // Only fails when the writer is gone (the supervisor is stopping).
        let _ = self.tx.send(record).await;
    }
}

/// The single place a refusal is reported beyond the network log.
fn refused(r: &NetRecord) {
    tracing::warn!(
        agent = %r.agent,
        role = %r.role,
        child = r.child,
        host = %r.host,
        port = ?r.port,
        reason = %r.reason.as_deref().unwrap_or(""),
        "egress refused"
    );
    // The audit log's `denied` record was appended before the refusal was
    // sent (`Egress::audit_denied`).
}

fn append(home: &Home, record: &NetRecord) -> Result<(), EgressError> {
    let files = home.network_log_files(&record.agent)?;
    super::policy::private_dirs(&home.network_dir(), &files.dir)?;
    let err = |source: std::io::Error| EgressError::Write {
        path: files.current.clone(),
        source,
    };
    if std::fs::symlink_metadata(&files.current).is_ok_and(|m| m.len() >= ROTATE_AT) {
        std::fs::rename(&files.current, &files.previous).map_err(err)?;
    }
    let mut line = serde_json::to_vec(record).map_err(|e| err(std::io::Error::other(e)))?;
    line.push(b'\n');
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(&files.current)
        .map_err(err)?;
    f.write_all(&line).map_err(err)
}

/// Agent `id`'s records, oldest first, at or after `since` when given.
/// Lines that are not records are skipped.
pub fn read(
    home: &Home,
    id: &str,
    since: Option<OffsetDateTime>,
) -> Result<Vec<NetRecord>, EgressError> {
    let files = home.network_log_files(id)?;
    let mut out = Vec::new();
    for path in [&files.previous, &files.current] {
        let Some(bytes) = read_log(path)? else {
            continue;
        };
        for line in bytes.split(|b| *b == b'\n') {
            let Ok(r) = serde_json::from_slice::<NetRecord>(line) else {
                continue;
            };
            let keep =
                since.is_none_or(|s| crate::clock::parse_rfc3339(&r.time).is_some_and(|t| t >= s));
            if keep {
                out.push(r);
            }
        }
    }
    Ok(out)
}

/// A log file, bounded by the rotation size (with room for the last
/// record written past it).
fn read_log(path: &std::path::Path) -> Result<Option<Vec<u8>>, EgressError> {
    use std::io::Read;
    let err = |source: std::io::Error| EgressError::Read {
        path: path.to_path_buf(),
        source,
    };
    let Some(file) = super::policy::open_no_follow(path)? else {
        return Ok(None);
    };
    if !file.metadata().map_err(err)?.is_file() {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    file.take(ROTATE_AT * 2)
        .read_to_end(&mut bytes)
        .map_err(err)?;
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(agent: &str, time: &str, verdict: Verdict) -> NetRecord {
        NetRecord {
            time: time.into(),
            agent: agent.into(),
            role: "tool".into(),
            child: 7,
            method: "GET".into(),
            host: "pypi.org".into(),
            port: Some(443),
            address: None,
            verdict,
            reason: None,
            bytes_up: 1,
            bytes_down: 2,
            duration_ms: 3,
        }
    }

    #[test]
    fn records_are_appended_rotated_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path());
        let a = record("agent-a", "2026-01-01T00:00:00Z", Verdict::Allowed);
        let b = record("agent-a", "2026-02-01T00:00:00Z", Verdict::Denied);
        append(&home, &a).unwrap();
        append(&home, &b).unwrap();
        assert_eq!(
            read(&home, "agent-a", None).unwrap(),
            [a.clone(), b.clone()]
        );
        let feb = crate::clock::parse_rfc3339("2026-01-15T00:00:00Z").unwrap();
        assert_eq!(
            read(&home, "agent-a", Some(feb)).unwrap(),
            std::slice::from_ref(&b)
        );
        // Past the size limit the file is rotated, and both are read.
        let files = home.network_log_files("agent-a").unwrap();
        let f = std::fs::OpenOptions::new()
            .append(true)
            .open(&files.current)
            .unwrap();
        f.set_len(ROTATE_AT).unwrap();
        append(&home, &a).unwrap();
        assert!(files.previous.exists());
        let all = read(&home, "agent-a", None).unwrap();
        assert_eq!(all.len(), 3);
        let v = serde_json::to_value(&b).unwrap();
        assert_eq!(v["verdict"], "denied");
        assert!(read(&home, "agent-none", None).unwrap().is_empty());
    }
}
