//! Which characters a name may hold: memory paths, conversation ids, agent
//! record fields and anything else that an agent, an archive or a remote
//! chooses and a person later reads on a terminal.
//!
//! Control characters (C0, DEL, C1) can drive a terminal (`ESC ] 52` writes
//! the clipboard, `ESC [ 2 J` clears the screen, BEL rings), and the
//! bidirectional formatting characters make a name read differently from
//! what it is (`U+202E` turns `txt.exe` into `exe.txt`). Neither belongs in a
//! name, so every path that creates one refuses them with [`check`].

/// Whether `c` must never appear in a name.
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            // Bidirectional marks, embeddings, overrides and isolates.
            '\u{061C}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
                // Line and paragraph separators break a line like `\n`.
                | '\u{2028}'
                | '\u{2029}'
        )
}

/// The first character of `name` that [`is_unsafe`], if any.
pub fn first_unsafe(name: &str) -> Option<char> {
    name.chars().find(|c| is_unsafe(*c))
}

/// `Ok` when `name` holds no unsafe character; else a reason such as
/// `contains the control character U+001B`, for an error message.
pub fn check(name: &str) -> Result<(), String> {
    match first_unsafe(name) {
        None => Ok(()),
        Some(c) => Err(describe(c)),
    }
}

/// Why `c` is refused, naming its code point.
pub fn describe(c: char) -> String {
    let kind = if c.is_control() {
        "control character"
    } else {
        "bidirectional or line-separator character"
    };
    format!("contains the {kind} U+{:04X}", u32::from(c))
}

/// A fresh id for something made now (a memory worktree, a reflection
/// launch): UTC `YYYYMMDDHHMMSS`, `-`, 8 random hex digits — sorted by
/// time, and unique in practice among those made in one second.
pub fn stamped_id(now: time::OffsetDateTime) -> String {
    let t = now.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}{:02}{:02}{:02}{:02}{:02}-{:08x}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        rand::random::<u32>()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_bidi_are_unsafe_letters_are_not() {
        for bad in [
            "a\u{1b}]0;t\u{7}.md",
            "x\u{7f}",
            "\u{9b}2J",
            "evil\u{202e}dm.txt",
            "a\u{2066}b",
            "l\u{2028}",
        ] {
            assert!(first_unsafe(bad).is_some(), "{bad:?}");
            assert!(check(bad).is_err());
        }
        for good in [
            "human.md",
            "日本/メモ.md",
            "notes – draft (1).md",
            "emoji 🦀.md",
            "tab-free",
        ] {
            assert_eq!(check(good), Ok(()), "{good:?}");
        }
        assert_eq!(
            check("a\u{1b}b").unwrap_err(),
            "contains the control character U+001B"
        );
        assert!(check("a\u{202e}b").unwrap_err().contains("U+202E"));
    }
}
