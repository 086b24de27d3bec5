//! The deterministic mock model and its scripted mode: every rule, the
//! tool-result follow-ups, summaries, reflections, usage and ids.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;

use mini_letta::model::mock::{MockModel, request_chars};
use mini_letta::model::scripted::cursor_path;
use mini_letta::model::{
    Message, Model, ModelError, ModelEvent, ModelRequest, ModelResponse, Part, ProviderConfig,
    Purpose, Role, StopKind, ToolSpec, open_model,
};
use serde_json::{Value, json};

fn request(messages: Vec<Message>) -> ModelRequest {
    ModelRequest {
        model: "mock".into(),
        system: "You are a test agent.".into(),
        messages,
        tools: vec![],
        max_tokens: None,
        purpose: Purpose::Turn,
        context_window: None,
    }
}

fn run(model: &dyn Model, req: &ModelRequest) -> (ModelResponse, Vec<ModelEvent>) {
    let mut events = Vec::new();
    let resp = model.complete(req, &mut |e| events.push(e)).unwrap();
    (resp, events)
}

fn say(text: &str) -> (ModelResponse, Vec<ModelEvent>) {
    run(&MockModel::new(), &request(vec![Message::user(text)]))
}

/// The single tool call of a response: (name, arguments).
fn tool_call(resp: &ModelResponse) -> (String, Value) {
    assert_eq!(resp.stop, StopKind::ToolUse, "{resp:?}");
    let calls: Vec<_> = resp
        .parts
        .iter()
        .filter_map(|p| match p {
            Part::ToolCall {
                name, arguments, ..
            } => Some((name.clone(), arguments.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(calls.len(), 1, "{resp:?}");
    calls.into_iter().next().unwrap()
}

fn text_of(resp: &ModelResponse) -> String {
    resp.parts
        .iter()
        .filter_map(|p| match p {
            Part::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn forget_rule_chinese_and_english() {
    for input in [
        "忘掉: tabs",
        "忘掉：tabs",
        "forget: tabs",
        "Forget:   tabs  ",
    ] {
        let (resp, _) = say(input);
        let (name, args) = tool_call(&resp);
        assert_eq!(name, "memory");
        assert_eq!(
            args,
            json!({"command":"str_replace","file_path":"human.md","old_string":"tabs",
                   "new_string":"","reason":"forget: tabs"}),
            "input {input:?}"
        );
    }
}

#[test]
fn remember_rule_chinese_and_english() {
    for input in [
        "记住: I prefer tabs",
        "记住：I prefer tabs",
        "remember: I prefer tabs",
        "REMEMBER: I prefer tabs",
    ] {
        let (resp, _) = say(input);
        let (name, args) = tool_call(&resp);
        assert_eq!(name, "memory");
        assert_eq!(
            args,
            json!({"command":"insert","file_path":"human.md","insert_text":"- I prefer tabs",
                   "reason":"remember: I prefer tabs"}),
            "input {input:?}"
        );
    }
}

/// A fact the memory in view already holds is not written again: the
/// model says it knows it, and calls no tool.
#[test]
fn remember_rule_does_not_repeat_a_known_fact() {
    let mut req = request(vec![Message::user("remember: I prefer tabs.")]);
    req.system = "You are a test agent.\n<human>\n- I like tea\n- I prefer tabs\n</human>\n".into();
    let (resp, _) = run(&MockModel::new(), &req);
    assert_eq!(resp.stop, StopKind::EndTurn, "{resp:?}");
    assert_eq!(text_of(&resp), "I already remember that: I prefer tabs.");
    // In Chinese too; a fact that only begins like a known one is new.
    req.messages = vec![Message::user("记住：I prefer tabs")];
    assert_eq!(
        text_of(&run(&MockModel::new(), &req).0),
        "我已经记得：I prefer tabs。"
    );
    req.messages = vec![Message::user("remember: I prefer tabs and spaces")];
    let (resp, _) = run(&MockModel::new(), &req);
    let (_, args) = tool_call(&resp);
    assert_eq!(args["insert_text"], "- I prefer tabs and spaces");
}

#[test]
fn persona_rule() {
    let (resp, _) = say("设定：说话简洁");
    let (name, args) = tool_call(&resp);
    assert_eq!(name, "memory");
    assert_eq!(
        args,
        json!({"command":"insert","file_path":"persona.md","insert_text":"- 说话简洁",
               "reason":"persona: 说话简洁"})
    );
}

#[test]
fn rename_rule_chinese_and_english() {
    let (resp, _) = say("别再叫我 小王 了，叫我 老王");
    let (_, args) = tool_call(&resp);
    assert_eq!(
        args,
        json!({"command":"str_replace","file_path":"human.md","old_string":"小王",
               "new_string":"老王","reason":"rename: 小王 -> 老王"})
    );
    let (resp, _) = say("Don't call me Bob, call me Robert.");
    let (name, args) = tool_call(&resp);
    assert_eq!(name, "memory");
    assert_eq!(args["old_string"], "Bob");
    assert_eq!(args["new_string"], "Robert");
    assert_eq!(args["reason"], "rename: Bob -> Robert");
}

#[test]
fn run_rule_calls_bash() {
    let (resp, events) = say("run: echo hi");
    let (name, args) = tool_call(&resp);
    assert_eq!(name, "Bash");
    assert_eq!(
        args,
        json!({"command":"echo hi","description":"run echo hi"})
    );
    assert!(matches!(&events[..], [ModelEvent::ToolCall { name, .. }] if name == "Bash"));
    // Only at the start of the message.
    let (resp, _) = say("please run: echo hi");
    assert_eq!(resp.stop, StopKind::EndTurn);
}

#[test]
fn echo_strips_reminders_and_streams_text() {
    let long = "x".repeat(100);
    let msg = Message {
        role: Role::User,
        parts: vec![
            Part::text("<system-reminder>agent info</system-reminder>"),
            Part::text(format!(
                "<system-reminder>remember: not me</system-reminder>\nhello {long}"
            )),
        ],
    };
    let (resp, events) = run(&MockModel::new(), &request(vec![msg]));
    assert_eq!(resp.stop, StopKind::EndTurn);
    let expected = format!("mock: hello {long}");
    assert_eq!(text_of(&resp), expected);
    let streamed: String = events
        .iter()
        .map(|e| match e {
            ModelEvent::TextDelta { text } => text.clone(),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(streamed, expected);
    assert!(events.len() > 1, "long text streams in several deltas");
    assert_eq!(resp.model, "mock");
}

fn tool_results(name: &str, text: &str, is_error: bool) -> Message {
    Message {
        role: Role::Tool,
        parts: vec![Part::ToolResult {
            call_id: "call_1".into(),
            name: name.into(),
            text: text.into(),
            is_error,
        }],
    }
}

#[test]
fn follow_ups_after_tool_results() {
    let m = MockModel::new();
    let history = |results: Message| {
        request(vec![
            Message::user("记住: tabs"),
            Message {
                role: Role::Assistant,
                parts: vec![Part::ToolCall {
                    id: "call_1".into(),
                    name: "memory".into(),
                    arguments: json!({}),
                }],
            },
            results,
        ])
    };
    let (ok, _) = run(
        &m,
        &history(tool_results(
            "memory",
            "Memory insert committed locally (abc1234).",
            false,
        )),
    );
    assert_eq!(text_of(&ok), "好的，已更新记忆（提交 abc1234）。");
    assert_eq!(ok.stop, StopKind::EndTurn);
    // No commit named: no claim that memory was updated.
    let (same, _) = run(
        &m,
        &history(tool_results(
            "memory",
            "Memory insert: nothing changed.",
            false,
        )),
    );
    assert_eq!(
        text_of(&same),
        "记忆没有变化：Memory insert: nothing changed."
    );

    let err_text = "persona.md: read-only file cannot be created, changed or removed";
    let (failed, _) = run(&m, &history(tool_results("memory", err_text, true)));
    assert_eq!(text_of(&failed), format!("操作失败：{err_text}"));

    let long = "y".repeat(300);
    let (bash, _) = run(&m, &history(tool_results("Bash", &long, false)));
    assert_eq!(text_of(&bash), format!("工具结果：{}", "y".repeat(200)));
}

#[test]
fn follow_up_skips_a_trailing_reminder_only_message() {
    let req = request(vec![
        Message::user("forget: tabs"),
        tool_results(
            "memory",
            "Memory str_replace committed locally (abc1234).",
            false,
        ),
        Message::user("<system-reminder>MEMORY COMMIT NEEDED</system-reminder>"),
    ]);
    let (resp, _) = run(&MockModel::new(), &req);
    // Spoken to in English, it answers in English (issue 48 (19)).
    assert_eq!(text_of(&resp), "OK, memory updated (commit abc1234).");
    assert_eq!(resp.stop, StopKind::EndTurn);
    let req = request(vec![
        Message::user("忘掉: tabs"),
        tool_results(
            "memory",
            "Memory str_replace committed locally (abc1234).",
            false,
        ),
    ]);
    let (resp, _) = run(&MockModel::new(), &req);
    assert_eq!(text_of(&resp), "好的，已更新记忆（提交 abc1234）。");
}

#[test]
fn summary_is_deterministic() {
    let mut req = request(vec![
        Message::user("first line\nsecond line"),
        Message::assistant("a".repeat(100)),
        tool_results("Bash", "ok", false),
    ]);
    req.purpose = Purpose::Summary;
    let (resp, _) = run(&MockModel::new(), &req);
    let expected = format!(
        "Summary of 3 messages:\n[user] first line\n[assistant] {}\n[tool] Bash: ok",
        "a".repeat(80)
    );
    assert_eq!(text_of(&resp), expected);
    let (again, _) = run(&MockModel::new(), &req);
    assert_eq!(again.parts, resp.parts);
}

#[test]
fn summary_of_a_transcript_keeps_the_facts() {
    // What the agent sends to summarise: one user message, the transcript.
    let transcript = " \n[user] Summary of 3 messages:\n- 记住: 我喜欢茶\n- likes owls\n\
        [user] <system-reminder>\nAgent info:\n- Agent ID: agent-1\n</system-reminder>\n\n记住: 我住在柏林\n\
        [assistant] -> memory({\"command\":\"insert\"})\n\
        [tool] Memory insert committed locally (abc1234).\n\
        [assistant] 好的\n\
        [user] 记住: 我喜欢茶\n \n. Generate the summary.";
    let mut req = request(vec![Message::user(transcript)]);
    req.system = "Summarise.".into();
    req.purpose = Purpose::Summary;
    let (resp, _) = run(&MockModel::new(), &req);
    assert_eq!(
        text_of(&resp),
        "Summary of 6 messages:\n- 记住: 我喜欢茶\n- likes owls\n- 记住: 我住在柏林"
    );
    // At most eight facts, the oldest first.
    let many: String = (1..=12).map(|i| format!("[user] fact {i}\n")).collect();
    let mut req = request(vec![Message::user(format!(
        " \n{many} \n. Generate the summary."
    ))]);
    req.purpose = Purpose::Summary;
    let (resp, _) = run(&MockModel::new(), &req);
    let text = text_of(&resp);
    assert!(
        text.starts_with("Summary of 12 messages:\n- fact 1\n"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 1 + 8);
    assert!(text.ends_with("- fact 8"), "{text}");
}

#[test]
fn the_request_window_holds_the_mock_to_the_smaller_one() {
    let mut req = request(vec![Message::user("x".repeat(400))]);
    assert!(MockModel::new().complete(&req, &mut |_| {}).is_ok());
    req.context_window = Some(100);
    let err = MockModel::new().complete(&req, &mut |_| {}).unwrap_err();
    assert!(matches!(err, ModelError::ContextOverflow { .. }), "{err:?}");
    // A configured window smaller than the request's wins too.
    req.context_window = Some(100_000);
    let err = MockModel::new()
        .with_context_window(Some(100))
        .complete(&req, &mut |_| {})
        .unwrap_err();
    assert!(err.to_string().contains("> 100 maximum"), "{err}");
}

#[test]
fn reflection_filters_facts_by_instruction_keywords() {
    let prompt = "Review the transcript.\n\
        Candidate facts:\n\
        - User prefers tabs in Rust code\n\
        - User lives in Berlin\n\
        - User writes Rust every day\n\
        Additional user-provided reflection instruction:\n\
        Only keep facts about Rust\n";
    let mut req = request(vec![Message::user(prompt)]);
    req.purpose = Purpose::Reflection;
    let (resp, _) = run(&MockModel::new(), &req);
    assert_eq!(
        text_of(&resp),
        "Reflection instruction: Only keep facts about Rust\nKeywords: rust\nMatching facts:\n\
         - User prefers tabs in Rust code\n- User writes Rust every day"
    );

    let mut none = request(vec![Message::user(
        "- User lives in Berlin\nAdditional user-provided reflection instruction\n只记录与编程相关的事实",
    )]);
    none.purpose = Purpose::Reflection;
    let (resp, _) = run(&MockModel::new(), &none);
    assert!(
        text_of(&resp).ends_with("Keywords: 编程\nMatching facts: (none)"),
        "{resp:?}"
    );
}

#[test]
fn usage_counts_characters() {
    let mut req = request(vec![Message::user("hello")]); // system 21 chars + 5
    let (resp, _) = run(&MockModel::new(), &req);
    assert_eq!(request_chars(&req), 26);
    assert_eq!(resp.usage.input_tokens, 7); // ceil(26 / 4)
    assert_eq!(resp.usage.output_tokens, 3); // "mock: hello" = 11 chars
    req.tools.push(ToolSpec {
        name: "Bash".into(),
        description: "run".into(),
        parameters: json!({"type":"object"}),
    });
    let tools_json = serde_json::to_string(&req.tools).unwrap().chars().count();
    assert_eq!(request_chars(&req), 26 + tools_json);
}

#[test]
fn context_window_overflows() {
    let cfg_dir = tempfile::tempdir().unwrap();
    let path = cfg_dir.path().join("config.toml");
    std::fs::write(&path, "[providers.mock]\ncontext_window = 10\n").unwrap();
    let cfg = ProviderConfig::load_from(&path, &|_| None).unwrap();
    let model = open_model("mock", &cfg).unwrap();
    let small = request(vec![Message::user("hi")]);
    let mut sys_only = small.clone();
    sys_only.system = "s".repeat(100);
    assert!(model.complete(&small, &mut |_| {}).is_ok());
    let err = model.complete(&sys_only, &mut |_| {}).unwrap_err();
    assert!(matches!(err, ModelError::ContextOverflow { .. }), "{err:?}");
}

#[test]
fn ids_are_unique() {
    let m = MockModel::new();
    let mut resp_ids = HashSet::new();
    let mut call_ids = HashSet::new();
    for _ in 0..50 {
        let (resp, events) = run(&m, &request(vec![Message::user("remember: x")]));
        assert!(resp.response_id.starts_with("mock-resp-"));
        assert!(resp_ids.insert(resp.response_id.clone()));
        let Some(Part::ToolCall { id, .. }) = resp.parts.first() else {
            panic!("no call")
        };
        assert!(id.starts_with("call_"));
        assert!(matches!(&events[0], ModelEvent::ToolCall { id: e, .. } if e == id));
        assert!(call_ids.insert(id.clone()));
    }
}

// ---------------------------------------------------------------------------
// Scripted mode

/// Writes the script and returns the configuration naming it (as the
/// supervisor's start-up environment would).
fn write_script(dir: &std::path::Path, script: Value) -> ProviderConfig {
    let path = dir.join("script.json");
    std::fs::write(&path, serde_json::to_string(&script).unwrap()).unwrap();
    script_config(&path)
}

fn script_config(path: &std::path::Path) -> ProviderConfig {
    ProviderConfig::load_from(std::path::Path::new("/nonexistent/config.toml"), &|k| {
        (k == "MINI_LETTA_SCRIPTED_MODEL").then(|| path.display().to_string())
    })
    .unwrap()
}

const SCRIPTED: &str = "mock/scripted";

#[test]
fn scripted_turns_in_order_across_instances() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_script(
        dir.path(),
        json!({"turns": [
            {"tool_calls": [{"name": "Bash", "arguments": {"command": "echo hi"}}]},
            {"error": {"kind": "transient", "status": 500, "message": "boom"}},
            {"error": {"kind": "context_overflow", "message": "prompt is too long"}},
            {"text": "done", "usage": {"input_tokens": 11, "output_tokens": 2}},
        ]}),
    );
    let req = request(vec![Message::user("go")]);

    let first = open_model(SCRIPTED, &cfg).unwrap();
    let mut events = Vec::new();
    let r1 = first.complete(&req, &mut |e| events.push(e)).unwrap();
    let (name, args) = tool_call(&r1);
    assert_eq!(
        (name.as_str(), args),
        ("Bash", json!({"command": "echo hi"}))
    );
    assert!(matches!(&events[..], [ModelEvent::ToolCall { .. }]));

    // A new instance (as the supervisor builds per step) continues the script.
    let second = open_model(SCRIPTED, &cfg).unwrap();
    let e2 = second.complete(&req, &mut |_| {}).unwrap_err();
    assert_eq!(
        e2,
        ModelError::Transient {
            status: Some(500),
            message: "boom".into(),
            retry_after_ms: None,
            hint: None,
        }
    );
    let e3 = second.complete(&req, &mut |_| {}).unwrap_err();
    assert!(matches!(e3, ModelError::ContextOverflow { .. }));
    let r4 = first.complete(&req, &mut |_| {}).unwrap();
    assert_eq!(text_of(&r4), "done");
    assert_eq!(r4.stop, StopKind::EndTurn);
    assert_eq!((r4.usage.input_tokens, r4.usage.output_tokens), (11, 2));

    let exhausted = second.complete(&req, &mut |_| {}).unwrap_err();
    assert!(
        matches!(&exhausted, ModelError::Fatal { message, .. } if message.contains("script exhausted")),
        "{exhausted:?}"
    );
    let script = dir.path().join("script.json");
    assert_eq!(
        std::fs::read_to_string(cursor_path(&script))
            .unwrap()
            .trim(),
        "4"
    );

    // Deleting the cursor starts over.
    std::fs::remove_file(cursor_path(&script)).unwrap();
    assert!(first.complete(&req, &mut |_| {}).is_ok());
}

#[test]
fn scripted_rejects_bad_scripts() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_script(dir.path(), json!({"turns": [{}]}));
    let err = open_model(SCRIPTED, &cfg).err().unwrap();
    assert!(err.to_string().contains("turn 0"), "{err}");
    let missing = open_model(
        SCRIPTED,
        &script_config(std::path::Path::new("/nonexistent/x.json")),
    )
    .err()
    .unwrap();
    assert!(
        missing.to_string().contains("/nonexistent/x.json"),
        "{missing}"
    );
}

/// A script path inside the model name is never opened: whoever names the
/// model (a child) would otherwise choose what the supervisor reads and
/// writes (the script and its cursor file).
#[test]
fn scripted_path_in_the_model_name_is_refused_and_touches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script.json");
    std::fs::write(&script, r#"{"turns":[{"text":"hi"}]}"#).unwrap();
    for cfg in [ProviderConfig::offline(), script_config(&script)] {
        let handle = format!("mock/scripted:{}", script.display());
        let err = open_model(&handle, &cfg).err().unwrap();
        assert!(
            err.to_string().contains("MINI_LETTA_SCRIPTED_MODEL"),
            "{err}"
        );
    }
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("script.json")]);
    // Without the start-up setting, plain `mock/scripted` says what to set.
    let err = open_model(SCRIPTED, &ProviderConfig::offline())
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("MINI_LETTA_SCRIPTED_MODEL"),
        "{err}"
    );
}
