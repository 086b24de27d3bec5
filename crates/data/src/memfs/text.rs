//! JavaScript-compatible whitespace trimming.
//!
//! letta-code trims with `String.prototype.trim`/`trimEnd`, whose whitespace set
//! differs from Rust's `char::is_whitespace` on exactly two code points: JS
//! removes U+FEFF (Rust keeps it) and keeps U+0085 NEL (Rust removes it). The
//! compiled prompt must match letta-code byte for byte, so we use the JS set.

/// True for the characters ECMAScript's `WhiteSpace` and `LineTerminator`
/// productions name (what `String.prototype.trim` strips).
pub(crate) fn is_js_whitespace(c: char) -> bool {
    matches!(
        c,
        '\u{0009}'..='\u{000D}'
            | '\u{0020}'
            | '\u{00A0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200A}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202F}'
            | '\u{205F}'
            | '\u{3000}'
            | '\u{FEFF}'
    )
}

/// `s.trim()` as JavaScript does it.
pub(crate) fn js_trim(s: &str) -> &str {
    s.trim_matches(is_js_whitespace)
}

/// `s.trimEnd()` as JavaScript does it.
pub(crate) fn js_trim_end(s: &str) -> &str {
    s.trim_end_matches(is_js_whitespace)
}

/// `s.trimStart()` as JavaScript does it.
#[cfg(test)]
pub(crate) fn js_trim_start(s: &str) -> &str {
    s.trim_start_matches(is_js_whitespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differs_from_rust_trim_where_js_does() {
        assert_eq!(js_trim("\u{FEFF}x\u{FEFF}"), "x");
        assert_eq!(js_trim("\u{0085}x\u{0085}"), "\u{0085}x\u{0085}");
        assert_eq!(js_trim("\u{200B}x"), "\u{200B}x");
        assert_eq!(js_trim("\u{001C}x"), "\u{001C}x");
        assert_eq!(js_trim("\u{3000}\u{2028}\u{00A0} x\t\r\n"), "x");
        assert_eq!(js_trim_end("  x  "), "  x");
        assert_eq!(js_trim_start("  x  "), "x  ");
    }
}
