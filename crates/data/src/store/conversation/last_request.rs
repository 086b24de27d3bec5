//! `conversations/<id>/last-request.json`: what the model was last sent,
//! kept for operators and tests — bounded, since a conversation's request
//! is as large as its whole context (hundreds of kilobytes at a large
//! window) and every conversation ever used would otherwise keep one.
//!
//! * Size: at most [`LAST_REQUEST_MAX_BYTES`]. A request past it is
//!   recorded without its oldest messages; if not even its newest message
//!   fits, long texts are cut as well. The record then says so in
//!   `truncated: {omitted_messages, cut_texts, bytes, max_bytes}` (`bytes`:
//!   the whole request's size).
//! * Number: the [`LAST_REQUEST_MAX_FILES`] most recently written of an
//!   agent's conversations keep theirs; writing one removes the others'.

use serde_json::{Value, json};

use super::error::ConversationError;
use crate::agentfs::Dir;
use crate::paths::{AgentPaths, LAST_REQUEST_FILE_NAME};
use crate::protocol::messages::ModelRequest;

/// Largest `last-request.json` written.
pub const LAST_REQUEST_MAX_BYTES: usize = 256 << 10;
/// Conversations of one agent that keep a `last-request.json`.
pub const LAST_REQUEST_MAX_FILES: usize = 8;
/// A text longer than this is cut when even one message does not fit.
const CUT_TEXT_CHARS: usize = 2_048;
/// Most conversation directories one prune looks at.
const MAX_CONVERSATIONS: usize = 1 << 20;

fn pretty(v: &impl serde::Serialize) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(v).unwrap_or_default();
    out.push(b'\n');
    out
}

/// The bytes of `last-request.json` for `request`: the request itself when
/// it fits in `max` bytes, else a shortened record that says what it left
/// out.
pub fn record(request: &ModelRequest, max: usize) -> Vec<u8> {
    let whole = pretty(request);
    if whole.len() <= max {
        return whole;
    }
    let mut base = serde_json::to_value(request).unwrap_or_default();
    let messages = match base.get_mut("messages").map(Value::take) {
        Some(Value::Array(m)) => m,
        _ => Vec::new(),
    };
    let note = |omitted: usize, cut: usize| json!({"omitted_messages": omitted, "cut_texts": cut, "bytes": whole.len(), "max_bytes": max});
    if let Some(b) = newest_that_fit(&base, &messages, max, |o| note(o, 0)) {
        return b;
    }
    // Not even the newest message fits: cut long texts everywhere.
    let mut cut = 0;
    cut_texts(&mut base, &mut cut);
    let mut messages = Value::Array(messages);
    cut_texts(&mut messages, &mut cut);
    let messages = match messages {
        Value::Array(m) => m,
        _ => Vec::new(),
    };
    newest_that_fit(&base, &messages, max, |o| note(o, cut)).unwrap_or_else(|| {
        pretty(&json!({
            "model": request.model,
            "purpose": request.purpose,
            "truncated": note(messages.len(), cut),
        }))
    })
}

/// `base` with the most of the newest `messages` that fit in `max` bytes
/// (at least one), and `note(omitted)` as `truncated`.
fn newest_that_fit(
    base: &Value,
    messages: &[Value],
    max: usize,
    note: impl Fn(usize) -> Value,
) -> Option<Vec<u8>> {
    let with = |kept: usize| {
        let mut v = base.clone();
        let from = messages.len() - kept;
        v["messages"] = Value::Array(messages[from..].to_vec());
        v["truncated"] = note(from);
        let b = pretty(&v);
        (b.len() <= max).then_some(b)
    };
    // The record shrinks as fewer messages are kept: the largest count
    // that fits, by bisection.
    let (mut lo, mut hi) = (1, messages.len());
    let mut best = None;
    while lo <= hi {
        let mid = lo + (hi - lo) / 2;
        match with(mid) {
            Some(b) => {
                best = Some(b);
                lo = mid + 1;
            }
            None => hi = mid - 1,
        }
    }
    best
}

/// Cut every string in `v` longer than [`CUT_TEXT_CHARS`]; count them.
fn cut_texts(v: &mut Value, cut: &mut usize) {
    match v {
        Value::String(s) if s.chars().count() > CUT_TEXT_CHARS => {
            let kept: String = s.chars().take(CUT_TEXT_CHARS).collect();
            let dropped = s.len() - kept.len();
            *s = format!("{kept}… [{dropped} bytes cut]");
            *cut += 1;
        }
        Value::Array(a) => a.iter_mut().for_each(|x| cut_texts(x, cut)),
        Value::Object(o) => o.values_mut().for_each(|x| cut_texts(x, cut)),
        _ => {}
    }
}

/// Keep `last-request.json` in only the `keep` conversations of `agent`
/// that wrote theirs last. Reached through descriptors, as every
/// conversation file is; an entry that is not a conversation directory is
/// passed over.
pub fn prune(agent: &AgentPaths, keep: usize) -> Result<(), ConversationError> {
    let convs = match Dir::open(&agent.conversations_dir()) {
        Ok(d) => d,
        Err(e) if e.is_not_found() => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let mut written = Vec::new();
    for name in convs.list(MAX_CONVERSATIONS)? {
        let Some(id) = name.to_str().filter(|n| crate::paths::is_valid_agent_id(n)) else {
            continue;
        };
        let Ok(dir) = convs.open_dir(id) else {
            continue;
        };
        if let Ok(Some(st)) = dir.stat_at(LAST_REQUEST_FILE_NAME) {
            written.push((st.mtime, id.to_string(), dir));
        }
    }
    if written.len() <= keep {
        return Ok(());
    }
    written.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    for (_, _, dir) in written.into_iter().skip(keep) {
        match dir.remove_file(LAST_REQUEST_FILE_NAME) {
            Err(e) if !e.is_not_found() => return Err(e.into()),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::messages::{Message, Part, Role};

    fn request(texts: &[String]) -> ModelRequest {
        ModelRequest {
            model: "mock".into(),
            system: "sys".into(),
            messages: texts
                .iter()
                .map(|t| Message {
                    role: Role::User,
                    parts: vec![Part::Text { text: t.clone() }],
                })
                .collect(),
            tools: Vec::new(),
            max_tokens: None,
            purpose: Default::default(),
            context_window: None,
        }
    }

    #[test]
    fn a_small_request_is_kept_whole() {
        let r = request(&["a".into(), "b".into()]);
        let b = record(&r, 4096);
        let back: ModelRequest = serde_json::from_slice(&b).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn the_oldest_messages_go_first() {
        let texts: Vec<String> = (0..10)
            .map(|i| format!("m{i} {}", "x".repeat(900)))
            .collect();
        let b = record(&request(&texts), 4096);
        assert!(b.len() <= 4096, "{}", b.len());
        let v: Value = serde_json::from_slice(&b).unwrap();
        let kept = v["messages"].as_array().unwrap();
        assert!(!kept.is_empty());
        let omitted = v["truncated"]["omitted_messages"].as_u64().unwrap() as usize;
        assert_eq!(omitted + kept.len(), 10);
        assert!(v.to_string().contains("m9 "));
        assert!(!v.to_string().contains("m0 "));
        assert_eq!(v["truncated"]["cut_texts"], 0);
    }

    #[test]
    fn a_message_too_large_alone_is_cut() {
        let b = record(&request(&["y".repeat(100_000)]), 8192);
        assert!(b.len() <= 8192, "{}", b.len());
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["truncated"]["omitted_messages"], 0);
        assert_eq!(v["truncated"]["cut_texts"], 1);
        assert!(v.to_string().contains("bytes cut]"));
        // Nothing fits at all: still a small record saying so.
        let b = record(&request(&["z".repeat(100_000)]), 200);
        assert!(b.len() <= 400, "{}", b.len());
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["truncated"]["omitted_messages"], 1);
    }
}
