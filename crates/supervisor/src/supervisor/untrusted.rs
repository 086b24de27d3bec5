//! Text that comes from children, bounded before the supervisor keeps or
//! logs it. Escaping happens where it is logged (as a quoted `Debug` field),
//! so no child text is ever a record's raw message.

use tokio::io::{AsyncRead, AsyncReadExt};

/// The most bytes of one child log message or output line kept.
pub const MAX_LINE: usize = 8 * 1024;

/// `text` cut to [`MAX_LINE`] bytes at a character boundary.
pub fn clip(text: &str) -> &str {
    if text.len() <= MAX_LINE {
        return text;
    }
    let mut end = MAX_LINE;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Read `reader` to its end, calling `line` for each line (without its
/// newline, lossily decoded) cut to `max` bytes, with how many bytes were
/// cut. Memory stays bounded whatever the child writes: a line longer than
/// `max` is not buffered past it.
pub(crate) async fn for_each_line<R, F>(mut reader: R, max: usize, mut line: F)
where
    R: AsyncRead + Unpin,
    F: FnMut(&str, usize),
{
    let mut buf = vec![0u8; 16 * 1024];
    let mut current: Vec<u8> = Vec::new();
    let mut cut = 0usize;
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for chunk in buf[..n].split_inclusive(|b| *b == b'\n') {
            let (body, ends) = match chunk.split_last() {
                Some((b'\n', body)) => (body, true),
                _ => (chunk, false),
            };
            let room = max.saturating_sub(current.len());
            current.extend_from_slice(&body[..body.len().min(room)]);
            cut += body.len().saturating_sub(room);
            if ends {
                line(&String::from_utf8_lossy(&current), cut);
                current.clear();
                cut = 0;
            }
        }
    }
    if !current.is_empty() || cut > 0 {
        line(&String::from_utf8_lossy(&current), cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_keeps_short_text_and_cuts_at_a_char_boundary() {
        assert_eq!(clip("abc"), "abc");
        let long = "é".repeat(MAX_LINE);
        let c = clip(&long);
        assert!(c.len() <= MAX_LINE && c.len() >= MAX_LINE - 1);
        assert!(c.chars().all(|ch| ch == 'é'));
    }

    #[tokio::test]
    async fn lines_are_split_and_capped() {
        let mut input = b"one\ntwo\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 100));
        input.extend(b"\nlast");
        let mut seen = Vec::new();
        for_each_line(&input[..], 10, |l, cut| seen.push((l.to_string(), cut))).await;
        assert_eq!(
            seen,
            vec![
                ("one".to_string(), 0),
                ("two".to_string(), 0),
                ("x".repeat(10), 90),
                ("last".to_string(), 0),
            ]
        );
    }
}
