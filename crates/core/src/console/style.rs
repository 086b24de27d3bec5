//! Colour for the CLI's own messages on stderr: errors red, warnings
//! yellow, and only when stderr is a terminal and `NO_COLOR` is unset or
//! empty (<https://no-color.org>). A pipe or a log file never gets an
//! escape sequence. The message itself may quote data, so it passes
//! [`super::output::text`] first: only our colour is a sequence.

use std::io::IsTerminal;
use std::sync::OnceLock;

const RED_BOLD: &str = "\x1b[1;31m";
const YELLOW_BOLD: &str = "\x1b[1;33m";
const RESET: &str = "\x1b[0m";

/// Whether `NO_COLOR` (its value) asks for no colour: set and not empty.
fn no_color_requested(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_some_and(|v| !v.is_empty())
}

/// Whether stderr gets colour (decided once per process).
pub fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| {
        std::io::stderr().is_terminal()
            && !no_color_requested(std::env::var_os("NO_COLOR").as_deref())
    })
}

fn paint(on: bool, code: &str, text: &str) -> String {
    if on {
        format!("{code}{text}{RESET}")
    } else {
        text.to_string()
    }
}

/// `text` in the error colour when stderr takes colour.
pub fn error(text: &str) -> String {
    paint(enabled(), RED_BOLD, text)
}

/// `text` in the warning colour when stderr takes colour.
pub fn warning(text: &str) -> String {
    paint(enabled(), YELLOW_BOLD, text)
}

/// The CLI's error line: `mini-letta: error: MESSAGE` (the label coloured,
/// the message shown safely).
pub(crate) fn error_line(message: &str) -> String {
    format!(
        "mini-letta: {} {}",
        error("error:"),
        super::output::text(message)
    )
}

/// Print [`error_line`] on stderr.
pub fn eprint_error(message: &str) {
    eprintln!("{}", error_line(message));
}

/// Print `mini-letta: warning: MESSAGE` on stderr (the label coloured,
/// the message shown safely).
pub fn eprint_warning(message: &str) {
    eprintln!(
        "mini-letta: {} {}",
        warning("warning:"),
        super::output::text(message)
    );
}

/// Print `mini-letta: note: MESSAGE` on stderr: something true that the
/// reader may not expect, not a fault (the message shown safely).
pub fn eprint_note(message: &str) {
    eprintln!("mini-letta: note: {}", super::output::text(message));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_color_counts_only_when_set_and_not_empty() {
        assert!(!no_color_requested(None));
        assert!(!no_color_requested(Some(std::ffi::OsStr::new(""))));
        assert!(no_color_requested(Some(std::ffi::OsStr::new("1"))));
    }

    #[test]
    fn painting_wraps_only_when_on() {
        assert_eq!(paint(false, RED_BOLD, "error:"), "error:");
        let on = paint(true, RED_BOLD, "error:");
        assert!(on.starts_with('\x1b') && on.ends_with(RESET), "{on:?}");
        assert!(on.contains("error:"));
    }

    /// Test processes' stderr is captured, never a terminal: no escape.
    #[test]
    fn an_error_line_to_a_pipe_is_plain() {
        if std::io::stderr().is_terminal() {
            return;
        }
        assert_eq!(error_line("boom"), "mini-letta: error: boom");
        assert_eq!(
            error_line("x\u{1b}]0;t\u{7}"),
            "mini-letta: error: x^[]0;t\\u{7}"
        );
    }
}
