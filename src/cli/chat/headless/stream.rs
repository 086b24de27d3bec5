//! `--input-format stream-json`: one process, many turns. The `init` line
//! first; then stdin is read line by line on a thread of its own, which
//! answers control requests at once (an `interrupt` must reach a turn
//! while it runs) and hands `user` messages to the main thread, which runs
//! each as `chat` runs a turn and ends it with exactly one `result` line.
//! Bad input gets an `error` line and the session goes on; EOF ends it once
//! the running turn has ended.

use std::io::BufReader;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use serde_json::{Value, json};

use super::messages::{self, PageRequest};
use super::target::Target;
use super::wire::{Init, TurnLines, Wire};
use crate::cli::chat::args::{ChatArgs, input_for};
use crate::cli::chat::turn::runner_for;
use crate::cli::interrupt;
use crate::paths::{AgentPaths, Home};
use crate::store::conversation::lines::{Line, LinePos, LogLines};

/// The longest input line read; a longer one is refused (and skipped).
pub(crate) const MAX_INPUT_LINE: usize = 8 << 20;

/// What the stdin reader shares with the turn loop.
struct Shared {
    wire: Wire,
    agent: AgentPaths,
    agent_id: String,
    conversation: String,
    init: Value,
    /// A turn was handed over and has not ended.
    busy: AtomicBool,
    /// An interrupt came before its turn had started: cancel it at its first event.
    latched: AtomicBool,
}

/// Serve the session until stdin ends.
pub(crate) fn serve(
    home: &Home,
    args: &ChatArgs,
    t: &Target,
    init: &Init,
) -> anyhow::Result<ExitCode> {
    let wire = Wire::new(Box::new(std::io::stdout()), &t.record.id);
    wire.send(init.line());
    let shared = Arc::new(Shared {
        wire: wire.clone(),
        agent: t.agent.clone(),
        agent_id: t.record.id.clone(),
        conversation: t.conversation.clone(),
        init: init.fields(),
        busy: AtomicBool::new(false),
        latched: AtomicBool::new(false),
    });
    let (tx, rx) = mpsc::channel::<String>();
    let reader = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("stdin".into())
            .spawn(move || read_input(&shared, &tx))?
    };
    let mut runner = runner_for(home, args, &t.record.id, &t.conversation)?;
    let mut first = true;
    for text in rx {
        let mut lines = TurnLines::new(wire.clone(), args.headless.include_partial_messages);
        let result = if shared.latched.swap(false, Ordering::SeqCst) {
            // Interrupted before it began: nothing ran.
            lines.result(
                &t.record.id,
                &t.conversation,
                Some(&crate::protocol::turn::TurnEvent::Done {
                    stop_reason: "cancelled".into(),
                    text: String::new(),
                    steps: 0,
                    usage: Default::default(),
                }),
            )
        } else {
            let input = input_for(args, &t.conversation, &text, args.recompile && first, first)?;
            let done = runner.run(&input, &mut |e| {
                if shared.latched.swap(false, Ordering::SeqCst) {
                    interrupt::cancel_current_turn();
                }
                lines.event(e);
            });
            match done {
                Ok(d) => {
                    first = false;
                    lines.result(&t.record.id, &t.conversation, Some(&d))
                }
                Err(e) => {
                    wire.error(&crate::console::one_line(&e), "error");
                    lines.result(&t.record.id, &t.conversation, None)
                }
            }
        };
        // Free before the result is out: a client answers a result with
        // its next message at once.
        shared.busy.store(false, Ordering::SeqCst);
        wire.send(result);
        if interrupt::end_requested().is_some() {
            break;
        }
    }
    runner.close();
    drop(reader);
    Ok(match interrupt::end_requested() {
        Some(sig) => ExitCode::from(128 + sig as u8),
        None => ExitCode::SUCCESS,
    })
}

/// Read stdin until EOF: control requests answered here, `user` messages
/// sent to the turn loop.
fn read_input(shared: &Shared, turns: &mpsc::Sender<String>) {
    let stdin = BufReader::new(std::io::stdin());
    for line in LogLines::resuming(stdin, LinePos::default(), MAX_INPUT_LINE) {
        match line {
            Ok(Line::Text { bytes, .. }) => {
                if bytes.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                match serde_json::from_slice::<Value>(&bytes) {
                    Ok(v) => one_input(shared, turns, &v),
                    Err(e) => shared
                        .wire
                        .error(&format!("Invalid JSON input: {e}"), "error"),
                }
            }
            Ok(Line::TooLong { len, .. }) => shared.wire.error(
                &format!("an input line of {len} bytes is longer than {MAX_INPUT_LINE}; skipped"),
                "error",
            ),
            Err(e) => {
                shared
                    .wire
                    .error(&format!("cannot read stdin: {e}"), "error");
                break;
            }
        }
    }
}

fn one_input(shared: &Shared, turns: &mpsc::Sender<String>, v: &Value) {
    match v["type"].as_str() {
        Some("user") => {
            let Some(text) = user_text(&v["message"]["content"]) else {
                shared.wire.error(
                    "a user message needs message.content: a string or text parts",
                    "error",
                );
                return;
            };
            if shared.busy.swap(true, Ordering::SeqCst) {
                shared.wire.error(
                    "a turn is running in this session; send the next message after its result",
                    "error",
                );
                return;
            }
            if turns.send(text).is_err() {
                shared.busy.store(false, Ordering::SeqCst);
            }
        }
        Some("control_request") => control(shared, v),
        // Answers to requests we never send.
        Some("control_response") => {}
        Some(other) => shared
            .wire
            .error(&format!("Unknown message type: {other}"), "error"),
        None => shared.wire.error("an input line needs a type", "error"),
    }
}

/// The text of a user message's content: a string, or its text parts
/// joined (other parts, such as images, are not taken).
fn user_text(content: &Value) -> Option<String> {
    match content {
        Value::String(s) if !s.trim().is_empty() => Some(s.clone()),
        Value::Array(parts) => {
            let text: Vec<&str> = parts
                .iter()
                .filter(|p| p["type"] == "text")
                .filter_map(|p| p["text"].as_str())
                .collect();
            let joined = text.join("\n");
            (!joined.trim().is_empty()).then_some(joined)
        }
        _ => None,
    }
}

/// Answer one control request.
fn control(shared: &Shared, v: &Value) {
    let Some(id) = v["request_id"].as_str() else {
        shared
            .wire
            .error("a control_request needs a request_id", "error");
        return;
    };
    let req = &v["request"];
    let subtype = req["subtype"].as_str().unwrap_or("");
    match subtype {
        "initialize" => shared.wire.control_ok(id, Some(shared.init.clone())),
        "interrupt" => {
            if shared.busy.load(Ordering::SeqCst) && !interrupt::cancel_current_turn() {
                shared.latched.store(true, Ordering::SeqCst);
            }
            shared.wire.control_ok(id, None);
        }
        "list_messages" => {
            let conversation = req["conversation_id"]
                .as_str()
                .unwrap_or(&shared.conversation);
            match list(shared, conversation, req) {
                Ok(page) => shared.wire.control_ok(id, Some(page.fields())),
                Err(e) => shared.wire.control_error(id, &e),
            }
        }
        "bootstrap_session_state" => match list(shared, &shared.conversation, req) {
            Ok(page) => {
                let mut r = page.fields();
                for k in [
                    "agent_id",
                    "conversation_id",
                    "model",
                    "tools",
                    "memfs_enabled",
                ] {
                    r[k] = shared.init[k].clone();
                }
                r["has_pending_approval"] = json!(false);
                shared.wire.control_ok(id, Some(r));
            }
            Err(e) => shared.wire.control_error(id, &e),
        },
        other => shared
            .wire
            .control_error(id, &format!("unknown control request subtype: {other}")),
    }
}

/// A page of `conversation`, which must be this agent's (`default` or one
/// of its own ids).
fn list(shared: &Shared, conversation: &str, req: &Value) -> Result<messages::Page, String> {
    let page = PageRequest::from_request(req)?;
    if let Some(a) = req["agent_id"].as_str()
        && a != shared.agent_id
    {
        return Err(format!("agent {a} is not this session's agent"));
    }
    shared
        .agent
        .conversation(conversation)
        .map_err(|e| e.to_string())?;
    messages::page(&shared.agent, conversation, &page)
}
