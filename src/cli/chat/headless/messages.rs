//! A conversation's messages as Letta's message objects, a page at a time
//! (`list_messages` and `bootstrap_session_state`): newest first by
//! default, `before`/`after` cursors by message id, `limit` per page. The
//! log is streamed, and a page holds at most `limit` messages, however
//! long the conversation.

use std::collections::VecDeque;

use serde_json::{Value, json};

use crate::paths::AgentPaths;
use crate::protocol::messages::{Part, Role};
use crate::store::conversation::{self, StoredMessage, lines::LinePos};

/// Most messages in one page.
pub(crate) const MAX_LIMIT: usize = 1000;
/// Messages in a page unless the request says.
pub(crate) const DEFAULT_LIMIT: usize = 50;

/// What a page request asked for.
#[derive(Debug, Default)]
pub(crate) struct PageRequest {
    pub before: Option<String>,
    pub after: Option<String>,
    pub limit: Option<usize>,
    /// `asc` or `desc` (the default).
    pub order: Option<String>,
}

impl PageRequest {
    /// The page fields of a control request.
    pub(crate) fn from_request(r: &Value) -> Result<Self, String> {
        let text = |k: &str| -> Result<Option<String>, String> {
            match r.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(format!("{k} must be a string")),
            }
        };
        let limit = match r.get("limit") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_u64()
                    .filter(|n| (1..=MAX_LIMIT as u64).contains(n))
                    .ok_or_else(|| format!("limit must be a number from 1 to {MAX_LIMIT}"))?
                    as usize,
            ),
        };
        let order = text("order")?;
        if let Some(o) = &order
            && o != "asc"
            && o != "desc"
        {
            return Err(format!("order must be asc or desc, not {o:?}"));
        }
        Ok(Self {
            before: text("before")?,
            after: text("after")?,
            limit,
            order,
        })
    }
}

/// One page: the messages, the cursor for the next older page, and
/// whether the page is full (letta-code's `has_more`).
#[derive(Debug)]
pub(crate) struct Page {
    pub messages: Vec<Value>,
    pub next_before: Option<String>,
    pub has_more: bool,
}

impl Page {
    pub(crate) fn fields(&self) -> Value {
        json!({
            "messages": self.messages,
            "next_before": self.next_before,
            "has_more": self.has_more,
        })
    }
}

/// The page of conversation `id` that `req` asks for; an unknown
/// conversation is an empty one (a new `conv-…` before its first turn).
pub(crate) fn page(agent: &AgentPaths, id: &str, req: &PageRequest) -> Result<Page, String> {
    let limit = req.limit.unwrap_or(DEFAULT_LIMIT);
    let desc = req.order.as_deref() != Some("asc");
    // Chronological stream; `after` opens the window, `before` closes it.
    let mut open = req.after.is_none();
    let mut closed = false;
    let mut kept: VecDeque<Value> = VecDeque::new();
    let mut full_asc = false;
    conversation::read_messages(agent, id, LinePos::default(), |m: StoredMessage, _| {
        if closed || full_asc {
            return;
        }
        for v in letta_messages(&m) {
            let vid = v["id"].as_str().unwrap_or("").to_string();
            if req.before.as_deref() == Some(vid.as_str()) {
                closed = true;
                return;
            }
            if !open {
                open = req.after.as_deref() == Some(vid.as_str());
                continue;
            }
            kept.push_back(v);
            if desc {
                if kept.len() > limit {
                    kept.pop_front();
                }
            } else if kept.len() == limit {
                full_asc = true;
                return;
            }
        }
    })
    .map_err(|e| e.to_string())?;
    let mut messages: Vec<Value> = kept.into_iter().collect();
    if desc {
        messages.reverse();
    }
    let next_before = messages
        .last()
        .and_then(|m| m["id"].as_str())
        .map(str::to_string);
    let has_more = messages.len() >= limit;
    Ok(Page {
        messages,
        next_before,
        has_more,
    })
}

/// A stored message as Letta's message objects: a user's text, an
/// assistant's text and each of its tool calls, each tool result.
fn letta_messages(m: &StoredMessage) -> Vec<Value> {
    let base = |suffix: &str, message_type: &str| {
        json!({
            "id": format!("message-{}{suffix}", m.id),
            "date": m.ts,
            "message_type": message_type,
            "otid": Value::Null,
            "run_id": Value::Null,
        })
    };
    let mut out = Vec::new();
    if m.kind.as_deref() == Some("summary") {
        let mut v = base("", "summary_message");
        v["summary"] = json!(m.text());
        v["content"] = json!(m.text());
        return vec![v];
    }
    let text = m.text();
    match m.role {
        Role::User => {
            // What the person wrote: the reminders the harness added are
            // not theirs, and a message of reminders only is not shown.
            let own = without_reminders(&text);
            if own.is_empty() {
                return out;
            }
            let mut v = base("", "user_message");
            v["content"] = json!(own);
            out.push(v);
        }
        Role::Assistant => {
            if !text.is_empty() {
                let mut v = base("", "assistant_message");
                v["content"] = json!(text);
                out.push(v);
            }
            for (n, p) in m.parts.iter().enumerate() {
                if let Part::ToolCall {
                    id,
                    name,
                    arguments,
                } = p
                {
                    let args = match arguments {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    let mut v = base(&format!("-call-{n}"), "tool_call_message");
                    v["tool_call"] = json!({"name": name, "arguments": args, "tool_call_id": id});
                    out.push(v);
                }
            }
        }
        Role::Tool => {
            for (n, p) in m.parts.iter().enumerate() {
                if let Part::ToolResult {
                    call_id,
                    text,
                    is_error,
                    ..
                } = p
                {
                    let mut v = base(&format!("-return-{n}"), "tool_return_message");
                    v["tool_call_id"] = json!(call_id);
                    v["tool_return"] = json!(text);
                    v["status"] = json!(if *is_error { "error" } else { "success" });
                    out.push(v);
                }
            }
        }
    }
    out
}

/// `text` without its `<system-reminder>…</system-reminder>` blocks, trimmed.
fn without_reminders(text: &str) -> String {
    const OPEN: &str = "<system-reminder>";
    const CLOSE: &str = "</system-reminder>";
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(OPEN) {
        out.push_str(&rest[..at]);
        match rest[at..].find(CLOSE) {
            Some(end) => rest = &rest[at + end + CLOSE.len()..],
            None => {
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reminders_are_not_the_users_words() {
        assert_eq!(
            without_reminders("<system-reminder>\nAgent info\n</system-reminder>\nremember: x"),
            "remember: x"
        );
        assert_eq!(
            without_reminders("<system-reminder>a</system-reminder>"),
            ""
        );
        assert_eq!(without_reminders("plain"), "plain");
        assert_eq!(without_reminders("a <system-reminder>unclosed"), "a");
    }
}
