//! Supervisor benchmark: a real background supervisor (`mini-letta supervisor
//! start`) on a temporary home with one agent, then medians and p90s of
//!
//! * (a) a no-op `ping` round trip on the control socket (library client);
//! * (b) a no-op `ping` round trip on a child's channel, as measured inside
//!   the child by `mini-letta-agent channel ping`;
//! * (c) launch → first frame of a child running `true` (isolation off), as
//!   the supervisor records it (`first_frame_us` in `ps`), and the client-side
//!   `child.spawn` round trip;
//! * (d) for comparison, a bare fork+exec of `true` from this process.
//!
//! Run: `cargo bench --bench supervisor` (or `scripts/bench-supervisor`);
//! `--quick` divides the iteration counts by ten. See `docs/supervisor.md`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use mini_letta::protocol::client::Client;
use mini_letta::protocol::events::ChildExit;
use mini_letta::protocol::{Call, Event, ServerFrame, SpawnParams, StdioMode};
use serde_json::Value;

/// Median and p90 of microsecond samples.
fn stats(mut us: Vec<f64>) -> (f64, f64, usize) {
    us.sort_by(|a, b| a.total_cmp(b));
    let pick = |q: f64| us[((us.len() as f64 - 1.0) * q).round() as usize];
    (pick(0.5), pick(0.9), us.len())
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn mini(home: &Path, args: &[&str]) -> Value {
    let o = Command::new(support::bin())
        .args(args)
        .env("MINI_LETTA_HOME", home)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "mini-letta {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Stops the supervisor even when the bench panics half-way.
struct Running<'a>(&'a Path);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let _ = Command::new(support::bin())
            .args(["supervisor", "stop", "--timeout", "5", "--json"])
            .env("MINI_LETTA_HOME", self.0)
            .output();
    }
}

/// Whether `pid` is gone (or a zombie nobody reaped yet).
fn process_gone(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z')),
    }
}

fn spawn_params(agent: &str, argv: Vec<String>) -> Call {
    Call::Spawn(SpawnParams {
        agent: agent.to_string(),
        role: "tool".into(),
        argv,
        stdio: StdioMode::Null,
        workspace: None,
        isolation: Some("off".into()),
        model: None,
    })
}

/// Send a request and wait for its result, keeping `child.exit` events
/// (a short-lived child's exit can arrive before its spawn response).
fn call_keeping_exits(c: &mut Client, call: Call, seen: &mut Vec<ChildExit>) -> Value {
    let id = c.send_request(call).unwrap();
    c.wait_response_keeping_exits(id, seen).unwrap()
}

/// Wait for the `child.exit` events of `children` (the client subscribed).
fn wait_exits(c: &mut Client, children: &[u64], seen: &mut Vec<ChildExit>) {
    while !children
        .iter()
        .all(|id| seen.iter().any(|e| e.child == *id))
    {
        if let ServerFrame::Event(Event::ChildExit(exit)) = c.read_frame().unwrap() {
            seen.push(exit);
        }
    }
}

fn main() {
    support::say_binary();
    let quick = std::env::args().any(|a| a == "--quick");
    let scale = if quick { 10 } else { 1 };
    let pings = 2000 / scale;
    let channel_pings = 2000 / scale;
    let launches = 50usize.div_ceil(scale);
    let t0 = Instant::now();

    let home = tempfile::tempdir().unwrap();
    let agent = mini(home.path(), &["agent", "create", "bench", "--json"])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let started = mini(home.path(), &["supervisor", "start", "--json"]);
    let running = Running(home.path());
    let sup_pid = started["pid"].as_u64().unwrap();

    let socket = home.path().join("run/supervisor.sock");
    let mut c = Client::connect(&socket).unwrap();
    c.set_timeout(Some(Duration::from_secs(30))).unwrap();

    // (a) control-socket ping.
    for _ in 0..100 {
        c.call_json(Call::Ping {}).unwrap();
    }
    let mut ping = Vec::with_capacity(pings);
    for _ in 0..pings {
        let t = Instant::now();
        c.call_json(Call::Ping {}).unwrap();
        ping.push(micros(t.elapsed()));
    }

    c.call_json(Call::Subscribe {}).unwrap();
    let mut exits = Vec::new();

    // (b) channel ping, measured inside a child.
    let out = home.path().join("channel-ping.json");
    let script = format!(
        "exec '{}' channel ping --count {channel_pings} > '{}'",
        support::agent_bin().display(),
        out.display()
    );
    let v = call_keeping_exits(
        &mut c,
        spawn_params(&agent, vec!["sh".into(), "-c".into(), script]),
        &mut exits,
    );
    let child = v["child"].as_u64().unwrap();
    wait_exits(&mut c, &[child], &mut exits);
    let exit = exits.iter().find(|e| e.child == child).unwrap();
    assert_eq!(exit.code(), Some(0), "channel ping child failed: {exit:?}");
    let channel: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();

    // (c) launch → first frame, children running `true`, alternating
    // with (d) a bare fork+exec of `true` from this process (A, B, B, A…
    // so neither always runs first).
    let mut spawn_rt = Vec::with_capacity(launches);
    let mut ids = Vec::with_capacity(launches);
    let mut bare_spawn = Vec::with_capacity(launches);
    let mut bare_total = Vec::with_capacity(launches);
    for round in 0..launches * 2 {
        if (round % 2 == 0) == (round / 2 % 2 == 0) {
            let t = Instant::now();
            let v = call_keeping_exits(
                &mut c,
                spawn_params(&agent, vec!["true".into()]),
                &mut exits,
            );
            spawn_rt.push(micros(t.elapsed()));
            ids.push(v["child"].as_u64().unwrap());
        } else {
            let t = Instant::now();
            let mut child = Command::new("true").spawn().unwrap();
            bare_spawn.push(micros(t.elapsed()));
            assert!(child.wait().unwrap().success());
            bare_total.push(micros(t.elapsed()));
        }
    }
    wait_exits(&mut c, &ids, &mut exits);
    let rows = c.call_json(Call::Ps {}).unwrap();
    let first_frame: Vec<f64> = rows["children"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| ids.contains(&r["id"].as_u64().unwrap_or(0)))
        .filter_map(|r| r["first_frame_us"].as_u64())
        .map(|us| us as f64)
        .collect();
    let failed = exits
        .iter()
        .filter(|e| ids.contains(&e.child) && e.code() != Some(0))
        .count();

    drop(c);
    let t = Instant::now();
    drop(running);
    let stop_took = t.elapsed();
    // The pid file is released just before the process exits: give it a moment.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !process_gone(sup_pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let gone = process_gone(sup_pid);

    println!();
    println!(
        "supervisor benchmark (pid {sup_pid}, {} build, one agent, isolation off)",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    println!();
    println!(
        "{:<54} {:>6} {:>12} {:>12}",
        "measurement", "n", "median µs", "p90 µs"
    );
    println!("{}", "-".repeat(87));
    let row = |name: &str, (median, p90, n): (f64, f64, usize)| {
        println!("{name:<54} {n:>6} {median:>12.1} {p90:>12.1}");
    };
    row("(a) ping round trip, control socket", stats(ping));
    row(
        "(b) ping round trip, child channel (child-measured)",
        (
            channel["median_us"].as_f64().unwrap_or(f64::NAN),
            channel["p90_us"].as_f64().unwrap_or(f64::NAN),
            channel["count"].as_u64().unwrap_or(0) as usize,
        ),
    );
    if first_frame.is_empty() {
        println!("(c) launch → first frame: no child recorded a first frame");
    } else {
        row(
            "(c) launch → first frame (`true`, supervisor-side)",
            stats(first_frame.clone()),
        );
    }
    row(
        "    child.spawn request round trip (client-side)",
        stats(spawn_rt.clone()),
    );
    row(
        "(d) bare fork+exec of `true`: spawn() returns",
        stats(bare_spawn),
    );
    row(
        "    bare fork+exec of `true`: spawn + wait",
        stats(bare_total.clone()),
    );
    println!("{}", "-".repeat(87));
    let pairs = spawn_rt
        .iter()
        .zip(&bare_total)
        .map(|(a, b)| a / b)
        .collect();
    println!(
        "child.spawn round trip / bare spawn + wait, ratio of pairs (median): {:.2}",
        support::median(pairs)
    );
    if first_frame.len() < launches {
        println!(
            "note: {} of {launches} children have no first_frame_us (their exit was recorded before their hello)",
            launches - first_frame.len()
        );
    }
    if failed > 0 {
        println!("note: {failed} `true` children exited non-zero");
    }
    println!(
        "supervisor stopped: {} (`supervisor stop` took {:.0} ms); whole run {:.1} s",
        if gone { "yes" } else { "NO" },
        stop_took.as_secs_f64() * 1000.0,
        t0.elapsed().as_secs_f64()
    );
}
