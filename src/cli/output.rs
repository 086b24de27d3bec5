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
