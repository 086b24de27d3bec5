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

/// A timestamp as every table and listing shows one: RFC 3339 in UTC to
/// the second (`2026-12-02T07:30:00Z`). Text that is not an RFC 3339
/// timestamp is shown as it is.
pub fn timestamp(text: &str) -> String {
    use time::format_description::well_known::Rfc3339;
    match time::OffsetDateTime::parse(text, &Rfc3339) {
        Ok(t) => format_utc(t),
        Err(_) => text.to_string(),
    }
}

/// `t` in UTC to the second, as [`timestamp`] shows it.
pub fn format_utc(t: time::OffsetDateTime) -> String {
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

/// A table: a header row, then the rows, columns padded to their widest
/// cell and separated by two spaces (the last column is not padded).
/// `right` names the columns aligned right (numbers).
pub fn table(header: &[&str], rows: &[Vec<String>], right: &[usize]) -> String {
    let width = |s: &str| s.chars().count();
    let mut widths: Vec<usize> = header.iter().map(|h| width(h)).collect();
    for row in rows {
        // A short row's last cell runs on to the end of the line (a note
        // in place of the remaining columns) and widens nothing.
        let spans = row.len() < header.len();
        for (i, cell) in row.iter().enumerate() {
            if spans && i + 1 == row.len() {
                continue;
            }
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(width(cell));
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut out = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            let pad = widths
                .get(i)
                .copied()
                .unwrap_or(0)
                .saturating_sub(width(cell));
            if i > 0 {
                out.push_str("  ");
            }
            if right.contains(&i) {
                out.push_str(&" ".repeat(pad));
                out.push_str(cell);
            } else {
                out.push_str(cell);
                if i < last {
                    out.push_str(&" ".repeat(pad));
                }
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_utc_seconds() {
        assert_eq!(
            timestamp("2026-12-02T07:30:00.123Z"),
            "2026-12-02T07:30:00Z"
        );
        assert_eq!(
            timestamp("2026-12-02T08:30:00+01:00"),
            "2026-12-02T07:30:00Z"
        );
        assert_eq!(timestamp("yesterday"), "yesterday");
    }

    #[test]
    fn tables_pad_columns() {
        let t = table(
            &["ID", "NAME", "N"],
            &[
                vec!["1".into(), "alice".into(), "7".into()],
                vec!["22".into(), "b".into(), "123".into()],
            ],
            &[2],
        );
        assert_eq!(t, "ID  NAME     N\n1   alice    7\n22  b      123\n");
        let t = table(
            &["ID", "NAME", "MODEL", "CREATED"],
            &[
                vec!["1".into(), "a".into(), "mock".into(), "now".into()],
                vec!["2".into(), "-".into(), "unreadable: a long reason".into()],
            ],
            &[],
        );
        assert_eq!(
            t,
            "ID  NAME  MODEL  CREATED\n1   a     mock   now\n2   -     unreadable: a long reason\n"
        );
    }
}
