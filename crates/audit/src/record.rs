//! One record's bytes: how a line is written, and the fixed header
//! (`{"seq":N,"prev":"<64 hex>",`) a verifier reads without a JSON parse.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// The `prev` of the very first record.
pub const GENESIS: [u8; 32] = [0; 32];

/// Keys the writer sets itself; a caller's field of the same name is dropped.
const RESERVED: [&str; 6] = ["seq", "prev", "time", "kind", "agent", "role"];

/// The largest value a string field keeps (commit messages, paths): a
/// record stays one short line, and a tail read finds the last one.
pub const MAX_FIELD_CHARS: usize = 2048;

/// A record before the writer numbers and chains it.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub kind: String,
    /// The agent's id; `None` for supervisor-wide events.
    pub agent: Option<String>,
    /// The child's role (`agent`, `tool`, `reflection`, …), or `cli` /
    /// `supervisor` for what the operator or the supervisor did.
    pub role: Option<String>,
    pub fields: Map<String, Value>,
}

impl Entry {
    pub fn new(kind: &str, agent: Option<&str>, role: Option<&str>) -> Self {
        Entry {
            kind: kind.to_string(),
            agent: agent.map(str::to_string),
            role: role.map(str::to_string),
            fields: Map::new(),
        }
    }

    /// Add a field (builder style).
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.fields.insert(key.to_string(), value.into());
        self
    }
}

/// The sha256 of a line (without its newline).
pub(crate) fn line_hash(line: &[u8]) -> [u8; 32] {
    Sha256::digest(line).into()
}

pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// Lowercase hex of a 32-byte hash, back to bytes.
pub(crate) fn parse_hex32(s: &[u8]) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    // Every line's header is read: a table, and one check at the end.
    let mut bad = 0u8;
    for (o, pair) in out.iter_mut().zip(s.chunks_exact(2)) {
        let (hi, lo) = (HEX[pair[0] as usize], HEX[pair[1] as usize]);
        bad |= hi | lo;
        *o = hi << 4 | (lo & 15);
    }
    (bad & 0x80 == 0).then_some(out)
}

/// Lowercase hex digits' values; 0x80 for every other byte.
const HEX: [u8; 256] = {
    let mut t = [0x80u8; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

/// The current time as records carry it: RFC 3339 UTC with microseconds,
/// fixed width, so times compare as strings.
pub fn now() -> String {
    format_time(time::OffsetDateTime::now_utc())
}

/// A time as records carry it (see [`now`]).
pub(crate) fn format_time(t: time::OffsetDateTime) -> String {
    crate::clock::fixed_micros(t)
}

/// The line for `entry` as record `seq` after `prev` (no newline).
pub(crate) fn format_line(seq: u64, prev: &[u8; 32], time: &str, entry: &Entry) -> Vec<u8> {
    let json = |v: &Value| serde_json::to_string(v).unwrap_or_else(|_| "null".into());
    let opt = |v: &Option<String>| match v {
        Some(s) => json(&Value::String(clip(s))),
        None => "null".into(),
    };
    let mut line = format!(
        "{{\"seq\":{seq},\"prev\":\"{}\",\"time\":{},\"kind\":{},\"agent\":{},\"role\":{}",
        hex(prev),
        json(&Value::String(time.to_string())),
        json(&Value::String(clip(&entry.kind))),
        opt(&entry.agent),
        opt(&entry.role),
    );
    for (k, v) in &entry.fields {
        if RESERVED.contains(&k.as_str()) {
            continue;
        }
        line.push(',');
        line.push_str(&json(&Value::String(k.clone())));
        line.push(':');
        line.push_str(&json(&clip_value(v)));
    }
    line.push('}');
    line.into_bytes()
}

fn clip(s: &str) -> String {
    match s.char_indices().nth(MAX_FIELD_CHARS) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

/// Long strings cut, long lists shortened (with a count of what was left out).
fn clip_value(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(clip(s)),
        Value::Array(items) if items.len() > 64 => {
            let mut kept: Vec<Value> = items[..64].iter().map(clip_value).collect();
            kept.push(Value::String(format!("… {} more", items.len() - 64)));
            Value::Array(kept)
        }
        Value::Array(items) => Value::Array(items.iter().map(clip_value).collect()),
        Value::Object(m) => {
            Value::Object(m.iter().map(|(k, v)| (k.clone(), clip_value(v))).collect())
        }
        other => other.clone(),
    }
}

/// The `seq` and `prev` of a record line, read from its fixed header;
/// `None` when the line does not start like a record.
pub fn header(line: &[u8]) -> Option<(u64, [u8; 32])> {
    let rest = line.strip_prefix(b"{\"seq\":")?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 19 {
        return None;
    }
    let seq = rest[..digits].iter().try_fold(0u64, |n, d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })?;
    let rest = rest[digits..].strip_prefix(b",\"prev\":\"")?;
    let prev = parse_hex32(rest.get(..64)?)?;
    if rest.get(64) != Some(&b'"') {
        return None;
    }
    Some((seq, prev))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_starts_with_its_header_and_parses_as_json() {
        let e = Entry::new("model", Some("agent-1"), Some("agent"))
            .with("input_tokens", 3)
            .with("seq", 99)
            .with("note", "line\nbreak\u{202e}");
        let line = format_line(7, &[0xab; 32], "2025-01-01T00:00:00.000000Z", &e);
        assert!(!line.contains(&b'\n'));
        let (seq, prev) = header(&line).unwrap();
        assert_eq!((seq, prev), (7, [0xab; 32]));
        let v: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(
            v["seq"], 7,
            "a field named seq cannot override the writer's"
        );
        assert_eq!(v["kind"], "model");
        assert_eq!(v["input_tokens"], 3);
    }

    #[test]
    fn headers_that_are_not_records_are_refused() {
        for bad in [
            &b"{\"seq\":,\"prev\":\"00\"}"[..],
            b"{\"prev\":\"00\",\"seq\":1}",
            b"{\"seq\":1,\"prev\":\"ABCD\"}",
            b"",
        ] {
            assert!(header(bad).is_none(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn times_are_fixed_width_utc() {
        let t = time::macros::datetime!(2025-03-04 05:06:07.000008 UTC);
        assert_eq!(format_time(t), "2025-03-04T05:06:07.000008Z");
    }
}
