//! `anthropic/<model>`: the Messages API, streamed.
//!
//! Wire: `POST {base_url}/v1/messages` with `stream: true`, `x-api-key`
//! and `anthropic-version: 2023-06-01`; `system` is top level and
//! `max_tokens` is required (4096 unless the request sets it). Tool results
//! travel as `tool_result` blocks inside a user message, so consecutive
//! messages of the same API role are merged (the API wants them to
//! alternate). The answer is SSE: `message_start` (id, input usage),
//! `content_block_start` / `_delta` / `_stop` per text or `tool_use` block
//! (`input_json_delta.partial_json` pieces are joined and parsed at the
//! block's stop), `message_delta` (stop reason, output usage),
//! `message_stop`, and `error` events.

use serde_json::{Value, json};

use super::answer::{Answer, Assembler, OnEvent, Reply, parse_arguments, read_answer};
use super::http::{HttpModel, Wire, WireFormat, reported_error};
use super::provider::{ModelError, ModelEvent};
use crate::protocol::messages::{ModelRequest, Part, Role, StopKind};

/// The API version sent with every request.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// `max_tokens` when the request sets none.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// A Claude model (`AnthropicModel::new(model, endpoint)`, `model` being the
/// provider's own name: `claude-sonnet-4-5`).
pub type AnthropicModel = HttpModel<Messages>;

/// The Messages wire format.
#[derive(Debug)]
pub struct Messages;

impl WireFormat for Messages {
    const WIRE: Wire = Wire::new("anthropic", "ANTHROPIC_BASE_URL", "/v1/messages");

    fn headers(api_key: Option<&str>) -> Vec<(&'static str, String)> {
        let version = ("anthropic-version", ANTHROPIC_VERSION.to_string());
        let key = api_key.map(|k| ("x-api-key", k.to_string()));
        std::iter::once(version).chain(key).collect()
    }

    fn request_body(model: &str, request: &ModelRequest) -> Value {
        let mut messages: Vec<Value> = Vec::new();
        for m in &request.messages {
            let role = match m.role {
                Role::Assistant => "assistant",
                Role::User | Role::Tool => "user",
            };
            let blocks: Vec<Value> = m.parts.iter().filter_map(block).collect();
            if blocks.is_empty() {
                continue;
            }
            match messages.last_mut() {
                Some(last) if last["role"] == role => {
                    if let Some(content) = last["content"].as_array_mut() {
                        content.extend(blocks);
                    }
                }
                _ => messages.push(json!({"role": role, "content": blocks})),
            }
        }
        let mut body = json!({
            "model": model,
            "max_tokens": request.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
            "messages": messages,
            "stream": true,
        });
        if !request.system.is_empty() {
            body["system"] = json!(request.system);
        }
        if !request.tools.is_empty() {
            let tools: Vec<Value> = request
                .tools
                .iter()
                .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
                .collect();
            body["tools"] = Value::Array(tools);
        }
        body
    }

    fn answer(model: &str) -> impl Assembler {
        Accumulator::new(model)
    }
}

/// Read a Messages event stream (the body of a streaming response) into
/// the response it describes; deltas reach `on_event` as they arrive.
/// Whatever the server sends, this answers or fails — it never panics.
pub fn read_stream(model: &str, body: impl std::io::Read, on_event: OnEvent<'_>) -> Reply {
    read_answer(Accumulator::new(model), body, on_event)
}

fn block(p: &Part) -> Option<Value> {
    match p {
        Part::Text { text } if text.is_empty() => None,
        Part::Text { text } => Some(json!({"type": "text", "text": text})),
        Part::ToolCall {
            id,
            name,
            arguments,
        } => {
            // `input` must be an object; arguments that were not valid JSON
            // are kept under a key so the transcript stays truthful.
            let input = match arguments {
                Value::Object(_) => arguments.clone(),
                other => json!({"_invalid_arguments": other}),
            };
            Some(json!({"type": "tool_use", "id": id, "name": name, "input": input}))
        }
        Part::ToolResult {
            call_id,
            text,
            is_error,
            ..
        } => Some(json!({"type": "tool_result", "tool_use_id": call_id,
                         "content": text, "is_error": is_error})),
    }
}

enum Block {
    Text(String),
    Tool {
        id: String,
        name: String,
        json: String,
        start_input: Value,
    },
    Other,
}

/// Assembles a streamed answer.
struct Accumulator {
    answer: Answer,
    /// The blocks still open, by index.
    blocks: Vec<(u64, Block)>,
    stop: Option<String>,
    stopped: bool,
}

impl Assembler for Accumulator {
    /// Takes one event's data; returns true at `message_stop`.
    fn feed(&mut self, data: &str, on_event: OnEvent<'_>) -> Result<bool, ModelError> {
        let data = data.trim();
        if data.is_empty() {
            return Ok(false);
        }
        let ev: Value = serde_json::from_str(data)
            .map_err(|e| ModelError::fatal(format!("unparsable stream event ({e}): {data}")))?;
        let index = ev.get("index").and_then(Value::as_u64).unwrap_or(0);
        match ev.get("type").and_then(Value::as_str).unwrap_or("") {
            "message_start" => {
                let msg = ev.get("message").unwrap_or(&Value::Null);
                if let Some(id) = msg.get("id").and_then(Value::as_str) {
                    self.answer.response_id = id.to_string();
                }
                if let Some(m) = msg.get("model").and_then(Value::as_str) {
                    self.answer.model = m.to_string();
                }
                self.add_usage(msg.get("usage"));
            }
            "content_block_start" => {
                let b = ev.get("content_block").unwrap_or(&Value::Null);
                let s = |k: &str| b.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                let block = match b.get("type").and_then(Value::as_str) {
                    Some("text") => Block::Text(s("text")),
                    Some("tool_use") => Block::Tool {
                        id: s("id"),
                        name: s("name"),
                        json: String::new(),
                        start_input: b.get("input").cloned().unwrap_or(Value::Null),
                    },
                    _ => Block::Other,
                };
                if let Block::Text(t) = &block
                    && !t.is_empty()
                {
                    on_event(ModelEvent::TextDelta { text: t.clone() });
                }
                self.blocks.push((index, block));
            }
            "content_block_delta" => {
                let d = ev.get("delta").unwrap_or(&Value::Null);
                let block = self.blocks.iter_mut().rev().find(|(i, _)| *i == index);
                match (d.get("type").and_then(Value::as_str), block) {
                    (Some("text_delta"), Some((_, Block::Text(t)))) => {
                        if let Some(piece) = d.get("text").and_then(Value::as_str) {
                            t.push_str(piece);
                            on_event(ModelEvent::TextDelta {
                                text: piece.to_string(),
                            });
                        }
                    }
                    (Some("input_json_delta"), Some((_, Block::Tool { json, .. }))) => {
                        if let Some(piece) = d.get("partial_json").and_then(Value::as_str) {
                            json.push_str(piece);
                        }
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                if let Some(pos) = self.blocks.iter().position(|(i, _)| *i == index) {
                    let (_, block) = self.blocks.remove(pos);
                    self.close(block, on_event);
                }
            }
            "message_delta" => {
                if let Some(r) = ev
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    self.stop = Some(r.to_string());
                }
                self.add_usage(ev.get("usage"));
            }
            "message_stop" => {
                self.stopped = true;
                return Ok(true);
            }
            "error" => return Err(stream_error(ev.get("error").unwrap_or(&ev))),
            _ => {} // ping and future event types
        }
        Ok(false)
    }

    fn finish(mut self, _: OnEvent<'_>) -> Reply {
        // Blocks never closed (a server that skips content_block_stop) are
        // kept but not announced.
        let open = std::mem::take(&mut self.blocks);
        let mut ignore = |_| {};
        for (_, b) in open {
            self.close(b, &mut ignore);
        }
        let (stop, stopped) = (self.stop, self.stopped);
        self.answer
            .finish("anthropic", stop.as_deref(), stop_named, stopped)
    }
}

impl Accumulator {
    fn new(model: &str) -> Self {
        Self {
            answer: Answer::new(model),
            blocks: Vec::new(),
            stop: None,
            stopped: false,
        }
    }

    fn add_usage(&mut self, u: Option<&Value>) {
        let Some(u) = u.filter(|u| u.is_object()) else {
            return;
        };
        let get = |k: &str| u.get(k).and_then(Value::as_u64);
        if let Some(n) = get("input_tokens") {
            self.answer.usage.input_tokens = n;
        }
        if let Some(n) = get("output_tokens") {
            self.answer.usage.output_tokens = n;
        }
        if let Some(n) = get("cache_read_input_tokens") {
            self.answer.usage.cache_read_tokens = n;
        }
        if let Some(n) = get("cache_creation_input_tokens") {
            self.answer.usage.cache_write_tokens = n;
        }
    }

    fn close(&mut self, block: Block, on_event: OnEvent<'_>) {
        match block {
            Block::Text(text) if !text.is_empty() => self.answer.parts.push(Part::Text { text }),
            Block::Tool {
                id,
                name,
                json,
                start_input,
            } => {
                let arguments = if json.trim().is_empty() && start_input.is_object() {
                    start_input
                } else {
                    parse_arguments(&json)
                };
                self.answer.add_tool_call(id, name, arguments, on_event);
            }
            _ => {}
        }
    }
}

/// What the format's own `stop_reason`s mean.
fn stop_named(reason: &str) -> Option<StopKind> {
    match reason {
        "max_tokens" => Some(StopKind::MaxTokens),
        "tool_use" => Some(StopKind::ToolUse),
        _ => None,
    }
}

/// An `error` event: overloaded and API errors are worth a retry.
fn stream_error(err: &Value) -> ModelError {
    let kind = err.get("type").and_then(Value::as_str).unwrap_or("");
    let retry = matches!(
        kind,
        "overloaded_error" | "api_error" | "rate_limit_error" | "timeout_error" | ""
    );
    reported_error(err, Some(kind), retry)
}
