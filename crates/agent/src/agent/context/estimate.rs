//! How many tokens a conversation's context holds (spec agent-loop.md §4).
//!
//! A message is `ceil(chars / 4)` tokens, characters counted in UTF-16 code
//! units (as letta-code's JavaScript does: a CJK character is one, an emoji
//! two): user text; assistant text plus each tool call's name and compact
//! JSON arguments; each tool result's text.
//!
//! The context estimate anchors on the provider's own count: the last
//! assistant message in the context that did not fail, has non-zero usage
//! and is newer than the latest compaction summary (its usage counted the
//! context before it, and a summary replaced that context), plus the
//! estimates of the messages after it. Without such an anchor: the system
//! prompt, every message and the tools' JSON schemas, estimated.
//!
//! "Newer" is creation order: message ids are `msg-<n>` with `n` growing
//! (a summary is created after everything it summarises, so a message it
//! kept has a smaller `n`); ids of another form fall back to their times.

use serde::Serialize;

use crate::protocol::messages::{Message, Part, Role, ToolSpec, Usage};
use crate::store::conversation::StoredMessage;

/// Characters of `s` in UTF-16 code units.
pub(crate) fn utf16_len(s: &str) -> usize {
    if s.is_ascii() {
        return s.len();
    }
    s.chars().map(char::len_utf16).sum()
}

/// `ceil(units / 4)`.
pub(crate) fn tokens_for(units: usize) -> u64 {
    (units as u64).div_ceil(4)
}

/// The estimate of a text.
pub(crate) fn text_tokens(s: &str) -> u64 {
    tokens_for(utf16_len(s))
}

/// Compact JSON, as `JSON.stringify` writes it (no escaping of non-ASCII).
fn json_len(v: &impl Serialize) -> usize {
    serde_json::to_string(v).map(|s| utf16_len(&s)).unwrap_or(0)
}

/// The estimate of one message. A tool message holds one result per call;
/// each counts as the message it is in letta-code.
pub(crate) fn message_tokens(m: &StoredMessage) -> u64 {
    parts_tokens(m.role, &m.parts)
}

/// The estimate of a message of `role` made of `parts` (see
/// [`message_tokens`]).
pub(crate) fn parts_tokens(role: Role, parts: &[Part]) -> u64 {
    match role {
        Role::Tool => parts
            .iter()
            .map(|p| match p {
                Part::ToolResult { text, .. } => text_tokens(text),
                Part::Text { text } => text_tokens(text),
                Part::ToolCall { .. } => 0,
            })
            .sum(),
        Role::User | Role::Assistant => {
            let units: usize = parts
                .iter()
                .map(|p| match p {
                    Part::Text { text } => utf16_len(text),
                    Part::ToolCall {
                        name, arguments, ..
                    } => utf16_len(name) + json_len(arguments),
                    Part::ToolResult { text, .. } => utf16_len(text),
                })
                .sum();
            tokens_for(units)
        }
    }
}

/// The estimates of `messages`, summed.
pub fn messages_tokens(messages: &[&StoredMessage]) -> u64 {
    messages.iter().map(|m| message_tokens(m)).sum()
}

/// The estimate of the tools' JSON schemas.
pub fn tools_tokens(tools: &[ToolSpec]) -> u64 {
    if tools.is_empty() {
        return 0;
    }
    tokens_for(json_len(&tools))
}

/// What a request is made of, estimated without any usage: what
/// "does it fit the window" is decided on, and what an error naming the
/// parts that do not fit says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RequestTokens {
    pub system: u64,
    pub tools: u64,
    pub messages: u64,
}

impl RequestTokens {
    pub fn total(&self) -> u64 {
        self.system + self.tools + self.messages
    }
}

/// The parts of a request to send: its system prompt, its tools' schemas
/// and its messages.
pub(crate) fn request_tokens(
    system: &str,
    messages: &[Message],
    tools: &[ToolSpec],
) -> RequestTokens {
    RequestTokens {
        system: text_tokens(system),
        tools: tools_tokens(tools),
        messages: messages
            .iter()
            .map(|m| parts_tokens(m.role, &m.parts))
            .sum(),
    }
}

/// The context a response's usage accounts for: input, output and cache
/// reads and writes. OpenAI-compatible servers count cached tokens inside
/// the input already (`prompt_tokens_details.cached_tokens`), so for
/// `openai/…` models cache reads are not added again.
pub fn usage_tokens(usage: &Usage, model: Option<&str>) -> u64 {
    let cache_read = if model.is_some_and(|m| m.starts_with("openai/")) {
        0
    } else {
        usage.cache_read_tokens
    };
    usage
        .input_tokens
        .saturating_add(usage.output_tokens)
        .saturating_add(cache_read)
        .saturating_add(usage.cache_write_tokens)
}

/// Whether `m` is a compaction summary.
pub fn is_summary(m: &StoredMessage) -> bool {
    m.kind.as_deref() == Some("summary")
}

/// The `n` of a `msg-<n>` id.
fn sequence(id: &str) -> Option<u64> {
    id.strip_prefix("msg-")?.parse().ok()
}

/// Whether `a` was created after `b` (see the module doc).
pub fn newer(a: &StoredMessage, b: &StoredMessage) -> bool {
    if let (Some(x), Some(y)) = (sequence(&a.id), sequence(&b.id)) {
        return x > y;
    }
    match (
        crate::clock::parse_rfc3339(&a.ts),
        crate::clock::parse_rfc3339(&b.ts),
    ) {
        (Some(x), Some(y)) => x > y,
        _ => false,
    }
}

/// A context estimate and how it was made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Estimate {
    pub tokens: u64,
    /// The assistant message whose usage anchors the estimate, if one does.
    pub anchor: Option<String>,
    /// That message's usage.
    pub usage_tokens: u64,
    /// The estimates of the messages after the anchor (of all of them
    /// without one).
    pub trailing_tokens: u64,
    /// The system prompt and the tools' schemas (counted only without an
    /// anchor: the usage includes them).
    pub system_tokens: u64,
    pub tool_tokens: u64,
}

/// The anchor: the index in `context` of the last assistant message that
/// did not fail, has usage, and is newer than the latest summary.
pub fn anchor(context: &[&StoredMessage]) -> Option<(usize, u64)> {
    let latest_summary = context
        .iter()
        .filter(|m| is_summary(m))
        .reduce(|a, b| if newer(b, a) { b } else { a });
    context.iter().enumerate().rev().find_map(|(i, m)| {
        if m.role != Role::Assistant
            || matches!(m.stop.as_deref(), Some("error" | "cancelled" | "aborted"))
            || matches!(m.kind.as_deref(), Some("error" | "interrupted"))
        {
            return None;
        }
        if latest_summary.is_some_and(|s| !newer(m, s)) {
            return None;
        }
        let tokens = usage_tokens(m.usage.as_ref()?, m.model.as_deref());
        (tokens > 0).then_some((i, tokens))
    })
}

/// The context estimate of a request with `system` and `tools` over
/// `context` (see the module doc).
pub fn context_estimate(context: &[&StoredMessage], system: &str, tools: &[ToolSpec]) -> Estimate {
    if let Some((i, usage)) = anchor(context) {
        let trailing = messages_tokens(&context[i + 1..]);
        return Estimate {
            tokens: usage + trailing,
            anchor: Some(context[i].id.clone()),
            usage_tokens: usage,
            trailing_tokens: trailing,
            system_tokens: 0,
            tool_tokens: 0,
        };
    }
    let trailing = messages_tokens(context);
    let system_tokens = text_tokens(system);
    let tool_tokens = tools_tokens(tools);
    Estimate {
        tokens: system_tokens + trailing + tool_tokens,
        anchor: None,
        usage_tokens: 0,
        trailing_tokens: trailing,
        system_tokens,
        tool_tokens,
    }
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

    fn text(id: &str, role: Role, t: &str) -> StoredMessage {
        msg(id, role, vec![Part::text(t)])
    }

    fn answered(id: &str, t: &str, input: u64, output: u64) -> StoredMessage {
        StoredMessage {
            usage: Some(Usage {
                input_tokens: input,
                output_tokens: output,
                ..Usage::default()
            }),
            stop: Some("end_turn".into()),
            ..text(id, Role::Assistant, t)
        }
    }

    #[test]
    fn utf16_units_count_cjk_once_and_emoji_twice() {
        assert_eq!(utf16_len("abcd"), 4);
        assert_eq!(utf16_len("记住我喜欢茶"), 6);
        assert_eq!(utf16_len("😀"), 2);
        assert_eq!(utf16_len("hi 😀 茶"), 3 + 2 + 1 + 1);
        // UTF-8 bytes would say otherwise.
        assert_eq!("记住我喜欢茶".len(), 18);
        assert_eq!(text_tokens("记住我喜欢茶"), 2); // ceil(6 / 4)
        assert_eq!(text_tokens("😀😀"), 1); // 4 units
        assert_eq!(text_tokens("😀😀😀"), 2); // 6 units
        assert_eq!(text_tokens(""), 0);
    }

    #[test]
    fn message_estimates_follow_the_roles() {
        let user = text("msg-1", Role::User, "12345");
        assert_eq!(message_tokens(&user), 2);
        let call = msg(
            "msg-2",
            Role::Assistant,
            vec![
                Part::text("ok"),
                Part::ToolCall {
                    id: "c".into(),
                    name: "Bash".into(),
                    arguments: json!({"command": "ls 茶"}),
                },
            ],
        );
        // 2 + 4 + len({"command":"ls 茶"}) = 2 + 4 + 17
        assert_eq!(message_tokens(&call), 23u64.div_ceil(4));
        let results = msg(
            "msg-3",
            Role::Tool,
            vec![
                Part::ToolResult {
                    call_id: "c".into(),
                    name: "Bash".into(),
                    text: "a".into(),
                    is_error: false,
                },
                Part::ToolResult {
                    call_id: "d".into(),
                    name: "Bash".into(),
                    text: "b".into(),
                    is_error: false,
                },
            ],
        );
        // One result is one letta-code message: each rounds up.
        assert_eq!(message_tokens(&results), 2);
    }

    #[test]
    fn estimate_anchors_on_the_last_usage() {
        let user1 = text("msg-1", Role::User, "hello");
        let a1 = answered("msg-2", "hi", 100, 5);
        let user2 = text("msg-3", Role::User, "x".repeat(40).as_str());
        let context = [&user1, &a1, &user2];
        let e = context_estimate(&context, &"s".repeat(4000), &[]);
        assert_eq!(e.anchor.as_deref(), Some("msg-2"));
        assert_eq!(e.tokens, 105 + 10);
        assert_eq!((e.usage_tokens, e.trailing_tokens), (105, 10));
        assert_eq!(e.system_tokens, 0, "the usage already counts the prompt");
    }

    #[test]
    fn estimate_without_a_usable_anchor_counts_system_messages_and_tools() {
        let tools = vec![ToolSpec {
            name: "Bash".into(),
            description: "run".into(),
            parameters: json!({"type": "object"}),
        }];
        let tools_len = serde_json::to_string(&tools).unwrap().len();
        let user = text("msg-1", Role::User, "12345678");
        // An error reply, an empty usage and a cancelled reply anchor nothing.
        let failed = StoredMessage {
            stop: Some("error".into()),
            ..answered("msg-2", "boom", 50, 1)
        };
        let empty = answered("msg-3", "1234", 0, 0);
        let cancelled = StoredMessage {
            stop: Some("cancelled".into()),
            ..answered("msg-4", "1234", 50, 1)
        };
        let context = [&user, &failed, &empty, &cancelled];
        let e = context_estimate(&context, "system!!", &tools);
        assert_eq!(e.anchor, None);
        assert_eq!(e.system_tokens, 2);
        assert_eq!(e.tool_tokens, tools_len.div_ceil(4) as u64);
        assert_eq!(e.trailing_tokens, 2 + 1 + 1 + 1);
        assert_eq!(e.tokens, 2 + 5 + tools_len.div_ceil(4) as u64);
    }

    #[test]
    fn usage_older_than_the_latest_summary_is_ignored() {
        // After a compaction the context is [summary, kept…, new…]: a kept
        // assistant's usage counted the old, larger context.
        let summary = StoredMessage {
            kind: Some("summary".into()),
            ..text("msg-10", Role::User, "summary!")
        };
        let kept = answered("msg-8", "kept", 5000, 10);
        let user = text("msg-11", Role::User, "next");
        let context = [&summary, &kept, &user];
        let e = context_estimate(&context, "sys!", &[]);
        assert_eq!(e.anchor, None);
        assert_eq!(e.tokens, 1 + 2 + 1 + 1);
        // A reply after the summary anchors again.
        let reply = answered("msg-12", "re", 40, 2);
        let context = [&summary, &kept, &user, &reply];
        let e = context_estimate(&context, "sys!", &[]);
        assert_eq!((e.anchor.as_deref(), e.tokens), (Some("msg-12"), 42));
    }

    #[test]
    fn openai_usage_counts_cached_input_once() {
        let u = Usage {
            input_tokens: 100,
            output_tokens: 10,
            cache_read_tokens: 80,
            cache_write_tokens: 0,
        };
        assert_eq!(usage_tokens(&u, Some("openai/gpt-4o")), 110);
        assert_eq!(usage_tokens(&u, Some("anthropic/claude")), 190);
        assert_eq!(usage_tokens(&u, None), 190);
    }

    #[test]
    fn newer_by_sequence_then_time() {
        let a = text("msg-9", Role::User, "");
        let b = text("msg-10", Role::User, "");
        assert!(newer(&b, &a) && !newer(&a, &b));
        let c = StoredMessage {
            ts: "2026-01-02T00:00:00Z".into(),
            ..text("imported-1", Role::User, "")
        };
        let d = StoredMessage {
            ts: "2026-01-01T00:00:00.5Z".into(),
            ..text("imported-2", Role::User, "")
        };
        assert!(newer(&c, &d) && !newer(&d, &c));
    }
}
