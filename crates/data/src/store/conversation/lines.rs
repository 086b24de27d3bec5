//! The one line reader of agent-written logs that root runs over (a
//! conversation's `messages.jsonl`). Lines stream through a buffer that
//! never holds more than the cap: a longer line is skipped whole and
//! reported with its number and length, as the recall index skips it. So
//! what a reader holds is bounded by the cap, never by what an agent wrote.

use std::io::BufRead;

/// The longest log line kept. Over any message a turn stores (a prompt is
/// at most 8 MiB, and a model's answer reaches the child in a frame of at
/// most 4 MiB), with room for JSON escaping; the recall index skips the
/// same lines, so search and the readers agree on what a log holds.
pub const MAX_LINE_BYTES: usize = 16 << 20;

/// Where a line starts: its byte offset and its 1-based number. The end
/// of a read is where the next one resumes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinePos {
    pub offset: u64,
    /// Lines before this one.
    pub line: u64,
}

/// One line of a log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// A line within the cap, without its newline.
    Text {
        at: LinePos,
        bytes: Vec<u8>,
        /// False for a last line with no newline (torn, or being written).
        ended: bool,
    },
    /// A line over the cap, skipped: its length without the newline.
    TooLong { at: LinePos, len: u64, ended: bool },
}

impl Line {
    pub fn at(&self) -> LinePos {
        match self {
            Line::Text { at, .. } | Line::TooLong { at, .. } => *at,
        }
    }

    pub fn ended(&self) -> bool {
        match self {
            Line::Text { ended, .. } | Line::TooLong { ended, .. } => *ended,
        }
    }
}

/// Lines of `reader`, each at most `cap` bytes held (see the module doc).
pub struct LogLines<R> {
    reader: R,
    cap: usize,
    pos: LinePos,
    buf: Vec<u8>,
}

impl<R: BufRead> LogLines<R> {
    /// Lines from the start of `reader`, capped at [`MAX_LINE_BYTES`].
    pub fn new(reader: R) -> Self {
        Self::resuming(reader, LinePos::default(), MAX_LINE_BYTES)
    }

    /// Lines of `reader`, which is positioned at `pos` (numbers and offsets
    /// continue from there), each capped at `cap` bytes.
    pub fn resuming(reader: R, pos: LinePos, cap: usize) -> Self {
        Self {
            reader,
            cap,
            pos,
            buf: Vec::new(),
        }
    }

    /// Where the next line starts (after a line with no newline: its end).
    pub fn position(&self) -> LinePos {
        self.pos
    }

    fn read_line(&mut self) -> std::io::Result<Option<Line>> {
        let at = self.pos;
        let mut len = 0u64;
        let mut over = false;
        let ended = loop {
            let chunk = match self.reader.fill_buf() {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if chunk.is_empty() {
                if len == 0 {
                    return Ok(None);
                }
                break false;
            }
            let newline = chunk.iter().position(|b| *b == b'\n');
            let body = &chunk[..newline.unwrap_or(chunk.len())];
            keep(&mut self.buf, self.cap, body, &mut over);
            len += body.len() as u64;
            let consumed = body.len() + usize::from(newline.is_some());
            self.reader.consume(consumed);
            self.pos.offset += consumed as u64;
            if newline.is_some() {
                break true;
            }
        };
        self.pos.line += 1;
        Ok(Some(if over {
            Line::TooLong { at, len, ended }
        } else {
            Line::Text {
                at,
                bytes: std::mem::take(&mut self.buf),
                ended,
            }
        }))
    }
}

/// Append `body` to the line in `buf`, or give the line up (`over`) once
/// it passes `cap`; the buffer never grows past `cap`.
fn keep(buf: &mut Vec<u8>, cap: usize, body: &[u8], over: &mut bool) {
    if *over {
        return;
    }
    let want = buf.len() + body.len();
    if want > cap {
        *over = true;
        *buf = Vec::new();
        return;
    }
    if want > buf.capacity() {
        // Doubling, as a Vec would, but never past the cap.
        let grown = (buf.capacity() * 2).clamp(want, cap);
        buf.reserve_exact(grown - buf.len());
    }
    buf.extend_from_slice(body);
}

impl<R: BufRead> Iterator for LogLines<R> {
    type Item = std::io::Result<Line>;

    fn next(&mut self) -> Option<Self::Item> {
        self.read_line().transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], cap: usize, chunk: usize) -> Vec<Line> {
        let reader = std::io::BufReader::with_capacity(chunk, input);
        LogLines::resuming(reader, LinePos::default(), cap)
            .map(|l| l.unwrap())
            .collect()
    }

    fn text(offset: u64, line: u64, s: &str, ended: bool) -> Line {
        Line::Text {
            at: LinePos { offset, line },
            bytes: s.as_bytes().to_vec(),
            ended,
        }
    }

    #[test]
    fn lines_within_the_cap_are_kept_and_longer_ones_skipped_whole() {
        let mut input = b"one\n\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 100));
        input.extend(b"\ntwo\ntorn");
        // Reads of 7 bytes: lines and the long one cross buffer refills.
        let got = lines(&input, 10, 7);
        assert_eq!(
            got,
            vec![
                text(0, 0, "one", true),
                text(4, 1, "", true),
                Line::TooLong {
                    at: LinePos { offset: 5, line: 2 },
                    len: 100,
                    ended: true
                },
                text(106, 3, "two", true),
                text(110, 4, "torn", false),
            ]
        );
        // A line of exactly the cap is kept; one byte more is not.
        let got = lines(b"0123456789\n0123456789a", 10, 4);
        assert_eq!(got[0], text(0, 0, "0123456789", true));
        assert!(matches!(
            got[1],
            Line::TooLong {
                len: 11,
                ended: false,
                ..
            }
        ));
    }

    #[test]
    fn a_resumed_read_continues_numbers_and_offsets() {
        let input = b"a\nbb\nccc\n";
        let mut first = LogLines::resuming(&input[..], LinePos::default(), 10);
        assert_eq!(first.next().unwrap().unwrap(), text(0, 0, "a", true));
        let pos = first.position();
        assert_eq!(pos, LinePos { offset: 2, line: 1 });
        let rest: Vec<Line> = LogLines::resuming(&input[2..], pos, 10)
            .map(|l| l.unwrap())
            .collect();
        assert_eq!(rest, vec![text(2, 1, "bb", true), text(5, 2, "ccc", true)]);
    }

    #[test]
    fn the_buffer_never_grows_past_the_cap() {
        let mut buf = Vec::new();
        let mut over = false;
        for _ in 0..9 {
            keep(&mut buf, 1000, &[b'x'; 100], &mut over);
        }
        assert!(!over && buf.len() == 900 && buf.capacity() <= 1000);
        keep(&mut buf, 1000, &[b'x'; 101], &mut over);
        assert!(over && buf.capacity() == 0);
    }
}
