//! What the audit log costs: one scripted turn (a Bash tool call, a memory
//! commit, three model calls) end to end with the log on and off
//! (`MINI_LETTA_AUDIT=off`), medians and their ratio; and `audit verify`
//! over 1,000,000 records.
//!
//! Run: `scripts/bench-audit` (`--quick` for fewer runs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use serde_json::json;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_mini-letta")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
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
    let quick = std::env::args().any(|a| a == "--quick");
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

    let n: u64 = if quick { 200_000 } else { 1_000_000 };
    let big = tempfile::tempdir().unwrap();
    let bh = mini_letta::paths::Home::at(big.path());
    let mut writer = mini_letta::audit::Writer::open(&bh)
        .unwrap()
        .rotate_at(u64::MAX);
    let t = Instant::now();
    let mut batch = Vec::with_capacity(10_000);
    for i in 0..n {
        batch.push(
            mini_letta::audit::Entry::new(
                "model",
                Some("agent-0bf78de8-0291-4270-b0cf-6a31a5c2d629"),
                Some("agent"),
            )
            .with("model", "mock")
            .with("purpose", "turn")
            .with("input_tokens", 800 + i % 100)
            .with("output_tokens", 20)
            .with("outcome", "ok")
            .with("duration_ms", 1),
        );
        if batch.len() == 10_000 {
            writer.append(&batch).unwrap();
            batch.clear();
        }
    }
    writer.append(&batch).unwrap();
    let wrote = t.elapsed().as_secs_f64();
    let size = std::fs::metadata(bh.audit_log()).unwrap().len();
    let t = Instant::now();
    let report = mini_letta::audit::verify::verify(&bh, None).unwrap();
    let took = t.elapsed().as_secs_f64();
    assert!(report.ok() && report.records == n);
    let t = Instant::now();
    run(big.path(), &[], &["audit", "verify"]);
    let cli = t.elapsed().as_secs_f64();
    println!(
        "audit verify over {n} records ({:.0} MB): {took:.2} s in-process, {cli:.2} s as `mini-letta audit verify` (written in {wrote:.1} s)",
        size as f64 / 1e6
    );
}
