//! A minimal Server-Sent Events reader. Both providers stream their answers
//! as `text/event-stream`; reading it line by line from the body lets text
//! deltas reach the user while the model is still writing.

use std::io::{BufRead, BufReader, Read};

use super::provider::ModelError;

/// Longest line accepted: a server cannot make the supervisor buffer
/// without bound.
const MAX_LINE: u64 = 16 * 1024 * 1024;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct SseEvent {
    /// The `event:` field (empty when absent).
    pub event: String,
    /// The `data:` lines joined by `\n`.
    pub data: String,
}

/// Give each event's data in `body` to `feed` until it says the answer is
/// complete or the stream ends (the providers' stream readers).
pub(crate) fn feed_events(
    body: impl Read,
    mut feed: impl FnMut(&str) -> Result<bool, ModelError>,
) -> Result<(), ModelError> {
    let mut sse = SseReader::new(body);
    while let Some(ev) = sse.next_event().map_err(|e| stream_read_error(&e))? {
        if feed(&ev.data)? {
            break;
        }
    }
    Ok(())
}

/// Reads events from a byte stream.
pub(crate) struct SseReader<R> {
    inner: BufReader<R>,
    line: Vec<u8>,
}

impl<R: Read> SseReader<R> {
    pub(crate) fn new(inner: R) -> Self {
        Self {
            inner: BufReader::new(inner),
            line: Vec::new(),
        }
    }

    /// The next event, or `None` at the end of the stream.
    pub(crate) fn next_event(&mut self) -> std::io::Result<Option<SseEvent>> {
        let mut ev = SseEvent::default();
        let mut has_data = false;
        loop {
            self.line.clear();
            let n = (&mut self.inner)
                .take(MAX_LINE)
                .read_until(b'\n', &mut self.line)?;
            if n == 0 {
                return Ok(has_data.then_some(ev));
            }
            if n as u64 == MAX_LINE && self.line.last() != Some(&b'\n') {
                return Err(std::io::Error::other(format!(
                    "stream line longer than {MAX_LINE} bytes"
                )));
            }
            let text = String::from_utf8_lossy(&self.line);
            let line = text.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if has_data {
                    return Ok(Some(ev));
                }
                ev.event.clear();
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (line, ""),
            };
            match field {
                "event" => ev.event = value.to_string(),
                "data" => {
                    if has_data {
                        ev.data.push('\n');
                    }
                    ev.data.push_str(value);
                    has_data = true;
                }
                _ => {}
            }
        }
    }
}

/// A read error in the middle of a stream: the connection broke.
fn stream_read_error(e: &std::io::Error) -> ModelError {
    ModelError::Transient {
        status: None,
        message: format!("reading the response stream failed: {e}"),
        retry_after_ms: None,
        hint: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_events_and_multiline_data() {
        let raw = ": comment\nevent: a\ndata: 1\ndata:2\n\ndata: x\r\n\r\ndata: tail";
        let mut r = SseReader::new(raw.as_bytes());
        let e1 = r.next_event().ok().flatten();
        assert_eq!(
            e1,
            Some(SseEvent {
                event: "a".into(),
                data: "1\n2".into()
            })
        );
        let e2 = r.next_event().ok().flatten();
        assert_eq!(
            e2.map(|e| (e.event, e.data)),
            Some((String::new(), "x".into()))
        );
        let e3 = r.next_event().ok().flatten();
        assert_eq!(e3.map(|e| e.data), Some("tail".into()));
        assert_eq!(r.next_event().ok().flatten(), None);
    }
}
