//! Assembling a streamed answer: what the providers' stream readers share
//! once their wire format has been read — the SSE feed, the parts, usage
//! and ids every answer gathers, tool calls made whole, how it stopped.

use std::io::Read;

use serde_json::Value;

use super::provider::{ModelError, ModelEvent};
use super::sse::feed_events;
use crate::protocol::messages::{ModelResponse, Part, StopKind, Usage};

/// Where a reader's deltas go as they arrive.
pub(crate) type OnEvent<'a> = &'a mut dyn FnMut(ModelEvent);
/// What reading a streamed answer gives.
pub(crate) type Reply = Result<ModelResponse, ModelError>;

/// A wire format's reader of one streamed answer.
pub trait Assembler {
    /// Takes one event's data; returns true once the answer is complete.
    fn feed(&mut self, data: &str, on_event: OnEvent<'_>) -> Result<bool, ModelError>;
    /// The answer the events described.
    fn finish(self, on_event: OnEvent<'_>) -> Reply;
}

/// Read an event stream (the body of a streaming response) with `reader`;
/// deltas reach `on_event` as they arrive.
pub(crate) fn read_answer(
    mut reader: impl Assembler,
    body: impl Read,
    on_event: OnEvent<'_>,
) -> Reply {
    feed_events(body, |data| reader.feed(data, on_event))?;
    reader.finish(on_event)
}

/// What every streamed answer gathers, whatever its wire.
#[derive(Debug, Default)]
pub(crate) struct Answer {
    /// The model that answered (the server may name it more exactly).
    pub model: String,
    pub response_id: String,
    pub parts: Vec<Part>,
    pub usage: Usage,
}

impl Answer {
    pub fn new(model: &str) -> Self {
        Self {
            model: model.to_string(),
            ..Self::default()
        }
    }

    /// A tool call made whole: announced to `on_event` and kept.
    pub(crate) fn add_tool_call(
        &mut self,
        id: String,
        name: String,
        arguments: Value,
        on_event: OnEvent<'_>,
    ) {
        on_event(ModelEvent::ToolCall {
            id: id.clone(),
            name: name.clone(),
            arguments: arguments.clone(),
        });
        self.parts.push(Part::ToolCall {
            id,
            name,
            arguments,
        });
    }

    /// The response of `provider`. `reason` is the stop reason the wire
    /// gave and `named` what the format's own reasons mean (the token
    /// limit, tool use); any other reason ends the turn unless tool calls
    /// came. With no reason, tool calls still mean tool use and an answer
    /// the stream marked `complete` ends the turn; else the stream was cut
    /// short.
    pub fn finish(
        self,
        provider: &str,
        reason: Option<&str>,
        named: fn(&str) -> Option<StopKind>,
        complete: bool,
    ) -> Reply {
        let has_calls = self
            .parts
            .iter()
            .any(|p| matches!(p, Part::ToolCall { .. }));
        let stop = match reason.map(named) {
            Some(Some(kind)) => kind,
            Some(None) | None if has_calls => StopKind::ToolUse,
            Some(None) => StopKind::EndTurn,
            None if complete => StopKind::EndTurn,
            None => return Err(ended_early()),
        };
        Ok(ModelResponse {
            parts: self.parts,
            usage: self.usage,
            stop,
            response_id: self.response_id,
            model: format!("{provider}/{}", self.model),
        })
    }
}

/// Parses accumulated tool-call arguments: empty → `{}`, valid JSON → the
/// value, anything else → the raw string (the runtime reports a tool error).
pub(crate) fn parse_arguments(raw: &str) -> Value {
    if raw.trim().is_empty() {
        return Value::Object(Default::default());
    }
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()))
}

/// A stream that ended before the answer said how it stopped: cut short,
/// worth another try.
pub(crate) fn ended_early() -> ModelError {
    ModelError::Transient {
        status: None,
        message: "the provider stream ended without a stop reason".into(),
        retry_after_ms: None,
        hint: None,
    }
}
