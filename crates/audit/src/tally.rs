//! What one record line adds to its agent's usage. The writer's own lines
//! (plain ASCII, no escapes) are read by a small scanner; any other line
//! goes to serde, so every reader of usage (the log, the summary, `audit
//! verify`) reads a line alike and none pays a JSON parse per record.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::record;

/// The fields every record has, and those usage sums.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct View {
    #[serde(default)]
    pub seq: u64,
    #[serde(default)]
    pub time: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub agent: Option<String>,
    #[serde(default)]
    pub role: Option<String>,
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    #[serde(default)]
    pub cpu_us: u64,
    #[serde(default)]
    pub peak_memory_bytes: u64,
    #[serde(default)]
    pub conversation: Option<String>,
    #[serde(default)]
    pub egress_bytes: u64,
}

/// The fields of a record usage reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Rec<'a> {
    pub seq: u64,
    pub time: Cow<'a, str>,
    pub kind: Cow<'a, str>,
    pub agent: Option<Cow<'a, str>>,
    pub role: Option<Cow<'a, str>>,
    pub conversation: bool,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cpu_us: u64,
    pub peak_memory_bytes: u64,
    pub egress_bytes: u64,
}

impl Rec<'_> {
    /// The UTC day (`YYYY-MM-DD`) its time falls in.
    pub fn day(&self) -> &str {
        day_of(&self.time)
    }
}

/// The day of a record time: its first ten bytes (the whole of a shorter one).
pub(crate) fn day_of(time: &str) -> &str {
    time.get(..10).unwrap_or(time)
}

/// A record line (without its newline) as usage reads it; `None` for what
/// is not a record (usage skips it, as `audit log` does).
pub(crate) fn scan(line: &[u8]) -> Option<Rec<'_>> {
    record::header(line)?;
    scan_record(line)
}

/// [`scan`] of a line whose header was read already.
pub(crate) fn scan_record(line: &[u8]) -> Option<Rec<'_>> {
    match fast(line) {
        Some(rec) => Some(rec),
        None => {
            let v: View = serde_json::from_slice(line).ok()?;
            Some(Rec {
                seq: v.seq,
                time: Cow::Owned(v.time),
                kind: Cow::Owned(v.kind),
                agent: v.agent.map(Cow::Owned),
                role: v.role.map(Cow::Owned),
                conversation: v.conversation.is_some(),
                input_tokens: v.input_tokens,
                output_tokens: v.output_tokens,
                cpu_us: v.cpu_us,
                peak_memory_bytes: v.peak_memory_bytes,
                egress_bytes: v.egress_bytes,
            })
        }
    }
}

/// The keys of [`View`] (each may appear once), numbered.
fn key_number(key: &[u8]) -> Option<usize> {
    Some(match key {
        b"seq" => 0,
        b"time" => 1,
        b"kind" => 2,
        b"agent" => 3,
        b"role" => 4,
        b"conversation" => 5,
        b"input_tokens" => 6,
        b"output_tokens" => 7,
        b"cpu_us" => 8,
        b"peak_memory_bytes" => 9,
        b"egress_bytes" => 10,
        _ => return None,
    })
}

/// The scanner: `None` whenever the line is anything but plain (an escape,
/// a byte outside printable ASCII, a repeated key, a number serde might
/// read otherwise), and serde decides.
fn fast(line: &[u8]) -> Option<Rec<'_>> {
    // Without a branch per byte, so it runs a vector at a time.
    let odd = line.iter().fold(false, |odd, &b| {
        odd | (b == b'\\') | !(0x20..=0x7e).contains(&b)
    });
    if odd {
        return None;
    }
    let mut p = Scan { s: line, i: 0 };
    let mut rec = Rec::default();
    let mut seen = 0u16;
    p.eat(b'{')?;
    loop {
        let key = p.string()?;
        p.eat(b':')?;
        if let Some(k) = key_number(key) {
            if seen & (1 << k) != 0 {
                return None;
            }
            seen |= 1 << k;
            p.field(k, &mut rec)?;
        } else {
            p.value(0)?;
        }
        match p.next()? {
            b',' => {}
            b'}' => break,
            _ => return None,
        }
    }
    (p.i == line.len()).then_some(rec)
}

struct Scan<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Scan<'a> {
    fn next(&mut self) -> Option<u8> {
        let b = *self.s.get(self.i)?;
        self.i += 1;
        Some(b)
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn eat(&mut self, b: u8) -> Option<()> {
        (self.next()? == b).then_some(())
    }

    /// A string (no escapes: the line has no backslash).
    fn string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let len = memchr::memchr(b'"', &self.s[self.i..])?;
        let out = &self.s[self.i..self.i + len];
        self.i += len + 1;
        Some(out)
    }

    fn text(&mut self) -> Option<Cow<'a, str>> {
        std::str::from_utf8(self.string()?).ok().map(Cow::Borrowed)
    }

    fn text_or_null(&mut self) -> Option<Option<Cow<'a, str>>> {
        if self.peek()? == b'n' {
            return self.literal(b"null").map(|()| None);
        }
        self.text().map(Some)
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i + word.len();
        (self.s.get(self.i..end)? == word).then(|| self.i = end)
    }

    /// A plain unsigned integer (no sign, fraction, exponent or leading zero).
    fn unsigned(&mut self) -> Option<u64> {
        let digits = self.s[self.i..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        let text = &self.s[self.i..self.i + digits];
        if digits == 0 || (digits > 1 && text[0] == b'0') {
            return None;
        }
        if matches!(self.s.get(self.i + digits), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        self.i += digits;
        std::str::from_utf8(text).ok()?.parse().ok()
    }

    /// Key number `k` ([`key_number`]).
    fn field(&mut self, k: usize, rec: &mut Rec<'a>) -> Option<()> {
        match k {
            0 => rec.seq = self.unsigned()?,
            1 => rec.time = self.text()?,
            2 => rec.kind = self.text()?,
            3 => rec.agent = self.text_or_null()?,
            4 => rec.role = self.text_or_null()?,
            5 => rec.conversation = self.text_or_null()?.is_some(),
            6 => rec.input_tokens = self.unsigned()?,
            7 => rec.output_tokens = self.unsigned()?,
            8 => rec.cpu_us = self.unsigned()?,
            9 => rec.peak_memory_bytes = self.unsigned()?,
            _ => rec.egress_bytes = self.unsigned()?,
        }
        Some(())
    }

    /// Step over any JSON value, checking its grammar (serde's nesting
    /// limit kept).
    fn value(&mut self, depth: usize) -> Option<()> {
        if depth >= 100 {
            return None;
        }
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'{' => {
                self.i += 1;
                if self.peek()? == b'}' {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    self.string()?;
                    self.eat(b':')?;
                    self.value(depth + 1)?;
                    match self.next()? {
                        b',' => {}
                        b'}' => return Some(()),
                        _ => return None,
                    }
                }
            }
            b'[' => {
                self.i += 1;
                if self.peek()? == b']' {
                    self.i += 1;
                    return Some(());
                }
                loop {
                    self.value(depth + 1)?;
                    match self.next()? {
                        b',' => {}
                        b']' => return Some(()),
                        _ => return None,
                    }
                }
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.number(),
        }
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`
    fn number(&mut self) -> Option<()> {
        let digits = |p: &mut Self| {
            let n = p.s[p.i..].iter().take_while(|b| b.is_ascii_digit()).count();
            p.i += n;
            n
        };
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek()? {
            b'0' => self.i += 1,
            b'1'..=b'9' => {
                digits(self);
            }
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            (digits(self) > 0).then_some(())?;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            (digits(self) > 0).then_some(())?;
        }
        Some(())
    }
}

/// One agent's usage over some records, as sums (cpu in µs: rounded to
/// ms only at the end, as one sum).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Sums {
    pub turns: u64,
    pub model_calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub tool_calls: u64,
    pub cpu_us: u64,
    pub peak_memory_bytes: u64,
    pub egress_bytes: u64,
    pub budget_refusals: u64,
}

impl Sums {
    pub fn add(&mut self, r: &Rec<'_>) {
        match r.kind.as_ref() {
            // A turn is its agent child, started for a conversation.
            "spawn" if r.role.as_deref() == Some("agent") && r.conversation => {
                self.turns = self.turns.saturating_add(1)
            }
            "model" => {
                self.model_calls = self.model_calls.saturating_add(1);
                self.input_tokens = self.input_tokens.saturating_add(r.input_tokens);
                self.output_tokens = self.output_tokens.saturating_add(r.output_tokens);
            }
            "tool" => self.tool_calls = self.tool_calls.saturating_add(1),
            "exit" => {
                self.cpu_us = self.cpu_us.saturating_add(r.cpu_us);
                self.peak_memory_bytes = self.peak_memory_bytes.max(r.peak_memory_bytes);
            }
            "budget" => self.budget_refusals = self.budget_refusals.saturating_add(1),
            _ => {}
        }
        self.egress_bytes = self.egress_bytes.saturating_add(r.egress_bytes);
    }

    pub fn merge(&mut self, o: &Sums) {
        self.turns = self.turns.saturating_add(o.turns);
        self.model_calls = self.model_calls.saturating_add(o.model_calls);
        self.input_tokens = self.input_tokens.saturating_add(o.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(o.output_tokens);
        self.tool_calls = self.tool_calls.saturating_add(o.tool_calls);
        self.cpu_us = self.cpu_us.saturating_add(o.cpu_us);
        self.peak_memory_bytes = self.peak_memory_bytes.max(o.peak_memory_bytes);
        self.egress_bytes = self.egress_bytes.saturating_add(o.egress_bytes);
        self.budget_refusals = self.budget_refusals.saturating_add(o.budget_refusals);
    }
}

/// Sums per agent.
pub(crate) type Agents = BTreeMap<String, Sums>;

/// Add `r` to its agent's sums (an agent with any record has a line, even
/// of zeros).
pub(crate) fn add_to(agents: &mut Agents, r: &Rec<'_>) {
    let Some(agent) = r.agent.as_deref() else {
        return;
    };
    match agents.get_mut(agent) {
        Some(s) => s.add(r),
        None => agents.entry(agent.to_string()).or_default().add(r),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::record::{Entry, format_line};

    /// The scanner reads every line as serde does, or leaves it to serde.
    #[test]
    fn the_scanner_reads_lines_as_serde_does() {
        let plain = Entry::new("model", Some("agent-1"), Some("agent"))
            .with("input_tokens", 12)
            .with("output_tokens", 3)
            .with(
                "nested",
                serde_json::json!({"a": [1, -2.5e3, true, null, {}], "b": []}),
            );
        let odd = Entry::new("exit", Some("agent-é"), None)
            .with("cpu_us", 7)
            .with("note", "quote \" and é");
        let line = format_line(3, &[1; 32], "2025-01-01T00:00:00.000000Z", &plain);
        let r = fast(&line).unwrap();
        assert_eq!((r.seq, r.input_tokens, r.output_tokens), (3, 12, 3));
        assert_eq!(r.agent.as_deref(), Some("agent-1"));
        let line2 = format_line(4, &[1; 32], "2025-01-01T00:00:00.000000Z", &odd);
        assert!(fast(&line2).is_none(), "escapes go to serde");
        assert_eq!(scan(&line2).unwrap().cpu_us, 7);
        let head = format!("{{\"seq\":5,\"prev\":\"{}\"", "0".repeat(64));
        for (tail, tokens) in [
            (",\"kind\":\"model\",\"input_tokens\":1.0}", None),
            (",\"kind\":\"model\",\"input_tokens\":-1}", None),
            (",\"kind\":\"model\",\"input_tokens\":01}", None),
            (
                ",\"kind\":\"model\",\"input_tokens\":1,\"input_tokens\":2}",
                None,
            ),
            (",\"kind\":\"model\",\"input_tokens\":9}", Some(9)),
            (",\"kind\":\"model\",\"x\":[1,,2],\"input_tokens\":9}", None),
            (",\"kind\":\"model\",\"x\":tru,\"input_tokens\":9}", None),
            (",\"kind\":\"model\",\"input_tokens\":9} ", Some(9)),
            (",\"kind\":\"model\",\"input_tokens\":9}x", None),
            (",\"kind\":null}", None),
        ] {
            let line = format!("{head}{tail}");
            let by_serde = serde_json::from_str::<View>(&line).ok();
            assert_eq!(
                scan(line.as_bytes()).map(|r| r.input_tokens),
                by_serde.map(|v| v.input_tokens),
                "{line}"
            );
            if let Some(r) = fast(line.as_bytes()) {
                assert_eq!(Some(r.input_tokens), tokens, "{line}");
            }
        }
    }
}
