//! Multi-tenant load (`scripts/load-tenants`): one supervisor, many agents
//! (default 500), many turns at once (default 50) on the mock model.
//!
//! Phases, each measured by the turn latency its clients see:
//! 1. idle — turns one at a time (the baseline);
//! 2. load — `--concurrency` clients; one turn in five is an isolation
//!    probe: the agent's own shell tool tries to read another tenant's
//!    secret, list the supervisor's run directory and read the other's
//!    record; any of it in the answer is an isolation failure;
//! 3. hostile — the same load while one tenant runs a fork bomb, another
//!    allocates without bound, and a third floods the egress proxy with
//!    refused requests (each one an attempt at an audit record); the first
//!    two must stay inside their cgroup limits (pids, memory), the third
//!    inside its rates (connections a second, audit records a second),
//!    while the others keep their latency.
//!
//! Also sampled: the supervisor's resident memory and CPU time. Bounded by
//! `--seconds` (default 600). Needs root (agent uids, cgroups). Exits 1 on
//! an isolation failure or an uncontained tenant.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "../tests/common/mod.rs"]
mod common;

use common::{bin, run};

struct Args {
    agents: usize,
    concurrency: usize,
    turns: usize,
    seconds: u64,
    /// `--agent-cpu-percent N`: the agent role's CPU bandwidth for this run
    /// (a profile override in the home), to weigh containment against speed.
    agent_cpu_percent: Option<u64>,
}

fn args() -> Args {
    let mut a = Args {
        agents: 500,
        concurrency: 50,
        turns: 400,
        seconds: 600,
        agent_cpu_percent: None,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let value = argv.get(i + 1).and_then(|v| v.parse::<u64>().ok());
        match (argv[i].as_str(), value) {
            ("--agents", Some(v)) => a.agents = v.max(3) as usize,
            ("--concurrency", Some(v)) => a.concurrency = v.max(1) as usize,
            ("--turns", Some(v)) => a.turns = v.max(1) as usize,
            ("--seconds", Some(v)) => a.seconds = v.max(10),
            ("--agent-cpu-percent", Some(v)) => a.agent_cpu_percent = Some(v.max(1)),
            // cargo bench passes `--bench`; anything else is ignored too.
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    a
}

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn summary(name: &str, lat: &mut [f64]) -> (f64, f64) {
    lat.sort_by(|a, b| a.total_cmp(b));
    let (p50, p99) = (percentile(lat, 0.5), percentile(lat, 0.99));
    println!(
        "  {name:<8} {:>5} turns  p50 {p50:>7.1} ms  p99 {p99:>7.1} ms",
        lat.len()
    );
    (p50, p99)
}

/// One turn by the CLI; its latency, or why it failed.
fn turn(home: &Path, agent: &str, text: &str) -> Result<(f64, String), String> {
    let started = Instant::now();
    let o = Command::new(bin())
        .env("MINI_LETTA_HOME", home)
        .env_remove("RUST_LOG")
        .args(["chat", "-a", agent, "-p", text])
        .output()
        .map_err(|e| e.to_string())?;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    if o.status.success() {
        Ok((ms, out))
    } else {
        let err = String::from_utf8_lossy(&o.stderr);
        Err(err.lines().last().unwrap_or("").to_string())
    }
}

struct Tenants {
    home: PathBuf,
    /// (name, id)
    agents: Vec<(String, String)>,
}

#[derive(Default)]
struct Phase {
    latencies: Mutex<Vec<f64>>,
    acknowledged: AtomicUsize,
    failed: AtomicUsize,
    probes: AtomicUsize,
    isolation_failures: Mutex<Vec<String>>,
    errors: Mutex<Vec<String>>,
}

/// `turns` turns from `concurrency` clients; tenants in `exclude` are left
/// alone (the hostile ones).
fn load(t: &Tenants, concurrency: usize, turns: usize, exclude: &[usize], seed: u64) -> Phase {
    let phase = Arc::new(Phase::default());
    let next = Arc::new(AtomicUsize::new(0));
    let t = Arc::new((t.home.clone(), t.agents.clone()));
    let workers: Vec<_> = (0..concurrency)
        .map(|w| {
            let (phase, next, t) = (phase.clone(), next.clone(), t.clone());
            let exclude = exclude.to_vec();
            std::thread::spawn(move || {
                let mut rng = Rng(seed ^ (w as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                let (home, agents) = (&t.0, &t.1);
                loop {
                    let k = next.fetch_add(1, Ordering::SeqCst);
                    if k >= turns {
                        break;
                    }
                    let pick = |rng: &mut Rng| loop {
                        let i = rng.below(agents.len());
                        if !exclude.contains(&i) {
                            return i;
                        }
                    };
                    let a = pick(&mut rng);
                    let (name, _) = &agents[a];
                    if k % 5 == 4 {
                        // An isolation probe against another tenant.
                        let mut b = pick(&mut rng);
                        if b == a {
                            b = (a + 1) % agents.len();
                        }
                        let (_, other) = &agents[b];
                        let dir = home.join("agents").join(other);
                        let cmd = format!(
                            "run: cat {dir}/memory/human.md; ls -a {run}; cat {dir}/agent.json; ls /proc",
                            dir = dir.display(),
                            run = home.join("run").display()
                        );
                        phase.probes.fetch_add(1, Ordering::SeqCst);
                        match turn(home, name, &cmd) {
                            Ok((ms, out)) => {
                                phase.latencies.lock().unwrap().push(ms);
                                let leaked = [
                                    format!("secret-{other}"),
                                    "supervisor.sock".to_string(),
                                    format!("\"id\": \"{other}\""),
                                ];
                                if let Some(l) = leaked.iter().find(|l| out.contains(l.as_str())) {
                                    phase
                                        .isolation_failures
                                        .lock()
                                        .unwrap()
                                        .push(format!("{name} saw {l:?} of {other}"));
                                }
                            }
                            Err(e) => {
                                phase.failed.fetch_add(1, Ordering::SeqCst);
                                phase.errors.lock().unwrap().push(e);
                            }
                        }
                    } else {
                        match turn(home, name, &format!("记住: load fact {seed}-{k}")) {
                            Ok((ms, out)) if out.contains("已更新记忆") => {
                                phase.latencies.lock().unwrap().push(ms);
                                phase.acknowledged.fetch_add(1, Ordering::SeqCst);
                            }
                            Ok((_, out)) => {
                                phase.failed.fetch_add(1, Ordering::SeqCst);
                                phase.errors.lock().unwrap().push(out);
                            }
                            Err(e) => {
                                phase.failed.fetch_add(1, Ordering::SeqCst);
                                phase.errors.lock().unwrap().push(e);
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    Arc::try_unwrap(phase).unwrap_or_default()
}

/// The supervisor's resident memory (kB) and CPU time (ms).
fn supervisor_usage(home: &Path) -> Option<(u64, u64)> {
    let pid: u32 = std::fs::read_to_string(home.join("run/supervisor.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit(')').next()?.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as u64;
    Some((rss, ticks * 1000 / hz))
}

/// A cgroup value of an agent's `agent` role, if the controller is there.
fn cgroup_value(controller: &str, agent: &str, file: &str) -> Option<u64> {
    std::fs::read_to_string(format!(
        "/sys/fs/cgroup/{controller}/mini-letta/{agent}/agent/{file}"
    ))
    .ok()?
    .trim()
    .parse()
    .ok()
}

/// A tool command that opens connections to the proxy as fast as it can,
/// each a request for a host on no list (refused, and each refusal an
/// attempt at an audit record), until its turn is cancelled.
const EGRESS_FLOOD: &str = "run: python3 -c \"import socket; \
[(lambda s: (s.sendall(b'GET http://not-listed.example/ HTTP/1.1\\r\\nHost: not-listed.example\\r\\n\\r\\n'), \
s.recv(99), s.close()))(socket.create_connection(('127.0.0.1', 3128))) for _ in iter(int, 1)]\"";

/// Bytes in the home's audit log files.
fn audit_size(home: &Path) -> u64 {
    std::fs::read_dir(home.join("audit"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Agent `id`'s refused egress requests in the audit log: (records, the
/// refusals they account for).
fn denials_of(home: &Path, id: &str) -> (u64, u64) {
    let text = std::fs::read_to_string(home.join("audit/audit.jsonl")).unwrap_or_default();
    let mut records = 0;
    let mut refused = 0;
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["kind"] != "denied" || v["method"] != "egress" || v["agent"] != id {
            continue;
        }
        records += 1;
        refused += match v["suppressed"].as_u64() {
            Some(n) => n,
            None => 1 + v["suppressed_before"].as_u64().unwrap_or(0),
        };
    }
    (records, refused)
}

fn spawn_hostile(home: &Path, agent: &str, text: &str) -> Child {
    Command::new(bin())
        .env("MINI_LETTA_HOME", home)
        .env_remove("RUST_LOG")
        .args(["chat", "-a", agent, "-p", text])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn main() -> ExitCode {
    let a = args();
    if !nix::unistd::geteuid().is_root() {
        eprintln!("load-tenants needs root (agent uids, cgroups)");
        return ExitCode::FAILURE;
    }
    let deadline = Instant::now() + Duration::from_secs(a.seconds);
    let home = common::open_home();
    let h = home.path().to_path_buf();
    println!(
        "load-tenants: {} agents, {} clients, {} turns per phase",
        a.agents, a.concurrency, a.turns
    );
    let started = Instant::now();
    let mut agents = Vec::new();
    for n in 0..a.agents {
        let name = format!("t{n:04}");
        let id = common::create_agent(&h, &[&name]);
        let o = run(
            &h,
            &[
                "memory",
                "insert",
                "-a",
                &id,
                "human.md",
                "--text",
                &format!("- secret-{id}"),
            ],
        );
        assert!(o.status.success(), "{}", common::stderr(&o));
        agents.push((name, id));
    }
    println!(
        "  setup    {} agents with a secret each in {:.1} s",
        a.agents,
        started.elapsed().as_secs_f64()
    );
    if let Some(pct) = a.agent_cpu_percent {
        let builtin = include_str!("../sandbox-profiles/agent.toml");
        let text: String = builtin
            .lines()
            .map(|l| {
                if l.starts_with("cpu_percent") {
                    format!("cpu_percent = {pct}\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        let dir = mini_letta::paths::Home::at(&h).sandbox_profiles_dir();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("agent.toml"), text).unwrap();
        println!("  agent role CPU bandwidth: {pct}% of a core");
    }
    let o = run(&h, &["supervisor", "start"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let t = Tenants {
        home: h.clone(),
        agents,
    };
    let usage0 = supervisor_usage(&h);

    // 1. Idle: one at a time.
    let idle = load(&t, 1, 40.min(a.turns), &[], 1);
    let (_, idle_p99) = summary("idle", &mut idle.latencies.lock().unwrap());

    // 2. Load.
    let normal = load(&t, a.concurrency, a.turns, &[], 2);
    let (_, load_p99) = summary("load", &mut normal.latencies.lock().unwrap());
    let usage1 = supervisor_usage(&h);

    // 3. Hostile tenants under the same load.
    let (bomb, hog, flood) = (0usize, 1usize, 2usize);
    let audit_before = audit_size(&h);
    let peak_pids = Arc::new(AtomicU64::new(0));
    let peak_mem = Arc::new(AtomicU64::new(0));
    // The limits as seen while the cgroups exist (they go when the
    // hostile commands end, which may be before the phase does).
    let seen_pids_limit = Arc::new(AtomicU64::new(0));
    let seen_mem_limit = Arc::new(AtomicU64::new(0));
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (peak_pids, peak_mem, sampling) =
            (peak_pids.clone(), peak_mem.clone(), sampling.clone());
        let (pids_limit, mem_limit) = (seen_pids_limit.clone(), seen_mem_limit.clone());
        let (bomb_id, hog_id) = (t.agents[bomb].1.clone(), t.agents[hog].1.clone());
        std::thread::spawn(move || {
            while sampling.load(Ordering::SeqCst) {
                if let Some(p) = cgroup_value("pids", &bomb_id, "pids.current") {
                    peak_pids.fetch_max(p, Ordering::SeqCst);
                }
                if let Some(l) = cgroup_value("pids", &bomb_id, "pids.max") {
                    pids_limit.store(l, Ordering::SeqCst);
                }
                if let Some(m) = cgroup_value("memory", &hog_id, "memory.usage_in_bytes") {
                    peak_mem.fetch_max(m, Ordering::SeqCst);
                }
                if let Some(l) = cgroup_value("memory", &hog_id, "memory.limit_in_bytes") {
                    mem_limit.store(l, Ordering::SeqCst);
                }
                if let Some(m) = cgroup_value("memory", &hog_id, "memory.max_usage_in_bytes") {
                    peak_mem.fetch_max(m, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let mut hostile = vec![
        spawn_hostile(&h, &t.agents[bomb].0, "run: f(){ f | f & }; f"),
        spawn_hostile(&h, &t.agents[hog].0, "run: tail /dev/zero"),
        spawn_hostile(&h, &t.agents[flood].0, EGRESS_FLOOD),
    ];
    let flood_started = Instant::now();
    // Let both get going before the others' turns are measured.
    std::thread::sleep(Duration::from_secs(2));
    let under_attack = if Instant::now() < deadline {
        load(&t, a.concurrency, a.turns, &[bomb, hog, flood], 3)
    } else {
        Phase::default()
    };
    let (_, hostile_p99) = summary("hostile", &mut under_attack.latencies.lock().unwrap());
    sampling.store(false, Ordering::SeqCst);
    let _ = sampler.join();
    let known = |v: &AtomicU64| Some(v.load(Ordering::SeqCst)).filter(|l| *l > 0);
    let pids_limit = known(&seen_pids_limit);
    let mem_limit = known(&seen_mem_limit);
    // Their clients go away: the supervisor cancels their turns.
    for c in &mut hostile {
        let _ = c.kill();
        let _ = c.wait();
    }
    let flood_secs = flood_started.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(2));
    let usage2 = supervisor_usage(&h);

    let phases = [&idle, &normal, &under_attack];
    let acknowledged: usize = phases
        .iter()
        .map(|p| p.acknowledged.load(Ordering::SeqCst))
        .sum();
    let failed: usize = phases.iter().map(|p| p.failed.load(Ordering::SeqCst)).sum();
    let probes: usize = phases.iter().map(|p| p.probes.load(Ordering::SeqCst)).sum();
    let failures: Vec<String> = phases
        .iter()
        .flat_map(|p| p.isolation_failures.lock().unwrap().clone())
        .collect();
    println!("  turns acknowledged {acknowledged}, failed {failed}");
    for p in phases {
        for e in p.errors.lock().unwrap().iter().take(3) {
            println!("    failed turn: {}", e.lines().last().unwrap_or(""));
        }
    }
    println!("  isolation probes {probes}, failures {}", failures.len());
    for f in &failures {
        println!("    ISOLATION FAILURE: {f}");
    }
    let pids = peak_pids.load(Ordering::SeqCst);
    let mem = peak_mem.load(Ordering::SeqCst);
    println!(
        "  fork bomb: peak {pids} pids (limit {})",
        pids_limit.map_or("none".into(), |l| l.to_string())
    );
    println!(
        "  memory hog: peak {} MiB (limit {})",
        mem >> 20,
        mem_limit.map_or("none".into(), |l| format!("{} MiB", l >> 20))
    );
    let (records, refused) = denials_of(&h, &t.agents[flood].1);
    let grew = audit_size(&h).saturating_sub(audit_before);
    println!(
        "  egress flood: {refused} refused requests in {flood_secs:.1} s (the pace allows {:.0}), \
         {records} audit records, the audit log grew {} KiB",
        mini_letta::egress::pace::BURST + mini_letta::egress::pace::RATE_PER_SEC * flood_secs,
        grew >> 10
    );
    let ratio = hostile_p99 / load_p99;
    println!(
        "  p99 ratios: hostile/load {ratio:.2}, load/idle {:.2}",
        load_p99 / idle_p99
    );
    for (when, u) in [("start", usage0), ("after load", usage1), ("end", usage2)] {
        if let Some((rss, cpu)) = u {
            println!(
                "  supervisor at {when:<10} RSS {:>6} kB  CPU {cpu:>7} ms",
                rss
            );
        }
    }
    let _ = run(&h, &["supervisor", "stop"]);
    // Observed at all (a bomb that never ran proves nothing), and held.
    let paced = refused as f64
        <= mini_letta::egress::pace::BURST + mini_letta::egress::pace::RATE_PER_SEC * flood_secs;
    let contained = pids > 0
        && mem > 0
        && refused > 0
        && paced
        && pids_limit.is_some_and(|l| pids <= l)
        && mem_limit.is_some_and(|l| mem <= l);
    if !failures.is_empty() || !contained {
        println!("FAILED: isolation failures or an uncontained tenant");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
