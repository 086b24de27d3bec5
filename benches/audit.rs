//! What the audit log costs: one scripted turn (a Bash tool call, a memory
//! commit, three model calls) end to end with the log on and off
//! (`MINI_LETTA_AUDIT=off`), medians and their ratio; `audit verify` over
//! 1,000,000 records against `sha256sum` of the same file, alternated;
//! and `usage` over 10,000 and 1,000,000 records.
//!
//! Run: `scripts/bench-audit` (`--quick`: fewer runs and records;
//! `--no-turn`: the log's readers only). `MINI_LETTA_BIN` times another
//! build of the binary (a before/after comparison).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use serde_json::json;
use sha2::{Digest, Sha256};

use support::median;

fn bin() -> String {
    support::bin().display().to_string()
}

fn run(home: &Path, env: &[(&str, &str)], args: &[&str]) {
    let mut c = Command::new(bin());
    c.args(args)
        .env("MINI_LETTA_HOME", home)
        .env_remove("RUST_LOG");
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A script long enough for every turn of the run.
fn script(path: &Path, turns: usize) {
    let mut entries = Vec::new();
    for i in 0..turns {
        entries.push(json!({"tool_calls": [{"name": "Bash", "arguments": {
            "command": format!("printf -- '- fact {i}\\n' >> \"$MEMORY_DIR/human.md\""),
            "description": "note"}}]}));
        entries.push(json!({"tool_calls": [{"name": "memory", "arguments": {
            "command": "commit", "reason": format!("fact {i}")}}]}));
        entries.push(json!({"text": "done"}));
    }
    std::fs::write(path, json!({ "turns": entries }).to_string()).unwrap();
}

/// Median ms of `runs` turns under a supervisor started with `env`.
fn turns(home: &Path, env: &[(&str, &str)], runs: usize) -> f64 {
    run(home, env, &["supervisor", "start"]);
    let times = (0..runs)
        .map(|i| {
            let t = Instant::now();
            run(
                home,
                env,
                &["chat", "-a", "bench", "-p", &format!("turn {i}"), "--json"],
            );
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    run(home, &[], &["supervisor", "stop"]);
    median(times)
}

fn main() {
    support::say_binary();
    let quick = std::env::args().any(|a| a == "--quick");
    if !std::env::args().any(|a| a == "--no-turn") {
        turn_cost(quick);
    }
    readers(quick);
}

fn turn_cost(quick: bool) {
    let (runs, rounds) = if quick { (5, 2) } else { (15, 3) };
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    std::fs::set_permissions(h, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let script_path = h.join("script.json");
    // Reflections after some turns take entries from the same script.
    script(&script_path, (runs * rounds * 2 + 1) * 4);
    let s = script_path.display().to_string();
    run(
        h,
        &[],
        &["agent", "create", "bench", "--model", "mock/scripted"],
    );
    let on = [("MINI_LETTA_SCRIPTED_MODEL", s.as_str())];
    let off = [
        ("MINI_LETTA_SCRIPTED_MODEL", s.as_str()),
        ("MINI_LETTA_AUDIT", "off"),
    ];
    // Alternating rounds, so drift on a shared machine hits both alike.
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        with.push(turns(h, &on, runs));
        without.push(turns(h, &off, runs));
    }
    let (w, wo) = (median(with), median(without));
    println!(
        "one scripted turn (Bash + memory commit + 3 model calls; {runs} runs x {rounds} rounds, medians):"
    );
    println!("  audit log on   {w:>7.1} ms");
    println!("  audit log off  {wo:>7.1} ms");
    println!("  ratio on/off   {:>7.3}", w / wo);
}

/// Records a day in the generated logs: `usage --since` reads one day's
/// records, whatever the log's length.
const PER_DAY: u64 = 5_000;

/// A home whose log holds `n` `model` records over `n / PER_DAY` days up
/// to today (a valid chain, written directly: fast), and the usage
/// summary a supervisor's writer leaves (made from the log by the
/// library's writer, which then appends one more record).
fn big_home(n: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let home = mini_letta::paths::Home::at(dir.path());
    std::fs::create_dir_all(home.audit_dir()).unwrap();
    let days = n.div_ceil(PER_DAY) as i64;
    let first = time::OffsetDateTime::now_utc().date() - time::Duration::days(days);
    let mut out = std::io::BufWriter::with_capacity(
        1 << 20,
        std::fs::File::create(home.audit_log()).unwrap(),
    );
    let mut prev = [0u8; 32];
    let mut line = String::with_capacity(512);
    for i in 0..n {
        let day = first + time::Duration::days((i / PER_DAY) as i64 + 1);
        let secs = (i % PER_DAY) * 86_000 / PER_DAY;
        line.clear();
        use std::fmt::Write as _;
        write!(
            line,
            "{{\"seq\":{},\"prev\":\"{}\",\"time\":\"{day}T{:02}:{:02}:{:02}.000000Z\",\"kind\":\"model\",\"agent\":\"agent-0bf78de8-0291-4270-b0cf-6a31a5c2d62{}\",\"role\":\"agent\",\"duration_ms\":1,\"input_tokens\":{},\"model\":\"mock\",\"outcome\":\"ok\",\"output_tokens\":20,\"purpose\":\"turn\"}}",
            i + 1,
            mini_letta::audit::record::hex(&prev),
            secs / 3600,
            secs / 60 % 60,
            secs % 60,
            i % 4,
            800 + i % 100,
        )
        .unwrap();
        prev = Sha256::digest(line.as_bytes()).into();
        out.write_all(line.as_bytes()).unwrap();
        out.write_all(b"\n").unwrap();
    }
    out.flush().unwrap();
    drop(out);
    let mut w = mini_letta::audit::Writer::open(&home)
        .unwrap()
        .rotate_at(u64::MAX)
        .track_usage();
    w.append(&[mini_letta::audit::Entry::new(
        "start",
        None,
        Some("supervisor"),
    )])
    .unwrap();
    drop(w);
    dir
}

/// Wall time (s) of a command that must succeed.
fn timed(c: &mut Command) -> f64 {
    let t = Instant::now();
    let o = c.output().unwrap();
    let took = t.elapsed().as_secs_f64();
    assert!(
        o.status.success(),
        "{c:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    took
}

fn mini(home: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.args(args)
        .env("MINI_LETTA_HOME", home)
        .env_remove("RUST_LOG");
    c
}

fn readers(quick: bool) {
    let pairs = if quick { 5 } else { 9 };
    let n: u64 = 1_000_000;
    let t = Instant::now();
    let big = big_home(n);
    let log = big.path().join("audit/audit.jsonl");
    let size = std::fs::metadata(&log).unwrap().len() as f64;
    println!(
        "{n} records ({:.0} MB) written in {:.1} s; binary {}",
        size / 1e6,
        t.elapsed().as_secs_f64(),
        bin()
    );
    // Alternated A, B, A, B: drift on a shared machine hits both alike.
    let (mut verify, mut sha, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    timed(&mut mini(big.path(), &["audit", "verify"]));
    for _ in 0..pairs {
        let a = timed(&mut mini(big.path(), &["audit", "verify"]));
        let b = timed(Command::new("sha256sum").arg(&log));
        verify.push(a);
        sha.push(b);
        ratios.push(b / a);
    }
    let (v, s) = (median(verify), median(sha));
    println!("audit verify vs sha256sum over the same file ({pairs} pairs, alternated, medians):");
    println!("  audit verify  {:>7.3} s  {:>6.0} MB/s", v, size / 1e6 / v);
    println!("  sha256sum     {:>7.3} s  {:>6.0} MB/s", s, size / 1e6 / s);
    println!(
        "  throughput of verify / sha256sum (median of per-pair ratios)  {:.3}",
        median(ratios)
    );
    let small = big_home(10_000);
    let today = time::OffsetDateTime::now_utc().date().to_string();
    let runs = if quick { 5 } else { 11 };
    for (what, args) in [
        ("usage", vec!["usage", "--json"]),
        (
            "usage --since today",
            vec!["usage", "--json", "--since", today.as_str()],
        ),
    ] {
        let (mut at_small, mut at_big) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            at_small.push(timed(&mut mini(small.path(), &args)) * 1000.0);
            at_big.push(timed(&mut mini(big.path(), &args)) * 1000.0);
        }
        let (a, b) = (median(at_small), median(at_big));
        println!(
            "{what:<20} 10,000 records {a:>8.1} ms   1,000,000 records {b:>8.1} ms   ratio {:>6.2}",
            b / a
        );
    }
}
