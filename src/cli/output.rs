//! Writing results to stdout: raw bytes or exactly one JSON object.

use std::io::Write;

use serde::Serialize;

/// Write `bytes` to stdout exactly (no added newline).
pub fn raw(bytes: &[u8]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)?;
    out.flush()?;
    Ok(())
}

/// Print one JSON value followed by a newline.
pub fn json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    raw(text.as_bytes())
}

/// A time for display: RFC 3339 in UTC, whole seconds
/// (`2026-12-02T07:30:00Z`). The one format every table and line shows.
pub fn display_time(t: time::OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// A stored RFC 3339 time (any offset, any fraction) shown as
/// [`display_time`]; text that is not one is shown as it is.
pub fn display_stored_time(stored: &str) -> String {
    use time::format_description::well_known::Rfc3339;
    match time::OffsetDateTime::parse(stored, &Rfc3339) {
        Ok(t) => display_time(t),
        Err(_) => stored.to_string(),
    }
}

/// A table for people: a header row, then rows, columns padded to their
/// widest cell and two spaces apart; the last column is not padded. A row
/// shorter than the header ends in a cell that runs to the end of the line
/// (a note in place of the remaining columns) and widens nothing.
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

    /// The table as text, one line per row, each ending in a newline.
    pub fn render(&self) -> String {
        let width = |s: &str| s.chars().count();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| width(h)).collect();
        for row in &self.rows {
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
        for row in std::iter::once(&header).chain(&self.rows) {
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
        raw(self.render().as_bytes())
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
            t.render(),
            "ID  NAME  MODEL  CREATED\n1   a     mock   now\n2   -     unreadable: a long reason\n"
        );
    }

    #[test]
    fn tables_pad_columns_under_their_headers() {
        let mut t = Table::new(&["ID", "MESSAGES", "LAST"]).right(1);
        t.row(vec!["default".into(), "12".into(), "x".into()]);
        t.row(vec!["a".into(), "3".into(), "longer text".into()]);
        assert_eq!(
            t.render(),
            "ID       MESSAGES  LAST\n\
             default        12  x\n\
             a               3  longer text\n"
        );
    }
}
