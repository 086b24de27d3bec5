//! The usage summary (`usage-summary.json` beside the log): usage per UTC
//! day per agent over the records up to one (`seq`, whose line hashes to
//! `head` and ends at `end`), and where each day's first record is. A
//! reader sums whole days and reads only the records after `end` (and,
//! for `--since`, from the start of that day). The supervisor's writer
//! keeps it as it appends and writes it now and then (atomically, never
//! synced: it is checked against the log before it is believed, and a
//! summary that is missing, unreadable, off the chain or ahead of the log
//! is not used: the log is read instead).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::chain::chain_files;
use super::error::AuditError;
use super::record;
use super::tally::{self, Agents};
use crate::paths::Home;

pub(crate) const VERSION: u32 = 1;
/// The writer saves the summary after this many records (and when it
/// stops, flushes or rolls the log over).
pub(crate) const SAVE_EVERY: u64 = 4096;
/// A line longer than this is not looked for behind a position.
const MAX_LINE: u64 = 256 * 1024;

/// A place in the chain's files: `file` 0 is `audit.jsonl`, `n` is
/// `audit-<n>.jsonl`; `offset` is a byte offset in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Pos {
    pub file: u64,
    pub offset: u64,
}

/// One UTC day.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Day {
    /// Where its first record starts.
    pub start: Pos,
    pub agents: Agents,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Summary {
    pub version: u32,
    /// The last record covered (0: none).
    pub seq: u64,
    /// The sha256 (hex) of its line.
    pub head: String,
    /// Just past its line's newline.
    pub end: Pos,
    pub days: BTreeMap<String, Day>,
}

/// A place as an index into [`chain_files`] and an offset.
pub(crate) type At = (usize, u64);

/// A summary found to be on the chain as it is now.
#[derive(Debug)]
pub(crate) struct Resolved {
    pub summary: Summary,
    pub files: Vec<PathBuf>,
    /// The files' numbers as the summary names them (0: the current file).
    pub numbers: Vec<u64>,
    /// Their numbers as they are now.
    pub real: Vec<u64>,
    pub end: At,
}

impl Resolved {
    /// Where a position of the summary is now (`None`: a file not there).
    pub fn at(&self, pos: Pos) -> Option<At> {
        let i = self.numbers.iter().position(|n| *n == pos.file)?;
        Some((i, pos.offset))
    }
}

fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> AuditError + '_ {
    move |source| AuditError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The saved summary, if there is one that parses.
pub(crate) fn load(home: &Home) -> Option<Summary> {
    let path = home.audit_usage_summary();
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %path.display(), "cannot read the usage summary: {e}");
            }
            return None;
        }
    };
    match serde_json::from_slice::<Summary>(&bytes) {
        Ok(s) if s.version == VERSION => Some(s),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(path = %path.display(), "the usage summary does not parse ({e}); the log is read instead");
            None
        }
    }
}

/// Write `summary` over the saved one (temp file, rename; not synced).
pub(crate) fn save(home: &Home, summary: &Summary) -> Result<(), AuditError> {
    let tmp = home.audit_usage_summary_tmp();
    let bytes = serde_json::to_vec(summary).map_err(|e| AuditError::Corrupt {
        path: tmp.clone(),
        detail: e.to_string(),
    })?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(io(&tmp))?;
    f.write_all(&bytes).map_err(io(&tmp))?;
    let path = home.audit_usage_summary();
    std::fs::rename(&tmp, &path).map_err(io(&path))
}

/// The chain's files with the numbers a summary gives them.
pub(crate) fn numbered(home: &Home) -> Result<(Vec<PathBuf>, Vec<u64>), AuditError> {
    let mut files = Vec::new();
    let mut numbers = Vec::new();
    for (n, p) in super::chain::rotated(home)? {
        files.push(p);
        numbers.push(n);
    }
    let all = chain_files(home)?;
    if all.len() > files.len() {
        files.push(home.audit_log());
        numbers.push(0);
    }
    Ok((files, numbers))
}

/// `summary` as the chain is now: its last record must end at `end` and
/// hash to `head`. The current file may have rolled over since it was
/// written: then the record is in a newer rolled-over file, and what the
/// summary names file 0 is that file.
pub(crate) fn resolve(home: &Home, summary: Summary) -> Result<Option<Resolved>, AuditError> {
    let (files, real) = numbered(home)?;
    let mut numbers = real.clone();
    let Some(head) = record::parse_hex32(summary.head.as_bytes()) else {
        return Ok(None);
    };
    if summary.seq == 0 {
        return Ok(None);
    }
    let known = summary
        .days
        .values()
        .map(|d| d.start.file)
        .chain([summary.end.file]);
    let highest = known.max().unwrap_or(0);
    let mut candidates: Vec<usize> = Vec::new();
    if summary.end.file == 0 {
        // The current file first, then rolled-over files newer than any
        // the summary names, newest first.
        candidates.extend(numbers.iter().rposition(|n| *n == 0));
        candidates.extend((0..numbers.len()).rev().filter(|&i| numbers[i] > highest));
    } else {
        candidates.extend(numbers.iter().position(|n| *n == summary.end.file));
    }
    for i in candidates {
        if line_before(&files[i], summary.end.offset)?
            .is_some_and(|l| ends_chain_at(&l, summary.seq, &head))
        {
            if summary.end.file == 0 && numbers[i] != 0 {
                // Rolled over since: file 0 of the summary is this one now.
                let was = numbers[i];
                for n in numbers.iter_mut() {
                    if *n == was {
                        *n = 0;
                    } else if *n == 0 {
                        *n = u64::MAX;
                    }
                }
            }
            return Ok(Some(Resolved {
                end: (i, summary.end.offset),
                summary,
                files,
                numbers,
                real,
            }));
        }
    }
    Ok(None)
}

fn ends_chain_at(line: &[u8], seq: u64, head: &[u8; 32]) -> bool {
    record::header(line).is_some_and(|(s, _)| s == seq) && record::line_hash(line) == *head
}

/// The line ending (with its newline) just before `offset`.
fn line_before(path: &PathBuf, offset: u64) -> Result<Option<Vec<u8>>, AuditError> {
    let mut f = File::open(path).map_err(io(path))?;
    let size = f.metadata().map_err(io(path))?.len();
    if offset == 0 || offset > size {
        return Ok(None);
    }
    let start = offset.saturating_sub(MAX_LINE);
    let mut buf = vec![0; (offset - start) as usize];
    f.seek(SeekFrom::Start(start)).map_err(io(path))?;
    f.read_exact(&mut buf).map_err(io(path))?;
    if buf.pop() != Some(b'\n') {
        return Ok(None);
    }
    match buf.iter().rposition(|&b| b == b'\n') {
        Some(nl) => Ok(Some(buf[nl + 1..].to_vec())),
        None if start == 0 => Ok(Some(buf)),
        None => Ok(None),
    }
}

/// The line starting at `at` (it must start a line), without its newline.
pub(crate) fn line_at(files: &[PathBuf], at: At) -> Result<Option<Vec<u8>>, AuditError> {
    let Some(path) = files.get(at.0) else {
        return Ok(None);
    };
    let mut f = File::open(path).map_err(io(path))?;
    let from = at.1.saturating_sub(1);
    f.seek(SeekFrom::Start(from)).map_err(io(path))?;
    let mut buf = Vec::new();
    f.take(MAX_LINE + 1)
        .read_to_end(&mut buf)
        .map_err(io(path))?;
    let rest = if at.1 == 0 {
        &buf[..]
    } else {
        match buf.split_first() {
            Some((b'\n', rest)) => rest,
            _ => return Ok(None),
        }
    };
    Ok(rest
        .iter()
        .position(|&b| b == b'\n')
        .map(|nl| rest[..nl].to_vec()))
}

/// Call `f` with every complete line of `files` from `from` on, and where
/// it starts.
pub(crate) fn stream(
    files: &[PathBuf],
    from: At,
    mut f: impl FnMut(At, &[u8]),
) -> Result<(), AuditError> {
    for (i, path) in files.iter().enumerate().skip(from.0) {
        let mut file = File::open(path).map_err(io(path))?;
        let mut offset = if i == from.0 { from.1 } else { 0 };
        file.seek(SeekFrom::Start(offset)).map_err(io(path))?;
        let mut buf = Vec::with_capacity(1 << 20);
        let mut chunk = vec![0u8; 1 << 20];
        loop {
            let n = file.read(&mut chunk).map_err(io(path))?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            let mut done = 0;
            while let Some(nl) = memchr::memchr(b'\n', &buf[done..]) {
                f((i, offset), &buf[done..done + nl]);
                offset += nl as u64 + 1;
                done += nl + 1;
            }
            buf.drain(..done);
        }
    }
    Ok(())
}

/// Usage per day over the whole chain: the summary's days (when it holds)
/// and the records after it; and the last record's number.
pub(crate) fn days_now(home: &Home) -> Result<(BTreeMap<String, Agents>, u64), AuditError> {
    let resolved = match load(home) {
        Some(s) => resolve(home, s)?,
        None => None,
    };
    let (mut days, files, from, mut last) = match resolved {
        Some(r) => {
            let days: BTreeMap<String, Agents> = r
                .summary
                .days
                .iter()
                .map(|(d, day)| (d.clone(), day.agents.clone()))
                .collect();
            (days, r.files, r.end, r.summary.seq)
        }
        None => (BTreeMap::new(), chain_files(home)?, (0, 0), 0),
    };
    stream(&files, from, |_, line| {
        if let Some(r) = tally::scan(line) {
            last = last.max(r.seq);
            let agents = match days.get_mut(r.day()) {
                Some(a) => a,
                None => days.entry(r.day().to_string()).or_default(),
            };
            tally::add_to(agents, &r);
        }
    })?;
    Ok((days, last))
}
