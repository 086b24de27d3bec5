//! The book's labs 4 and 5 as a reader runs them (issue 31 §1, §3;
//! `docs/labs.md`): the real binary, a real home, confined children and
//! the mock model.
//!
//! * Lab 4: an agent created with a 900-token window answers ten one-shot
//!   turns in a row, compacting as it goes, and its reflection merges once
//!   the reflection window is 8000.
//! * Lab 5: the reflector's cached system prompt holds the parent's
//!   `<human>` and `<persona>`, and the mock reflector keeps only what the
//!   user's instruction asks for.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{bin, confinement_or_skip, create_agent, open_home, stderr, stdout};
use serde_json::Value;

/// The binary under `home`, with none of the windows of the test's own
/// environment.
fn cmd(home: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.args(args)
        .env("MINI_LETTA_HOME", home)
        .env_remove("RUST_LOG")
        .env_remove("MINI_LETTA_CONTEXT_WINDOW")
        .env_remove("MINI_LETTA_REFLECTION_CONTEXT_WINDOW");
    c
}

fn run(home: &Path, args: &[&str]) -> Output {
    cmd(home, args).output().unwrap()
}

fn ok(home: &Path, args: &[&str]) -> String {
    let o = run(home, args);
    assert!(
        o.status.success(),
        "{args:?} failed: {}{}",
        stdout(&o),
        stderr(&o)
    );
    stdout(&o)
}

fn json_of(home: &Path, args: &[&str]) -> Value {
    let o = run(home, args);
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {}{}", stdout(&o), stderr(&o)))
}

fn agent_dir(home: &Path, id: &str) -> PathBuf {
    home.join("agents").join(id)
}

fn human(home: &Path, id: &str) -> String {
    std::fs::read_to_string(agent_dir(home, id).join("memory/human.md")).unwrap()
}

/// Ten two-line messages of about thirty words, each a first-person fact
/// (a reflection has something to keep) and a question.
fn lab4_messages() -> Vec<String> {
    let facts = [
        "I like green tea in the morning",
        "I live in Hangzhou near the West Lake",
        "I work on compilers written in Rust",
        "I have a cat called Miso",
        "I love long walks along the river",
        "I am learning to play the cello",
        "I like reading science fiction novels",
        "I live with two friends who cook well",
        "I work mostly from home on Fridays",
        "I have visited Kyoto three times",
    ];
    facts
        .iter()
        .enumerate()
        .map(|(i, f)| {
            format!(
                "{f}, and I would like you to keep that in mind, please.\n\
                 Turn {}: what would you suggest I try this week, given what you know?",
                i + 1
            )
        })
        .collect()
}

#[test]
fn lab4_ten_one_shot_turns_at_900_answer_compact_and_reflect_at_8000() {
    if !confinement_or_skip("lab 4 at a 900-token window") {
        return;
    }
    let home = open_home();
    let h = home.path();
    // The default system prompt, as the lab creates the agent.
    let id = create_agent(h, &["lab4", "--context-window", "900"]);
    for (i, text) in lab4_messages().iter().enumerate() {
        let o = run(h, &["chat", "-a", "lab4", "-p", text]);
        assert!(
            o.status.success(),
            "turn {} failed: {}{}",
            i + 1,
            stdout(&o),
            stderr(&o)
        );
        let first_line = text.lines().next().unwrap();
        assert!(
            stdout(&o).contains(first_line),
            "turn {}: {}",
            i + 1,
            stdout(&o)
        );
        let ctx = json_of(h, &["context", "-a", "lab4", "--json"]);
        assert!(
            ctx["tokens"].as_u64().unwrap() <= 900,
            "turn {}: {ctx:#}",
            i + 1
        );
    }
    let ctx = json_of(h, &["context", "-a", "lab4", "--json"]);
    assert!(ctx["compactions"].as_u64().unwrap() >= 3, "{ctx:#}");
    assert_eq!(ctx["context_window"], 900);

    // The reflection has a window of its own, from the supervisor's
    // environment (a one-shot command runs an embedded supervisor).
    let o = cmd(h, &["reflect", "-a", "lab4", "--wait", "--json"])
        .env("MINI_LETTA_REFLECTION_CONTEXT_WINDOW", "8000")
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&o), stderr(&o)));
    assert_eq!(v["result"]["status"], "merged", "{v:#}");
    let memory = human(h, &id);
    assert!(memory.contains("I have a cat called Miso"), "{memory}");

    // Issue 48 (5): the merged memory grew the system prompt until the
    // summary alone no longer fitted, and every turn failed. The ladder
    // shortens the summary: ten more turns answer.
    for i in 1..=10 {
        let text = format!("after the reflection, turn {i}: what should I plant next?");
        let o = run(h, &["chat", "-a", "lab4", "-p", &text]);
        assert!(
            o.status.success() && stdout(&o).contains(&text),
            "turn {i} after the reflection: {}{}",
            stdout(&o),
            stderr(&o)
        );
        let ctx = json_of(h, &["context", "-a", "lab4", "--json"]);
        assert!(ctx["tokens"].as_u64().unwrap() <= 900, "turn {i}: {ctx:#}");
    }
}

#[test]
fn lab4_the_floor_at_900_leaves_room_for_a_message_and_a_reply() {
    let home = open_home();
    let h = home.path();
    create_agent(h, &["lab4", "--context-window", "900"]);
    let ctx = json_of(h, &["context", "-a", "lab4", "--json"]);
    let system = ctx["estimate"]["system_tokens"].as_u64().unwrap();
    let tools = ctx["estimate"]["tool_tokens"].as_u64().unwrap();
    // The agent-info reminder every one-shot turn carries: about 70.
    let floor = system + tools + 80;
    // The book: "the floor (system + tools + agent-info) is about 600".
    assert!(floor <= 600, "floor {floor}: {ctx:#}");
    // A thirty-word message and its echo fit under the threshold.
    assert!(720 - floor >= 2 * 60, "floor {floor}");
    // What the request carries, and what each tool costs.
    let carried: Vec<&str> = ctx["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools in {ctx:#}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(carried, ["memory", "recall_search"], "{ctx:#}");
    let sum: u64 = ctx["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tokens"].as_u64().unwrap())
        .sum();
    assert!(sum.abs_diff(tools) <= 2, "{sum} vs {tools}");
    assert_eq!(ctx["tool_schemas"], "minimal", "{ctx:#}");
    let text = ok(h, &["context", "-a", "lab4"]);
    assert!(text.contains("tools:"), "{text}");
    assert!(text.contains("memory "), "{text}");

    // A large window carries every tool with its full schema.
    create_agent(h, &["big", "--context-window", "128000"]);
    let ctx = json_of(h, &["context", "-a", "big", "--json"]);
    assert_eq!(ctx["tool_schemas"], "full", "{ctx:#}");
    assert_eq!(ctx["tools"].as_array().unwrap().len(), 6, "{ctx:#}");
    assert!(ctx["estimate"]["tool_tokens"].as_u64().unwrap() > tools);
}

#[test]
fn the_reflection_window_is_configured_and_context_says_where_it_comes_from() {
    let home = open_home();
    let h = home.path();
    create_agent(h, &["lab4", "--context-window", "900"]);
    let ctx = json_of(h, &["context", "-a", "lab4", "--json"]);
    assert_eq!(ctx["reflection_context_window"], 900);
    assert_eq!(ctx["reflection_window_source"], "main", "{ctx:#}");

    std::fs::write(
        h.join("config.toml"),
        "[reflection]\ncontext_window = 8000\n",
    )
    .unwrap();
    let ctx = json_of(h, &["context", "-a", "lab4", "--json"]);
    assert_eq!(ctx["reflection_context_window"], 8000, "{ctx:#}");
    assert_eq!(ctx["reflection_window_source"], "config", "{ctx:#}");
    let text = ok(h, &["context", "-a", "lab4"]);
    assert!(
        text.contains("reflection window: 8000 tokens (config.toml [reflection] context_window)"),
        "{text}"
    );

    let o = cmd(h, &["context", "-a", "lab4", "--json"])
        .env("MINI_LETTA_REFLECTION_CONTEXT_WINDOW", "16000")
        .output()
        .unwrap();
    let ctx: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(ctx["reflection_context_window"], 16000);
    assert_eq!(ctx["reflection_window_source"], "environment");

    // A typo in the table is refused, naming it.
    std::fs::write(
        h.join("config.toml"),
        "[reflection]\ncontext_windw = 8000\n",
    )
    .unwrap();
    let o = run(h, &["context", "-a", "lab4"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("context_windw"), "{}", stderr(&o));
}

#[test]
fn the_reflection_window_from_config_lets_the_lab4_reflection_merge() {
    if !confinement_or_skip("lab 4 reflection window from config.toml") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let id = create_agent(h, &["lab4", "--context-window", "900"]);
    for text in lab4_messages().iter().take(3) {
        ok(h, &["chat", "-a", "lab4", "-p", text]);
    }
    // Sharing the 900-token window, the reflection cannot run, and says
    // why.
    let o = run(h, &["reflect", "-a", "lab4", "--wait"]);
    assert!(!o.status.success());
    assert!(stdout(&o).contains("(failed)"), "{}", stdout(&o));
    assert!(stdout(&o).contains("prompt is too long"), "{}", stdout(&o));
    std::fs::write(
        h.join("config.toml"),
        "[reflection]\ncontext_window = 8000\n",
    )
    .unwrap();
    let v = json_of(h, &["reflect", "-a", "lab4", "--wait", "--json"]);
    assert_eq!(v["result"]["status"], "merged", "{v:#}");
    assert!(human(h, &id).contains("I like green tea in the morning"));
}

#[test]
fn a_tool_result_too_large_for_the_window_is_trimmed_and_the_turn_answers() {
    if !confinement_or_skip("a tool result larger than the window") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let id = create_agent(h, &["owl", "--context-window", "3000"]);
    // About 14,000 characters: several times the whole window.
    let o = run(h, &["chat", "-a", "owl", "-p", "run: seq 1 3000"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("Tool result: "), "{}", stdout(&o));
    let last: Value = serde_json::from_slice(
        &std::fs::read(agent_dir(h, &id).join("conversations/default/last-request.json")).unwrap(),
    )
    .unwrap();
    let sent = last.to_string();
    assert!(sent.contains("trimmed"), "{sent}");
    assert!(!sent.contains("\\n2999\\n"), "the whole result was sent");
    // The log keeps the whole result.
    let log =
        std::fs::read_to_string(agent_dir(h, &id).join("conversations/default/messages.jsonl"))
            .unwrap();
    assert!(log.contains("\\n2999\\n"));
    // And the conversation goes on.
    let o = run(h, &["chat", "-a", "owl", "-p", "hello again"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("mock: hello again"));
}

#[test]
fn a_message_that_cannot_fit_names_the_parts_and_the_conversation_carries_on() {
    if !confinement_or_skip("a message larger than the window") {
        return;
    }
    let home = open_home();
    let h = home.path();
    create_agent(h, &["lab4", "--context-window", "900"]);
    ok(h, &["chat", "-a", "lab4", "-p", "hello"]);
    let huge = "word ".repeat(1000);
    let o = run(h, &["chat", "-a", "lab4", "-p", &huge]);
    assert!(!o.status.success());
    let err = stderr(&o);
    for part in ["system prompt", "tools", "messages", "900"] {
        assert!(err.contains(part), "{part} not named: {err}");
    }
    for i in 0..3 {
        let text = format!("a short message {i}");
        let out = ok(h, &["chat", "-a", "lab4", "-p", &text]);
        assert!(out.contains(&text), "{out}");
    }
}

#[test]
fn lab5_the_reflector_sees_the_parent_memory_and_keeps_what_the_instruction_asks() {
    if !confinement_or_skip("lab 5 reflector prompt") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let id = create_agent(h, &["owl"]);
    // A fact the main agent stores itself: it is in the parent's memory.
    ok(h, &["chat", "-a", "owl", "-p", "记住: 我住在杭州"]);
    ok(h, &["chat", "-a", "owl", "-p", "我喜欢绿茶"]);
    ok(h, &["chat", "-a", "owl", "-p", "我养了一只猫"]);
    ok(h, &["chat", "-a", "owl", "-p", "我每天早上喝一杯乌龙茶"]);
    let v = json_of(
        h,
        &[
            "reflect",
            "-a",
            "owl",
            "--wait",
            "--json",
            "--instruction",
            "只记住和茶有关的事",
        ],
    );
    assert_eq!(v["result"]["status"], "merged", "{v:#}");
    let memory = human(h, &id);
    assert!(
        memory.contains("我喜欢绿茶") && memory.contains("我每天早上喝一杯乌龙茶"),
        "{memory}"
    );
    assert!(
        !memory.contains("猫"),
        "the instruction was not honoured: {memory}"
    );

    // The reflector's cached system prompt (the lab's `jq -r .content`).
    let dir = h.join(format!("agents/{id}~reflection/conversations"));
    let cached: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert_eq!(cached.len(), 1);
    assert!(
        cached[0]
            .file_name()
            .to_string_lossy()
            .starts_with("reflection-")
    );
    let prompt: Value = serde_json::from_slice(
        &std::fs::read(cached[0].path().join("system-prompt.json")).unwrap(),
    )
    .unwrap();
    let content = prompt["content"].as_str().unwrap();
    let block = |tag: &str| -> String {
        let open = format!("<{tag}>");
        let close = format!("</{tag}>");
        let start = content
            .find(&open)
            .unwrap_or_else(|| panic!("no {open}: {content}"));
        let end = content[start..]
            .find(&close)
            .unwrap_or_else(|| panic!("no {close}: {content}"));
        content[start..start + end].to_string()
    };
    assert!(block("human").contains("- 我住在杭州"), "{content}");
    assert!(block("persona").contains("mini-letta"), "{content}");
    // Compiled at the reflection's base revision: what main was when it
    // started, before its own merge.
    let base = prompt["memfsRevision"].as_str().unwrap();
    assert!(!block("human").contains("绿茶"), "{content}");
    let o = Command::new("git")
        .arg("--git-dir")
        .arg(agent_dir(h, &id).join("memory.git"))
        .args(["show", &format!("{base}:human.md")])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("我住在杭州"));
}

#[test]
fn a_tool_a_small_window_does_not_offer_does_not_run() {
    if !confinement_or_skip("a tool not offered at 900 tokens") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let id = create_agent(h, &["lab4", "--context-window", "900"]);
    let marker = agent_dir(h, &id).join("memory/ran.txt");
    let o = run(
        h,
        &[
            "chat",
            "-a",
            "lab4",
            "-p",
            &format!("run: touch {}", marker.display()),
        ],
    );
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("Bash is not offered at this context window (900 tokens"),
        "{}",
        stdout(&o)
    );
    assert!(!marker.exists(), "Bash ran");
}

#[test]
fn the_supervisors_own_reflection_window_wins_over_the_agents() {
    if !confinement_or_skip("the supervisor's reflection window") {
        return;
    }
    // A background supervisor started with the variable; the commands
    // that talk to it do not have it.
    let d =
        common::Daemon::start_with_env(&[], &[("MINI_LETTA_REFLECTION_CONTEXT_WINDOW", "8000")]);
    let h = d.path();
    std::fs::set_permissions(h, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let id = create_agent(h, &["lab4", "--context-window", "900"]);
    for text in lab4_messages().iter().take(2) {
        ok(h, &["chat", "-a", "lab4", "-p", text]);
    }
    let v = json_of(h, &["reflect", "-a", "lab4", "--wait", "--json"]);
    assert_eq!(v["result"]["status"], "merged", "{v:#}");
    assert!(human(h, &id).contains("I live in Hangzhou near the West Lake"));
}
