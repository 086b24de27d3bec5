//! Context accounting and compaction on a 10,000-message conversation:
//! the estimate (with a usage anchor and without), the sliding-window and
//! all plans, the summariser transcript, a whole compaction with an
//! instant summariser, and one mock `chat -p` turn end to end on that
//! conversation without compaction and with one (the turn's pre-flight
//! check compacts it, the summary written by the mock through the
//! supervisor), beside a turn on an empty conversation.
//!
//! Run: `cargo bench --bench context` (or `scripts/bench-context`);
//! `--quick` for fewer runs. Turns run with `--isolation off` (the
//! conversation is restored by the benchmark, as root, between turns).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use mini_letta::agent::context::compact::{self, CompactionSettings, Mode, Summarizer, Trigger};
use mini_letta::agent::context::{estimate, plan, transcript};
use mini_letta::model::{ModelFailure, Part, Role, Usage};
use mini_letta::paths::{AgentPaths, Home};
use mini_letta::store::conversation::{Conversation, StoredMessage};

const MESSAGES: usize = 10_000;
/// No compaction at this window.
const ROOMY: &str = "100000000";
/// The 10,000 messages (~250k tokens) are over this one's threshold.
const TIGHT: u64 = 200_000;

use support::{bin, median};

fn time<T>(runs: usize, mut f: impl FnMut() -> T) -> f64 {
    median(
        (0..runs)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(f());
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect(),
    )
}

fn run(home: &Path, args: &[&str], window: Option<&str>) -> std::process::Output {
    let mut c = Command::new(bin());
    c.args(args).env("MINI_LETTA_HOME", home);
    match window {
        Some(w) => c.env("MINI_LETTA_CONTEXT_WINDOW", w),
        None => c.env_remove("MINI_LETTA_CONTEXT_WINDOW"),
    };
    let o = c.output().unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// 5,000 exchanges of ~100-character messages; each answer carries the
/// usage its request would have had.
fn messages() -> Vec<StoredMessage> {
    let filler = "lorem ipsum dolor sit amet ".repeat(4);
    let mut tokens = 700u64;
    let mut out = Vec::with_capacity(MESSAGES);
    for i in 0..MESSAGES / 2 {
        let user = format!("question {i}: {filler}");
        let answer = format!("answer {i}: {filler}");
        tokens += (user.len() as u64).div_ceil(4);
        let mut q = StoredMessage::new(
            format!("msg-{:06}", 2 * i + 1),
            Role::User,
            vec![Part::text(user)],
        );
        q.ts = "2026-01-01T00:00:00Z".into();
        let mut a = StoredMessage::new(
            format!("msg-{:06}", 2 * i + 2),
            Role::Assistant,
            vec![Part::text(answer.clone())],
        );
        a.ts = q.ts.clone();
        a.usage = Some(Usage {
            input_tokens: tokens,
            output_tokens: (answer.len() as u64).div_ceil(4),
            ..Usage::default()
        });
        a.stop = Some("end_turn".into());
        a.model = Some("mock".into());
        tokens += (answer.len() as u64).div_ceil(4);
        out.push(q);
        out.push(a);
    }
    out
}

/// Write the conversation's log and context (what a restore puts back).
fn write_conversation(agent: &AgentPaths, msgs: &[StoredMessage]) -> (Vec<u8>, Vec<u8>) {
    let dir = agent.conversation("default").unwrap();
    std::fs::create_dir_all(dir.dir()).unwrap();
    let mut log = Vec::new();
    for m in msgs {
        serde_json::to_writer(&mut log, m).unwrap();
        log.push(b'\n');
    }
    let ids: Vec<&str> = msgs.iter().map(|m| m.id.as_str()).collect();
    let context =
        serde_json::to_vec(&serde_json::json!({ "in_context_message_ids": ids })).unwrap();
    restore(agent, &log, &context);
    (log, context)
}

fn restore(agent: &AgentPaths, log: &[u8], context: &[u8]) {
    let dir = agent.conversation("default").unwrap();
    std::fs::write(dir.messages_jsonl(), log).unwrap();
    std::fs::write(dir.context_json(), context).unwrap();
    let _ = std::fs::remove_file(dir.compaction_event_json());
}

struct Instant0;

impl Summarizer for Instant0 {
    fn summarize(&mut self, _system: &str, transcript: &str) -> Result<String, ModelFailure> {
        Ok(format!("summary of {} characters", transcript.len()))
    }
}

fn main() {
    support::say_binary();
    let quick = std::env::args().any(|a| a == "--quick");
    let (runs, turns) = if quick { (7, 3) } else { (31, 9) };
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    std::fs::set_permissions(h, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let o = run(h, &["agent", "create", "bench", "--json"], None);
    let id = serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let agent = Home::at(h).agent(&id).unwrap();
    let msgs = messages();
    let (log, context) = write_conversation(&agent, &msgs);

    // In process.
    let load = time(runs, || Conversation::open(&agent, "default").unwrap());
    let conv = Conversation::open(&agent, "default").unwrap();
    let ctx = conv.context().unwrap();
    assert_eq!(ctx.len(), MESSAGES);
    let context_read = time(runs, || conv.context().unwrap().len());
    let tools = mini_letta::agent::tools::specs();
    let system = "s".repeat(2_000);
    let anchored = time(runs * 10, || {
        estimate::context_estimate(&ctx, &system, &tools).tokens
    });
    let stale: Vec<StoredMessage> = msgs
        .iter()
        .map(|m| StoredMessage {
            usage: None,
            ..m.clone()
        })
        .collect();
    let stale_refs: Vec<&StoredMessage> = stale.iter().collect();
    let unanchored = time(runs, || {
        estimate::context_estimate(&stale_refs, &system, &tools).tokens
    });
    let total = estimate::context_estimate(&stale_refs, &system, &tools).tokens;
    let sliding = time(runs, || plan::sliding(&ctx, None, Some(TIGHT)).unwrap().cut);
    let cut = plan::sliding(&ctx, None, Some(TIGHT)).unwrap().cut;
    let all = time(runs, || plan::all(&ctx).cut);
    let transcript_ms = time(runs, || transcript::transcript(&ctx[..cut], None).len());
    drop(ctx);
    drop(conv);
    let settings = CompactionSettings::default();
    let whole = time(runs.min(11), || {
        restore(&agent, &log, &context);
        let mut conv = Conversation::open(&agent, "default").unwrap();
        let req = compact::Request {
            trigger: Trigger::Manual,
            mode: Mode::SlidingWindow,
            window: Some(TIGHT),
            settings: &settings,
        };
        compact::compact(&mut conv, &req, &mut Instant0)
            .unwrap()
            .event
            .messages_after
    });
    restore(&agent, &log, &context);

    // End to end: `chat -p` turns.
    run(h, &["supervisor", "start"], None);
    let chat = |text: &str, window: Option<&str>, conversation: &str| {
        let t = Instant::now();
        let o = run(
            h,
            &[
                "chat",
                "-p",
                text,
                "--isolation",
                "off",
                "--conversation",
                conversation,
                "--json",
            ],
            window,
        );
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["stop_reason"], "end_turn", "{v}");
        let compactions = v["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == "compaction")
            .count();
        (ms, compactions)
    };
    // Warm up (the supervisor, the prompt cache).
    chat("warm up", Some(ROOMY), "fresh");
    chat("warm up", Some(ROOMY), "default");
    // The three kinds of turn alternate, round by round.
    let tight = TIGHT.to_string();
    let i = std::cell::Cell::new(0usize);
    let text = || {
        i.set(i.get() + 1);
        format!("hello {}", i.get())
    };
    let rounds = support::alternate(
        turns,
        vec![
            support::Case::new("empty conversation", || {
                let (ms, n) = chat(&text(), Some(ROOMY), "fresh");
                assert_eq!(n, 0);
                ms
            }),
            support::Case::new("many messages, no compaction", || {
                restore(&agent, &log, &context);
                let (ms, n) = chat(&text(), Some(ROOMY), "default");
                assert_eq!(n, 0);
                ms
            }),
            support::Case::new("many messages, one compaction", || {
                restore(&agent, &log, &context);
                let (ms, n) = chat(&text(), Some(&tight), "default");
                assert_eq!(n, 1, "one compaction");
                ms
            }),
        ],
    );
    let (fresh, plain, compacting) = (rounds.median(0), rounds.median(1), rounds.median(2));
    run(h, &["supervisor", "stop"], None);

    println!(
        "context accounting on {MESSAGES} messages (~{total} tokens; medians of {runs} runs, in-process):"
    );
    let rows: Vec<(String, f64, String)> = vec![
        ("load messages.jsonl".into(), load, String::new()),
        (
            "context() (ids → messages)".into(),
            context_read,
            String::new(),
        ),
        ("estimate, usage anchor".into(), anchored, String::new()),
        (
            "estimate, no anchor (every message)".into(),
            unanchored,
            String::new(),
        ),
        (
            format!("sliding plan (window {TIGHT})"),
            sliding,
            format!("cut at {cut}"),
        ),
        ("all plan".into(), all, String::new()),
        (
            format!("transcript of {cut} messages"),
            transcript_ms,
            String::new(),
        ),
        (
            "whole compaction, instant summariser".into(),
            whole,
            "restore, load, plan, write".into(),
        ),
    ];
    for (label, ms, note) in rows {
        let note = if note.is_empty() {
            note
        } else {
            format!("  ({note})")
        };
        println!("  {label:<38} {ms:>9.3} ms{note}");
    }
    println!(
        "one mock turn (`chat -p --isolation off`, {turns} rounds, kinds alternated, medians; ratios of pairs):"
    );
    println!("  {:<38} {fresh:>9.1} ms", "empty conversation");
    println!(
        "  {:<38} {plain:>9.1} ms  ({:.2}× the empty one)",
        format!("{MESSAGES} messages, no compaction"),
        rounds.ratio(1, 0)
    );
    println!(
        "  {:<38} {compacting:>9.1} ms  ({:.2}× without compaction, {:.2}× the empty one)",
        format!("{MESSAGES} messages, compacted first"),
        rounds.ratio(2, 1),
        rounds.ratio(2, 0)
    );
}
