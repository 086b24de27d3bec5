//! The lines of letta-code's headless protocol (`--output-format
//! stream-json`), as letta-code's own clients read them: one JSON object
//! per line, each with the session's id (the agent's id, as letta-code
//! sets it) and a `uuid`. What a turn's events become is decided here, in
//! [`TurnLines`], for one-shot and bidirectional mode alike.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{Value, json};

use crate::protocol::turn::TurnEvent;
use crate::store::new_prefixed_id;

/// Where lines go: stdout, one writer at a time (the stdin reader answers
/// control requests while a turn streams).
#[derive(Clone)]
pub(crate) struct Wire {
    out: Arc<Mutex<Box<dyn Write + Send>>>,
    session_id: String,
}

impl Wire {
    pub(crate) fn new(out: Box<dyn Write + Send>, session_id: &str) -> Self {
        Self {
            out: Arc::new(Mutex::new(out)),
            session_id: session_id.to_string(),
        }
    }

    /// Write `v` as one line, with `session_id` and a `uuid` when it has
    /// none. A reader that went away ends nothing here: the process ends
    /// at its stdin's EOF.
    pub(crate) fn send(&self, mut v: Value) {
        if let Some(o) = v.as_object_mut() {
            o.entry("session_id")
                .or_insert_with(|| json!(self.session_id));
            o.entry("uuid")
                .or_insert_with(|| json!(new_prefixed_id("line")));
        }
        let Ok(mut text) = serde_json::to_string(&v) else {
            return;
        };
        text.push('\n');
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    }

    /// An `error` line (it does not end a turn).
    pub(crate) fn error(&self, message: &str, stop_reason: &str) {
        self.send(json!({"type": "error", "message": message, "stop_reason": stop_reason}));
    }

    /// A successful `control_response` to `request_id`.
    pub(crate) fn control_ok(&self, request_id: &str, response: Option<Value>) {
        let mut r = json!({"subtype": "success", "request_id": request_id});
        if let Some(p) = response {
            r["response"] = p;
        }
        self.send(json!({"type": "control_response", "response": r}));
    }

    /// A failed `control_response` to `request_id`.
    pub(crate) fn control_error(&self, request_id: &str, error: &str) {
        self.send(json!({
            "type": "control_response",
            "response": {"subtype": "error", "request_id": request_id, "error": error},
        }));
    }
}

/// The time as Letta's messages carry it.
pub(crate) fn now() -> String {
    crate::clock::now_rfc3339()
}

/// What the `system`/`init` line says of a session.
pub(crate) struct Init<'a> {
    pub agent_id: &'a str,
    pub conversation_id: &'a str,
    pub model: &'a str,
    pub cwd: String,
    pub reflection_trigger: &'a str,
    pub reflection_step_count: u32,
}

impl Init<'_> {
    /// The fields the SDK reads at `initialize`, and letta-code's others.
    pub(crate) fn fields(&self) -> Value {
        let tools: Vec<&str> = crate::agent::tools::names().collect();
        json!({
            "agent_id": self.agent_id,
            "conversation_id": self.conversation_id,
            "model": self.model,
            "tools": tools,
            "cwd": self.cwd,
            "memfs_enabled": true,
            "skill_sources": ["agent"],
            "system_info_reminder_enabled": true,
            "reflection_trigger": self.reflection_trigger,
            // Reflections run as sub-agents the supervisor launches.
            "reflection_behavior": "auto-launch",
            "reflection_step_count": self.reflection_step_count,
            "mcp_servers": [],
            "permission_mode": "",
            "slash_commands": [],
        })
    }

    /// The `system`/`init` line.
    pub(crate) fn line(&self) -> Value {
        let mut v = self.fields();
        v["type"] = json!("system");
        v["subtype"] = json!("init");
        v["uuid"] = json!(format!("init-{}", self.agent_id));
        v
    }
}

/// One turn's events as protocol lines: whole messages, or with
/// `--include-partial-messages` every chunk as a `stream_event` (letta-code
/// sends no `message` line then).
pub(crate) struct TurnLines {
    wire: Wire,
    partial: bool,
    pub(crate) run_id: String,
    started: Instant,
    /// The assistant text of the current step, not yet sent as a message.
    text: String,
    text_id: String,
    /// The last assistant text sent (the result's `result`).
    last_text: String,
    /// The last tool result, for a turn that ends without text.
    last_tool: String,
    errored: bool,
}

impl TurnLines {
    pub(crate) fn new(wire: Wire, partial: bool) -> Self {
        Self {
            wire,
            partial,
            run_id: new_prefixed_id("run"),
            started: Instant::now(),
            text: String::new(),
            text_id: new_prefixed_id("message"),
            last_text: String::new(),
            last_tool: String::new(),
            errored: false,
        }
    }

    /// A Letta message object of `message_type` with `fields`.
    fn message(&self, message_type: &str, id: &str, fields: Value) -> Value {
        let mut m = json!({
            "message_type": message_type,
            "id": id,
            "date": now(),
            "otid": id,
            "run_id": self.run_id,
        });
        if let (Some(o), Value::Object(f)) = (m.as_object_mut(), fields) {
            o.extend(f);
        }
        m
    }

    /// Send `m` as a message line (or, partial, a stream event).
    fn emit(&self, m: Value) {
        let uuid = m["id"].clone();
        if self.partial {
            self.wire
                .send(json!({"type": "stream_event", "event": m, "uuid": uuid}));
        } else {
            let mut line = m;
            line["type"] = json!("message");
            line["uuid"] = uuid;
            self.wire.send(line);
        }
    }

    /// The step's assistant text so far, as one message.
    fn flush_text(&mut self) {
        if self.text.is_empty() {
            return;
        }
        let text = std::mem::take(&mut self.text);
        if !self.partial {
            let m = self.message("assistant_message", &self.text_id, json!({"content": text}));
            self.emit(m);
        }
        self.last_text = text;
        self.text_id = new_prefixed_id("message");
    }

    /// One event of the turn.
    pub(crate) fn event(&mut self, e: &TurnEvent) {
        match e {
            TurnEvent::TextDelta { text } => {
                if self.partial {
                    let m =
                        self.message("assistant_message", &self.text_id, json!({"content": text}));
                    self.emit(m);
                }
                self.text.push_str(text);
            }
            TurnEvent::Step { .. } => self.flush_text(),
            TurnEvent::ToolCall {
                id,
                name,
                arguments,
            } => {
                self.flush_text();
                let args = match arguments {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let m = self.message(
                    "tool_call_message",
                    &format!("tool-call-{id}"),
                    json!({"tool_call": {"name": name, "arguments": args, "tool_call_id": id}}),
                );
                self.emit(m);
            }
            TurnEvent::ToolResult {
                id, text, is_error, ..
            } => {
                let status = if *is_error { "error" } else { "success" };
                let m = self.message(
                    "tool_return_message",
                    &format!("tool-return-{id}"),
                    json!({"tool_call_id": id, "status": status, "tool_return": text}),
                );
                self.emit(m);
                self.last_tool = text.clone();
            }
            TurnEvent::Retry {
                attempt,
                error,
                delay_ms,
            } => self.wire.send(json!({
                "type": "retry",
                "reason": "llm_api_error",
                "attempt": attempt,
                "max_attempts": crate::agent::runtime::MAX_RETRIES + 1,
                "delay_ms": delay_ms,
                "message": error,
                "run_id": self.run_id,
            })),
            TurnEvent::Error { message, hint } => {
                self.errored = true;
                let message = match hint {
                    Some(h) => format!("{message} ({h})"),
                    None => message.clone(),
                };
                self.wire.send(json!({
                    "type": "error",
                    "message": message,
                    "stop_reason": "error",
                    "run_id": self.run_id,
                }));
            }
            _ => {}
        }
    }

    /// The turn's `result` line from its `done` event (`None`: the turn
    /// failed before it had one, `error` saying why).
    pub(crate) fn result(
        &mut self,
        agent_id: &str,
        conversation: &str,
        done: Option<&TurnEvent>,
    ) -> Value {
        self.flush_text();
        let duration_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let Some(TurnEvent::Done {
            stop_reason,
            text,
            steps,
            usage,
        }) = done
        else {
            return json!({
                "type": "result",
                "subtype": "error",
                "is_error": true,
                "stop_reason": "error",
                "duration_ms": duration_ms,
                "duration_api_ms": 0,
                "num_turns": 0,
                "result": Value::Null,
                "agent_id": agent_id,
                "conversation_id": conversation,
                "run_ids": [self.run_id],
                "usage": Value::Null,
            });
        };
        let answer = if !text.is_empty() {
            text.clone()
        } else if !self.last_text.is_empty() {
            self.last_text.clone()
        } else {
            self.last_tool.clone()
        };
        let mut r = json!({
            "type": "result",
            "subtype": "success",
            "is_error": false,
            "duration_ms": duration_ms,
            "duration_api_ms": 0,
            "num_turns": steps,
            "result": answer,
            "agent_id": agent_id,
            "conversation_id": conversation,
            "run_ids": [self.run_id],
            "usage": {
                "prompt_tokens": usage.input_tokens,
                "completion_tokens": usage.output_tokens,
                "total_tokens": usage.input_tokens + usage.output_tokens,
                "step_count": steps,
            },
        });
        match stop_reason.as_str() {
            "cancelled" => {
                r["subtype"] = json!("interrupted");
                r["is_error"] = json!(true);
            }
            "error" | "max_steps" => {
                r["subtype"] = json!("error");
                r["is_error"] = json!(true);
                r["stop_reason"] = json!(stop_reason);
            }
            _ if self.errored => {
                r["subtype"] = json!("error");
                r["is_error"] = json!(true);
                r["stop_reason"] = json!("error");
            }
            _ => {}
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wire writing into a shared buffer, and its lines.
    fn buffer() -> (Wire, Arc<Mutex<Vec<u8>>>) {
        #[derive(Clone)]
        struct Shared(Arc<Mutex<Vec<u8>>>);
        impl Write for Shared {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Arc::new(Mutex::new(Vec::new()));
        (Wire::new(Box::new(Shared(buf.clone())), "agent-x"), buf)
    }

    fn lines(buf: &Arc<Mutex<Vec<u8>>>) -> Vec<Value> {
        String::from_utf8(buf.lock().unwrap().clone())
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn done(stop: &str, text: &str) -> TurnEvent {
        TurnEvent::Done {
            stop_reason: stop.into(),
            text: text.into(),
            steps: 2,
            usage: Default::default(),
        }
    }

    #[test]
    fn a_turn_becomes_messages_then_one_result() {
        let (wire, buf) = buffer();
        let mut t = TurnLines::new(wire.clone(), false);
        for e in [
            TurnEvent::Step { n: 1 },
            TurnEvent::TextDelta {
                text: "let me ".into(),
            },
            TurnEvent::TextDelta {
                text: "look".into(),
            },
            TurnEvent::ToolCall {
                id: "t1".into(),
                name: "Bash".into(),
                arguments: json!({"command": "ls"}),
            },
            TurnEvent::ToolResult {
                id: "t1".into(),
                name: "Bash".into(),
                text: "a.txt".into(),
                is_error: false,
            },
            TurnEvent::Step { n: 2 },
            TurnEvent::TextDelta {
                text: "a.txt".into(),
            },
        ] {
            t.event(&e);
        }
        let r = t.result("agent-x", "default", Some(&done("end_turn", "a.txt")));
        wire.send(r);
        let l = lines(&buf);
        let kinds: Vec<&str> = l
            .iter()
            .map(|v| {
                v["message_type"]
                    .as_str()
                    .unwrap_or(v["type"].as_str().unwrap())
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "assistant_message",
                "tool_call_message",
                "tool_return_message",
                "assistant_message",
                "result"
            ]
        );
        assert_eq!(l[0]["content"], "let me look");
        assert_eq!(l[1]["tool_call"]["tool_call_id"], "t1");
        assert_eq!(l[1]["tool_call"]["arguments"], "{\"command\":\"ls\"}");
        assert_eq!(l[2]["status"], "success");
        assert_eq!(l[4]["subtype"], "success");
        assert_eq!(l[4]["result"], "a.txt");
        // One run id for the turn's lines, and each line its session's.
        assert!(l[..4].iter().all(|v| v["run_id"] == l[4]["run_ids"][0]));
        assert!(
            l.iter()
                .all(|v| v["session_id"] == "agent-x" && v["uuid"].is_string())
        );
    }

    #[test]
    fn partial_mode_sends_stream_events_only_and_stops_map_to_subtypes() {
        let (wire, buf) = buffer();
        let mut t = TurnLines::new(wire.clone(), true);
        t.event(&TurnEvent::TextDelta { text: "hi".into() });
        let r = t.result("agent-x", "default", Some(&done("cancelled", "")));
        wire.send(r);
        let l = lines(&buf);
        assert_eq!(l[0]["type"], "stream_event");
        assert_eq!(l[0]["event"]["content"], "hi");
        assert_eq!(l[1]["subtype"], "interrupted");
        assert!(l[1].get("stop_reason").is_none());
        let mut t = TurnLines::new(wire.clone(), false);
        assert_eq!(
            t.result("a", "c", Some(&done("max_steps", "")))["stop_reason"],
            "max_steps"
        );
        assert_eq!(t.result("a", "c", None)["subtype"], "error");
    }
}
