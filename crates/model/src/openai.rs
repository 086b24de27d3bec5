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

use super::answer::{Answer, Assembler, OnEvent, Reply, parse_arguments, read_answer};
use super::http::{HttpModel, Wire, WireFormat, reported_error};
use super::provider::{ModelError, ModelEvent};
use crate::protocol::messages::{Message, ModelRequest, Part, Role, StopKind};

/// An OpenAI-compatible chat model (`OpenAiModel::new(model, endpoint)`,
/// `model` being the provider's own name: `gpt-4o-mini`, `llama3.2`).
pub type OpenAiModel = HttpModel<ChatCompletions>;

/// The Chat Completions wire format.
#[derive(Debug)]
pub struct ChatCompletions;

impl WireFormat for ChatCompletions {
    const WIRE: Wire = Wire::new("openai", "OPENAI_BASE_URL", "/chat/completions");

    fn headers(api_key: Option<&str>) -> Vec<(&'static str, String)> {
        api_key
            .map(|k| ("authorization", format!("Bearer {k}")))
            .into_iter()
            .collect()
    }

    fn request_body(model: &str, request: &ModelRequest) -> Value {
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

    fn answer(model: &str) -> impl Assembler {
        Accumulator::new(model)
    }
}

/// Read a Chat Completions event stream (the body of a streaming response)
/// into the response it describes; deltas reach `on_event` as they arrive.
/// Whatever the server sends, this answers or fails — it never panics.
pub fn read_stream(model: &str, body: impl std::io::Read, on_event: OnEvent<'_>) -> Reply {
    read_answer(Accumulator::new(model), body, on_event)
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
    answer: Answer,
    /// The text so far (it comes before the tool calls).
    text: String,
    calls: Vec<PendingCall>,
    finish: Option<String>,
    done: bool,
}

impl Assembler for Accumulator {
    /// Takes one `data:` payload; returns true at `[DONE]`.
    fn feed(&mut self, data: &str, on_event: OnEvent<'_>) -> Result<bool, ModelError> {
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
            // Whatever its kind: a server that fails mid-stream may answer
            // the next request.
            return Err(reported_error(err, None, true));
        }
        if let Some(id) = chunk.get("id").and_then(Value::as_str)
            && self.answer.response_id.is_empty()
        {
            self.answer.response_id = id.to_string();
        }
        if let Some(m) = chunk.get("model").and_then(Value::as_str)
            && !m.is_empty()
        {
            self.answer.model = m.to_string();
        }
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            let n = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
            self.answer.usage.input_tokens = n(u.get("prompt_tokens"));
            self.answer.usage.output_tokens = n(u.get("completion_tokens"));
            self.answer.usage.cache_read_tokens = n(u
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

    fn finish(mut self, on_event: OnEvent<'_>) -> Reply {
        if !self.text.is_empty() {
            let text = std::mem::take(&mut self.text);
            self.answer.parts.push(Part::Text { text });
        }
        let named = self.calls.into_iter().filter(|c| !c.name.is_empty());
        for (n, c) in (1..).zip(named) {
            let id = if c.id.is_empty() {
                format!("call_{}_{n}", self.answer.response_id)
            } else {
                c.id
            };
            let arguments = parse_arguments(&c.arguments);
            self.answer.add_tool_call(id, c.name, arguments, on_event);
        }
        let reason = self.finish.as_deref();
        self.answer.finish("openai", reason, stop_named, self.done)
    }
}

impl Accumulator {
    fn new(model: &str) -> Self {
        Self {
            answer: Answer::new(model),
            text: String::new(),
            calls: Vec::new(),
            finish: None,
            done: false,
        }
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
}

/// What the format's own `finish_reason`s mean.
fn stop_named(reason: &str) -> Option<StopKind> {
    match reason {
        "length" => Some(StopKind::MaxTokens),
        "tool_calls" | "function_call" => Some(StopKind::ToolUse),
        _ => None,
    }
}
