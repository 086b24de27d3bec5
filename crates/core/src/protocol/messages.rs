//! The data the model proxy carries: messages, tool specifications, model
//! requests and responses, as they travel in `model.complete` and as the
//! agent stores them. The providers (the `model` module, above this one)
//! speak these types too and own none of them;
//! the agent child knows only these.

use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Assistant,
    /// Results of tool calls, answering the preceding assistant message.
    Tool,
}

/// One part of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    Text {
        text: String,
    },
    ToolCall {
        id: String,
        name: String,
        /// Parsed JSON arguments (an object), or a string holding arguments
        /// that were not valid JSON (the tool then reports an error).
        arguments: Value,
    },
    ToolResult {
        call_id: String,
        name: String,
        text: String,
        is_error: bool,
    },
}

/// A message of the conversation as the model sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub parts: Vec<Part>,
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
}

/// Why a request is made (the mock answers summaries and reflections
/// deterministically; real providers ignore it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Purpose {
    #[default]
    Turn,
    Summary,
    Reflection,
}

/// One model request (= one step).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRequest {
    /// Provider-qualified handle, e.g. `mock`, `openai/gpt-4o-mini`.
    pub model: String,
    pub system: String,
    pub messages: Vec<Message>,
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub purpose: Purpose,
    /// The context window the caller accounts with (tokens). Providers
    /// ignore it; the mock refuses a request above it, as a real model
    /// above its own window would (it takes the smaller of this and its
    /// configured window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
}

/// Token accounting of one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(default)]
    pub cache_read_tokens: u64,
    #[serde(default)]
    pub cache_write_tokens: u64,
}

/// Why the model stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopKind {
    EndTurn,
    ToolUse,
    MaxTokens,
}

/// A complete response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelResponse {
    /// Text and tool-call parts, in order.
    pub parts: Vec<Part>,
    pub usage: Usage,
    pub stop: StopKind,
    pub response_id: String,
    /// The model that answered.
    pub model: String,
}

impl ModelResponse {
    /// Its text parts, joined.
    pub fn text(&self) -> String {
        self.parts
            .iter()
            .filter_map(|p| match p {
                Part::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("")
    }

    /// Its tool calls, as `(id, name, arguments)`, in order.
    pub fn tool_calls(&self) -> Vec<(String, String, serde_json::Value)> {
        self.parts
            .iter()
            .filter_map(|p| match p {
                Part::ToolCall {
                    id,
                    name,
                    arguments,
                } => Some((id.clone(), name.clone(), arguments.clone())),
                _ => None,
            })
            .collect()
    }
}

impl Part {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Self {
        Part::Text { text: text.into() }
    }
}

impl Message {
    /// A user message of one text part.
    pub fn user(text: impl Into<String>) -> Self {
        Message {
            role: Role::User,
            parts: vec![Part::text(text)],
        }
    }

    /// An assistant message of one text part.
    pub fn assistant(text: impl Into<String>) -> Self {
        Message {
            role: Role::Assistant,
            parts: vec![Part::text(text)],
        }
    }
}

/// Why a model request failed, as the wire carries it: the `data` of a
/// `model.complete` error response (`{"kind":"transient",…}`), which is
/// what the caller — the agent child — acts on. A provider's own error
/// (`model::ModelError`, this type re-exported) is sent in exactly this
/// shape: the wire owns it, the providers use it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelFailure {
    /// Worth retrying (5xx, 429, connection reset).
    #[error("transient model error{}: {message}", status.map(|s| format!(" (HTTP {s})")).unwrap_or_default())]
    Transient {
        status: Option<u16>,
        message: String,
        retry_after_ms: Option<u64>,
        /// What to do about it, when the provider knows better than a
        /// generic "try again" (a refused connection: check `base_url`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hint: Option<String>,
    },
    /// The request does not fit the model's context window.
    #[error("context window exceeded: {message}")]
    ContextOverflow { message: String },
    /// Anything else, the supervisor's refusal or an unreachable supervisor
    /// included.
    #[error("model error{}: {message}", status.map(|s| format!(" (HTTP {s})")).unwrap_or_default())]
    Fatal {
        status: Option<u16>,
        message: String,
    },
}

impl ModelFailure {
    /// A fatal failure without an HTTP status.
    pub fn fatal(message: impl Into<String>) -> Self {
        ModelFailure::Fatal {
            status: None,
            message: message.into(),
        }
    }

    /// Whether the request is worth retrying.
    pub fn is_transient(&self) -> bool {
        matches!(self, ModelFailure::Transient { .. })
    }
}

static REMINDER: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?s)<system-reminder>.*?</system-reminder>").ok());

/// Removes `<system-reminder>…</system-reminder>` blocks (how reminders
/// ride in a user message's text) from `text`.
pub fn strip_reminders(text: &str) -> String {
    match REMINDER.as_ref() {
        Some(re) => re.replace_all(text, "").into_owned(),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reminders_are_stripped() {
        assert!(REMINDER.is_some());
        assert_eq!(
            strip_reminders("a<system-reminder>x\ny</system-reminder>b"),
            "ab"
        );
    }
}
