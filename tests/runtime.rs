//! The agent runtime end to end: CLI → supervisor → confined agent child →
//! supervisor (model, commits), with the mock model and with real provider
//! wire formats served from 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;

use common::http::{Canned, Server, data, event};
use common::{Daemon, bin, stderr, stdout};
use serde_json::{Value, json};

fn chat(home: &Path, args: &[&str]) -> std::process::Output {
    let mut a = vec!["chat"];
    a.extend_from_slice(args);
    Command::new(bin())
        .args(&a)
        .env("MINI_LETTA_HOME", home)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

fn chat_json(home: &Path, prompt: &str, extra: &[&str]) -> Value {
    let mut args = vec!["-p", prompt, "--json"];
    args.extend_from_slice(extra);
    let o = chat(home, &args);
    assert!(
        o.status.success() || !stdout(&o).is_empty(),
        "{}",
        stderr(&o)
    );
    serde_json::from_str(&stdout(&o))
        .unwrap_or_else(|e| panic!("{e}: {} / {}", stdout(&o), stderr(&o)))
}

fn events_of(v: &Value, ty: &str) -> Vec<Value> {
    v["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == ty)
        .cloned()
        .collect()
}

fn conv_file(d: &Daemon, name: &str) -> std::path::PathBuf {
    d.path()
        .join("agents")
        .join(&d.agents[0])
        .join("conversations/default")
        .join(name)
}

#[test]
fn remember_forget_and_one_memory_update_with_a_stable_prompt() {
    let d = Daemon::start(&["owl"]);
    let first = chat_json(d.path(), "hello", &[]);
    assert_eq!(first["text"], "mock: hello");
    assert_eq!(first["stop_reason"], "end_turn");
    let cached1 = std::fs::read_to_string(conv_file(&d, "system-prompt.json")).unwrap();
    let content1: Value = serde_json::from_str(&cached1).unwrap();

    let v = chat_json(d.path(), "记住: I prefer tabs", &[]);
    assert_eq!(v["stop_reason"], "end_turn", "{v}");
    let calls = events_of(&v, "tool_call");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["name"], "memory");
    let human = Command::new(bin())
        .args(["memory", "show", "human.md"])
        .env("MINI_LETTA_HOME", d.path())
        .output()
        .unwrap();
    assert!(
        stdout(&human).contains("- I prefer tabs"),
        "{}",
        stdout(&human)
    );
    // The commit was validated and made by the supervisor.
    // Opened as the supervisor does (the working tree belongs to the agent's uid).
    let paths = d.mini_home().agent(&d.agents[0]).unwrap();
    let repo = mini_letta::memfs::repo::open_agent(&paths).unwrap();
    let head = repo.head().unwrap().peel_to_commit().unwrap();
    assert!(
        head.message().unwrap().contains("human.md"),
        "{:?}",
        head.message()
    );

    let v2 = chat_json(d.path(), "and now?", &[]);
    let updates: usize = [&v, &v2]
        .iter()
        .map(|x| events_of(x, "memory_update").len())
        .sum();
    assert_eq!(updates, 1, "exactly one <memory_update> after the commit");
    // The cached prompt bytes did not change (prompt-cache prefix kept).
    let content2: Value = serde_json::from_str(
        &std::fs::read_to_string(conv_file(&d, "system-prompt.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(content1["content"], content2["content"]);
    assert_ne!(content1["memfsRevision"], content2["memfsRevision"]);
    assert!(
        content2["coreMemory"]
            .as_str()
            .unwrap()
            .contains("I prefer tabs")
    );
    // A fresh compile shows the new memory.
    let fresh = Command::new(bin())
        .args(["prompt", "--fresh"])
        .env("MINI_LETTA_HOME", d.path())
        .output()
        .unwrap();
    assert!(stdout(&fresh).contains("- I prefer tabs"));

    let v = chat_json(d.path(), "忘掉: tabs", &[]);
    assert_eq!(v["stop_reason"], "end_turn", "{v}");
    let human = std::fs::read_to_string(d.memory_dir(0).join("human.md")).unwrap();
    assert!(!human.contains("tabs"), "{human}");
    assert!(
        human.starts_with("---\nname: Human\n"),
        "frontmatter kept: {human}"
    );
}

#[test]
fn refused_memory_write_is_reported_by_the_mock() {
    let d = Daemon::start(&["owl"]);
    // Protect persona.md (a human approves the config change).
    let mem = d.memory_dir(0);
    std::fs::write(
        mem.join(".memfs.config.json"),
        "{\"version\": 1, \"readOnlyFiles\": [\"persona.md\"]}\n",
    )
    .unwrap();
    let o = Command::new(bin())
        .args([
            "memory",
            "commit",
            ".memfs.config.json",
            "-m",
            "protect persona",
        ])
        .env("MINI_LETTA_HOME", d.path())
        .env("MINI_LETTA_CONSTRAINTS_UPDATE", "1")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v = chat_json(d.path(), "设定: I speak like a pirate", &[]);
    let text = v["text"].as_str().unwrap();
    assert!(text.starts_with("操作失败："), "{text}");
    assert!(
        text.contains("persona.md: read-only file cannot be created, changed or removed"),
        "{text}"
    );
    // Nothing lost, nothing half-applied.
    let persona = std::fs::read_to_string(mem.join("persona.md")).unwrap();
    assert!(!persona.contains("pirate"));
}

fn openai_tool_then_text() -> Vec<Canned> {
    let args = r#"{"command":"echo hi","description":"say hi"}"#;
    let (a, b) = args.split_at(12);
    vec![
        Canned::sse(&[
            data(
                json!({"id":"c1","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"Bash","arguments":a}}]}}]}),
            ),
            data(
                json!({"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":b}}]}}]}),
            ),
            data(
                json!({"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
            ),
            data(
                json!({"id":"c1","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}),
            ),
            "data: [DONE]\n\n".to_string(),
        ]),
        Canned::sse(&[
            data(json!({"id":"c2","choices":[{"index":0,"delta":{"content":"the shell said "}}]})),
            data(
                json!({"id":"c2","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}),
            ),
            "data: [DONE]\n\n".to_string(),
        ]),
    ]
}

fn write_config(home: &Path, body: &str) {
    std::fs::write(home.join("config.toml"), body).unwrap();
}

#[test]
fn openai_wire_streamed_tool_call_runs_in_the_child() {
    let server = Server::start(openai_tool_then_text());
    let d = Daemon::start_with_env(
        &["owl"],
        &[("OPENAI_API_KEY", "sk-test-key-held-by-supervisor")],
    );
    write_config(
        d.path(),
        &format!(
            "[providers.openai]\nbase_url = \"http://127.0.0.1:{}/v1\"\n",
            server.port
        ),
    );
    let v = chat_json(d.path(), "say hi", &["--model", "openai/gpt-test"]);
    assert_eq!(v["text"], "the shell said hi", "{v}");
    let results = events_of(&v, "tool_result");
    assert_eq!(results.len(), 1, "{v}");
    assert_eq!(results[0]["text"].as_str().unwrap().trim(), "hi");
    assert_eq!(results[0]["is_error"], false);
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].path, "/v1/chat/completions");
    assert!(
        reqs[0]
            .headers
            .iter()
            .any(|(k, v)| k == "authorization" && v == "Bearer sk-test-key-held-by-supervisor")
    );
    assert_eq!(reqs[0].body["model"], "gpt-test");
    assert_eq!(reqs[0].body["stream"], true);
    let msgs = reqs[1].body["messages"].as_array().unwrap();
    let tool_msg = msgs.iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(tool_msg["tool_call_id"], "call_1");
    assert!(tool_msg["content"].as_str().unwrap().contains("hi"));
}

#[test]
fn anthropic_wire_streamed_tool_use_runs_in_the_child() {
    let server = Server::start(vec![
        Canned::sse(&[
            event(
                "message_start",
                json!({"type":"message_start","message":{"id":"m1","usage":{"input_tokens":12,"output_tokens":0}}}),
            ),
            event(
                "content_block_start",
                json!({"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"Bash","input":{}}}),
            ),
            event(
                "content_block_delta",
                json!({"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"command\":\"ec"}}),
            ),
            event(
                "content_block_delta",
                json!({"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"ho hi\",\"description\":\"d\"}"}}),
            ),
            event(
                "content_block_stop",
                json!({"type":"content_block_stop","index":0}),
            ),
            event(
                "message_delta",
                json!({"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":7}}),
            ),
            event("message_stop", json!({"type":"message_stop"})),
        ]),
        Canned::sse(&[
            event(
                "message_start",
                json!({"type":"message_start","message":{"id":"m2","usage":{"input_tokens":20,"output_tokens":0}}}),
            ),
            event(
                "content_block_start",
                json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
            ),
            event(
                "content_block_delta",
                json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"done: hi"}}),
            ),
            event(
                "content_block_stop",
                json!({"type":"content_block_stop","index":0}),
            ),
            event(
                "message_delta",
                json!({"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}),
            ),
            event("message_stop", json!({"type":"message_stop"})),
        ]),
    ]);
    let d = Daemon::start_with_env(&["owl"], &[("ANTHROPIC_API_KEY", "sk-ant-test")]);
    write_config(
        d.path(),
        &format!(
            "[providers.anthropic]\nbase_url = \"http://127.0.0.1:{}\"\n",
            server.port
        ),
    );
    let v = chat_json(d.path(), "say hi", &["--model", "anthropic/claude-test"]);
    assert_eq!(v["text"], "done: hi", "{v}");
    let results = events_of(&v, "tool_result");
    assert_eq!(results[0]["text"].as_str().unwrap().trim(), "hi");
    let reqs = server.requests();
    assert_eq!(reqs[0].path, "/v1/messages");
    assert!(
        reqs[0]
            .headers
            .iter()
            .any(|(k, v)| k == "x-api-key" && v == "sk-ant-test")
    );
    let second = &reqs[1].body["messages"];
    let has_result = second.as_array().unwrap().iter().any(|m| {
        m["content"]
            .as_array()
            .map(|c| {
                c.iter()
                    .any(|b| b["type"] == "tool_result" && b["tool_use_id"] == "toolu_1")
            })
            .unwrap_or(false)
    });
    assert!(has_result, "{second}");
}

#[test]
fn the_child_never_sees_the_api_key() {
    let server = Server::start(vec![
        Canned::sse(&[
            data(
                json!({"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"Bash","arguments":"{\"command\":\"env; tr '\\\\0' '\\\\n' < /proc/self/environ; tr '\\\\0' '\\\\n' < /proc/$PPID/environ\",\"description\":\"d\"}"}}]}}]}),
            ),
            data(
                json!({"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
            ),
            "data: [DONE]\n\n".to_string(),
        ]),
        Canned::sse(&[
            data(
                json!({"id":"c2","choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}),
            ),
            "data: [DONE]\n\n".to_string(),
        ]),
    ]);
    let d = Daemon::start_with_env(&["owl"], &[("OPENAI_API_KEY", "sk-supervisor-only-4242")]);
    write_config(
        d.path(),
        &format!(
            "[providers.openai]\nbase_url = \"http://127.0.0.1:{}/v1\"\n",
            server.port
        ),
    );
    let v = chat_json(d.path(), "show env", &["--model", "openai/x"]);
    let out = events_of(&v, "tool_result")[0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(out.contains("AGENT_ID="), "the command ran: {out}");
    assert!(!out.contains("sk-supervisor-only-4242"), "{out}");
    assert!(
        !stdout(
            &Command::new("cat")
                .arg(conv_file(&d, "messages.jsonl"))
                .output()
                .unwrap()
        )
        .contains("sk-supervisor-only")
    );
}

#[test]
fn provider_500_three_times_then_clear_error_and_intact_conversation() {
    let server = Server::start(vec![Canned::status(
        500,
        "{\"error\":{\"message\":\"overloaded\"}}",
    )]);
    let d = Daemon::start_with_env(&["owl"], &[("OPENAI_API_KEY", "k")]);
    write_config(
        d.path(),
        &format!(
            "[providers.openai]\nbase_url = \"http://127.0.0.1:{}/v1\"\n",
            server.port
        ),
    );
    let v = chat_json(d.path(), "hi", &["--model", "openai/x"]);
    assert_eq!(v["stop_reason"], "error", "{v}");
    assert_eq!(events_of(&v, "retry").len(), 3);
    assert_eq!(server.requests().len(), 4, "one try and three retries");
    assert!(v["text"].as_str().unwrap().contains("500"), "{v}");
    // The conversation still works with the mock.
    let v = chat_json(d.path(), "again", &["--model", "mock"]);
    assert_eq!(v["text"], "mock: again");
}

#[test]
fn killed_child_mid_turn_leaves_a_readable_conversation() {
    let d = Daemon::start(&["owl"]);
    // A long Bash call; kill the agent child while it waits.
    let home = d.path().to_path_buf();
    let h = std::thread::spawn(move || chat(&home, &["-p", "run: sleep 30", "--json"]));
    let mut killed = false;
    for _ in 0..200 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let ps = d
            .client()
            .call_json(mini_letta::protocol::Call::Ps {})
            .unwrap();
        if let Some(c) = ps["children"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["role"] == "agent" && c["state"] == "running")
        {
            let msgs = std::fs::read_to_string(conv_file(&d, "messages.jsonl")).unwrap_or_default();
            // The assistant's Bash call is stored: the tool is running.
            if msgs.contains("\"tool_call\"") {
                nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(c["pid"].as_u64().unwrap() as i32),
                    nix::sys::signal::Signal::SIGKILL,
                )
                .unwrap();
                killed = true;
                break;
            }
        }
    }
    assert!(killed, "never saw the agent child running the tool");
    let o = h.join().unwrap();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("ended without finishing the turn"),
        "{}",
        stderr(&o)
    );
    let v = chat_json(d.path(), "still there?", &[]);
    assert_eq!(v["text"], "mock: still there?");
    let log = std::fs::read_to_string(conv_file(&d, "messages.jsonl")).unwrap();
    // Either the next turn settled the dangling call, or the dying child
    // managed to store the tool's failure itself: every call has a result.
    assert!(
        log.contains("Turn did not complete") || log.contains("\"tool_result\""),
        "the dangling call was settled: {log}"
    );
    for line in log.lines() {
        serde_json::from_str::<Value>(line).unwrap();
    }
}

#[test]
fn malformed_tool_arguments_become_a_tool_error() {
    let server = Server::start(vec![
        Canned::sse(&[
            data(
                json!({"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"Bash","arguments":"{not json"}}]}}]}),
            ),
            data(
                json!({"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
            ),
            "data: [DONE]\n\n".to_string(),
        ]),
        Canned::sse(&[
            data(
                json!({"id":"c2","choices":[{"index":0,"delta":{"content":"sorry"},"finish_reason":"stop"}]}),
            ),
            "data: [DONE]\n\n".to_string(),
        ]),
    ]);
    let d = Daemon::start_with_env(&["owl"], &[("OPENAI_API_KEY", "k")]);
    write_config(
        d.path(),
        &format!(
            "[providers.openai]\nbase_url = \"http://127.0.0.1:{}/v1\"\n",
            server.port
        ),
    );
    let v = chat_json(d.path(), "go", &["--model", "openai/x"]);
    let r = &events_of(&v, "tool_result")[0];
    assert_eq!(r["is_error"], true);
    assert!(
        r["text"].as_str().unwrap().contains("Invalid arguments"),
        "{r}"
    );
    assert_eq!(v["text"], "sorry");
}

#[test]
fn interactive_session_conversations_and_recompile() {
    let d = Daemon::start(&["owl"]);
    let mut child = Command::new(bin())
        .args(["chat"])
        .env("MINI_LETTA_HOME", d.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"first\nsecond\n/quit\n").unwrap();
    }
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("mock: first") && out.contains("mock: second"),
        "{out}"
    );
    // One session: the agent-info reminder went with the first turn only.
    let log = std::fs::read_to_string(conv_file(&d, "messages.jsonl")).unwrap();
    let users: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|m| m["role"] == "user")
        .collect();
    assert_eq!(users.len(), 2);
    assert!(users[0].to_string().contains("Agent info"));
    assert!(!users[1].to_string().contains("Agent info"));

    let o = Command::new(bin())
        .args(["conversations", "--json"])
        .env("MINI_LETTA_HOME", d.path())
        .output()
        .unwrap();
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["conversations"][0]["id"], "default");
    assert_eq!(v["conversations"][0]["messages"], 4);

    // A memory change, then an explicit recompile: the cache holds it and
    // the next turn sends no <memory_update>.
    let o = Command::new(bin())
        .args(["memory", "insert", "human.md", "--text", "- likes owls"])
        .env("MINI_LETTA_HOME", d.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let o = Command::new(bin())
        .args(["recompile", "--json"])
        .env("MINI_LETTA_HOME", d.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let cached: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(cached["content"].as_str().unwrap().contains("- likes owls"));
    let v = chat_json(d.path(), "third", &[]);
    assert!(events_of(&v, "memory_update").is_empty(), "{v}");
}

#[test]
fn attach_follows_a_running_turn_live() {
    use std::io::{BufRead, BufReader};
    let d = Daemon::start(&["owl"]);
    let mut attach = Command::new(bin())
        .args(["attach", "--json", "--last", "0"])
        .env("MINI_LETTA_HOME", d.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = attach.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Once attach says it follows live, run a turn with a tool call.
    // Kept open to the end: attach may say more on stderr.
    let mut err = BufReader::new(attach.stderr.take().unwrap());
    let mut said = String::new();
    err.read_line(&mut said).unwrap();
    assert!(
        said.contains("following conversation default live"),
        "{said}"
    );
    let v = chat_json(d.path(), "记住: attach works", &[]);
    assert_eq!(v["stop_reason"], "end_turn");
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(std::time::Duration::from_millis(200)) {
            let e: Value = serde_json::from_str(&line).unwrap();
            let done = e["type"] == "done";
            seen.push(e);
            if done {
                break;
            }
        }
    }
    let _ = attach.kill();
    let _ = attach.wait();
    let types: Vec<&str> = seen.iter().filter_map(|e| e["type"].as_str()).collect();
    assert!(types.contains(&"step"), "{types:?}");
    assert!(types.contains(&"tool_call"), "{types:?}");
    assert!(types.contains(&"tool_result"), "{types:?}");
    assert_eq!(types.last(), Some(&"done"), "{types:?}");
}

/// A `chat -p` costs the supervisor one control-socket request (`turn.run`),
/// whatever the turn does inside its child; an unknown agent is refused
/// before any request (what a turn needs is checked before it starts),
/// with the store's message.
#[test]
fn one_chat_turn_is_one_request() {
    let d = Daemon::start(&["solo"]);
    let requests = || {
        let mut c = d.client();
        let v = c.call_json(mini_letta::protocol::Call::Status {}).unwrap();
        v["cli_requests"].as_u64().unwrap()
    };
    let before = requests();
    let v = chat_json(d.path(), "记住: one trip", &[]);
    assert_eq!(v["stop_reason"], "end_turn", "{v}");
    let after = requests();
    // `after` counts its own status request.
    assert_eq!(
        after - before,
        2,
        "chat -p made {} requests",
        after - before - 1
    );

    let o = chat(d.path(), &["-a", "nobody", "-p", "hi"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no agent \"nobody\""), "{}", stderr(&o));
    assert_eq!(requests() - after, 1, "a refused turn costs no request");
}
