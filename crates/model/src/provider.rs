//! What a provider is: the [`Model`] trait, the [`ModelEvent`]s it streams
//! while it answers and the [`ModelError`] it fails with.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::protocol::messages::{ModelRequest, ModelResponse};

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

/// Why a request failed: the protocol's `ModelFailure`, so a provider's
/// error and what the agent child reads of it are one type (retries: the
/// agent loop retries a transient one at most three times with backoff).
pub use crate::protocol::messages::ModelFailure as ModelError;

/// A language model.
pub trait Model: Send + Sync {
    /// Answer one request, streaming events to `on_event` as they arrive.
    fn complete(
        &self,
        request: &ModelRequest,
        on_event: &mut dyn FnMut(ModelEvent),
    ) -> Result<ModelResponse, ModelError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::messages::ModelFailure;

    /// A provider's error survives the wire: what the agent child reads is
    /// the same failure, with the same message and retry verdict.
    #[test]
    fn model_errors_travel_as_model_failures() {
        let errors = [
            ModelError::Transient {
                status: Some(503),
                message: "overloaded".into(),
                retry_after_ms: Some(1500),
                hint: None,
            },
            ModelError::Transient {
                status: None,
                message: "reset".into(),
                retry_after_ms: None,
                hint: None,
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
            assert_eq!(read, e);
        }
    }
}
