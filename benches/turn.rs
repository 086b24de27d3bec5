//! One mock turn end to end — CLI → supervisor → confined agent child →
//! supervisor (model, commit) — and its split: the CLI process alone, the
//! child's launch to first frame, one `model.complete` round trip, and the
//! remainder (turn loop, prompt compile, conversation writes, pipes).
//!
//! Run: `cargo bench --bench turn` (or `scripts/bench-turn`); `--quick`
//! for fewer runs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use mini_letta::paths::Home;
use mini_letta::protocol::Call;
use mini_letta::protocol::client::Client;
use serde_json::json;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_mini-letta")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn run(home: &Path, args: &[&str]) -> std::process::Output {
    let o = Command::new(bin())
        .args(args)
        .env("MINI_LETTA_HOME", home)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let runs = if quick { 5 } else { 20 };
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    run(h, &["agent", "create", "bench"]);
    // The coarse split times a cold child's launch to its first frame: no
    // warm children for it (the breakdown below has them).
    let started = Command::new(bin())
        .args(["supervisor", "start"])
        .env("MINI_LETTA_HOME", h)
        .env("MINI_LETTA_WARM_CHILDREN", "0")
        .status()
        .unwrap();
    assert!(started.success());
    let mut c = Client::connect(&Home::at(h).supervisor_socket()).unwrap();

    let cli_only: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            run(h, &["ps", "--json"]);
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    let model_rtt: Vec<f64> = (0..runs * 10)
        .map(|_| {
            let t = Instant::now();
            c.call(Call::ModelComplete {
                request: json!({"model": "mock", "system": "S", "messages": [{"role": "user", "parts": [{"type": "text", "text": "hi"}]}]}),
            })
            .unwrap();
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    let rootless = !nix::unistd::geteuid().is_root();
    let mut lines = Vec::new();
    for iso in ["strict", "off"] {
        if iso == "strict" && rootless {
            lines.push("strict: SKIPPED (needs root for per-agent uids)".to_string());
            continue;
        }
        let turns: Vec<f64> = (0..runs)
            .map(|i| {
                let t = Instant::now();
                run(
                    h,
                    &[
                        "chat",
                        "-p",
                        &format!("hello {i}"),
                        "--isolation",
                        iso,
                        "--json",
                    ],
                );
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        let ps = c.call(Call::Ps {}).unwrap();
        let first: Vec<f64> = ps["children"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .take(runs)
            .filter_map(|r| r["first_frame_us"].as_f64().map(|u| u / 1000.0))
            .collect();
        let (t, f, m, cli) = (
            median(turns),
            median(first),
            median(model_rtt.clone()),
            median(cli_only.clone()),
        );
        lines.push(format!(
            "{iso:<7} whole turn {t:>7.1} ms = CLI process {cli:>5.1} + child launch→first frame {f:>5.1} + model.complete {m:>5.2} + rest {:>5.1}",
            t - cli - f - m
        ));
    }
    println!("one mock turn (`chat -p`, {runs} runs each, medians; cold children):");
    for l in lines {
        println!("  {l}");
    }
    let iso = if rootless { "off" } else { "strict" };
    run(h, &["supervisor", "stop"]);
    run(h, &["supervisor", "start"]);
    // Turns a moment apart (a person, a script that does something
    // between calls): the agent's warm child is parked by then.
    let apart = breakdown(h, runs, iso, PAUSE);
    let back_to_back = breakdown(h, runs, iso, std::time::Duration::ZERO);
    run(h, &["supervisor", "stop"]);
    let embedded = breakdown(h, runs, iso, PAUSE);
    print_breakdown(runs, iso, &[&apart, &back_to_back, &embedded]);
}

/// The pause between turns "a moment apart".
const PAUSE: std::time::Duration = std::time::Duration::from_millis(300);

/// The phases of a turn: from one mark to the next (see
/// `protocol::timings`; the first mark of that name in the turn).
const PHASES: &[(&str, &str, &str)] = &[
    ("CLI start, supervisor connect", "cli.main", "cli.connected"),
    ("request to the supervisor", "cli.connected", "sup.received"),
    (
        "turn checks, conversation slot",
        "sup.received",
        "sup.slot_taken",
    ),
    (
        "child plan (record, uid, cgroup)",
        "sup.slot_taken",
        "sup.child_planned",
    ),
    (
        "fork, exec of the stage",
        "sup.child_planned",
        "stage.start",
    ),
    ("  namespaces, mounts", "stage.start", "stage.namespaces"),
    ("  landlock", "stage.namespaces", "stage.landlock"),
    ("  seccomp", "stage.landlock", "stage.seccomp"),
    ("  hello, exec of the agent", "stage.seccomp", "agent.main"),
    (
        "warm child: turn handed over",
        "sup.slot_taken",
        "sup.handed_over",
    ),
    ("  handover read by it", "sup.handed_over", "agent.handover"),
    ("  input, record", "agent.handover", "agent.loaded"),
    ("agent start (input, record)", "agent.main", "agent.loaded"),
    (
        "conversation, context open",
        "agent.loaded",
        "agent.context_open",
    ),
    (
        "user message logged",
        "agent.context_open",
        "agent.user_logged",
    ),
    (
        "prompt, request built",
        "agent.user_logged",
        "agent.request_built",
    ),
    (
        "request stored, compaction check",
        "agent.request_built",
        "agent.model_asked",
    ),
    (
        "model call (through the supervisor)",
        "agent.model_asked",
        "agent.model_answered",
    ),
    (
        "response logged",
        "agent.model_answered",
        "agent.response_logged",
    ),
    (
        "after the turn (memory check)",
        "agent.response_logged",
        "agent.done",
    ),
    ("child exit, reaped", "agent.done", "sup.child_exited"),
    ("sync, reflection check", "sup.child_exited", "sup.answered"),
    ("answer back to the CLI", "sup.answered", "cli.answered"),
    ("whole turn (to the answer)", "cli.main", "cli.answered"),
];

/// Medians of each phase over `runs` one-shot turns with `--timings`,
/// `pause` apart. A phase a turn did not go through (a warm child's turn
/// has no stage) counts only where it happened.
fn breakdown(h: &Path, runs: usize, iso: &str, pause: std::time::Duration) -> Vec<f64> {
    let mut per_phase: Vec<Vec<f64>> = vec![Vec::new(); PHASES.len()];
    for i in 0..runs {
        std::thread::sleep(pause);
        let o = run(
            h,
            &[
                "chat",
                "-p",
                &format!("timed {i}"),
                "--isolation",
                iso,
                "--json",
                "--timings",
            ],
        );
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let marks = doc["timings"]["marks"].as_array().unwrap();
        let at = |name: &str| {
            marks
                .iter()
                .find(|m| m["name"] == name)
                .and_then(|m| m["at_us"].as_f64())
        };
        for (k, (_, from, to)) in PHASES.iter().enumerate() {
            if let (Some(a), Some(b)) = (at(from), at(to)) {
                per_phase[k].push((b - a) / 1000.0);
            }
        }
    }
    per_phase
        .into_iter()
        .map(|v| if v.is_empty() { f64::NAN } else { median(v) })
        .collect()
}

fn print_breakdown(runs: usize, iso: &str, columns: &[&[f64]]) {
    println!(
        "phases of one turn (`chat -p --timings`, isolation {iso}, {runs} runs, medians in ms; \
         daemon turns {} ms apart and back to back; \"-\": not on that path):",
        PAUSE.as_millis()
    );
    println!(
        "  {:<38} {:>9} {:>9} {:>9}",
        "phase", "daemon", "b-to-b", "embedded"
    );
    for (k, (label, _, _)) in PHASES.iter().enumerate() {
        let cell = |c: &[f64]| {
            if c[k].is_nan() {
                "-".to_string()
            } else {
                format!("{:.2}", c[k])
            }
        };
        println!(
            "  {label:<38} {:>9} {:>9} {:>9}",
            cell(columns[0]),
            cell(columns[1]),
            cell(columns[2])
        );
    }
}
