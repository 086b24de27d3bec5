//! One mock turn end to end — CLI → supervisor → confined agent child →
//! supervisor (model, commit) — and its split: the CLI process alone, the
//! child's launch to first frame, one `model.complete` round trip, and the
//! remainder (turn loop, prompt compile, conversation writes, pipes).
//!
//! Then the same breakdown for `memory` commands (a write, and reads) and
//! `sandbox run`, from their `--timings` tables.
//!
//! Run: `cargo bench --bench turn` (or `scripts/bench-turn`); `--quick`
//! for fewer runs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use mini_letta::paths::Home;
use mini_letta::protocol::Call;
use mini_letta::protocol::client::Client;
use serde_json::json;

use support::{bin, median};

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
    support::say_binary();
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
            c.call_json(Call::ModelComplete {
                request: json!({"model": "mock", "system": "S", "messages": [{"role": "user", "parts": [{"type": "text", "text": "hi"}]}]}),
            })
            .unwrap();
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    // Strict and off alternate, turn by turn; each turn's child's launch
    // → first frame is read from the child table after it.
    let mut first: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut turn = |k: usize, iso: &str, i: usize, c: &mut Client| {
        let ms = support::time_ms(|| {
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
        });
        let ps = c.call_json(Call::Ps {}).unwrap();
        let newest = ps["children"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["role"] == "agent")
            .max_by_key(|r| r["id"].as_u64().unwrap_or(0))
            .and_then(|r| r["first_frame_us"].as_f64());
        first[k].extend(newest.map(|u| u / 1000.0));
        ms
    };
    let counter = std::cell::Cell::new(0usize);
    let client = std::cell::RefCell::new(c);
    let turn = std::cell::RefCell::new(&mut turn);
    let rounds = support::alternate(
        runs,
        vec![
            support::Case::new("strict", || {
                counter.set(counter.get() + 1);
                (turn.borrow_mut())(0, "strict", counter.get(), &mut client.borrow_mut())
            }),
            support::Case::new("off", || {
                counter.set(counter.get() + 1);
                (turn.borrow_mut())(1, "off", counter.get(), &mut client.borrow_mut())
            }),
        ],
    );
    drop(client);
    let mut lines = Vec::new();
    for (k, iso) in ["strict", "off"].into_iter().enumerate() {
        let (t, f, m, cli) = (
            rounds.median(k),
            median(first[k].clone()),
            median(model_rtt.clone()),
            median(cli_only.clone()),
        );
        lines.push(format!(
            "{iso:<7} whole turn {t:>7.1} ms = CLI process {cli:>5.1} + child launch→first frame {f:>5.1} + model.complete {m:>5.2} + rest {:>5.1}",
            t - cli - f - m
        ));
    }
    lines.push(format!(
        "strict / off, ratio of pairs: {:.3}",
        rounds.ratio(0, 1)
    ));
    println!("one mock turn (`chat -p`, {runs} runs each, medians; cold children):");
    for l in lines {
        println!("  {l}");
    }
    let iso = "strict";
    run(h, &["supervisor", "stop"]);
    run(h, &["supervisor", "start"]);
    // Turns a moment apart (a person, a script that does something
    // between calls): the agent's warm child is parked by then.
    let apart = breakdown(h, runs, iso, PAUSE);
    let back_to_back = breakdown(h, runs, iso, std::time::Duration::ZERO);
    run(h, &["supervisor", "stop"]);
    let embedded = breakdown(h, runs, iso, PAUSE);
    print_breakdown(runs, iso, &[&apart, &back_to_back, &embedded]);
    commands(h, runs, iso);
    as_users(runs);
}

/// The user these runs become (created with `useradd` when missing).
const BENCH_USER: &str = "mini-letta-bench";

/// A one-shot turn (`chat -p`, embedded supervisor, strict) as root, and as
/// an ordinary user with per-agent uids from its subordinate range and
/// without them: each in a home of its own, medians and ratios to root's.
fn as_users(runs: usize) {
    use std::os::unix::fs::PermissionsExt;
    if !nix::unistd::geteuid().is_root() {
        println!("one-shot turn as root vs as a user: SKIPPED (needs root to become a user)");
        return;
    }
    if !Command::new("id")
        .arg(BENCH_USER)
        .output()
        .unwrap()
        .status
        .success()
    {
        let made = Command::new("useradd")
            .args([
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                BENCH_USER,
            ])
            .status()
            .unwrap();
        assert!(made.success(), "useradd {BENCH_USER}");
    }
    let uid: u32 = String::from_utf8_lossy(
        &Command::new("id")
            .args(["-u", BENCH_USER])
            .output()
            .unwrap()
            .stdout,
    )
    .trim()
    .parse()
    .unwrap();
    // Programs and homes the user can reach (the build's may be private).
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    for name in ["mini-letta", "mini-letta-agent", "mini-letta-stage2"] {
        let to = d.join(name);
        std::fs::copy(bin().with_file_name(name), &to).unwrap();
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let user_home = d.join("u");
    std::fs::create_dir(&user_home).unwrap();
    std::fs::set_permissions(&user_home, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::os::unix::fs::chown(&user_home, Some(uid), Some(uid)).unwrap();
    let exe = d.join("mini-letta");
    let one = |who: &str, home: &Path, disable: &str, args: &[&str]| {
        let mut cmd = if who == "root" {
            Command::new(&exe)
        } else {
            let mut c = Command::new("runuser");
            c.args(["-u", BENCH_USER, "--", "env"])
                .arg(format!("HOME={}", user_home.display()))
                .arg(&exe);
            c
        };
        let o = cmd
            .args(args)
            .env("MINI_LETTA_HOME", home)
            .env("MINI_LETTA_SANDBOX_DISABLE", disable)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{who} {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        o
    };
    let mut rows = Vec::new();
    for (label, who, disable) in [
        ("root", "root", ""),
        ("user, per-agent uids", "user", ""),
        ("user, shared uid", "user", "subids"),
    ] {
        let home = user_home.join(format!("home-{}", rows.len()));
        one(who, &home, disable, &["agent", "create", "b"]);
        let status = one(who, &home, disable, &["sandbox", "status", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
        let backend = v["backend"].as_str().unwrap_or("?").to_string();
        let turns: Vec<f64> = (0..runs)
            .map(|i| {
                let t = Instant::now();
                one(
                    who,
                    &home,
                    disable,
                    &["chat", "-a", "b", "-p", &format!("hi {i}")],
                );
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        let cli: Vec<f64> = (0..runs)
            .map(|_| {
                let t = Instant::now();
                one(who, &home, disable, &["agent", "list"]);
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        rows.push((label, backend, median(turns), median(cli)));
    }
    let root = rows[0].2;
    println!("one-shot turn (`chat -p`, embedded supervisor, strict, {runs} runs, medians):");
    for (label, backend, turn, cli) in &rows {
        println!(
            "  {label:<22} {turn:>7.1} ms ({:.2}× root's)   `agent list` {cli:>5.1} ms   layers {backend}",
            turn / root
        );
    }
}

/// `memory` commands and `sandbox run`, each with `--timings`, with a
/// running supervisor and without.
fn commands(h: &Path, runs: usize, iso: &str) {
    let memory = |label: &str, args: &dyn Fn(usize) -> Vec<String>| -> (String, Vec<Timeline>) {
        let lines = (0..runs)
            .map(|i| {
                let mut a = args(i);
                a.push("--timings".into());
                let a: Vec<&str> = a.iter().map(String::as_str).collect();
                timeline(&run(h, &a).stderr)
            })
            .collect();
        (label.to_string(), lines)
    };
    let insert = |i: usize| -> Vec<String> {
        ["memory", "insert", "human.md", "--text"]
            .iter()
            .map(|s| s.to_string())
            .chain([format!("timed line {i}")])
            .collect()
    };
    let read = |what: &'static str| {
        move |_| -> Vec<String> {
            let mut a = vec!["memory".to_string(), what.to_string()];
            if what == "show" {
                a.push("human.md".into());
            }
            a
        }
    };
    let sandbox = |i: usize| -> Vec<String> {
        ["sandbox", "run", "--isolation", iso, "--json", "--", "echo"]
            .iter()
            .map(|s| s.to_string())
            .chain([i.to_string()])
            .collect()
    };
    let sandbox_runs = || -> Vec<Vec<(String, f64)>> {
        (0..runs)
            .map(|i| {
                let a = sandbox(i);
                let mut a: Vec<&str> = a.iter().map(String::as_str).collect();
                a.insert(2, "--timings");
                let o = run(h, &a);
                let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
                doc["timings"]["marks"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| {
                        (
                            m["name"].as_str().unwrap().to_string(),
                            m["at_us"].as_f64().unwrap() / 1000.0,
                        )
                    })
                    .collect()
            })
            .collect()
    };
    let cold = [
        memory("insert", &insert),
        memory("show", &read("show")),
        memory("tree", &read("tree")),
        memory("status", &read("status")),
    ];
    let sandbox_embedded = sandbox_runs();
    run(h, &["supervisor", "start"]);
    let warm = [
        memory("insert (daemon)", &insert),
        memory("show (daemon)", &read("show")),
    ];
    let sandbox_daemon = sandbox_runs();
    run(h, &["supervisor", "stop"]);
    println!(
        "memory commands (`--timings`, {runs} runs, medians in ms from the mark before; \
         without a supervisor, and with one running):"
    );
    for (label, lines) in cold.iter().chain(warm.iter()) {
        print_timeline(label, lines);
    }
    print_sandbox(runs, iso, &sandbox_daemon, &sandbox_embedded);
}

/// One command's `--timings` table: the marks and milliseconds since the
/// first, in time order.
type Timeline = Vec<(String, f64)>;

fn timeline(stderr: &[u8]) -> Timeline {
    let text = String::from_utf8_lossy(stderr);
    let table = text
        .split_once("timings (ms):")
        .map(|(_, t)| t)
        .unwrap_or_else(|| panic!("no timings table in: {text}"));
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let at: f64 = f.next()?.parse().ok()?;
            let _since_before = f.next()?;
            Some((f.next()?.to_string(), at))
        })
        .collect()
}

/// The median gap before each mark (in the first run's order), and the
/// whole.
fn print_timeline(label: &str, lines: &[Timeline]) {
    let Some(first) = lines.first() else {
        return;
    };
    let gap = |line: &Timeline, name: &str| -> Option<f64> {
        let k = line.iter().position(|(n, _)| n == name)?;
        Some(line[k].1 - line[k.checked_sub(1)?].1)
    };
    let whole = median(lines.iter().filter_map(|l| l.last().map(|m| m.1)).collect());
    println!("  {label}: {whole:.2} ms");
    for (name, _) in first.iter().skip(1) {
        let gaps: Vec<f64> = lines.iter().filter_map(|l| gap(l, name)).collect();
        if !gaps.is_empty() {
            println!("    {:<34} {:>7.2}", format!("→ {name}"), median(gaps));
        }
    }
}

/// The phases of `sandbox run -- echo N`, from its marks.
const SANDBOX_PHASES: &[(&str, &str, &str)] = &[
    ("CLI start, session open", "cli.main", "cli.connected"),
    (
        "request to the supervisor",
        "cli.connected",
        "sup.spawn_received",
    ),
    (
        "child plan (record, uid, cgroup)",
        "sup.spawn_received",
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
    ("  hello heard", "stage.seccomp", "sup.child_hello"),
    (
        "command runs, exits, reaped",
        "sup.child_hello",
        "sup.child_exited",
    ),
    (
        "exit recorded, announced",
        "sup.child_exited",
        "sup.exit_announced",
    ),
    ("exit to the CLI", "sup.exit_announced", "cli.exited"),
    ("whole (to the exit)", "cli.main", "cli.exited"),
];

fn print_sandbox(runs: usize, iso: &str, daemon: &[Timeline], embedded: &[Timeline]) {
    let medians = |lines: &[Timeline], from: &str, to: &str| -> String {
        let at = |l: &Timeline, n: &str| l.iter().find(|(m, _)| m == n).map(|m| m.1);
        let v: Vec<f64> = lines
            .iter()
            .filter_map(|l| Some(at(l, to)? - at(l, from)?))
            .collect();
        if v.is_empty() {
            "-".into()
        } else {
            format!("{:.2}", median(v))
        }
    };
    println!("`sandbox run --timings -- echo N` (isolation {iso}, {runs} runs, medians in ms):");
    println!("  {:<38} {:>9} {:>9}", "phase", "daemon", "embedded");
    for (label, from, to) in SANDBOX_PHASES {
        println!(
            "  {label:<38} {:>9} {:>9}",
            medians(daemon, from, to),
            medians(embedded, from, to)
        );
    }
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
