//! Context-window accounting and compaction end to end (book ch. 11–12,
//! lab 4): the real binary, the mock model holding turns to a 900-token
//! window, a provider's context overflow on the OpenAI wire, manual
//! compaction, and the operator's figures (`context`, `agent show`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::http::{Canned, Server, data};
use common::{bin, confinement_or_skip, create_agent, open_home, stderr, stdout};
use mini_letta::agent::context::estimate::messages_tokens;
use mini_letta::model::ModelRequest;
use mini_letta::model::mock::request_chars;
use mini_letta::store::conversation::Conversation;
use serde_json::{Value, json};

fn cmd(home: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.args(args)
        .env("MINI_LETTA_HOME", home)
        .env_remove("RUST_LOG")
        .env_remove("MINI_LETTA_CONTEXT_WINDOW")
        .env_remove("MINI_LETTA_REFLECTION_CONTEXT_WINDOW")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL");
    c
}

fn run(home: &Path, args: &[&str]) -> Output {
    cmd(home, args).output().unwrap()
}

/// `chat -p TEXT --json` plus `extra`; the turn's JSON.
fn chat(home: &Path, text: &str, extra: &[&str]) -> Value {
    let mut args = vec!["chat", "-p", text, "--json"];
    args.extend_from_slice(extra);
    let o = run(home, &args);
    serde_json::from_str(&stdout(&o))
        .unwrap_or_else(|e| panic!("{e}: {} / {}", stdout(&o), stderr(&o)))
}

fn events<'a>(turn: &'a Value, ty: &str) -> Vec<&'a Value> {
    turn["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == ty)
        .collect()
}

fn json_of(home: &Path, args: &[&str]) -> Value {
    let o = run(home, args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    serde_json::from_str(&stdout(&o)).unwrap()
}

fn conv_dir(home: &Path, agent: &str) -> PathBuf {
    home.join("agents")
        .join(agent)
        .join("conversations/default")
}

fn open_conv(home: &Path, agent: &str) -> Conversation {
    let paths = mini_letta::paths::Home::at(home).agent(agent).unwrap();
    Conversation::open_existing(&paths, "default")
        .unwrap()
        .unwrap()
}

fn last_request(home: &Path, agent: &str) -> ModelRequest {
    let bytes = std::fs::read(conv_dir(home, agent).join("last-request.json")).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// A short system prompt keeps the prompt's floor (system prompt, tool
/// schemas, the agent-info reminder each `chat -p` sends) low, so that
/// twenty short turns compact often; the default prompt fits a 900-token
/// window too (tests/labs.rs).
fn tiny_agent(home: &Path, name: &str, extra: &[&str]) -> String {
    let system = home.join("system.txt");
    std::fs::write(
        &system,
        "You are owl, a helpful assistant with long-term memory.\n",
    )
    .unwrap();
    let mut args = vec![name, "--system-file", system.to_str().unwrap()];
    args.extend_from_slice(extra);
    create_agent(home, &args)
}

#[test]
fn lab4_twenty_turns_in_a_900_token_window() {
    if !confinement_or_skip("lab4_twenty_turns_in_a_900_token_window") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let id = tiny_agent(h, "owl", &[]);
    let fact = "我最喜欢的颜色是青色";
    let mut compactions = 0;
    let mut texts = Vec::new();
    for turn in 1..=20 {
        let text = if turn == 1 {
            format!("记住: {fact}")
        } else {
            format!("第 {turn} 轮：随便聊聊")
        };
        // The window is given once; the conversation keeps it.
        let extra: &[&str] = if turn == 1 {
            &["--context-window", "900"]
        } else {
            &[]
        };
        let v = chat(h, &text, extra);
        assert_eq!(v["stop_reason"], "end_turn", "turn {turn}: {v}");
        let answer = v["text"].as_str().unwrap();
        if turn == 1 {
            // The mock stored the fact with the memory tool, and answered
            // the user (not a summary of them).
            assert!(answer.starts_with("好的，已更新记忆"), "{answer}");
        } else {
            assert_eq!(answer, format!("mock: {text}"), "turn {turn}");
        }
        for c in events(&v, "compaction") {
            assert_eq!(c["trigger"], "context_window_limit", "{c}");
            assert!(c["messages_after"].as_u64() <= c["messages_before"].as_u64());
            compactions += 1;
        }
        // What the model was sent fit the window (the mock refuses more)
        // and the context's messages stay well inside it.
        let req = last_request(h, &id);
        assert_eq!(req.context_window, Some(900));
        assert!(request_chars(&req).div_ceil(4) <= 900, "turn {turn}");
        let conv = open_conv(h, &id);
        assert!(
            messages_tokens(&conv.context().unwrap()) < 900,
            "turn {turn}"
        );
        texts.push(text);
    }
    assert!(compactions >= 10, "{compactions} compactions");

    // messages.jsonl holds every message: each turn's user message, and a
    // summary per compaction; context.json names a part of them.
    let conv = open_conv(h, &id);
    let stored = conv.messages();
    for text in &texts {
        assert!(
            stored.iter().any(|m| m.text().ends_with(text.as_str())),
            "{text} not in the log"
        );
    }
    let summaries = stored
        .iter()
        .filter(|m| m.kind.as_deref() == Some("summary"))
        .count();
    assert_eq!(summaries, compactions);
    assert!(conv.context().unwrap().len() < stored.len() / 4);

    // The fact from turn 1 is known in turn 20: in the recompiled system
    // prompt (memory) and in the summary the model saw.
    let req = last_request(h, &id);
    assert!(req.system.contains(&format!("- {fact}")), "{}", req.system);
    let seen: String = req
        .messages
        .iter()
        .flat_map(|m| m.parts.iter())
        .map(|p| serde_json::to_string(p).unwrap())
        .collect();
    assert!(seen.contains(fact), "{seen}");
    assert!(seen.contains("system_alert"), "{seen}");

    // The last compaction, as recorded, and the operator's view.
    let event: Value = serde_json::from_slice(
        &std::fs::read(conv_dir(h, &id).join("compaction-event.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(event["trigger"], "context_window_limit");
    assert_eq!(event["context_window"], 900);
    assert!(
        event["first_evicted_id"]
            .as_str()
            .unwrap()
            .starts_with("msg-")
    );
    assert!(
        event["last_evicted_id"]
            .as_str()
            .unwrap()
            .starts_with("msg-")
    );
    assert!(event["tokens_after"].as_u64() < event["tokens_before"].as_u64());
    let ctx = json_of(h, &["context", "--json"]);
    assert_eq!(ctx["context_window"], 900);
    assert_eq!(ctx["threshold"], 720);
    assert_eq!(ctx["window_source"], "conversation");
    assert_eq!(ctx["compactions"], compactions);
    assert_eq!(ctx["messages_stored"], stored.len());
    assert_eq!(
        ctx["last_compaction"]["summary_message_id"],
        event["summary_message_id"]
    );
    assert_eq!(ctx["reflection_context_window"], 900);
}

/// An OpenAI-wire text answer.
fn text_reply(text: &str) -> Canned {
    Canned::sse(&[
        data(json!({"id":"r","choices":[{"index":0,"delta":{"role":"assistant","content":text}}]})),
        data(json!({"id":"r","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})),
        data(
            json!({"id":"r","choices":[],"usage":{"prompt_tokens":50,"completion_tokens":5,"total_tokens":55}}),
        ),
        "data: [DONE]\n\n".to_string(),
    ])
}

#[test]
fn a_provider_overflow_compacts_and_retries_once() {
    if !confinement_or_skip("a_provider_overflow_compacts_and_retries_once") {
        return;
    }
    let server = Server::start(vec![
        text_reply("first answer"),
        Canned::status(
            400,
            r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#,
        ),
        text_reply("Earlier the user said hello and I answered."),
        text_reply("second answer"),
    ]);
    let home = open_home();
    let h = home.path();
    let id = create_agent(h, &["owl", "--model", "openai/gpt-test"]);
    std::fs::write(
        h.join("config.toml"),
        format!(
            "[providers.openai]\nbase_url = \"http://127.0.0.1:{}/v1\"\n",
            server.port
        ),
    )
    .unwrap();
    let v = chat(h, "hello", &[]);
    assert_eq!(v["text"], "first answer", "{v}");
    assert!(events(&v, "compaction").is_empty());

    let v = chat(h, "and now?", &[]);
    assert_eq!(v["stop_reason"], "end_turn", "{v}");
    assert_eq!(v["text"], "second answer");
    let c = events(&v, "compaction");
    assert_eq!(c.len(), 1, "{v}");
    assert_eq!(c[0]["trigger"], "context_window_overflow");
    // Three messages: too few for a sliding window, so all of them but the
    // pending question.
    assert_eq!(c[0]["mode"], "all");
    assert_eq!(
        (
            c[0]["messages_before"].as_u64(),
            c[0]["messages_after"].as_u64()
        ),
        (Some(3), Some(2))
    );
    assert!(events(&v, "error").is_empty(), "{v}");

    let reqs = server.requests();
    assert_eq!(reqs.len(), 4);
    // The summariser's request: the compaction prompt, one user message
    // (the transcript), no tools, the same model.
    let summary_req = &reqs[2].body;
    assert_eq!(summary_req["model"], "gpt-test");
    assert!(
        summary_req
            .get("tools")
            .is_none_or(|t| t.as_array().is_none_or(|a| a.is_empty()))
    );
    let msgs = summary_req["messages"].as_array().unwrap();
    assert_eq!(msgs[0]["role"], "system");
    assert!(
        msgs[0]["content"]
            .as_str()
            .unwrap()
            .contains("under 500 words")
    );
    let transcript = msgs[1]["content"].as_str().unwrap();
    assert!(transcript.contains("[user] "), "{transcript}");
    assert!(transcript.contains("hello") && transcript.contains("[assistant] first answer"));
    assert!(transcript.ends_with(". Generate the summary."));
    assert!(
        !transcript.contains("and now?"),
        "the pending question is kept, not summarised"
    );
    // The retry: the summary first, then the question verbatim.
    let retry = reqs[3].body["messages"].as_array().unwrap();
    let texts: Vec<String> = retry.iter().map(|m| m["content"].to_string()).collect();
    assert!(texts[1].contains("system_alert"), "{texts:?}");
    assert!(
        texts[1].contains("Earlier the user said hello"),
        "{texts:?}"
    );
    assert!(texts.last().unwrap().contains("and now?"), "{texts:?}");

    let event: Value = serde_json::from_slice(
        &std::fs::read(conv_dir(h, &id).join("compaction-event.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(event["trigger"], "context_window_overflow");
    assert_eq!(event["mode"], "all");
    // The log kept everything: 2 + 2 messages and the summary.
    assert_eq!(open_conv(h, &id).messages().len(), 5);
}

#[test]
fn all_mode_answers_the_first_message_not_its_summary() {
    if !confinement_or_skip("all_mode_answers_the_first_message_not_its_summary") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let id = tiny_agent(h, "owl", &["--context-window", "900"]);
    // Compact in all mode, as letta-code's bug needs.
    let record = h.join("agents").join(&id).join("agent.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    v["compaction_settings"] = json!({"mode": "all"});
    std::fs::write(&record, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    // The first request is over the threshold already (the floor and a
    // long message): the pending message is all there is, and stays.
    let text = format!("hello there{}", " and more".repeat(190));
    let v = chat(h, &text, &[]);
    assert_eq!(v["text"], format!("mock: {text}"), "{v}");
    let req = last_request(h, &id);
    assert_eq!(req.messages.len(), 1);
    assert!(request_chars(&req).div_ceil(4) > 720);
}

#[test]
fn manual_compaction_and_the_operators_figures() {
    if !confinement_or_skip("manual_compaction_and_the_operators_figures") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let id = create_agent(h, &["owl", "--context-window", "100000"]);
    let shown = json_of(h, &["agent", "show", "--json"]);
    assert_eq!(shown["id"], id.as_str());
    assert_eq!(shown["model_settings"]["context_window_limit"], 100_000);
    assert_eq!(shown["context"]["context_window"], 100_000);
    assert_eq!(shown["context"]["window_source"], "agent");
    assert_eq!(shown["context"]["exists"], false);

    // Nothing to compact yet.
    let o = run(h, &["compact"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("nothing to compact"), "{}", stdout(&o));

    for text in ["one", "two", "three", "four"] {
        assert_eq!(chat(h, text, &[])["text"], format!("mock: {text}"));
    }
    let before = json_of(h, &["context", "--json"]);
    assert_eq!(before["messages_in_context"], 8);
    assert_eq!(before["compactions"], 0);
    assert!(before["last_compaction"].is_null());
    assert_eq!(before["estimate"]["anchor"], "msg-000008");
    assert_eq!(before["over_threshold"], false);

    let v = json_of(h, &["compact", "--json"]);
    assert_eq!(v["compacted"], true, "{v}");
    assert_eq!(v["compaction"]["trigger"], "manual");
    assert_eq!(v["compaction"]["mode"], "sliding_window");
    // 8 messages, p = 0.4: the cut is the assistant at 3.
    assert_eq!(v["compaction"]["messages_after"], 6);
    let after = json_of(h, &["context", "--json"]);
    assert_eq!(after["messages_in_context"], 6);
    assert_eq!(after["messages_stored"], 9);
    assert_eq!(after["compactions"], 1);
    assert_eq!(after["last_compaction"]["first_evicted_id"], "msg-000001");
    assert_eq!(after["last_compaction"]["last_evicted_id"], "msg-000003");
    // The summary made the usage stale: the estimate counts afresh.
    assert!(after["estimate"]["anchor"].is_null());

    let v = json_of(h, &["compact", "--mode", "all", "--json"]);
    assert_eq!(v["compaction"]["mode"], "all");
    assert_eq!(v["compaction"]["messages_after"], 1);
    // The conversation goes on after it.
    assert_eq!(chat(h, "five", &[])["text"], "mock: five");

    // The environment's windows, for this invocation only.
    let o = cmd(h, &["context", "--json"])
        .env("MINI_LETTA_CONTEXT_WINDOW", "8192")
        .env("MINI_LETTA_REFLECTION_CONTEXT_WINDOW", "32768")
        .output()
        .unwrap();
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["context_window"], 8192);
    assert_eq!(v["threshold"], 6554);
    assert_eq!(v["window_source"], "environment");
    assert_eq!(v["reflection_context_window"], 32768);
    let o = cmd(h, &["context"])
        .env("MINI_LETTA_CONTEXT_WINDOW", "lots")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("MINI_LETTA_CONTEXT_WINDOW=\"lots\""),
        "{}",
        stderr(&o)
    );
    let text = stdout(&run(h, &["context"]));
    assert!(
        text.contains("window:      100000 tokens (the agent's setting)"),
        "{text}"
    );
    assert!(text.contains("threshold:   83616"), "{text}");
    let text = stdout(&run(h, &["agent", "show"]));
    assert!(text.contains("of 83616 before compaction"), "{text}");
    assert!(text.contains("compacted:  "), "{text}");
}

#[test]
fn model_info_gives_the_configured_window() {
    let d = common::Daemon::start(&["owl"]);
    std::fs::write(
        d.path().join("config.toml"),
        "[model]\ncontext_window = 64000\n\n[providers.mock]\ncontext_window = 1234\n",
    )
    .unwrap();
    let mut c = d.client();
    let v = c
        .call_json(mini_letta::protocol::Call::ModelInfo {
            model: Some("mock".into()),
        })
        .unwrap();
    assert_eq!(v, json!({"model": "mock", "context_window": 1234}));
    let w = c.model_context_window(Some("openai/gpt-x")).unwrap();
    assert_eq!(w, Some(64000));
}
