//! What a stored message says, without the harness's wrapping: the words
//! a person searching what was said expects to find and to see.
//!
//! Why here: the log stores messages as the model was sent them —
//! reminders inside user turns, a summary packaged as a JSON alert, tool
//! calls as JSON arguments. Recall indexes and shows this text instead,
//! and the compactor reads summaries back through the same function.

use serde_json::Value;

use super::message::StoredMessage;
use crate::protocol::messages::Part;

/// What introduces a summary inside its packaged alert (letta-code's words).
pub const SUMMARY_INTRO: &str = "The following is a summary of the previous messages:\n ";

/// The summary text of a summary message (its packaged JSON read back;
/// the whole text when it is not that).
pub fn summary_text(m: &StoredMessage) -> String {
    let text = m.text();
    let message = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_string))
        .unwrap_or(text);
    match message.split_once(SUMMARY_INTRO) {
        Some((_, summary)) => summary.to_string(),
        None => message,
    }
}

/// The message's words: text without `<system-reminder>` blocks (a part
/// that is a `<memory_update>` says nothing of the conversation), a
/// summary's own text, a tool call's name and argument values, a tool
/// result's name and text; parts on lines of their own.
pub fn said(m: &StoredMessage) -> String {
    let mut out = String::new();
    let mut push = |s: &str| {
        let s = s.trim();
        if s.is_empty() {
            return;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(s);
    };
    if m.kind.as_deref() == Some("summary") {
        push(&summary_text(m));
        return out;
    }
    for part in &m.parts {
        match part {
            Part::Text { text } => push(&without_reminders(text)),
            Part::ToolCall {
                name, arguments, ..
            } => {
                let mut words = name.clone();
                argument_words(arguments, &mut words);
                push(&words);
            }
            Part::ToolResult { name, text, .. } => push(&format!("{name} {text}")),
        }
    }
    out
}

/// `text` without its `<system-reminder>…</system-reminder>` blocks (an
/// unclosed one runs to the end); nothing when it is a `<memory_update>`.
fn without_reminders(text: &str) -> String {
    const OPEN: &str = "<system-reminder>";
    const CLOSE: &str = "</system-reminder>";
    if text.trim_start().starts_with("<memory_update>") {
        return String::new();
    }
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        out.push_str(&rest[..start]);
        rest = match rest[start..].find(CLOSE) {
            Some(end) => &rest[start + end + CLOSE.len()..],
            None => "",
        };
    }
    out.push_str(rest);
    out
}

/// The values of a tool call's arguments, space-separated (strings as
/// they are, other values as JSON); arguments sent as a string are parsed
/// first when they are JSON.
fn argument_words(arguments: &Value, out: &mut String) {
    match arguments {
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(v @ (Value::Object(_) | Value::Array(_))) => argument_words(&v, out),
            _ => {
                out.push(' ');
                out.push_str(s);
            }
        },
        Value::Object(map) => map.values().for_each(|v| argument_words(v, out)),
        Value::Array(items) => items.iter().for_each(|v| argument_words(v, out)),
        Value::Null => {}
        other => {
            out.push(' ');
            out.push_str(&other.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::messages::Role;
    use serde_json::json;

    fn message(kind: Option<&str>, parts: Vec<Part>) -> StoredMessage {
        StoredMessage {
            kind: kind.map(str::to_string),
            ..StoredMessage::new("msg-1".into(), Role::User, parts)
        }
    }

    #[test]
    fn reminders_and_memory_updates_are_not_what_was_said() {
        let m = message(
            None,
            vec![
                Part::text("<system-reminder>\nAgent info: x\n</system-reminder>"),
                Part::text("I like green tea<system-reminder>skip</system-reminder> a lot"),
                Part::text("<memory_update>\nThe local memory…</memory_update>"),
            ],
        );
        assert_eq!(said(&m), "I like green tea a lot");
    }

    #[test]
    fn a_summary_says_its_own_text_and_a_tool_call_its_values() {
        let alert = json!({"type": "system_alert",
            "message": format!("Note: prior messages have been hidden.\n{SUMMARY_INTRO}The user\nlikes tea."),
            "time": "t"});
        let m = message(Some("summary"), vec![Part::text(alert.to_string())]);
        assert_eq!(said(&m), "The user\nlikes tea.");
        let call = message(
            None,
            vec![Part::ToolCall {
                id: "c1".into(),
                name: "memory".into(),
                arguments: json!({"command": "insert", "path": "human.md", "text": "- likes tea"}),
            }],
        );
        assert_eq!(said(&call), "memory insert human.md - likes tea");
    }
}
