//! What the summariser is sent, and what its summary becomes (spec
//! agent-loop.md §5).
//!
//! The request: the compaction prompt as the system prompt (one per mode,
//! [`ALL_PROMPT`] and [`SLIDING_PROMPT`], or the agent's own), and one user
//! message, the transcript of the messages summarised: a line `[role] text`
//! per message — an assistant's tool calls appended as ` -> name(args)`,
//! each tool result as a `[tool]` line cut at 2,000 characters
//! (`... [truncated N chars]`), an earlier summary as a `[user]` line with
//! its summary text — between a leading space and newline and a closing
//! line `. Generate the summary.`. When the summariser says the transcript
//! does not fit its window, it is sent again cut in the middle to each
//! budget of [`LADDER`] in turn (30 % head, 30 % tail, a
//! `[TRUNCATED: dropped N middle chars due to context budget]` marker).
//!
//! The summary, trimmed and clipped (50,000 characters unless set,
//! `... [summary truncated to fit]`), becomes a user message of kind
//! `summary` whose one text part is the compact JSON `{"type":
//! "system_alert", "message", "time", "compaction_stats"}`.
//!
//! Lengths are UTF-16 code units, as in letta-code; cuts fall between
//! characters.

use serde::{Deserialize, Serialize};

use super::estimate::{is_summary, utf16_len};
use crate::protocol::messages::{Part, Role};
use crate::store::conversation::StoredMessage;

/// A tool result's longest text in a transcript.
pub const TOOL_RESULT_CHARS: usize = 2_000;
/// The budgets tried, in order, when the transcript overflows.
pub const LADDER: [usize; 10] = [
    120_000, 90_000, 60_000, 40_000, 25_000, 15_000, 10_000, 6_000, 4_000, 2_000,
];
/// A summary's longest length unless the agent's settings say otherwise.
pub const DEFAULT_CLIP_CHARS: usize = 50_000;
/// Appended to a clipped summary.
pub const SUMMARY_CLIPPED: &str = "... [summary truncated to fit]";
/// The summary of nothing.
pub const NO_MESSAGES: &str = "No prior conversation messages.";
/// The line a summary follows in a summary message.
pub use crate::store::conversation::said::SUMMARY_INTRO;

/// The compaction prompt of `all` mode: seven sections, 500 words.
pub const ALL_PROMPT: &str = "\
Your context window is full, so the whole conversation so far is being replaced by a summary \
that you write now. Afterwards you will have only this summary (and your memory) to go on, so \
keep what you need to carry on without repeating work or mistakes.

Organise it in these sections:

1. **Goals**: what the user wants overall and the task under way, in their own terms. If the \
transcript holds an earlier summary, carry its goals forward.
2. **What happened**: what the user asked, what you did, and how it went. Condense an earlier \
summary to what still matters.
3. **Key details**: files, paths, commands, names, numbers, settings, links and issue or \
ticket ids that came up, each with why it matters. Copy identifiers exactly; never shorten or \
reword them. Keep facts the user told you about themselves.
4. **Problems and fixes**: errors met and how they were solved, and any correction the user \
made (quote it when the wording matters).
5. **Current state**: exactly what was being worked on last, with the latest messages in view.
6. **Next step** (only if there is one): the step that directly follows from the user's latest \
request, with a short quote showing where you left off. Leave it out if the work was finished.
7. **Where to look**: for anything too long to keep here, the topic and the words to search \
the message history for.

Write in the first person, as a factual record. Stay under 500 words. Reply with the summary \
only.";

/// The compaction prompt of `sliding_window` mode: five sections, 300 words.
pub const SLIDING_PROMPT: &str = "\
The oldest messages of this conversation are leaving your context window to make room. \
Summarise them now: your summary will sit before the recent messages you keep, as their \
background.

Organise it in these sections:

1. **Goals**: what the user wants overall and the task under way, in their own terms. If the \
messages hold an earlier summary, carry its goals forward.
2. **What happened**: what the user asked, what you did, and how it went. Condense an earlier \
summary to what still matters.
3. **Key details**: files, paths, commands, names, numbers, settings, links and issue or \
ticket ids that came up, each with why it matters. Copy identifiers exactly; never shorten or \
reword them. Keep facts the user told you about themselves.
4. **Problems and fixes**: errors met and how they were solved, and any correction the user \
made (quote it when the wording matters).
5. **Where to look**: for anything too long to keep here, the topic and the words to search \
the message history for.

Write in the first person, as a factual record. Stay under 300 words. Reply with the summary \
only.";

/// The first `units` UTF-16 units of `s` (whole characters).
fn head(s: &str, units: usize) -> &str {
    let mut used = 0;
    for (i, c) in s.char_indices() {
        used += c.len_utf16();
        if used > units {
            return &s[..i];
        }
    }
    s
}

/// The last `units` UTF-16 units of `s` (whole characters).
fn tail(s: &str, units: usize) -> &str {
    let mut used = 0;
    for (i, c) in s.char_indices().rev() {
        used += c.len_utf16();
        if used > units {
            return &s[i + c.len_utf8()..];
        }
    }
    s
}

/// `text` cut to `limit` units with `... [truncated N chars]`.
pub(crate) fn truncate_tool_result(text: &str, limit: usize) -> String {
    let len = utf16_len(text);
    if len <= limit {
        return text.to_string();
    }
    let kept = head(text, limit);
    format!("{kept}... [truncated {} chars]", len - utf16_len(kept))
}

/// `text` cut to `budget` units in the middle: 30 % head, 30 % tail.
pub(crate) fn middle_truncate(text: &str, budget: usize) -> String {
    let len = utf16_len(text);
    if budget == 0 || len <= budget {
        return text.to_string();
    }
    let head_len = budget * 3 / 10;
    let tail_len = (budget * 3 / 10).min(budget - head_len);
    let h = head(text, head_len);
    let t = if tail_len > 0 {
        tail(text, tail_len)
    } else {
        ""
    };
    let dropped = len.saturating_sub(utf16_len(h) + utf16_len(t));
    format!("{h}\n[TRUNCATED: dropped {dropped} middle chars due to context budget]\n{t}")
}

/// The summary text of a summary message (see
/// [`crate::store::conversation::said::summary_text`]).
pub fn summary_text(m: &StoredMessage) -> String {
    crate::store::conversation::said::summary_text(m)
}

/// Text parts joined with a blank line.
fn texts(m: &StoredMessage) -> String {
    m.parts
        .iter()
        .filter_map(|p| match p {
            Part::Text { text } if !text.is_empty() => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// The transcript of `messages` (see the module doc), cut in the middle to
/// `max_chars` when given.
pub fn transcript(messages: &[&StoredMessage], max_chars: Option<usize>) -> String {
    let mut lines: Vec<String> = Vec::new();
    for m in messages {
        if is_summary(m) {
            lines.push(format!("[user] {}", summary_text(m)));
            continue;
        }
        match m.role {
            Role::User => {
                let text = texts(m);
                if !text.is_empty() {
                    lines.push(format!("[user] {text}"));
                }
            }
            Role::Assistant => {
                let mut text = texts(m);
                let calls: Vec<String> = m
                    .parts
                    .iter()
                    .filter_map(|p| match p {
                        Part::ToolCall {
                            name, arguments, ..
                        } => Some(format!(
                            "{name}({})",
                            match arguments {
                                serde_json::Value::String(s) => s.clone(),
                                other => other.to_string(),
                            }
                        )),
                        _ => None,
                    })
                    .collect();
                if !calls.is_empty() {
                    if !text.is_empty() {
                        text.push(' ');
                    }
                    text.push_str("-> ");
                    text.push_str(&calls.join(", "));
                }
                if !text.is_empty() {
                    lines.push(format!("[assistant] {text}"));
                }
            }
            Role::Tool => {
                for p in &m.parts {
                    if let Part::ToolResult { text, .. } = p
                        && !text.is_empty()
                    {
                        lines.push(format!(
                            "[tool] {}",
                            truncate_tool_result(text, TOOL_RESULT_CHARS)
                        ));
                    }
                }
            }
        }
    }
    let full = format!(" \n{}\n \n. Generate the summary.", lines.join("\n"));
    match max_chars {
        Some(budget) => middle_truncate(&full, budget),
        None => full,
    }
}

/// A summariser's answer made a summary: trimmed, clipped at `clip`
/// units (`None`: never).
pub(crate) fn clip_summary(text: &str, clip: Option<usize>) -> String {
    let summary = text.trim();
    match clip {
        Some(limit) if utf16_len(summary) > limit => {
            format!("{}{SUMMARY_CLIPPED}", head(summary, limit))
        }
        _ => summary.to_string(),
    }
}

/// The statistics a summary message carries (letta-code's
/// `compaction_stats`, in its order). Token counts are estimates of the
/// in-context messages (without the system prompt and tools).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionStats {
    pub trigger: String,
    pub context_tokens_before: u64,
    pub context_tokens_after: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    pub messages_count_before: u64,
    pub messages_count_after: u64,
}

/// The summary message's text, in letta-code's key order.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SystemAlert {
    #[serde(rename = "type")]
    kind: String,
    message: String,
    #[serde(default)]
    time: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    compaction_stats: Option<CompactionStats>,
}

/// The text of a summary message: `{"type":"system_alert", "message",
/// "time", "compaction_stats"}`, the message saying how many messages were
/// hidden (sliding window) or that prior ones were (all).
pub(crate) fn package_summary(
    summary: &str,
    stats: &CompactionStats,
    sliding: bool,
    time: &str,
) -> String {
    let note = if sliding {
        format!(
            "Note: {} messages from the beginning of the conversation have been hidden from view due to memory constraints.\n",
            stats
                .messages_count_before
                .saturating_sub(stats.messages_count_after)
        )
    } else {
        "Note: prior messages have been hidden from view due to conversation memory constraints.\n"
            .to_string()
    };
    let alert = SystemAlert {
        kind: "system_alert".into(),
        message: format!("{note}{SUMMARY_INTRO}{summary}"),
        time: time.to_string(),
        compaction_stats: Some(stats.clone()),
    };
    serde_json::to_string(&alert).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msg(id: &str, role: Role, parts: Vec<Part>) -> StoredMessage {
        StoredMessage {
            id: id.into(),
            role,
            parts,
            kind: None,
            usage: None,
            stop: None,
            model: None,
            ts: "2026-01-01T00:00:00Z".into(),
        }
    }

    fn stats() -> CompactionStats {
        CompactionStats {
            trigger: "manual".into(),
            context_tokens_before: 100,
            context_tokens_after: 20,
            context_window: Some(900),
            messages_count_before: 7,
            messages_count_after: 3,
        }
    }

    #[test]
    fn transcript_lines() {
        let user = msg(
            "msg-1",
            Role::User,
            vec![
                Part::text("<system-reminder>\nr\n</system-reminder>"),
                Part::text("hi"),
            ],
        );
        let call = msg(
            "msg-2",
            Role::Assistant,
            vec![
                Part::text("let me look"),
                Part::ToolCall {
                    id: "c".into(),
                    name: "Bash".into(),
                    arguments: json!({"command": "ls"}),
                },
                Part::ToolCall {
                    id: "d".into(),
                    name: "Read".into(),
                    arguments: json!("not json"),
                },
            ],
        );
        let results = msg(
            "msg-3",
            Role::Tool,
            vec![
                Part::ToolResult {
                    call_id: "c".into(),
                    name: "Bash".into(),
                    text: "a".repeat(2005),
                    is_error: false,
                },
                Part::ToolResult {
                    call_id: "d".into(),
                    name: "Read".into(),
                    text: String::new(),
                    is_error: true,
                },
            ],
        );
        let bare_call = msg(
            "msg-4",
            Role::Assistant,
            vec![Part::ToolCall {
                id: "e".into(),
                name: "memory".into(),
                arguments: json!({}),
            }],
        );
        let packaged = package_summary("I met the user.", &stats(), true, "t");
        let summary = StoredMessage {
            kind: Some("summary".into()),
            ..msg("msg-5", Role::User, vec![Part::text(packaged)])
        };
        let t = transcript(&[&user, &call, &results, &bare_call, &summary], None);
        let expected = format!(
            " \n[user] <system-reminder>\nr\n</system-reminder>\n\nhi\n\
             [assistant] let me look -> Bash({{\"command\":\"ls\"}}), Read(not json)\n\
             [tool] {}... [truncated 5 chars]\n\
             [assistant] -> memory({{}})\n\
             [user] I met the user.\n \n. Generate the summary.",
            "a".repeat(2000)
        );
        assert_eq!(t, expected);
        assert_eq!(transcript(&[], None), " \n\n \n. Generate the summary.");
    }

    #[test]
    fn middle_truncation_keeps_head_and_tail() {
        let text: String = (0..1000)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        let cut = middle_truncate(&text, 100);
        assert!(cut.starts_with(&text[..30]));
        assert!(cut.ends_with(&text[970..]));
        assert!(cut.contains("\n[TRUNCATED: dropped 940 middle chars due to context budget]\n"));
        assert_eq!(middle_truncate("short", 100), "short");
        // Emoji are two units and never split.
        let emoji = "😀".repeat(100);
        let cut = middle_truncate(&emoji, 21);
        assert!(cut.starts_with(&"😀".repeat(3)));
        assert!(cut.contains("dropped 188 middle chars"), "{cut}");
    }

    #[test]
    fn every_rung_of_the_ladder_fits_its_budget_give_or_take_the_marker() {
        let big: Vec<StoredMessage> = (0..400)
            .map(|i| {
                msg(
                    &format!("msg-{i}"),
                    Role::User,
                    vec![Part::text("记".repeat(500))],
                )
            })
            .collect();
        let refs: Vec<&StoredMessage> = big.iter().collect();
        let mut previous = usize::MAX;
        for budget in LADDER {
            let t = transcript(&refs, Some(budget));
            let len = utf16_len(&t);
            assert!(len < budget, "{len} ≥ {budget}");
            assert!(len < previous);
            previous = len;
        }
    }

    #[test]
    fn summaries_are_trimmed_clipped_and_packaged() {
        assert_eq!(clip_summary("  text \n", Some(10)), "text");
        assert_eq!(
            clip_summary("abcdef", Some(3)),
            format!("abc{SUMMARY_CLIPPED}")
        );
        assert_eq!(clip_summary("abcdef", None), "abcdef");
        let p = package_summary("S", &stats(), true, "2026-01-01T00:00:00.000Z");
        assert!(p.starts_with(
            "{\"type\":\"system_alert\",\"message\":\"Note: 4 messages from the beginning of the conversation have been hidden from view due to memory constraints.\\nThe following is a summary of the previous messages:\\n S\",\"time\":\"2026-01-01T00:00:00.000Z\",\"compaction_stats\":{\"trigger\":\"manual\",\"context_tokens_before\":100"
        ), "{p}");
        let all = package_summary("S", &stats(), false, "t");
        assert!(all.contains("Note: prior messages have been hidden from view due to conversation memory constraints.\\nThe following"));
        let m = StoredMessage {
            kind: Some("summary".into()),
            ..msg("msg-1", Role::User, vec![Part::text(all)])
        };
        assert_eq!(summary_text(&m), "S");
    }

    #[test]
    fn the_prompts_name_their_sections_and_limits() {
        assert!(ALL_PROMPT.contains("7. **Where to look**"));
        assert!(ALL_PROMPT.contains("under 500 words"));
        assert!(SLIDING_PROMPT.contains("5. **Where to look**"));
        assert!(!SLIDING_PROMPT.contains("Current state"));
        assert!(SLIDING_PROMPT.contains("under 300 words"));
    }
}
