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

use super::config::EndpointConfig;
use super::http::{Site, agent_for, is_context_overflow, parse_arguments, post_json_stream};
use super::sse::feed_events;
use super::{
    Model, ModelError, ModelEvent, ModelRequest, ModelResponse, Part, Role, StopKind, Usage,
};

/// The API version sent with every request.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// `max_tokens` when the request sets none.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// A Claude model.
pub struct AnthropicModel {
    model: String,
    base_url: String,
    api_key: Option<String>,
    agent: ureq::Agent,
    site: Site,
}

impl std::fmt::Debug for AnthropicModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnthropicModel")
            .field("model", &self.model)
            .field("base_url", &self.base_url)
            .field("has_key", &self.api_key.is_some())
            .finish()
    }
}

impl AnthropicModel {
    /// `model` is the provider's own name (`claude-sonnet-4-5`).
    pub fn new(model: &str, endpoint: &EndpointConfig) -> Self {
        let site = Site {
            provider: "anthropic",
            base_url_env: "ANTHROPIC_BASE_URL",
            timeout: std::time::Duration::from_secs(endpoint.timeout_secs),
        };
        Self {
            model: model.to_string(),
            base_url: endpoint.base_url.trim_end_matches('/').to_string(),
            api_key: endpoint.api_key.clone(),
            agent: agent_for(&endpoint.base_url, &site),
            site,
        }
    }
}

impl Model for AnthropicModel {
    fn complete(
        &self,
        request: &ModelRequest,
        on_event: &mut dyn FnMut(ModelEvent),
    ) -> Result<ModelResponse, ModelError> {
        let body = request_body(&self.model, request);
        let mut headers = vec![("anthropic-version", ANTHROPIC_VERSION)];
        if let Some(k) = &self.api_key {
            headers.push(("x-api-key", k.as_str()));
        }
        let url = format!("{}/v1/messages", self.base_url);
        let reader = post_json_stream(&self.agent, &url, &headers, &body, &self.site)?;
        read_stream(&self.model, reader, on_event)
    }
}

/// Read a Messages event stream (the body of a streaming response) into
/// the response it describes; deltas reach `on_event` as they arrive.
/// Whatever the server sends, this answers or fails — it never panics.
pub fn read_stream(
    model: &str,
    body: impl std::io::Read,
    on_event: &mut dyn FnMut(ModelEvent),
) -> Result<ModelResponse, ModelError> {
    let mut acc = Accumulator::new(model);
    feed_events(body, |data| acc.feed(data, on_event))?;
    acc.finish()
}

/// The JSON body of a Messages request.
pub fn request_body(model: &str, request: &ModelRequest) -> Value {
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
    model: String,
    response_id: String,
    blocks: Vec<(u64, Block)>,
    parts: Vec<Part>,
    stop: Option<String>,
    usage: Usage,
    stopped: bool,
}

impl Accumulator {
    fn new(model: &str) -> Self {
        Self {
            model: model.to_string(),
            response_id: String::new(),
            blocks: Vec::new(),
            parts: Vec::new(),
            stop: None,
            usage: Usage::default(),
            stopped: false,
        }
    }

    /// Takes one event's data; returns true at `message_stop`.
    fn feed(
        &mut self,
        data: &str,
        on_event: &mut dyn FnMut(ModelEvent),
    ) -> Result<bool, ModelError> {
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
                    self.response_id = id.to_string();
                }
                if let Some(m) = msg.get("model").and_then(Value::as_str) {
                    self.model = m.to_string();
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

    fn add_usage(&mut self, u: Option<&Value>) {
        let Some(u) = u.filter(|u| u.is_object()) else {
            return;
        };
        let get = |k: &str| u.get(k).and_then(Value::as_u64);
        if let Some(n) = get("input_tokens") {
            self.usage.input_tokens = n;
        }
        if let Some(n) = get("output_tokens") {
            self.usage.output_tokens = n;
        }
        if let Some(n) = get("cache_read_input_tokens") {
            self.usage.cache_read_tokens = n;
        }
        if let Some(n) = get("cache_creation_input_tokens") {
            self.usage.cache_write_tokens = n;
        }
    }

    fn close(&mut self, block: Block, on_event: &mut dyn FnMut(ModelEvent)) {
        match block {
            Block::Text(text) if !text.is_empty() => self.parts.push(Part::Text { text }),
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
            _ => {}
        }
    }

    fn finish(mut self) -> Result<ModelResponse, ModelError> {
        // Blocks never closed (a server that skips content_block_stop).
        let open = std::mem::take(&mut self.blocks);
        let mut ignore = |_: ModelEvent| {};
        for (_, b) in open {
            self.close(b, &mut ignore);
        }
        let has_calls = self
            .parts
            .iter()
            .any(|p| matches!(p, Part::ToolCall { .. }));
        let stop = match self.stop.as_deref() {
            Some("max_tokens") => StopKind::MaxTokens,
            Some("tool_use") => StopKind::ToolUse,
            Some(_) if has_calls => StopKind::ToolUse,
            Some(_) => StopKind::EndTurn,
            None if has_calls => StopKind::ToolUse,
            None if self.stopped => StopKind::EndTurn,
            None => {
                return Err(ModelError::Transient {
                    status: None,
                    message: "the provider stream ended without a stop reason".into(),
                    retry_after_ms: None,
                    hint: None,
                });
            }
        };
        Ok(ModelResponse {
            parts: self.parts,
            usage: self.usage,
            stop,
            response_id: self.response_id,
            model: format!("anthropic/{}", self.model),
        })
    }
}

/// An `error` event: overloaded and API errors are worth a retry.
fn stream_error(err: &Value) -> ModelError {
    let kind = err.get("type").and_then(Value::as_str).unwrap_or("");
    let message = err
        .get("message")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| err.to_string());
    if is_context_overflow(&message) {
        return ModelError::ContextOverflow { message };
    }
    match kind {
        "overloaded_error" | "api_error" | "rate_limit_error" | "timeout_error" | "" => {
            ModelError::Transient {
                status: None,
                message: format!("{kind}: {message}"),
                retry_after_ms: None,
                hint: None,
            }
        }
        _ => ModelError::Fatal {
            status: None,
            message: format!("{kind}: {message}"),
        },
    }
}
