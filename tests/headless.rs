#![allow(clippy::unwrap_used, clippy::expect_used)]
//! letta-code's headless protocol at the line level (issue 47): `chat
//! --output-format stream-json --input-format stream-json` answers each
//! message and control request as letta-code's clients expect, survives
//! bad input with an `error` line, and ends cleanly at EOF; the one-shot
//! `json` and `stream-json` outputs have letta-code's shapes.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

/// A bidirectional session: lines in, lines out.
struct Session {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<Value>,
}

impl Session {
    fn start(home: &std::path::Path, extra: &[&str]) -> Self {
        let mut child = Command::new(bin())
            .args([
                "chat",
                "--output-format",
                "stream-json",
                "--input-format",
                "stream-json",
            ])
            .args(extra)
            .env("MINI_LETTA_HOME", home)
            .env_remove("RUST_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                let v = serde_json::from_str(&l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Self {
            child,
            stdin,
            lines,
        }
    }

    fn send(&mut self, v: &Value) {
        self.raw(&v.to_string());
    }

    fn raw(&mut self, line: &str) {
        let w = self.stdin.as_mut().unwrap();
        w.write_all(line.as_bytes()).unwrap();
        w.write_all(b"\n").unwrap();
        w.flush().unwrap();
    }

    /// The next line (within 30 s).
    fn next(&self) -> Value {
        self.lines
            .recv_timeout(Duration::from_secs(30))
            .expect("a line within 30 s")
    }

    /// Lines up to and including the first that `stop` accepts.
    fn until(&self, stop: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut seen = Vec::new();
        loop {
            let Ok(v) = self.lines.recv_timeout(Duration::from_secs(30)) else {
                panic!("no awaited line within 30 s; after {seen:?}");
            };
            let done = stop(&v);
            seen.push(v);
            if done {
                return seen;
            }
        }
    }

    fn control(&mut self, id: &str, request: Value) -> Value {
        self.send(&json!({"type": "control_request", "request_id": id, "request": request}));
        let seen =
            self.until(|v| v["type"] == "control_response" && v["response"]["request_id"] == id);
        seen.last().unwrap()["response"].clone()
    }

    fn user(&mut self, text: &str) -> Vec<Value> {
        self.send(&json!({"type": "user", "message": {"role": "user", "content": text}}));
        self.until(|v| v["type"] == "result")
    }

    /// Close stdin and wait for the exit status.
    fn finish(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(Instant::now() < deadline, "no exit 30 s after EOF");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn home_with_owl() -> (tempfile::TempDir, String) {
    let home = open_home();
    let id = create_agent(home.path(), &["owl"]);
    (home, id)
}

#[test]
fn init_comes_first_control_requests_are_answered_and_bad_input_is_survived() {
    let (home, id) = home_with_owl();
    let mut s = Session::start(home.path(), &["--agent", &id]);
    let init = s.next();
    assert_eq!(
        (init["type"].as_str(), init["subtype"].as_str()),
        (Some("system"), Some("init"))
    );
    assert_eq!(init["agent_id"], id.as_str());
    assert_eq!(init["session_id"], id.as_str());
    assert_eq!(init["conversation_id"], "default");
    assert_eq!(init["memfs_enabled"], true);
    assert!(
        init["tools"].as_array().is_some_and(|t| !t.is_empty()),
        "{init}"
    );
    for k in ["model", "reflection_trigger", "reflection_step_count"] {
        assert!(!init[k].is_null(), "{k}: {init}");
    }
    let r = s.control("init_1", json!({"subtype": "initialize"}));
    assert_eq!(r["subtype"], "success");
    assert_eq!(r["response"]["agent_id"], id.as_str());
    let r = s.control("x1", json!({"subtype": "frobnicate"}));
    assert_eq!(r["subtype"], "error");
    assert_eq!(r["error"], "unknown control request subtype: frobnicate");
    // Bad input: each gets an error line, and the session goes on.
    s.raw("this is not json");
    let e = s.next();
    assert_eq!(e["type"], "error");
    assert!(
        e["message"].as_str().unwrap().contains("Invalid JSON"),
        "{e}"
    );
    s.send(&json!({"type": "bogus"}));
    assert_eq!(s.next()["message"], "Unknown message type: bogus");
    s.raw(&format!(
        "{{\"type\":\"user\",\"message\":{{\"content\":\"{}\"}}}}",
        "x".repeat(10 << 20)
    ));
    let e = s.next();
    assert!(
        e["message"].as_str().unwrap().contains("longer than"),
        "{e}"
    );
    let lines = s.user("hello");
    let result = lines.last().unwrap();
    assert_eq!(result["subtype"], "success", "{lines:?}");
    assert_eq!(result["result"], "mock: hello");
    assert!(
        lines
            .iter()
            .any(|l| l["type"] == "message" && l["message_type"] == "assistant_message")
    );
    // Every line carries the session and a uuid.
    assert!(
        lines
            .iter()
            .all(|l| l["session_id"] == id.as_str() && l["uuid"].is_string())
    );
    assert!(s.finish().success(), "EOF ends the session cleanly");
}

#[test]
fn a_memory_turn_streams_its_tool_call_and_result_and_a_busy_session_says_so() {
    let (home, id) = home_with_owl();
    let mut s = Session::start(home.path(), &["-a", &id]);
    s.next();
    s.send(&json!({"type": "user", "message": {"content": [{"type": "text", "text": "remember: I like tea"}]}}));
    s.send(&json!({"type": "user", "message": {"content": "and coffee"}}));
    let lines = s.until(|v| v["type"] == "result");
    let call = lines
        .iter()
        .find(|l| l["message_type"] == "tool_call_message")
        .expect("a tool call");
    let ret = lines
        .iter()
        .find(|l| l["message_type"] == "tool_return_message")
        .expect("a tool return");
    assert_eq!(call["tool_call"]["name"], "memory");
    assert_eq!(ret["tool_call_id"], call["tool_call"]["tool_call_id"]);
    assert_eq!(ret["status"], "success");
    assert!(
        lines.iter().any(|l| l["type"] == "error"
            && l["message"].as_str().unwrap().contains("a turn is running")),
        "{lines:?}"
    );
    // One result, for the one turn that ran.
    assert_eq!(lines.iter().filter(|l| l["type"] == "result").count(), 1);
    let run = &lines.last().unwrap()["run_ids"][0];
    assert!(
        lines
            .iter()
            .filter(|l| l["type"] == "message")
            .all(|l| &l["run_id"] == run)
    );
    let o = run_cmd(home.path(), &["memory", "show", "-a", &id, "human.md"]);
    assert!(o.contains("I like tea"), "{o}");
    assert!(s.finish().success());
}

fn run_cmd(home: &std::path::Path, args: &[&str]) -> String {
    let o = run(home, args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    stdout(&o)
}

#[test]
fn interrupt_ends_the_running_turn_with_an_interrupted_result() {
    if !confinement_or_skip("headless interrupt") {
        return;
    }
    let (home, id) = home_with_owl();
    let mut s = Session::start(home.path(), &["-a", &id]);
    s.next();
    s.send(&json!({"type": "user", "message": {"content": "run: sleep 20"}}));
    s.until(|v| v["message_type"] == "tool_call_message");
    let started = Instant::now();
    let r = s.control("i1", json!({"subtype": "interrupt"}));
    assert_eq!(r["subtype"], "success");
    let lines = s.until(|v| v["type"] == "result");
    let result = lines.last().unwrap();
    assert_eq!(result["subtype"], "interrupted", "{result}");
    assert!(result.get("stop_reason").is_none(), "{result}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the command ran on"
    );
    // The next message runs.
    assert_eq!(s.user("hi").last().unwrap()["subtype"], "success");
    // An idle interrupt is answered and changes nothing.
    assert_eq!(
        s.control("i2", json!({"subtype": "interrupt"}))["subtype"],
        "success"
    );
    assert!(s.finish().success());
}

#[test]
fn list_messages_pages_and_bootstrap_reports_the_session() {
    let (home, id) = home_with_owl();
    let mut s = Session::start(home.path(), &["-a", &id, "--new"]);
    let init = s.next();
    let conv = init["conversation_id"].as_str().unwrap().to_string();
    assert!(conv.starts_with("conv-"), "{init}");
    s.user("first");
    s.user("second");
    let r = s.control("l1", json!({"subtype": "list_messages", "limit": 2}));
    let page = &r["response"];
    let m = page["messages"].as_array().unwrap();
    assert_eq!(m.len(), 2);
    assert_eq!(m[0]["content"], "mock: second", "newest first: {page}");
    assert_eq!(m[1]["content"], "second");
    assert_eq!(page["has_more"], true);
    assert_eq!(page["next_before"], m[1]["id"]);
    let r = s.control(
        "l2",
        json!({"subtype": "list_messages", "before": page["next_before"], "limit": 10}),
    );
    let older: Vec<&str> = r["response"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(older, ["mock: first", "first"]);
    let r = s.control(
        "l3",
        json!({"subtype": "list_messages", "order": "asc", "limit": 1}),
    );
    assert_eq!(r["response"]["messages"][0]["content"], "first");
    let r = s.control("l4", json!({"subtype": "list_messages", "limit": 0}));
    assert_eq!(r["subtype"], "error", "{r}");
    let r = s.control(
        "b1",
        json!({"subtype": "bootstrap_session_state", "limit": 1}),
    );
    assert_eq!(r["response"]["conversation_id"], conv.as_str());
    assert_eq!(r["response"]["agent_id"], id.as_str());
    assert_eq!(r["response"]["has_pending_approval"], false);
    assert_eq!(r["response"]["messages"].as_array().unwrap().len(), 1);
    assert!(s.finish().success());
    // The new conversation can be resumed by its id alone.
    let again = Session::start(home.path(), &["--conversation", &conv]);
    let init = again.next();
    assert_eq!(init["agent_id"], id.as_str());
    assert_eq!(init["conversation_id"], conv.as_str());
    assert!(again.finish().success());
}

#[test]
fn partial_messages_come_as_stream_events() {
    let (home, id) = home_with_owl();
    let mut s = Session::start(home.path(), &["-a", &id, "--include-partial-messages"]);
    s.next();
    let lines = s.user("hello");
    assert!(lines.iter().all(|l| l["type"] != "message"), "{lines:?}");
    let text: String = lines
        .iter()
        .filter(|l| l["type"] == "stream_event")
        .filter_map(|l| l["event"]["content"].as_str())
        .collect();
    assert_eq!(text, "mock: hello");
    assert!(s.finish().success());
}

#[test]
fn one_shot_json_and_stream_json_have_letta_codes_shapes() {
    let (home, id) = home_with_owl();
    let h = home.path();
    let o = run(
        h,
        &["chat", "-a", &id, "-p", "hello", "--output-format", "json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["type"], "result");
    assert_eq!(v["subtype"], "success");
    assert_eq!(v["is_error"], false);
    assert_eq!(v["result"], "mock: hello");
    assert_eq!(v["agent_id"], id.as_str());
    assert!(v["usage"]["total_tokens"].as_u64().unwrap() > 0, "{v}");
    let o = run(
        h,
        &[
            "chat",
            "-a",
            &id,
            "-p",
            "hello",
            "--output-format",
            "stream-json",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["subtype"], "init");
    assert_eq!(lines.last().unwrap()["type"], "result");
    // Unknown ids are refused at once, naming them.
    let o = run(
        h,
        &[
            "chat",
            "--conversation",
            "conv-nope",
            "-p",
            "x",
            "--output-format",
            "json",
        ],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("Conversation conv-nope not found"),
        "{}",
        stderr(&o)
    );
    let o = run(
        h,
        &[
            "chat",
            "--agent",
            "agent-nope",
            "-p",
            "x",
            "--output-format",
            "json",
        ],
    );
    assert!(stderr(&o).contains("not found"), "{}", stderr(&o));
    // --new-agent makes one; flags without a counterpart are noted, never fatal.
    let o = run(
        h,
        &[
            "chat",
            "--new-agent",
            "-p",
            "hi",
            "--output-format",
            "json",
            "--yolo",
            "--no-skills",
            "--system-append",
            "x",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("--yolo"), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_ne!(v["agent_id"], id.as_str());
    let o = run(h, &["agent", "show", v["agent_id"].as_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
}
