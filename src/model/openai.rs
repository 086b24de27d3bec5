//! `openai/<model>`: the Chat Completions API, streamed. It is the common
//! denominator of OpenAI, Ollama, vLLM and llama.cpp servers, so one
//! provider covers hosted and local models.
//!
//! Wire: `POST {base_url}/chat/completions` with `stream: true` and
//! `stream_options.include_usage`; the answer is SSE `data:` chunks ending
//! with `[DONE]`. Text arrives in `choices[0].delta.content`; tool calls in
//! `delta.tool_calls[i]` fragments keyed by `index` (id and name first, then
//! pieces of the JSON `arguments` string), which are assembled here and
//! emitted as whole [`ModelEvent::ToolCall`]s once the stream ends. Usage
//! (`prompt_tokens`, `completion_tokens`, `prompt_tokens_details.
//! cached_tokens`) comes in the last chunk.

use serde_json::{Value, json};

use super::config::EndpointConfig;
use super::http::{Site, agent_for, is_context_overflow, parse_arguments, post_json_stream};
use super::sse::feed_events;
use super::{
    Message, Model, ModelError, ModelEvent, ModelRequest, ModelResponse, Part, Role, StopKind,
    Usage,
};

/// An OpenAI-compatible chat model.
pub struct OpenAiModel {
    model: String,
    base_url: String,
    api_key: Option<String>,
    agent: ureq::Agent,
    site: Site,
}

impl std::fmt::Debug for OpenAiModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiModel")
            .field("model", &self.model)
            .field("base_url", &self.base_url)
            .field("has_key", &self.api_key.is_some())
            .finish()
    }
}

impl OpenAiModel {
    /// `model` is the provider's own name (`gpt-4o-mini`, `llama3.2`).
    pub fn new(model: &str, endpoint: &EndpointConfig) -> Self {
        let site = Site {
            provider: "openai",
            base_url_env: "OPENAI_BASE_URL",
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

impl Model for OpenAiModel {
    fn complete(
        &self,
        request: &ModelRequest,
        on_event: &mut dyn FnMut(ModelEvent),
    ) -> Result<ModelResponse, ModelError> {
        let body = request_body(&self.model, request);
        let auth = self.api_key.as_ref().map(|k| format!("Bearer {k}"));
        let mut headers = Vec::new();
        if let Some(a) = &auth {
            headers.push(("authorization", a.as_str()));
        }
        let url = format!("{}/chat/completions", self.base_url);
        let reader = post_json_stream(&self.agent, &url, &headers, &body, &self.site)?;
        read_stream(&self.model, reader, on_event)
    }
}

/// Read a Chat Completions event stream (the body of a streaming response)
/// into the response it describes; deltas reach `on_event` as they arrive.
/// Whatever the server sends, this answers or fails — it never panics.
pub fn read_stream(
    model: &str,
    body: impl std::io::Read,
    on_event: &mut dyn FnMut(ModelEvent),
) -> Result<ModelResponse, ModelError> {
    let mut acc = Accumulator::new(model);
    feed_events(body, |data| acc.feed(data, on_event))?;
    acc.finish(on_event)
}

/// The JSON body of a Chat Completions request.
pub fn request_body(model: &str, request: &ModelRequest) -> Value {
    let mut messages = Vec::new();
    if !request.system.is_empty() {
        messages.push(json!({"role": "system", "content": request.system}));
    }
    for m in &request.messages {
        map_message(m, &mut messages);
    }
    let mut body = json!({
        "model": model,
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.parameters}})
            })
            .collect();
        body["tools"] = Value::Array(tools);
    }
    if let Some(n) = request.max_tokens {
        body["max_tokens"] = json!(n);
    }
    body
}

fn map_message(m: &Message, out: &mut Vec<Value>) {
    let texts: Vec<&str> = m
        .parts
        .iter()
        .filter_map(|p| match p {
            Part::Text { text } if !text.is_empty() => Some(text.as_str()),
            _ => None,
        })
        .collect();
    let text = texts.join("\n");
    let calls: Vec<Value> = m
        .parts
        .iter()
        .filter_map(|p| match p {
            Part::ToolCall {
                id,
                name,
                arguments,
            } => {
                let args = match arguments {
                    Value::String(raw) => raw.clone(),
                    v => v.to_string(),
                };
                Some(json!({"id": id, "type": "function",
                            "function": {"name": name, "arguments": args}}))
            }
            _ => None,
        })
        .collect();
    match m.role {
        Role::Assistant => {
            if text.is_empty() && calls.is_empty() {
                return;
            }
            let mut msg = json!({"role": "assistant",
                "content": if text.is_empty() { Value::Null } else { Value::String(text.clone()) }});
            if !calls.is_empty() {
                msg["tool_calls"] = Value::Array(calls);
            }
            out.push(msg);
        }
        Role::User | Role::Tool => {
            for p in &m.parts {
                if let Part::ToolResult { call_id, text, .. } = p {
                    out.push(json!({"role": "tool", "tool_call_id": call_id, "content": text}));
                }
            }
            if !text.is_empty() {
                out.push(json!({"role": "user", "content": text}));
            }
        }
    }
}

#[derive(Default)]
struct PendingCall {
    id: String,
    name: String,
    arguments: String,
}

/// Assembles a streamed answer.
struct Accumulator {
    model: String,
    response_id: String,
    text: String,
    calls: Vec<PendingCall>,
    finish: Option<String>,
    usage: Usage,
    done: bool,
}

impl Accumulator {
    fn new(model: &str) -> Self {
        Self {
            model: model.to_string(),
            response_id: String::new(),
            text: String::new(),
            calls: Vec::new(),
            finish: None,
            usage: Usage::default(),
            done: false,
        }
    }

    /// Takes one `data:` payload; returns true at `[DONE]`.
    fn feed(
        &mut self,
        data: &str,
        on_event: &mut dyn FnMut(ModelEvent),
    ) -> Result<bool, ModelError> {
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(true);
        }
        if data.is_empty() {
            return Ok(false);
        }
        let chunk: Value = serde_json::from_str(data)
            .map_err(|e| ModelError::fatal(format!("unparsable stream chunk ({e}): {data}")))?;
        if let Some(err) = chunk.get("error") {
            let message = err
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| err.to_string());
            return Err(if is_context_overflow(&message) {
                ModelError::ContextOverflow { message }
            } else {
                ModelError::Transient {
                    status: None,
                    message,
                    retry_after_ms: None,
                    hint: None,
                }
            });
        }
        if let Some(id) = chunk.get("id").and_then(Value::as_str)
            && self.response_id.is_empty()
        {
            self.response_id = id.to_string();
        }
        if let Some(m) = chunk.get("model").and_then(Value::as_str)
            && !m.is_empty()
        {
            self.model = m.to_string();
        }
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            let n = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
            self.usage.input_tokens = n(u.get("prompt_tokens"));
            self.usage.output_tokens = n(u.get("completion_tokens"));
            self.usage.cache_read_tokens = n(u
                .get("prompt_tokens_details")
                .and_then(|d| d.get("cached_tokens")));
        }
        let Some(choice) = chunk.get("choices").and_then(|c| c.get(0)) else {
            return Ok(false);
        };
        if let Some(delta) = choice.get("delta") {
            if let Some(t) = delta.get("content").and_then(Value::as_str)
                && !t.is_empty()
            {
                self.text.push_str(t);
                on_event(ModelEvent::TextDelta {
                    text: t.to_string(),
                });
            }
            if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                for c in calls {
                    self.add_fragment(c);
                }
            }
        }
        if let Some(r) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(r.to_string());
        }
        Ok(false)
    }

    fn add_fragment(&mut self, c: &Value) {
        let id = c.get("id").and_then(Value::as_str).unwrap_or("");
        let slot = match c.get("index").and_then(Value::as_u64) {
            Some(i) => i as usize,
            // Servers that omit `index` send whole calls: a new id is a new call.
            None => match self.calls.last() {
                Some(last) if id.is_empty() || last.id == id => self.calls.len() - 1,
                _ => self.calls.len(),
            },
        };
        while self.calls.len() <= slot {
            self.calls.push(PendingCall::default());
        }
        let call = &mut self.calls[slot];
        if !id.is_empty() {
            call.id = id.to_string();
        }
        let f = c.get("function").unwrap_or(&Value::Null);
        if let Some(n) = f.get("name").and_then(Value::as_str) {
            call.name.push_str(n);
        }
        match f.get("arguments") {
            Some(Value::String(s)) => call.arguments.push_str(s),
            Some(v @ Value::Object(_)) => call.arguments.push_str(&v.to_string()),
            _ => {}
        }
    }

    fn finish(self, on_event: &mut dyn FnMut(ModelEvent)) -> Result<ModelResponse, ModelError> {
        let mut parts = Vec::new();
        if !self.text.is_empty() {
            parts.push(Part::Text { text: self.text });
        }
        let mut n = 0;
        for c in self.calls.into_iter().filter(|c| !c.name.is_empty()) {
            n += 1;
            let id = if c.id.is_empty() {
                format!("call_{}_{n}", self.response_id)
            } else {
                c.id
            };
            let arguments = parse_arguments(&c.arguments);
            on_event(ModelEvent::ToolCall {
                id: id.clone(),
                name: c.name.clone(),
                arguments: arguments.clone(),
            });
            parts.push(Part::ToolCall {
                id,
                name: c.name,
                arguments,
            });
        }
        let has_calls = n > 0;
        let stop = match self.finish.as_deref() {
            Some("length") => StopKind::MaxTokens,
            Some("tool_calls") | Some("function_call") => StopKind::ToolUse,
            Some(_) if has_calls => StopKind::ToolUse,
            Some(_) => StopKind::EndTurn,
            None if has_calls => StopKind::ToolUse,
            None if self.done => StopKind::EndTurn,
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
            parts,
            usage: self.usage,
            stop,
            response_id: self.response_id,
            model: format!("openai/{}", self.model),
        })
    }
}
