//! What the mock's rules read of a request: the user's own words, the
//! text of a message, a sub-agent's task, a tagged block.

use crate::protocol::messages::{Message, Part, Role, strip_reminders};

/// The user's own words: the last text part, not only reminders, of the
/// last user message that has one, trimmed.
pub fn last_user_text(messages: &[Message]) -> String {
    messages
        .iter()
        .rev()
        .filter(|m| m.role == Role::User)
        .find_map(|m| {
            m.parts.iter().rev().find_map(|p| match p {
                Part::Text { text } => {
                    let s = strip_reminders(text);
                    let s = s.trim();
                    (!s.is_empty()).then(|| s.to_string())
                }
                _ => None,
            })
        })
        .unwrap_or_default()
}

/// A user message carrying nothing but `<system-reminder>` blocks (the
/// runtime may send one after tool results).
pub(crate) fn is_reminder_only(m: &Message) -> bool {
    m.role == Role::User
        && m.parts.iter().all(|p| match p {
            Part::Text { text } => strip_reminders(text).trim().is_empty(),
            _ => false,
        })
}

pub(crate) fn clean_capture(s: &str) -> String {
    s.trim()
        .trim_end_matches(['。', '.', '!', '！'])
        .trim()
        .to_string()
}

/// The text of a message as the summary and reflection rules read it.
pub(crate) fn message_text(m: &Message) -> String {
    let pieces: Vec<String> = m
        .parts
        .iter()
        .map(|p| match p {
            Part::Text { text } => strip_reminders(text).trim().to_string(),
            Part::ToolCall {
                name, arguments, ..
            } => format!("{name} {arguments}"),
            Part::ToolResult { name, text, .. } => format!("{name}: {text}"),
        })
        .filter(|s| !s.is_empty())
        .collect();
    pieces.join("\n")
}

pub(crate) fn role_name(r: Role) -> &'static str {
    match r {
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

/// The task a sub-agent was given: its user messages' text.
pub(crate) fn task_text(messages: &[Message]) -> String {
    messages
        .iter()
        .filter(|m| m.role == Role::User)
        .map(message_text)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text between the first `open` and the next `close`.
pub(crate) fn between<'a>(text: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let start = text.find(open)? + open.len();
    let end = text[start..].find(close)? + start;
    Some(&text[start..end])
}

/// The language the mock answers in: the one it was spoken to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lang {
    Chinese,
    English,
}

impl Lang {
    /// Chinese when `text` holds a Han, Kana or Hangul character (the
    /// book's labs speak Chinese), else English.
    pub(crate) fn of(text: &str) -> Self {
        let cjk = |c: char| {
            matches!(c as u32, 0x3040..=0x30FF | 0x3400..=0x4DBF | 0x4E00..=0x9FFF
                | 0xF900..=0xFAFF | 0xAC00..=0xD7AF | 0xFF01..=0xFF60 | 0x3000..=0x303F)
        };
        if text.chars().any(cjk) {
            Lang::Chinese
        } else {
            Lang::English
        }
    }

    /// `zh` or `en`, as spoken.
    pub(crate) fn say(self, zh: String, en: String) -> String {
        match self {
            Lang::Chinese => zh,
            Lang::English => en,
        }
    }
}
