//! The audit log (issue 33): what a turn leaves in it, that the chain
//! catches an edited, removed or cut record (checked here independently,
//! sha256 over the lines), that a confined command cannot touch it, usage
//! summed from it, and token budgets that refuse before any model call.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::common::*;

fn log_path(home: &Path) -> std::path::PathBuf {
    home.join("audit/audit.jsonl")
}

fn records(home: &Path) -> Vec<Value> {
    std::fs::read_to_string(log_path(home))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The chain recomputed here, not by the program: each `prev` is the
/// sha256 (hex) of the line before it, the first is 64 zeros, `seq`
/// counts from 1. Returns the head.
fn independent_head(text: &str) -> String {
    let mut prev = "0".repeat(64);
    for (i, line) in text.lines().enumerate() {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["seq"], json!(i as u64 + 1), "line {}", i + 1);
        assert_eq!(v["prev"], json!(prev), "line {}", i + 1);
        prev = Sha256::digest(line.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
    }
    prev
}

fn scripted_chat(home: &Path, agent: &str, script: &Path, text: &str) -> Output {
    Command::new(bin())
        .env("MINI_LETTA_HOME", home)
        .env("MINI_LETTA_SCRIPTED_MODEL", script)
        .env_remove("RUST_LOG")
        .args(["chat", "-a", agent, "-p", text, "--model", "mock/scripted"])
        .output()
        .unwrap()
}

/// A script: a Bash command writing memory, a memory commit, an answer.
fn tool_and_commit_script(home: &Path) -> std::path::PathBuf {
    let script = home.join("script.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"tool_calls": [{"name": "Bash", "arguments": {
                "command": "printf -- '- likes tea\\n' >> \"$MEMORY_DIR/human.md\"",
                "description": "note it"}}]},
            {"tool_calls": [{"name": "memory", "arguments": {
                "command": "commit", "reason": "remember tea"}}]},
            {"text": "done"}
        ]})
        .to_string(),
    )
    .unwrap();
    script
}

fn verify(home: &Path, extra: &[&str]) -> (i32, Value) {
    let mut args = vec!["audit", "verify", "--json"];
    args.extend_from_slice(extra);
    let o = run(home, &args);
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&o), stderr(&o)));
    (o.status.code().unwrap_or(-1), v)
}

#[test]
fn a_turn_leaves_spawn_tool_commit_and_model_records_on_a_chain_that_verifies() {
    if !confinement_or_skip("audit: a turn's records") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let id = create_agent(h, &["owl"]);
    let script = tool_and_commit_script(h);
    let o = scripted_chat(h, "owl", &script, "remember tea");
    assert!(o.status.success(), "{}", stderr(&o));

    let recs = records(h);
    let mine: Vec<&Value> = recs.iter().filter(|r| r["agent"] == json!(id)).collect();
    let kinds: Vec<&str> = mine.iter().filter_map(|r| r["kind"].as_str()).collect();
    for k in ["spawn", "tool", "commit", "model", "exit"] {
        assert!(kinds.contains(&k), "no {k} record: {kinds:?}");
    }
    // The commit's sha is the agent's HEAD.
    let o = Command::new("git")
        .args(["-c", "safe.directory=*", "-C"])
        .arg(h.join(format!("agents/{id}/memory")))
        .args(["rev-parse", "HEAD"])
        .output()
        .unwrap();
    let head = stdout(&o).trim().to_string();
    assert_eq!(head.len(), 40, "{}", stderr(&o));
    assert!(
        mine.iter()
            .any(|r| r["kind"] == "commit" && r["sha"] == json!(head)),
        "the commit record names {head}: {mine:?}"
    );
    let tools: Vec<&&Value> = mine.iter().filter(|r| r["kind"] == "tool").collect();
    assert!(tools.iter().any(|r| r["tool"] == "Bash"
        && r["reported_by"] == "child"
        && r["args_sha256"].as_str().is_some_and(|s| s.len() == 64)));
    assert!(mine.iter().any(|r| r["kind"] == "model"
        && r["input_tokens"].as_u64() > Some(0)
        && r["model"] == "mock/scripted"));

    let text = std::fs::read_to_string(log_path(h)).unwrap();
    let independent = independent_head(&text);
    let (code, v) = verify(h, &[]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(
        v["head"],
        json!(independent),
        "the program and this test agree"
    );
    assert_eq!(v["records"], json!(recs.len()));
    let o = run(h, &["audit", "head"]);
    assert_eq!(stdout(&o).trim(), independent);

    // Usage, summed from the same log.
    let o = run(h, &["usage", "-a", "owl", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let u: Value = serde_json::from_slice(&o.stdout).unwrap();
    let a = &u["agents"][0];
    assert!(a["turns"].as_u64() >= Some(1), "{u}");
    assert!(a["input_tokens"].as_u64() > Some(0), "{u}");
    assert!(a["output_tokens"].as_u64() > Some(0), "{u}");
    assert!(a["cpu_ms"].as_u64() > Some(0), "{u}");
    assert!(a["tool_calls"].as_u64() >= Some(2), "{u}");
    assert!(a["peak_memory_bytes"].as_u64() > Some(0), "{u}");
}

/// Ten records appended through the library (as the CLI appends policy
/// changes), and the log's lines.
fn ten_records(h: &Path) -> Vec<String> {
    let home = mini_letta::paths::Home::at(h);
    for i in 0..10 {
        let mut f = serde_json::Map::new();
        f.insert("n".into(), json!(i));
        mini_letta::audit::append(&home, "config", Some("agent-x"), Some("cli"), f).unwrap();
    }
    std::fs::read_to_string(log_path(h))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

fn write_lines(h: &Path, lines: &[String]) {
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(log_path(h), text).unwrap();
}

#[test]
fn verify_names_the_record_edited_removed_or_cut_off() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let lines = ten_records(h);
    let (code, v) = verify(h, &[]);
    assert_eq!((code, v["records"].clone()), (0, json!(10)), "{v}");
    let saved_head = v["head"].as_str().unwrap().to_string();
    assert_eq!(saved_head, independent_head(&(lines.join("\n") + "\n")));

    // One byte of record 5 edited (its `n`).
    let mut edited = lines.clone();
    edited[4] = edited[4].replace("\"n\":4", "\"n\":7");
    assert_ne!(edited[4], lines[4]);
    write_lines(h, &edited);
    let (code, v) = verify(h, &[]);
    assert_eq!(code, 1, "{v}");
    assert_eq!(v["bad_seq"], json!(5), "{v}");
    assert!(v["message"].as_str().unwrap().contains("seq 5"), "{v}");

    // Record 5 removed.
    let mut removed = lines.clone();
    removed.remove(4);
    write_lines(h, &removed);
    let (code, v) = verify(h, &[]);
    assert_eq!((code, v["bad_seq"].clone()), (1, json!(5)), "{v}");

    // Records 6 and 7 swapped.
    let mut swapped = lines.clone();
    swapped.swap(5, 6);
    write_lines(h, &swapped);
    let (code, v) = verify(h, &[]);
    assert_eq!((code, v["bad_seq"].clone()), (1, json!(6)), "{v}");

    // The tail cut off: the chain that is left is whole, so only the saved
    // head catches it, naming the first record missing.
    write_lines(h, &lines[..7]);
    let (code, v) = verify(h, &[]);
    assert_eq!(code, 0, "a cut chain is still a chain: {v}");
    let (code, v) = verify(h, &["--head", &saved_head]);
    assert_eq!(code, 1, "{v}");
    assert_eq!(v["bad_seq"], json!(8), "{v}");
    let o = run(h, &["audit", "verify", "--head", &saved_head]);
    assert!(stderr(&o).contains("seq 8"), "{}", stderr(&o));

    // The whole log back: the saved head is on it.
    write_lines(h, &lines);
    let (code, v) = verify(h, &["--head", &saved_head]);
    assert_eq!((code, v["head_found"].clone()), (0, json!(true)), "{v}");
}

#[test]
fn a_torn_last_line_is_reported_then_kept_and_noted_never_dropped() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let lines = ten_records(h);
    // A crash half-way through an append.
    let torn = &lines[9][..40];
    let mut text = lines[..9].join("\n");
    text.push('\n');
    text.push_str(torn);
    std::fs::write(log_path(h), &text).unwrap();
    let (code, v) = verify(h, &[]);
    assert_eq!(code, 1, "{v}");
    assert_eq!(v["problem"]["problem"], "torn_tail", "{v}");
    assert_eq!(v["bad_seq"], json!(10), "{v}");

    // The next appender (a supervisor's start does the same) keeps the
    // torn bytes and notes them in a record of their own.
    let mut f = serde_json::Map::new();
    f.insert("n".into(), json!("after"));
    let home_ = mini_letta::paths::Home::at(h);
    mini_letta::audit::append(&home_, "config", None, Some("cli"), f).unwrap();
    let now = std::fs::read_to_string(log_path(h)).unwrap();
    assert!(
        now.contains(&format!("{torn}\n")),
        "the torn bytes are kept"
    );
    let (code, v) = verify(h, &[]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["torn"][0]["after"], json!(9), "{v}");
    let recs: Vec<Value> = now
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let note = recs.iter().find(|r| r["kind"] == "torn").unwrap();
    assert_eq!(note["torn_bytes"], json!(40));
    assert_eq!(note["seq"], json!(10));
}

#[test]
fn the_chain_spans_rolled_over_files() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let mini = mini_letta::paths::Home::at(h);
    let mut w = mini_letta::audit::Writer::open(&mini)
        .unwrap()
        .rotate_at(600);
    for i in 0..12 {
        let e = mini_letta::audit::Entry::new("config", None, Some("cli")).with("n", i);
        w.append(&[e]).unwrap();
    }
    // Every file, oldest first: one chain, checked here over their lines.
    let mut n = 1;
    let mut files = Vec::new();
    while h.join(format!("audit/audit-{n}.jsonl")).exists() {
        files.push(std::fs::read_to_string(h.join(format!("audit/audit-{n}.jsonl"))).unwrap());
        n += 1;
    }
    assert!(files.len() >= 2, "rolled over more than once");
    let current = std::fs::read_to_string(log_path(h)).unwrap();
    let first: Value = serde_json::from_str(current.lines().next().unwrap()).unwrap();
    assert_eq!(
        first["prev"],
        json!(independent_head(&files.concat())),
        "the new file's first prev is the old files' head"
    );
    let whole = files.concat() + &current;
    let first_file = files[0].clone();
    let (code, v) = verify(h, &[]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["records"], json!(12));
    assert_eq!(v["head"], json!(independent_head(&whole)));
    assert!(v["files"].as_u64() > Some(2), "{v}");
    // A middle file edited is caught across the boundary.
    std::fs::write(
        h.join("audit/audit-1.jsonl"),
        first_file.replace("\"n\":0", "\"n\":9"),
    )
    .unwrap();
    let (code, v) = verify(h, &[]);
    assert_eq!((code, v["bad_seq"].clone()), (1, json!(1)), "{v}");
}

#[test]
fn a_confined_command_cannot_append_truncate_or_replace_the_log() {
    if !confinement_or_skip("audit: a confined command and the log") {
        return;
    }
    let home = open_home();
    let h = home.path();
    create_agent(h, &["owl"]);
    let o = run(h, &["sandbox", "run", "-a", "owl", "--", "true"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let before = std::fs::read(log_path(h)).unwrap();
    let log = log_path(h).display().to_string();
    let dir = h.join("audit").display().to_string();
    // Each attempt in a subshell of its own: one failing does not stop the rest.
    let attack = format!(
        "(echo '{{\"seq\":999}}' >> {log}); (: > {log}); \
         (echo x > {dir}/new.jsonl && mv -f {dir}/new.jsonl {log}); \
         (rm -f {log}); (ln -sf /dev/null {log}); \
         (echo '{{}}' > {dir}/budgets.json); exit 0"
    );
    let o = run(
        h,
        &[
            "sandbox", "run", "-a", "owl", "--", "/bin/sh", "-c", &attack,
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let after = std::fs::read(log_path(h)).unwrap();
    assert!(
        after.starts_with(&before) && after.len() > before.len(),
        "the log only grew, by the supervisor's own records"
    );
    assert!(!h.join("audit/budgets.json").exists());
    let (code, v) = verify(h, &[]);
    assert_eq!(code, 0, "{v}");
    // The attempt's own child is on the chain.
    let text = String::from_utf8(after).unwrap();
    assert!(
        text.lines()
            .filter(|l| l.contains("\"kind\":\"spawn\""))
            .count()
            >= 2
    );
}

/// The scripted model's cursor: how many calls it has answered.
fn calls_made(script: &Path) -> usize {
    std::fs::read_to_string(script.with_extension("json.cursor"))
        .map(|s| s.trim().parse().unwrap())
        .unwrap_or(0)
}

#[test]
fn a_spent_budget_refuses_the_next_turn_before_any_model_call() {
    if !confinement_or_skip("audit: budgets") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let id = create_agent(h, &["owl"]);
    let o = run(
        h,
        &[
            "agent",
            "set-budget",
            "owl",
            "--tokens",
            "1",
            "--period",
            "day",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let script = h.join("script.json");
    std::fs::write(
        &script,
        json!({"turns": [{"text": "one"}, {"text": "two"}]}).to_string(),
    )
    .unwrap();
    // The first turn starts with nothing spent and spends more than 1.
    let o = scripted_chat(h, "owl", &script, "hello");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(calls_made(&script), 1);

    let o = scripted_chat(h, "owl", &script, "again");
    assert!(!o.status.success(), "the turn is refused");
    let err = stderr(&o);
    assert!(err.contains("token budget"), "{err}");
    assert!(err.contains("of its 1 tokens per day"), "{err}");
    assert!(err.contains("resets at"), "{err}");
    assert_eq!(calls_made(&script), 1, "no model call was made");

    let recs = records(h);
    let refusal = recs
        .iter()
        .find(|r| r["kind"] == "budget" && r["agent"] == json!(id))
        .unwrap_or_else(|| panic!("no budget record: {recs:?}"));
    assert_eq!(refusal["at"], "turn_start");
    assert_eq!(refusal["budget"], json!(1));
    assert!(refusal["used"].as_u64() > Some(1));
    assert!(
        recs.iter()
            .any(|r| r["kind"] == "config" && r["setting"] == "budget")
    );
    assert_eq!(
        recs.iter().filter(|r| r["kind"] == "model").count(),
        1,
        "the refused turn made no model call"
    );

    // Cleared, the agent runs again.
    let o = run(h, &["agent", "set-budget", "owl", "--clear"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = scripted_chat(h, "owl", &script, "and again");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(calls_made(&script), 2);
}

#[test]
fn a_turn_crossing_its_budget_stops_after_the_call_under_way() {
    if !confinement_or_skip("audit: a budget crossed mid-turn") {
        return;
    }
    let home = open_home();
    let h = home.path();
    create_agent(h, &["owl"]);
    let o = run(
        h,
        &[
            "agent",
            "set-budget",
            "owl",
            "--tokens",
            "1",
            "--period",
            "total",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let script = h.join("script.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"tool_calls": [{"name": "Bash", "arguments": {"command": "true", "description": "x"}}]},
            {"text": "never sent"}
        ]})
        .to_string(),
    )
    .unwrap();
    let o = scripted_chat(h, "owl", &script, "go");
    assert_eq!(
        calls_made(&script),
        1,
        "the second call was refused: {}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("token budget"), "{}", stderr(&o));
    let recs = records(h);
    let refusal = recs.iter().find(|r| r["kind"] == "budget").unwrap();
    assert_eq!(refusal["at"], "model_call");
    assert!(refusal["resets"].is_null(), "a total budget never resets");
    // The turn's child still ended cleanly and was recorded.
    assert!(
        recs.iter()
            .any(|r| r["kind"] == "exit" && r["role"] == "agent")
    );
    let (code, v) = verify(h, &[]);
    assert_eq!(code, 0, "{v}");
}

/// Issue 45 (4): the budget was checked before a call and its tokens added
/// after it, so calls made at once all passed the check — 6 parallel calls
/// against a 100-token budget all ran. A call now reserves an upper bound
/// of what it can spend (its request's bytes plus its `max_tokens`) in the
/// same step as the check, and starts only while spent plus reserved stays
/// below the budget. A confined agent-role child sends 8 model calls at
/// once on its channel against 10 tokens (the mock spends 8 a call): what
/// is charged stays within the budget plus one call's tokens.
#[test]
fn parallel_calls_cannot_overrun_a_budget() {
    use mini_letta::protocol::{Call, Event, ServerFrame, SpawnParams, StdioMode};
    if !confinement_or_skip("audit: parallel calls against a budget") {
        return;
    }
    let d = Daemon::start(&["owl"]);
    let h = d.path();
    let o = run(
        h,
        &[
            "agent",
            "set-budget",
            "owl",
            "--tokens",
            "10",
            "--period",
            "total",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // Eight requests written back to back, then eight answers read.
    let client = r#"
import json, socket
s = socket.socket(fileno=3)
req = {"model": "", "system": "S", "max_tokens": 64,
       "messages": [{"role": "user", "parts": [{"type": "text", "text": "hello there"}]}]}
s.sendall(b"".join(json.dumps({"type": "request", "id": i, "method": "model.complete",
                               "params": {"request": req}}).encode() + b"\n" for i in range(1, 9)))
f = s.makefile("rb")
answers = 0
while answers < 8:
    v = json.loads(f.readline())
    if v.get("type") == "response":
        answers += 1
"#;
    let mut c = d.client();
    c.call_json(Call::Subscribe {}).unwrap();
    let v = c
        .call_json(Call::Spawn(SpawnParams {
            agent: "owl".into(),
            role: "agent".into(),
            argv: vec!["python3".into(), "-c".into(), client.into()],
            stdio: StdioMode::Null,
            workspace: None,
            isolation: None,
            model: None,
        }))
        .unwrap();
    let child = v["child"].as_u64().unwrap();
    let code = loop {
        if let ServerFrame::Event(Event::ChildExit(exit)) = c.read_frame().unwrap()
            && exit.child == child
        {
            break exit.code();
        }
    };
    assert_eq!(code, Some(0), "the client did not get its 8 answers");
    let recs = records(h);
    let calls: Vec<u64> = recs
        .iter()
        .filter(|r| r["kind"] == "model" && r["outcome"] == "ok")
        .map(|r| r["input_tokens"].as_u64().unwrap() + r["output_tokens"].as_u64().unwrap())
        .collect();
    let charged: u64 = calls.iter().sum();
    let largest = calls.iter().copied().max().unwrap_or(0);
    assert!(!calls.is_empty(), "no call ran at all");
    assert!(
        charged <= 10 + largest,
        "charged {charged} tokens in {} calls against a budget of 10 (largest call {largest})",
        calls.len()
    );
    assert!(
        recs.iter()
            .any(|r| r["kind"] == "budget" && r["at"] == "model_call"),
        "the refused calls are recorded"
    );
    let (code, v) = verify(h, &[]);
    assert_eq!(code, 0, "{v}");
}

/// Issue 45 (7): the chain was anchored only at genesis: a record
/// rewritten with every later `prev` recomputed passed `audit verify`, and
/// against a head saved after the rewrite... and against one saved before
/// it, verify said records "were removed" when they were altered. A head
/// saved with its record's number (`audit head --seq`) now tells the two
/// apart: the rewrite is named as an alteration of that record or one
/// before it, and a cut tail is still named a removal.
#[test]
fn a_rewritten_chain_is_caught_as_altered_against_a_saved_head() {
    let home = open_home();
    let h = home.path();
    create_agent(h, &["owl"]);
    for i in 0..3 {
        let o = run(
            h,
            &[
                "agent",
                "set-budget",
                "owl",
                "--tokens",
                &format!("{}", 100 + i),
            ],
        );
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let o = run(h, &["audit", "head", "--seq"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let saved = stdout(&o).trim().to_string();
    let (seq, _) = saved.split_once(':').expect("SEQ:HEX");
    let seq: usize = seq.parse().unwrap();
    assert!(seq >= 3, "{saved}");
    // Rewrite record 2 and recompute every later link: the chain holds.
    let path = log_path(h);
    rewrite_record(&path, 2);
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let (code, v) = verify(h, &[]);
    assert_eq!(code, 0, "the rewritten chain holds by itself: {v}");
    let (code, v) = verify(h, &["--head", &saved]);
    assert_eq!(code, 1, "{v}");
    let message = v["message"].as_str().unwrap();
    assert!(message.contains("altered"), "{message}");
    assert!(!message.contains("removed"), "{message}");
    assert_eq!(v["bad_seq"], json!(seq as u64), "{v}");
    // A cut tail against the same head is still a removal.
    let cut = lines[..seq - 1].join("\n") + "\n";
    std::fs::write(&path, cut).unwrap();
    let (code, v) = verify(h, &["--head", &saved]);
    assert_eq!(code, 1, "{v}");
    assert!(v["message"].as_str().unwrap().contains("removed"), "{v}");
}

/// Rewrite record `n` (1-based) of the log at `path` and recompute every
/// later link, as one who can write the log and wants it to verify.
fn rewrite_record(path: &std::path::Path, n: usize) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    // Edited as text: the header (`seq`, `prev`) keeps its place.
    let end = lines[n - 1].rfind('}').unwrap();
    lines[n - 1].insert_str(end, ",\"forged\":true");
    for i in n..lines.len() {
        let prev: String = Sha256::digest(lines[i - 1].as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let at = lines[i].find("\"prev\":\"").unwrap() + "\"prev\":\"".len();
        lines[i].replace_range(at..at + 64, &prev);
    }
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// Issue 45 (7): the supervisor publishes the head where the operator
/// says (`[audit] publish`, outside the home) — the head it found when it
/// starts, and the last one when it stops — and `audit verify --against`
/// checks the log against the latest: a record rewritten with every later
/// link recomputed passes the chain alone and is caught as altered.
#[test]
fn a_rewrite_is_caught_against_the_heads_the_supervisor_published() {
    let home = open_home();
    let h = home.path();
    let outside = tempfile::tempdir().unwrap();
    let heads = outside.path().join("audit-heads");
    create_agent(h, &["owl"]);
    let o = run(h, &["agent", "set-budget", "owl", "--tokens", "100"]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::write(
        h.join("config.toml"),
        format!("[audit]\npublish = {:?}\n", heads.display().to_string()),
    )
    .unwrap();
    let before = run(h, &["audit", "head", "--seq"]);
    let found = stdout(&before).trim().to_string();
    let o = run(h, &["supervisor", "start"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(h, &["chat", "-a", "owl", "-p", "hello"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(h, &["supervisor", "stop"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let published = std::fs::read_to_string(&heads).unwrap();
    let lines: Vec<&str> = published.lines().collect();
    assert_eq!(lines.len(), 2, "at start and at stop: {published}");
    assert!(
        lines[0].starts_with(&format!("{found} ")),
        "the head found at start, {found}: {published}"
    );
    // The head at stop is a head of this log, past the one found at start
    // (a child's exit may still follow it: the log's, not the anchor's).
    let at_stop = lines[1].split_whitespace().next().unwrap();
    let seq = |h: &str| h.split(':').next().unwrap().parse::<u64>().unwrap();
    assert!(seq(at_stop) > seq(&found), "the head at stop: {published}");
    let (code, v) = verify(h, &["--head", at_stop]);
    assert_eq!(code, 0, "the head at stop is on the chain: {v}");
    let against = heads.display().to_string();
    let (code, v) = verify(h, &["--against", &against]);
    assert_eq!(code, 0, "{v}");
    rewrite_record(&log_path(h), 2);
    let (code, v) = verify(h, &[]);
    assert_eq!(code, 0, "the rewritten chain holds by itself: {v}");
    let (code, v) = verify(h, &["--against", &against]);
    assert_eq!(code, 1, "{v}");
    let message = v["message"].as_str().unwrap();
    assert!(message.contains("altered"), "{message}");
    // A heads file inside the home anchors nothing: refused at start.
    std::fs::write(
        h.join("config.toml"),
        "[audit]\npublish = \"/tmp/x\"\nwhat = 1\n",
    )
    .unwrap();
    let o = run(h, &["supervisor", "start"]);
    assert!(!o.status.success(), "started with a bad [audit] table");
    let inside = h.join("heads").display().to_string();
    std::fs::write(
        h.join("config.toml"),
        format!("[audit]\npublish = {inside:?}\n"),
    )
    .unwrap();
    let o = run(h, &["supervisor", "start"]);
    assert!(!o.status.success(), "started publishing inside the home");
    assert!(stderr(&o).contains("inside the home"), "{}", stderr(&o));
}
