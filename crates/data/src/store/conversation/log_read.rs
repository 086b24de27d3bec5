//! Reading a conversation's log a line at a time: the scan that turns
//! lines into messages and reports what it skipped, and the readers that
//! hold one line at a time ([`read_messages`], [`summary`], [`last_messages`]).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Seek};

use crate::agentfs::{Dir, FsError};
use crate::paths::{AgentPaths, MESSAGES_FILE_NAME};

use super::dir::open_dir;
use super::error::{ConversationError, io};
use super::lines::{Line, LinePos, LogLines, MAX_LINE_BYTES};
use super::message::StoredMessage;

/// Skipped lines one read lists; past that it only counts them (a log of
/// a million bad lines must not make a million reports).
const MAX_LISTED_SKIPS: usize = 16;
/// The read buffer of a log: a few system calls per megabyte.
const LOG_READ_BUFFER: usize = 64 << 10;

/// A log line a read passed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedLine {
    /// 1-based.
    pub line: u64,
    /// Its length, without the newline.
    pub bytes: u64,
    pub why: SkipReason,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// Over [`MAX_LINE_BYTES`]: never held, never parsed.
    TooLong,
    /// Not a stored message; what the parser said.
    NotAMessage(String),
}

impl std::fmt::Display for SkippedLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.why {
            SkipReason::TooLong => write!(
                f,
                "line {} ({} bytes) is over the {MAX_LINE_BYTES}-byte line limit; skipped",
                self.line, self.bytes
            ),
            SkipReason::NotAMessage(e) => {
                write!(f, "line {} is not a message ({e}); skipped", self.line)
            }
        }
    }
}

/// What a read of a log met besides messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogReport {
    /// The first lines skipped (at most 16).
    pub skipped: Vec<SkippedLine>,
    /// Every line skipped, listed or not.
    pub skipped_count: u64,
    /// The last line is not a message yet: torn by a crash, or being
    /// written. Ignored, never reported as skipped.
    pub torn_tail: bool,
    /// Where a later read of new lines resumes: after the last line that
    /// ended (a torn or half-written one is read again).
    pub end: LinePos,
}

impl LogReport {
    fn skip(&mut self, line: SkippedLine) {
        self.skipped_count += 1;
        if self.skipped.len() < MAX_LISTED_SKIPS {
            self.skipped.push(line);
        }
    }

    /// One sentence per skipped line, and one for those not listed.
    pub fn warnings(&self) -> Vec<String> {
        let mut out: Vec<String> = self.skipped.iter().map(ToString::to_string).collect();
        let unlisted = self.skipped_count - self.skipped.len() as u64;
        if unlisted > 0 {
            out.push(format!("{unlisted} more line(s) skipped"));
        }
        out
    }

    /// Log [`Self::warnings`] and a torn tail, each prefixed by `what`.
    pub(super) fn warn(&self, what: &str) {
        for w in self.warnings() {
            tracing::warn!("{what}: {w}");
        }
        if self.torn_tail {
            tracing::warn!("{what}: torn last line ignored");
        }
    }
}

/// A stored message from one log line. Invalid UTF-8 is replaced, not
/// fatal (the log has always been read that way).
fn parse_message(bytes: &[u8]) -> Result<StoredMessage, serde_json::Error> {
    match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_str(&String::from_utf8_lossy(bytes)),
    }
}

/// Longest parser message kept for a skipped line (it can quote the line).
const MAX_REASON_CHARS: usize = 200;

/// What the parser said about a line, short and printable: it may quote
/// what the agent wrote (an unknown role, say), so it is cut, and any
/// character a terminal would act on is shown as its code point.
pub(super) fn parse_failure(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let mut out = String::new();
    let mut shown = 0;
    for c in text.chars() {
        let piece = if crate::names::is_unsafe(c) {
            format!("<U+{:04X}>", u32::from(c))
        } else {
            c.to_string()
        };
        shown += piece.chars().count();
        if shown > MAX_REASON_CHARS {
            out.push('…');
            break;
        }
        out.push_str(&piece);
    }
    out
}

pub(super) fn buffered<R: Read>(reader: R) -> BufReader<R> {
    BufReader::with_capacity(LOG_READ_BUFFER, reader)
}

/// The log of the conversation in `dir`, open, with its size; `None`
/// when there is no log.
pub(super) fn open_log(dir: &Dir) -> Result<Option<(std::fs::File, u64)>, FsError> {
    match dir.open_file(MESSAGES_FILE_NAME) {
        Ok((file, stat)) => Ok(Some((file, stat.size))),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Read log lines from `reader` (positioned at `from`) to its end, giving
/// `each` every message with where its line starts. A line that is not a
/// message is skipped and reported, except the last (torn by a crash
/// mid-append: it was never an acknowledged message); a last line with no
/// newline is never a message yet.
pub(super) fn scan<R: BufRead>(
    reader: R,
    from: LinePos,
    mut each: impl FnMut(StoredMessage, LinePos),
) -> std::io::Result<LogReport> {
    let mut report = LogReport {
        end: from,
        ..LogReport::default()
    };
    // A bad line is reported only once a later line shows it was not last.
    let mut pending: Option<SkippedLine> = None;
    let mut lines = LogLines::resuming(reader, from, MAX_LINE_BYTES);
    while let Some(line) = lines.next() {
        let line = line?;
        let blank =
            matches!(&line, Line::Text { bytes, .. } if bytes.iter().all(u8::is_ascii_whitespace));
        if !line.ended() {
            if !blank {
                report.torn_tail = true;
                report.skip_pending(&mut pending);
            }
            break;
        }
        report.end = lines.position();
        match line {
            _ if blank => {}
            Line::TooLong { at, len, .. } => {
                report.skip_pending(&mut pending);
                report.skip(SkippedLine {
                    line: at.line + 1,
                    bytes: len,
                    why: SkipReason::TooLong,
                });
            }
            Line::Text { at, bytes, .. } => {
                report.skip_pending(&mut pending);
                match parse_message(&bytes) {
                    Ok(m) => each(m, at),
                    Err(e) => {
                        pending = Some(SkippedLine {
                            line: at.line + 1,
                            bytes: bytes.len() as u64,
                            why: SkipReason::NotAMessage(parse_failure(&e)),
                        })
                    }
                }
            }
        }
    }
    if pending.is_some() {
        report.torn_tail = true;
    }
    Ok(report)
}

impl LogReport {
    fn skip_pending(&mut self, pending: &mut Option<SkippedLine>) {
        if let Some(p) = pending.take() {
            self.skip(p);
        }
    }
}

/// Stream the messages of conversation `id` of `agent` from `from` on
/// (the start, or a previous read's [`LogReport::end`]), giving `each`
/// every message with where its line starts; `None` when there is no
/// such conversation. Holds one line at a time, whatever the log holds.
/// A log shorter than `from` (replaced) is read again from its start.
pub fn read_messages(
    agent: &AgentPaths,
    id: &str,
    from: LinePos,
    each: impl FnMut(StoredMessage, LinePos),
) -> Result<Option<LogReport>, ConversationError> {
    let Some(dir) = open_dir(agent, id, false)? else {
        return Ok(None);
    };
    let log = agent.conversation(id)?.messages_jsonl();
    let Some((mut file, size)) = open_log(&dir)? else {
        return Ok(Some(LogReport::default()));
    };
    let from = if size < from.offset {
        tracing::warn!(
            "{}: the log shrank; read again from its start",
            log.display()
        );
        LinePos::default()
    } else {
        from
    };
    file.seek(std::io::SeekFrom::Start(from.offset))
        .map_err(io(&log))?;
    scan(buffered(file), from, each).map(Some).map_err(io(&log))
}

/// A conversation counted without being held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub messages: usize,
    /// The last message's time.
    pub last_ts: Option<String>,
    pub report: LogReport,
}

/// Count conversation `id`'s messages, streaming its log; `None` when
/// there is no such conversation.
pub fn summary(agent: &AgentPaths, id: &str) -> Result<Option<Summary>, ConversationError> {
    let mut messages = 0usize;
    let mut last_ts = None;
    let report = read_messages(agent, id, LinePos::default(), |m, _| {
        messages += 1;
        last_ts = Some(m.ts);
    })?;
    Ok(report.map(|report| Summary {
        messages,
        last_ts,
        report,
    }))
}

/// Give `each` the last `n` messages of conversation `id`, oldest first,
/// one at a time; `None` when there is no such conversation. The log is
/// read twice (where each message starts, then the last `n` again), so
/// what is held is one line and `n` offsets, however long the messages.
/// The report's `end` is where following the log resumes.
pub fn last_messages(
    agent: &AgentPaths,
    id: &str,
    n: usize,
    mut each: impl FnMut(StoredMessage),
) -> Result<Option<LogReport>, ConversationError> {
    let mut starts: VecDeque<LinePos> = VecDeque::new();
    let Some(report) = read_messages(agent, id, LinePos::default(), |_, at| {
        if n > 0 {
            if starts.len() == n {
                starts.pop_front();
            }
            starts.push_back(at);
        }
    })?
    else {
        return Ok(None);
    };
    let Some(dir) = open_dir(agent, id, false)? else {
        return Ok(Some(report));
    };
    let log = agent.conversation(id)?.messages_jsonl();
    let Some((file, _)) = open_log(&dir)? else {
        return Ok(Some(report));
    };
    for at in starts {
        (&file)
            .seek(std::io::SeekFrom::Start(at.offset))
            .map_err(io(&log))?;
        let mut one = LogLines::resuming(buffered(&file), at, MAX_LINE_BYTES);
        // The log only grows, so the line is where it was; if the log was
        // replaced meanwhile, what is there now is shown only if it is a
        // message.
        if let Some(Line::Text {
            bytes, ended: true, ..
        }) = one.next().transpose().map_err(io(&log))?
            && let Ok(m) = parse_message(&bytes)
        {
            each(m);
        }
    }
    Ok(Some(report))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::paths::Home;
    use crate::protocol::messages::{Part, Role};
    use crate::store::conversation::Conversation;

    /// Append raw bytes to conversation `id`'s log.
    fn append_raw(agent: &AgentPaths, id: &str, bytes: &[u8]) {
        let log = agent.conversation(id).unwrap().messages_jsonl();
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        f.write_all(bytes).unwrap();
    }

    fn line_of(id: &str, text: &str, ts: &str) -> Vec<u8> {
        let mut m = StoredMessage::new(
            id.into(),
            Role::User,
            vec![Part::Text { text: text.into() }],
        );
        m.ts = ts.into();
        let mut l = serde_json::to_vec(&m).unwrap();
        l.push(b'\n');
        l
    }

    fn ids(agent: &AgentPaths, id: &str, n: usize) -> Vec<String> {
        let mut got = Vec::new();
        last_messages(agent, id, n, |m| got.push(m.id))
            .unwrap()
            .unwrap();
        got
    }

    #[test]
    fn an_over_cap_line_is_skipped_reported_and_never_a_message() {
        let dir = tempfile::tempdir().unwrap();
        let agent = Home::at(dir.path()).agent("agent-x").unwrap();
        open_dir(&agent, "c", true).unwrap();
        append_raw(&agent, "c", &line_of("msg-000001", "one", "t1"));
        // A well-formed message one byte over the cap.
        let big = line_of("msg-000002", "@", "t2");
        let at = big.iter().position(|b| *b == b'@').unwrap();
        let mut long = big[..at].to_vec();
        long.resize(MAX_LINE_BYTES + 1 - (big.len() - 1 - at - 1), b'a');
        long.extend_from_slice(&big[at + 1..]);
        assert_eq!(long.len(), MAX_LINE_BYTES + 2);
        append_raw(&agent, "c", &long);
        append_raw(&agent, "c", &line_of("msg-000003", "three", "t3"));

        let s = summary(&agent, "c").unwrap().unwrap();
        assert_eq!((s.messages, s.last_ts.as_deref()), (2, Some("t3")));
        assert_eq!(
            s.report.skipped,
            vec![SkippedLine {
                line: 2,
                bytes: MAX_LINE_BYTES as u64 + 1,
                why: SkipReason::TooLong
            }]
        );
        assert!(!s.report.torn_tail);
        assert_eq!(s.report.warnings().len(), 1);
        assert_eq!(ids(&agent, "c", 1), ["msg-000003"]);
        assert_eq!(ids(&agent, "c", 10), ["msg-000001", "msg-000003"]);
        assert!(ids(&agent, "c", 0).is_empty());
        let c = Conversation::open_existing(&agent, "c").unwrap().unwrap();
        assert_eq!(c.messages().len(), 2);
        assert!(!c.torn_tail);
    }

    #[test]
    fn a_bad_line_is_reported_unless_it_is_the_torn_last_one() {
        let dir = tempfile::tempdir().unwrap();
        let agent = Home::at(dir.path()).agent("agent-x").unwrap();
        open_dir(&agent, "c", true).unwrap();
        append_raw(&agent, "c", &line_of("msg-000001", "one", "t1"));
        append_raw(&agent, "c", b"not json\n\n");
        append_raw(&agent, "c", &line_of("msg-000002", "two", "t2"));
        append_raw(&agent, "c", b"{\"id\":\"msg-000003\"\n\n");
        let s = summary(&agent, "c").unwrap().unwrap();
        assert_eq!(s.messages, 2);
        assert_eq!(s.report.skipped.len(), 1);
        assert_eq!(s.report.skipped[0].line, 2);
        assert!(matches!(
            s.report.skipped[0].why,
            SkipReason::NotAMessage(_)
        ));
        // The last line, bad even with its newline: a crash mid-append.
        assert!(s.report.torn_tail);
        // Many bad lines: a few listed, every one counted.
        for _ in 0..40 {
            append_raw(&agent, "c", b"x\n");
        }
        append_raw(&agent, "c", &line_of("msg-000004", "four", "t4"));
        let s = summary(&agent, "c").unwrap().unwrap();
        assert_eq!(s.messages, 3);
        assert_eq!(s.report.skipped.len(), MAX_LISTED_SKIPS);
        assert_eq!(s.report.skipped_count, 42);
        assert!(!s.report.torn_tail);
        assert!(s.report.warnings().last().unwrap().starts_with("26 more"));
    }

    #[test]
    fn what_the_parser_says_of_a_bad_line_is_short_and_printable() {
        let dir = tempfile::tempdir().unwrap();
        let agent = Home::at(dir.path()).agent("agent-x").unwrap();
        open_dir(&agent, "c", true).unwrap();
        // An unknown role, quoted by the parser as it is: escape sequences
        // and a megabyte of it.
        let role = format!("\u{1b}]52;c;x\u{7}\u{202e}{}", "r".repeat(1 << 20));
        let line = serde_json::json!({"id": "m", "role": role, "parts": [], "ts": "t"});
        append_raw(&agent, "c", format!("{line}\n").as_bytes());
        append_raw(&agent, "c", &line_of("msg-000001", "one", "t1"));
        let s = summary(&agent, "c").unwrap().unwrap();
        let SkipReason::NotAMessage(why) = &s.report.skipped[0].why else {
            panic!("{:?}", s.report.skipped);
        };
        assert!(
            why.chars().count() <= MAX_REASON_CHARS + 1,
            "{} chars",
            why.len()
        );
        assert!(crate::names::first_unsafe(why).is_none(), "{why:?}");
        assert!(why.contains("<U+001B>"), "{why:?}");
    }

    #[test]
    fn a_read_resumes_where_the_last_ended_and_rereads_a_half_written_line() {
        let dir = tempfile::tempdir().unwrap();
        let agent = Home::at(dir.path()).agent("agent-x").unwrap();
        assert!(
            read_messages(&agent, "c", LinePos::default(), |_, _| {})
                .unwrap()
                .is_none()
        );
        open_dir(&agent, "c", true).unwrap();
        let read = |from| {
            let mut got = Vec::new();
            let r = read_messages(&agent, "c", from, |m, _| got.push(m.id))
                .unwrap()
                .unwrap();
            (got, r)
        };
        let (got, r) = read(LinePos::default());
        assert!(got.is_empty() && r.end == LinePos::default());
        append_raw(&agent, "c", &line_of("msg-000001", "one", "t1"));
        let (got, r) = read(r.end);
        assert_eq!(got, ["msg-000001"]);
        // Half a line: not a message yet, and read again next time.
        let two = line_of("msg-000002", "two", "t2");
        append_raw(&agent, "c", &two[..10]);
        let (got, r2) = read(r.end);
        assert!(got.is_empty() && r2.torn_tail && r2.end == r.end);
        append_raw(&agent, "c", &two[10..]);
        let (got, r3) = read(r2.end);
        assert_eq!(got, ["msg-000002"]);
        assert_eq!(r3.end.line, 2);
        // A log replaced by a shorter one is read from its start.
        let log = agent.conversation("c").unwrap().messages_jsonl();
        std::fs::write(&log, line_of("msg-000009", "nine", "t9")).unwrap();
        let (got, _) = read(r3.end);
        assert_eq!(got, ["msg-000009"]);
    }
}
