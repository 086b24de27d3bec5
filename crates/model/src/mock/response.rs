//! How a mock response is made, shared with the scripted mode: characters
//! and tokens counted, response and call ids, the parts streamed as events.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

use crate::protocol::messages::{ModelRequest, ModelResponse, Part, StopKind, Usage};
use crate::provider::ModelEvent;

/// Characters of a request as the mock counts them: the system prompt, the
/// JSON of the tool specs, every text and tool-result text, and each tool
/// call's name and JSON arguments.
pub fn request_chars(request: &ModelRequest) -> usize {
    let tools = if request.tools.is_empty() {
        0
    } else {
        serde_json::to_string(&request.tools)
            .map(|s| s.chars().count())
            .unwrap_or(0)
    };
    request.system.chars().count()
        + tools
        + request
            .messages
            .iter()
            .flat_map(|m| m.parts.iter())
            .map(part_chars)
            .sum::<usize>()
}

/// Characters of one part (see [`request_chars`]).
pub fn part_chars(part: &Part) -> usize {
    match part {
        Part::Text { text } => text.chars().count(),
        Part::ToolCall {
            name, arguments, ..
        } => name.chars().count() + arguments_text(arguments).chars().count(),
        Part::ToolResult { text, .. } => text.chars().count(),
    }
}

fn arguments_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `ceil(chars / 4)`.
pub fn tokens(chars: usize) -> u64 {
    (chars as u64).div_ceil(4)
}

static COUNTER: AtomicU64 = AtomicU64::new(1);
static NONCE: LazyLock<String> = LazyLock::new(|| {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}{:x}", std::process::id(), nanos & 0xffff)
});

fn next_n() -> u64 {
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// A fresh response id (`mock-resp-<process nonce>-<n>`).
pub fn next_response_id() -> String {
    format!("mock-resp-{}-{}", *NONCE, next_n())
}

/// A fresh tool-call id (`call_<process nonce>_<n>`).
pub fn next_call_id() -> String {
    format!("call_{}_{}", *NONCE, next_n())
}

/// Streams `parts` (text in small deltas, each tool call as one event) and
/// builds the response with usage computed from the characters.
pub(crate) fn finish(
    parts: Vec<Part>,
    input_tokens: u64,
    stop: Option<StopKind>,
    model: &str,
    on_event: &mut dyn FnMut(ModelEvent),
) -> ModelResponse {
    let mut has_tool = false;
    for p in &parts {
        match p {
            Part::Text { text } => {
                let chars: Vec<char> = text.chars().collect();
                for chunk in chars.chunks(24) {
                    on_event(ModelEvent::TextDelta {
                        text: chunk.iter().collect(),
                    });
                }
            }
            Part::ToolCall {
                id,
                name,
                arguments,
            } => {
                has_tool = true;
                on_event(ModelEvent::ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: arguments.clone(),
                });
            }
            Part::ToolResult { .. } => {}
        }
    }
    let output_chars: usize = parts.iter().map(part_chars).sum();
    let stop = stop.unwrap_or(if has_tool {
        StopKind::ToolUse
    } else {
        StopKind::EndTurn
    });
    ModelResponse {
        parts,
        usage: Usage {
            input_tokens,
            output_tokens: tokens(output_chars),
            ..Usage::default()
        },
        stop,
        response_id: next_response_id(),
        model: model.to_string(),
    }
}
