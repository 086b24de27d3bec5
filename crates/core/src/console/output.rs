//! Writing results: raw bytes, exactly one JSON object, tables — and the
//! one layer every piece of data passes on its way to a person.
//!
//! Data (file names, commit messages, message text, ids, times, agent
//! records) may come from an agent, a remote or an archive, and a control
//! character in it drives the terminal it is printed on (`ESC ] 52` writes
//! the clipboard, `ESC ] 0` the title, `ESC [ 2 J` clears the screen; a
//! bidirectional override makes a name read as another). So every command
//! prints data through this module, decided per stream ([`Sink`]):
//!
//! - on a terminal, data is shown visibly: ESC as `^[`, every other
//!   character [`names::is_unsafe`] names as `\u{7}`;
//! - in a pipe, a field ([`field`]: a name, an id, a time, a commit subject)
//!   that holds such a character is quoted as Rust's `{:?}` quotes it, so a
//!   script can tell and decode it, and is as it is otherwise; content
//!   ([`content`]: `memory show`, `memory diff`, `memory compile`, `prompt`)
//!   is byte-exact;
//! - prose that quotes data and cannot be split into fields (a sync result
//!   naming files, a doctor finding, an error) is shown visibly on every
//!   stream ([`text`]): it has no exact form to keep, and logs of it are
//!   read on terminals later;
//! - `--json` ([`json`]) is always exact.
//!
//! The program's own colours are added by `style` around text already
//! made safe here, so they stay. `chat` and `attach` render model and tool
//! text with `cli::terminal::clean`, which drops sequences instead.

use std::borrow::Cow;
use std::io::{IsTerminal, Write};
use std::sync::OnceLock;

use serde::Serialize;

use crate::names;

/// Where a stream's text goes: a person's terminal, or a pipe or file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    Terminal,
    Pipe,
}

impl Sink {
    /// Stdout's sink (decided once per process). Stderr needs none: what
    /// goes there is prose ([`text`]), shown visibly on any stream.
    pub fn stdout() -> Sink {
        static SINK: OnceLock<Sink> = OnceLock::new();
        *SINK.get_or_init(|| {
            if std::io::stdout().is_terminal() {
                Sink::Terminal
            } else {
                Sink::Pipe
            }
        })
    }

    /// One datum of a listing or line (a name, id, time, subject): visible
    /// on a terminal; in a pipe quoted when odd, else unchanged.
    pub fn field(self, data: &str) -> Cow<'_, str> {
        match self {
            Sink::Terminal => visible(data, Keep::Nothing),
            Sink::Pipe => quoted(data),
        }
    }

    /// The bytes of a file or prompt: visible on a terminal (lines and
    /// tabs kept), exact in a pipe.
    pub fn content(self, bytes: &[u8]) -> Cow<'_, [u8]> {
        match self {
            Sink::Terminal => visible_bytes(bytes),
            Sink::Pipe => Cow::Borrowed(bytes),
        }
    }
}

/// A datum for stdout (see [`Sink::field`]).
pub fn field(data: &str) -> Cow<'_, str> {
    Sink::stdout().field(data)
}

/// Prose that quotes data, for any stream: every unsafe character shown
/// visibly, line breaks included (one message stays one line).
pub fn text(data: &str) -> Cow<'_, str> {
    visible(data, Keep::Nothing)
}

/// Several lines of prose that quote data (a validator's block): shown
/// visibly, its line breaks and tabs kept.
pub fn text_block(data: &str) -> Cow<'_, str> {
    visible(data, Keep::Layout)
}

/// Write content to stdout (see [`Sink::content`]).
pub fn content(bytes: &[u8]) -> anyhow::Result<()> {
    raw(&Sink::stdout().content(bytes))
}

/// Which layout characters survive [`visible`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// None: the text stays on one line.
    Nothing,
    /// `\n`, `\t` and a `\r` ending a line (`\r\n`); a lone `\r`, which
    /// would let text overwrite the line it is on, is shown.
    Layout,
}

/// Whether `c` (followed by `next`) is shown as it is under `keep`.
fn kept(c: char, next: Option<char>, keep: Keep) -> bool {
    if !names::is_unsafe(c) {
        return true;
    }
    keep == Keep::Layout && (c == '\n' || c == '\t' || (c == '\r' && next == Some('\n')))
}

/// `data` with every character [`names::is_unsafe`] names (but those
/// `keep` keeps) written visibly: ESC as `^[`, the rest as `\u{7}`.
fn visible(data: &str, keep: Keep) -> Cow<'_, str> {
    let mut chars = data.chars().peekable();
    let mut clean = true;
    while let Some(c) = chars.next() {
        if !kept(c, chars.peek().copied(), keep) {
            clean = false;
            break;
        }
    }
    if clean {
        return Cow::Borrowed(data);
    }
    let mut out = String::with_capacity(data.len() + 16);
    let mut chars = data.chars().peekable();
    while let Some(c) = chars.next() {
        if kept(c, chars.peek().copied(), keep) {
            out.push(c);
        } else {
            push_visible(&mut out, c);
        }
    }
    Cow::Owned(out)
}

fn push_visible(out: &mut String, c: char) {
    if c == '\u{1b}' {
        out.push_str("^[");
    } else {
        out.extend(c.escape_unicode());
    }
}

/// Bytes for a terminal: [`visible`] with layout kept, and every byte that
/// is not UTF-8 shown as `\xNN` (a terminal may take a stray 0x9B as CSI).
fn visible_bytes(bytes: &[u8]) -> Cow<'_, [u8]> {
    if let Ok(s) = std::str::from_utf8(bytes) {
        return match visible(s, Keep::Layout) {
            Cow::Borrowed(_) => Cow::Borrowed(bytes),
            Cow::Owned(o) => Cow::Owned(o.into_bytes()),
        };
    }
    let mut out = String::with_capacity(bytes.len() + 16);
    for chunk in bytes.utf8_chunks() {
        out.push_str(&visible(chunk.valid(), Keep::Layout));
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02X}"));
        }
    }
    Cow::Owned(out.into_bytes())
}

/// `data` as it is when it holds no unsafe character, else quoted the way
/// Rust's `{:?}` quotes a string (every unsafe character escaped).
pub fn quoted(data: &str) -> Cow<'_, str> {
    if names::first_unsafe(data).is_none() {
        return Cow::Borrowed(data);
    }
    let debug = format!("{data:?}");
    // `{:?}` escapes every control and format character today; make sure
    // of the rest of the rule rather than trust that.
    match visible(&debug, Keep::Nothing) {
        Cow::Borrowed(_) => Cow::Owned(debug),
        Cow::Owned(o) => Cow::Owned(o),
    }
}

/// Whether a panic message is std's for a write to a stdout whose reader
/// went away (`println!` into a closed pipe).
pub fn is_broken_pipe_message(text: &str) -> bool {
    text.starts_with("failed printing to stdout") && text.contains("Broken pipe")
}

/// Whether `e` is, at its root, a write into a pipe whose reader went away.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Write `bytes` to stdout exactly (no added newline). Only for output
/// that is the program's own or already passed [`Sink`].
pub fn raw(bytes: &[u8]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)?;
    out.flush()?;
    Ok(())
}

/// Print one JSON value followed by a newline, exact (JSON writes C0
/// controls as `\u001b`; the rest is left as the data has it).
pub fn json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    raw(text.as_bytes())
}

/// A stored RFC 3339 time (any offset, any fraction) shown as every
/// table and line shows one ([`crate::clock::whole_seconds`]); text that is
/// not one is shown as it is.
pub fn display_stored_time(stored: &str) -> String {
    crate::clock::parse_rfc3339(stored)
        .map_or_else(|| stored.to_string(), crate::clock::whole_seconds)
}

/// A table for people: a header row, then rows, columns padded to their
/// widest cell and two spaces apart; the last column is not padded. A row
/// shorter than the header ends in a cell that runs to the end of the line
/// (a note in place of the remaining columns) and widens nothing. Every
/// cell is a [`Sink::field`] of the stream it is printed on.
pub struct Table {
    headers: Vec<&'static str>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(headers: &[&'static str]) -> Self {
        Table {
            headers: headers.to_vec(),
            right: vec![false; headers.len()],
            rows: Vec::new(),
        }
    }

    /// Align column `col` to the right (numbers).
    pub fn right(mut self, col: usize) -> Self {
        if let Some(r) = self.right.get_mut(col) {
            *r = true;
        }
        self
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text for `sink`, one line per row, each ending in a
    /// newline.
    pub fn render(&self, sink: Sink) -> String {
        let width = |s: &str| s.chars().count();
        let rows: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| r.iter().map(|c| sink.field(c).into_owned()).collect())
            .collect();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| width(h)).collect();
        for row in &rows {
            let spans = row.len() < self.headers.len();
            for (i, cell) in row.iter().enumerate() {
                if spans && i + 1 == row.len() {
                    continue;
                }
                if let Some(w) = widths.get_mut(i) {
                    *w = (*w).max(width(cell));
                }
            }
        }
        let mut out = String::new();
        let header: Vec<String> = self.headers.iter().map(|h| h.to_string()).collect();
        for row in std::iter::once(&header).chain(&rows) {
            let last = row.len().saturating_sub(1);
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = widths
                    .get(i)
                    .copied()
                    .unwrap_or(0)
                    .saturating_sub(width(cell));
                let right = self.right.get(i).copied().unwrap_or(false) && i < last;
                if right {
                    line.extend(std::iter::repeat_n(' ', pad));
                }
                line.push_str(cell);
                if !right && i < last {
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }

    /// Print the table on stdout.
    pub fn print(&self) -> anyhow::Result<()> {
        raw(self.render(Sink::stdout()).as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_rows_end_in_a_note_that_widens_nothing() {
        let mut t = Table::new(&["ID", "NAME", "MODEL", "CREATED"]);
        t.row(vec!["1".into(), "a".into(), "mock".into(), "now".into()]);
        t.row(vec![
            "2".into(),
            "-".into(),
            "unreadable: a long reason".into(),
        ]);
        assert_eq!(
            t.render(Sink::Pipe),
            "ID  NAME  MODEL  CREATED\n1   a     mock   now\n2   -     unreadable: a long reason\n"
        );
    }

    #[test]
    fn tables_pad_columns_under_their_headers() {
        let mut t = Table::new(&["ID", "MESSAGES", "LAST"]).right(1);
        t.row(vec!["default".into(), "12".into(), "x".into()]);
        t.row(vec!["a".into(), "3".into(), "longer text".into()]);
        assert_eq!(
            t.render(Sink::Pipe),
            "ID       MESSAGES  LAST\n\
             default        12  x\n\
             a               3  longer text\n"
        );
    }

    const PLANTED: &str = "a\u{1b}]52;c;SGVsbG8=\u{7}b\u{1b}[2J\u{9b}c\u{202e}d";

    #[test]
    fn a_terminal_sees_every_unsafe_character_visibly() {
        let shown = Sink::Terminal.field(PLANTED);
        assert_eq!(shown, r"a^[]52;c;SGVsbG8=\u{7}b^[[2J\u{9b}c\u{202e}d");
        assert!(crate::names::first_unsafe(&shown).is_none());
        // A field stays on one line.
        assert_eq!(Sink::Terminal.field("a\nb\tc"), r"a\u{a}b\u{9}c");
        assert_eq!(text("x\ny"), r"x\u{a}y");
        // Content keeps its layout, but not a lone carriage return (it
        // would let text overwrite its line), nor bytes that are not UTF-8.
        assert_eq!(
            Sink::Terminal
                .content(b"l1\r\nl2\tx\ry\x1b[2J\n\xc2\x9b\xff")
                .as_ref(),
            b"l1\r\nl2\tx\\u{d}y^[[2J\n\\u{9b}\\xFF".as_slice()
        );
        assert_eq!(text_block("a\n\tb\u{7}"), "a\n\tb\\u{7}");
        // Plain text is not copied.
        assert!(matches!(Sink::Terminal.field("日本 ok"), Cow::Borrowed(_)));
        assert!(matches!(Sink::Terminal.content(b"ok\n"), Cow::Borrowed(_)));
    }

    #[test]
    fn a_pipe_quotes_odd_fields_and_passes_content_exactly() {
        assert_eq!(Sink::Pipe.field("human.md"), "human.md");
        assert_eq!(Sink::Pipe.field("emoji 🦀.md"), "emoji 🦀.md");
        let quoted = Sink::Pipe.field(PLANTED);
        assert_eq!(quoted, format!("{PLANTED:?}"));
        assert!(crate::names::first_unsafe(&quoted).is_none());
        assert_eq!(Sink::Pipe.content(PLANTED.as_bytes()), PLANTED.as_bytes());
    }

    #[test]
    fn table_cells_are_fields_of_their_stream() {
        let mut t = Table::new(&["PATH", "ROLE"]);
        t.row(vec!["n\u{1b}]0;t\u{7}.md".into(), "core".into()]);
        for (sink, cell) in [
            (Sink::Terminal, r"n^[]0;t\u{7}.md"),
            (Sink::Pipe, r#""n\u{1b}]0;t\u{7}.md""#),
        ] {
            let w = cell.chars().count();
            assert_eq!(
                t.render(sink),
                format!("{:<w$}  ROLE\n{cell}  core\n", "PATH"),
                "{sink:?}"
            );
        }
    }
}
