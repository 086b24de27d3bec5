//! Models: the [`Model`] trait and its providers. Providers run in the
//! supervisor only (it alone holds credentials and network); agent children
//! reach them through `model.complete` on their channel.
//!
//! * `mock` — deterministic and offline, the default: the book's rules
//!   (remember / forget / persona / rename), a scripted mode for tests,
//!   deterministic summaries and reflections, reported usage.
//! * `openai/<model>` — OpenAI-compatible Chat Completions (OpenAI, Ollama,
//!   vLLM, llama.cpp), streamed (SSE), with tool calls.
//! * `anthropic/<model>` — the Messages API, streamed, with tool use.

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub mod anthropic;
pub mod config;
pub mod factory;
mod http;
pub mod mock;
pub mod openai;
pub mod scripted;
mod sse;

pub use crate::protocol::messages::{
    Message, ModelFailure, ModelRequest, ModelResponse, Part, Purpose, Role, StopKind, ToolSpec,
    Usage,
};
pub use config::{ConfigError, ProviderConfig, default_model};
pub use factory::open_model;

/// Streamed while a response is produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ModelEvent {
    TextDelta {
        text: String,
    },
    ToolCall {
        id: String,
        name: String,
        arguments: Value,
    },
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelError {
    /// Worth retrying (5xx, 429, connection reset) — the loop retries at
    /// most three times with backoff.
    #[error("transient model error{}: {message}", status.map(|s| format!(" (HTTP {s})")).unwrap_or_default())]
    Transient {
        status: Option<u16>,
        message: String,
        retry_after_ms: Option<u64>,
    },
    /// The request does not fit the model's context window.
    #[error("context window exceeded: {message}")]
    ContextOverflow { message: String },
    /// Anything else (4xx, bad configuration, unparsable stream).
    #[error("model error{}: {message}", status.map(|s| format!(" (HTTP {s})")).unwrap_or_default())]
    Fatal {
        status: Option<u16>,
        message: String,
    },
}

/// A language model.
pub trait Model: Send + Sync {
    /// Answer one request, streaming events to `on_event` as they arrive.
    fn complete(
        &self,
        request: &ModelRequest,
        on_event: &mut dyn FnMut(ModelEvent),
    ) -> Result<ModelResponse, ModelError>;
}

impl ModelError {
    /// A fatal error without an HTTP status.
    pub fn fatal(message: impl Into<String>) -> Self {
        ModelError::Fatal {
            status: None,
            message: message.into(),
        }
    }

    /// Whether the agent loop should retry the request.
    pub fn is_transient(&self) -> bool {
        matches!(self, ModelError::Transient { .. })
    }
}

/// What the caller of `model.complete` reads: the same fields, the same
/// words (the supervisor sends a `ModelError` as the response's `data`).
impl From<ModelError> for ModelFailure {
    fn from(e: ModelError) -> Self {
        match e {
            ModelError::Transient {
                status,
                message,
                retry_after_ms,
            } => ModelFailure::Transient {
                status,
                message,
                retry_after_ms,
            },
            ModelError::ContextOverflow { message } => ModelFailure::ContextOverflow { message },
            ModelError::Fatal { status, message } => ModelFailure::Fatal { status, message },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A provider's error on the wire reads back as the protocol's
    /// `ModelFailure` with the same fields and the same message.
    #[test]
    fn model_errors_travel_as_model_failures() {
        let errors = [
            ModelError::Transient {
                status: Some(503),
                message: "overloaded".into(),
                retry_after_ms: Some(1500),
            },
            ModelError::Transient {
                status: None,
                message: "reset".into(),
                retry_after_ms: None,
            },
            ModelError::ContextOverflow {
                message: "too long".into(),
            },
            ModelError::Fatal {
                status: Some(401),
                message: "bad key".into(),
            },
            ModelError::fatal("unknown model"),
        ];
        for e in errors {
            let wire = serde_json::to_value(&e).unwrap_or_default();
            let read: ModelFailure = match serde_json::from_value(wire.clone()) {
                Ok(f) => f,
                Err(err) => panic!("{wire} does not read as a ModelFailure: {err}"),
            };
            assert_eq!(read.to_string(), e.to_string());
            assert_eq!(read.is_transient(), e.is_transient());
            assert_eq!(serde_json::to_value(&read).unwrap_or_default(), wire);
            assert_eq!(ModelFailure::from(e), read);
        }
    }
}
