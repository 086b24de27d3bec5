//! `audit verify`: walk the chain over every file, oldest first, in big
//! blocks whose lines are hashed on every core (`scan`), the links then
//! checked in order (a JSON parse only for the rare `torn` record); and
//! the usage summary checked against the records it covers.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::chain::chain_files;
use super::error::AuditError;
use super::record::{self, GENESIS};
use super::scan;
use super::summary::{self, Resolved};
use crate::paths::Home;

/// What broke the chain first; each names the record concerned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "problem", rename_all = "snake_case")]
pub enum Problem {
    /// The line of `seq` no longer hashes to the `prev` of the record
    /// after it (`next`): it (or that link) was edited.
    Altered { seq: u64, next: u64 },
    /// Record `seq` is not where it belongs: `found` follows `after`.
    Missing { seq: u64, after: u64, found: u64 },
    /// A record numbered lower than the one before it (`after`).
    OutOfOrder { seq: u64, after: u64 },
    /// The first record is not number 1, or its `prev` is not 64 zeros.
    BadStart { seq: u64 },
    /// The line after record `after` is not a record at all.
    NotARecord {
        after: u64,
        file: PathBuf,
        line: u64,
    },
    /// The last line has no newline (a crash while appending); the
    /// supervisor notes it at its next start.
    TornTail { after: u64, bytes: u64 },
    /// `--head` is the hash of no line on the chain: records after `last`
    /// were removed (or the head belongs to another log).
    HeadNotOnChain { last: u64, head: String },
    /// `--head SEQ:HEX`: the log has record `seq`, but its line no longer
    /// hashes to the saved head — it, or one before it, was rewritten
    /// (every later link recomputed, so the chain alone holds).
    AlteredSinceHead { seq: u64, head: String },
    /// The usage summary holds for the chain up to record `seq`, but its
    /// usage is not what those records add up to.
    UsageSummaryMismatch { seq: u64, detail: String },
}

impl Problem {
    /// The record the problem names.
    pub fn seq(&self) -> u64 {
        match self {
            Problem::Altered { seq, .. }
            | Problem::Missing { seq, .. }
            | Problem::OutOfOrder { seq, .. }
            | Problem::BadStart { seq } => *seq,
            Problem::NotARecord { after, .. } | Problem::TornTail { after, .. } => after + 1,
            Problem::HeadNotOnChain { last, .. } => last + 1,
            Problem::AlteredSinceHead { seq, .. } => *seq,
            Problem::UsageSummaryMismatch { seq, .. } => *seq,
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::Altered { seq, next } => write!(
                f,
                "record seq {seq} was altered: its sha256 is not the prev of record seq {next}"
            ),
            Problem::Missing { seq, after, found } => write!(
                f,
                "record seq {seq} is missing or out of place: seq {found} follows seq {after}"
            ),
            Problem::OutOfOrder { seq, after } => {
                write!(
                    f,
                    "record seq {seq} is out of order: it follows seq {after}"
                )
            }
            Problem::BadStart { seq } => write!(
                f,
                "record seq {seq} does not start the chain (the first record is seq 1 with a prev of 64 zeros; were older files removed?)"
            ),
            Problem::NotARecord { after, file, line } => write!(
                f,
                "record seq {} is not a record: line {line} of {} (after seq {after})",
                after + 1,
                file.display()
            ),
            Problem::TornTail { after, bytes } => write!(
                f,
                "record seq {} is torn: the last line ({bytes} bytes, after seq {after}) has no newline (a crash while appending; the supervisor notes it when it next starts)",
                after + 1
            ),
            Problem::AlteredSinceHead { seq, head } => write!(
                f,
                "record seq {seq}, or one before it, was altered since the head {head} was saved: its line no longer hashes to that head (the chain was rewritten after it)"
            ),
            Problem::UsageSummaryMismatch { seq, detail } => write!(
                f,
                "the usage summary (audit/usage-summary.json) does not match the records up to seq {seq} it covers: {detail}; `mini-letta usage` would read it wrong: remove the file (the supervisor makes it again from the log when it next starts)"
            ),
            Problem::HeadNotOnChain { last, head } => write!(
                f,
                "the saved head {head} is not on the chain: the log ends at seq {last}, so records from seq {} on were removed (or the head is another log's)",
                last + 1
            ),
        }
    }
}

/// A noted torn line the chain steps over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TornSeen {
    pub after: u64,
    pub noted_by: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub records: u64,
    /// The sha256 of the last record's line (`None`: an empty log).
    pub head: Option<String>,
    pub last_seq: u64,
    pub files: usize,
    pub torn: Vec<TornSeen>,
    /// Whether `--head` was found on the chain (when one was given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head_found: Option<bool>,
    pub problem: Option<Problem>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.problem.is_none()
    }
}

/// Where the walk is.
struct Walk {
    report: Report,
    expected: u64,
    prev: [u8; 32],
    /// A terminated line that is not a record, waiting for its `torn` note.
    pending_torn: Option<[u8; 32]>,
    want_head: Option<[u8; 32]>,
    /// The record the saved head is the hash of, when it was saved with it.
    want_seq: Option<u64>,
    /// The last record's hash (made hex once, at the end).
    head: Option<[u8; 32]>,
    /// The usage summary, when it holds for this chain, and the usage of
    /// the records it covers as the walk finds it.
    summary: Option<Resolved>,
    days: scan::Days,
}

/// A head saved earlier (`audit head`): the hash of the last record's
/// line, and that record's number when it was saved with it (`SEQ:HEX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SavedHead {
    pub seq: Option<u64>,
    pub hash: [u8; 32],
}

impl SavedHead {
    /// `HEX` or `SEQ:HEX`.
    pub fn parse(text: &str) -> Option<SavedHead> {
        let text = text.trim();
        let (seq, hex) = match text.split_once(':') {
            Some((s, h)) => (Some(s.parse().ok()?), h),
            None => (None, text),
        };
        Some(SavedHead {
            seq,
            hash: record::parse_hex32(hex.as_bytes())?,
        })
    }
}

/// Verify the whole chain; `head` is a head saved earlier that must be on it.
pub fn verify(home: &Home, head: Option<[u8; 32]>) -> Result<Report, AuditError> {
    verify_against(home, head.map(|hash| SavedHead { seq: None, hash }))
}

/// [`verify`] against a saved head; with its number, a head the log has
/// passed but no longer matches is told apart from a cut tail.
pub fn verify_against(home: &Home, head: Option<SavedHead>) -> Result<Report, AuditError> {
    let files = chain_files(home)?;
    let summary = match summary::load(home) {
        Some(s) => summary::resolve(home, s)?.filter(|r| r.files == files),
        None => None,
    };
    let mut walk = Walk {
        report: Report {
            files: files.len(),
            head_found: head.map(|_| false),
            ..Report::default()
        },
        expected: 1,
        prev: GENESIS,
        pending_torn: None,
        want_head: head.map(|h| h.hash),
        want_seq: head.and_then(|h| h.seq),
        head: None,
        summary,
        days: scan::Days::new(),
    };
    let last = files.len().saturating_sub(1);
    for (i, path) in files.iter().enumerate() {
        if let Err(p) = walk_file(&mut walk, path, i, i == last)? {
            walk.report.problem = Some(p);
            return Ok(finish(walk));
        }
    }
    if walk.pending_torn.is_some() {
        walk.report.problem = Some(Problem::NotARecord {
            after: walk.report.last_seq,
            file: files.last().cloned().unwrap_or_default(),
            line: 0,
        });
    } else if let (Some(h), Some(false)) = (walk.want_head, walk.report.head_found) {
        walk.report.problem = Some(Problem::HeadNotOnChain {
            last: walk.report.last_seq,
            head: record::hex(&h),
        });
    } else if let Some(r) = &walk.summary {
        walk.report.problem = summary_mismatch(r, &walk.days);
    }
    Ok(finish(walk))
}

fn finish(mut walk: Walk) -> Report {
    walk.report.head = walk.head.map(|h| record::hex(&h));
    walk.report
}

/// Where the summary's usage differs from the records it covers.
fn summary_mismatch(r: &Resolved, days: &scan::Days) -> Option<Problem> {
    let differ = |detail: String| {
        Some(Problem::UsageSummaryMismatch {
            seq: r.summary.seq,
            detail,
        })
    };
    let show = |s: Option<&crate::tally::Sums>| {
        s.and_then(|s| serde_json::to_string(s).ok())
            .unwrap_or_else(|| "nothing".into())
    };
    for (day, claimed) in &r.summary.days {
        let Some((at, agents)) = days.get(day) else {
            return differ(format!("it has usage on {day}, the records none"));
        };
        if r.at(claimed.start) != Some(*at) {
            return differ(format!(
                "it has {day} start elsewhere than its first record"
            ));
        }
        for (agent, sums) in agents {
            if claimed.agents.get(agent) != Some(sums) {
                return differ(format!(
                    "on {day}, agent {agent}'s records add up to {}, the summary says {}",
                    show(Some(sums)),
                    show(claimed.agents.get(agent))
                ));
            }
        }
        if let Some(agent) = claimed.agents.keys().find(|a| !agents.contains_key(*a)) {
            return differ(format!(
                "on {day} it has usage for agent {agent}, who has no record"
            ));
        }
    }
    if let Some(day) = days.keys().find(|d| !r.summary.days.contains_key(*d)) {
        return differ(format!("the records have usage on {day}, it none"));
    }
    None
}

/// Bytes read at once (split over the cores).
const BLOCK: usize = 8 << 20;

/// Read `file` into `buf[*len..]` until it holds `want` bytes; whether
/// the file ended first.
fn fill(file: &mut File, buf: &mut Vec<u8>, len: &mut usize, want: usize) -> std::io::Result<bool> {
    if buf.len() < want {
        buf.resize(want, 0);
    }
    while *len < want {
        match file.read(&mut buf[*len..want]) {
            Ok(0) => return Ok(true),
            Ok(n) => *len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

/// One file of the chain (number `index`); the outer `Err` is an I/O
/// failure, the inner one the first problem.
fn walk_file(
    walk: &mut Walk,
    path: &PathBuf,
    index: usize,
    is_last: bool,
) -> Result<Result<(), Problem>, AuditError> {
    let io = |source| AuditError::Io {
        path: path.clone(),
        source,
    };
    let mut file = File::open(path).map_err(io)?;
    let tally = walk.summary.as_ref().map(|r| scan::Tally {
        file: index,
        cover: r.end,
    });
    let mut buf = Vec::new();
    let (mut len, mut base, mut line_no, mut want) = (0usize, 0u64, 0u64, BLOCK);
    loop {
        let eof = fill(&mut file, &mut buf, &mut len, want).map_err(io)?;
        let whole = memchr::memrchr(b'\n', &buf[..len]).map_or(0, |i| i + 1);
        if whole == 0 && !eof {
            // A line longer than a block: read more of it.
            want = len + BLOCK;
            continue;
        }
        for l in scan::lines(&buf[..whole], base, tally, &mut walk.days) {
            line_no += 1;
            let line = &buf[l.start..l.start + l.len];
            if let Err(p) = step(walk, line, l.header, l.hash, path, line_no) {
                return Ok(Err(p));
            }
        }
        if eof {
            if whole == len {
                return Ok(Ok(()));
            }
            let after = walk.report.last_seq;
            return Ok(Err(if is_last && walk.pending_torn.is_none() {
                Problem::TornTail {
                    after,
                    bytes: (len - whole) as u64,
                }
            } else {
                Problem::NotARecord {
                    after,
                    file: path.clone(),
                    line: line_no + 1,
                }
            }));
        }
        buf.copy_within(whole..len, 0);
        len -= whole;
        base += whole as u64;
        want = BLOCK;
    }
}

/// One line, with its header and hash.
fn step(
    walk: &mut Walk,
    line: &[u8],
    header: Option<(u64, [u8; 32])>,
    hash: [u8; 32],
    path: &Path,
    line_no: u64,
) -> Result<(), Problem> {
    let after = walk.report.last_seq;
    let not_a_record = || Problem::NotARecord {
        after,
        file: path.to_path_buf(),
        line: line_no,
    };
    let Some((seq, prev)) = header else {
        // A torn line the next record must note; two in a row is damage.
        if walk.pending_torn.is_some() {
            return Err(not_a_record());
        }
        walk.pending_torn = Some(hash);
        return Ok(());
    };
    if let Some(torn) = walk.pending_torn.take() {
        if !notes_torn(line, &torn) {
            return Err(Problem::NotARecord {
                after,
                file: path.to_path_buf(),
                line: line_no - 1,
            });
        }
        walk.report.torn.push(TornSeen {
            after,
            noted_by: seq,
        });
    }
    if seq != walk.expected {
        return Err(match seq {
            _ if walk.expected == 1 => Problem::BadStart { seq },
            s if s > walk.expected => Problem::Missing {
                seq: walk.expected,
                after,
                found: s,
            },
            s => Problem::OutOfOrder { seq: s, after },
        });
    }
    if prev != walk.prev {
        return Err(if seq == 1 {
            Problem::BadStart { seq }
        } else {
            Problem::Altered {
                seq: after,
                next: seq,
            }
        });
    }
    if walk.want_head == Some(hash) {
        walk.report.head_found = Some(true);
    } else if walk.want_seq == Some(seq)
        && let Some(want) = walk.want_head
    {
        return Err(Problem::AlteredSinceHead {
            seq,
            head: record::hex(&want),
        });
    }
    walk.prev = hash;
    walk.expected = seq + 1;
    walk.report.records += 1;
    walk.report.last_seq = seq;
    walk.head = Some(hash);
    Ok(())
}

/// Whether `line` is the `torn` record noting the line hashing to `torn`.
fn notes_torn(line: &[u8], torn: &[u8; 32]) -> bool {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else {
        return false;
    };
    v["kind"] == "torn" && v["torn_sha256"].as_str() == Some(record::hex(torn).as_str())
}

/// The current head (the sha256 of the last record's line), read from the
/// tail alone (no walk).
pub fn head(home: &Home) -> Result<Option<(u64, String)>, AuditError> {
    for path in chain_files(home)?.into_iter().rev() {
        let mut f = File::open(&path).map_err(|source| AuditError::Io {
            path: path.clone(),
            source,
        })?;
        let size = f
            .metadata()
            .map_err(|source| AuditError::Io {
                path: path.clone(),
                source,
            })?
            .len();
        if let (Some(line), _) = super::file::last_line(&mut f, &path, size)? {
            let seq = record::header(&line).map(|(s, _)| s).unwrap_or(0);
            return Ok(Some((seq, record::hex(&record::line_hash(&line)))));
        }
    }
    Ok(None)
}
