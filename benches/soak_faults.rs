//! Fault-injection soak (`scripts/soak-faults`): a supervisor with several
//! agents under a mixed load (one client per agent: turns that commit a
//! memory fact, turns that delegate one to a memory worker, manual
//! reflections; every commit synced to a local bare remote by the
//! supervisor), and a fault every few hundred milliseconds chosen at
//! random — `kill -9` of an agent child or of a sub-agent (reflection,
//! memory worker), `kill -9` of the supervisor (then a restart),
//! a full disk (an agent's quota volume filled, then emptied), a `SIGSTOP`ped
//! agent child past its client's deadline (the client gives up and goes
//! away; the supervisor must kill the turn), and a read-only remount of an
//! agent's volume under its turns. After each
//! fault and at the end: every repository passes `git fsck` and the
//! validator at `main`, every fact whose turn was acknowledged is in `main`
//! (a delegated fact once the worker queue has drained: acknowledged
//! instructions are durable), every `messages.jsonl` parses line by line; at
//! the end a sync of each agent is clean, the remote holds `main` and passes
//! `git fsck`, and no process of an agent uid, no mount of ours and no
//! cgroup of its agents is left.
//!
//! Bounded: `--faults N` (default 50) and `--seconds S` (default 120),
//! whichever comes first; `--agents K` (default 3). Needs root (quota
//! volumes, agent uids). Exits 1 on any loss or corruption.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// The integration tests' helpers: the built binary, `run`, the hostile child.
#[path = "../tests/common/mod.rs"]
mod common;

use common::run;

use common::rng::Rng;

/// How long a client waits for its turn before it gives up (and goes
/// away, which cancels the turn).
const TURN_DEADLINE: Duration = Duration::from_secs(20);

/// `run`, but a client that has not finished by `deadline` is killed (a
/// turn stuck on a stopped child); its output is what it had printed.
fn run_with_deadline(home: &Path, args: &[&str], deadline: Duration) -> std::process::Output {
    use std::process::Stdio;
    // Logged: a client that finds no supervisor runs one in-process, and
    // what its supervisor did (memory workers) is part of a post-mortem.
    let mut child = Command::new(common::bin())
        .args(args)
        .env("MINI_LETTA_HOME", home)
        .env("RUST_LOG", "mini_letta=info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let end = Instant::now() + deadline;
    let output = loop {
        if let Ok(Some(_)) = child.try_wait() {
            break child.wait_with_output().unwrap();
        }
        if Instant::now() >= end {
            let _ = child.kill();
            break child.wait_with_output().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    keep_client_log(home, args, &output.stderr);
    output
}

/// Where the clients' log lines go (`<home>/clients.log`).
fn clients_log(home: &Path) -> std::path::PathBuf {
    home.join("clients.log")
}

/// Append the log lines of a client's stderr (its in-process supervisor's,
/// when it ran one) to [`clients_log`].
fn keep_client_log(home: &Path, args: &[&str], stderr: &[u8]) {
    use std::io::Write;
    let text = String::from_utf8_lossy(stderr);
    let lines: String = text
        .lines()
        .filter(|l| l.contains(" INFO ") || l.contains(" WARN ") || l.contains(" ERROR "))
        .map(|l| format!("[{}] {l}\n", args.first().copied().unwrap_or("?")))
        .collect();
    if lines.is_empty() {
        return;
    }
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(clients_log(home))
    {
        let _ = f.write_all(lines.as_bytes());
    }
}

#[derive(Default)]
struct Tally {
    acknowledged: u64,
    failed_turns: u64,
    faults: BTreeMap<&'static str, u64>,
    /// Each lost fact, with what the log and the repository say of it.
    lost: Vec<(String, Vec<String>)>,
    corrupt: Vec<String>,
    /// Per fault kind: from the fault (or, for a full disk and a read-only
    /// volume, its end) to the next turn of the agent it hit answering (see
    /// [`next_turn_ms`]).
    recovery_ms: BTreeMap<&'static str, Vec<u64>>,
    /// The slowest recoveries: time, fault kind, what the tries met.
    slowest: Vec<(u64, &'static str, String)>,
    /// Why turns failed: the last line of their error, counted.
    errors: BTreeMap<String, u64>,
}

fn supervisor_pid(home: &Path) -> Option<i32> {
    std::fs::read_to_string(home.join("run/supervisor.pid"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// How long a person waits after a fault: from `t0` (the fault) until a
/// turn of agent `name`, on the conversation the load uses, answers
/// (retried while it fails, for at most [`RECOVERY_LIMIT`]). The turn is a
/// plain message: it commits nothing. Also what each try met, for the
/// slowest recoveries' report.
fn next_turn_ms(home: &Path, name: &str, t0: Instant) -> (u64, String) {
    let mut tries = Vec::new();
    while t0.elapsed() < RECOVERY_LIMIT {
        let start = Instant::now();
        let o = run_with_deadline(home, &["chat", "-a", name, "-p", "你好"], TURN_DEADLINE);
        let err = String::from_utf8_lossy(&o.stderr);
        let waited = if err.contains("waiting for the running turn") {
            " (waited for the running turn)"
        } else {
            ""
        };
        let took = start.elapsed().as_millis();
        if o.status.success() {
            tries.push(format!("ok after {took} ms{waited}"));
            break;
        }
        let why = err
            .lines()
            .find(|l| l.contains("error"))
            .unwrap_or("(no error line)")
            .chars()
            .take(100)
            .collect::<String>();
        tries.push(format!("failed after {took} ms{waited}: {why}"));
        std::thread::sleep(Duration::from_millis(20));
    }
    (t0.elapsed().as_millis() as u64, tries.join("; "))
}

fn record_recovery(tally: &Mutex<Tally>, kind: &'static str, (ms, tries): (u64, String)) {
    let mut t = tally.lock().unwrap();
    t.recovery_ms.entry(kind).or_default().push(ms);
    t.slowest.push((ms, kind, tries));
    t.slowest.sort_by_key(|s| std::cmp::Reverse(s.0));
    t.slowest.truncate(5);
}

/// The pseudo fault kind of the control measure.
const CONTROL: &str = "no fault (control)";

/// The longest a recovery is waited for.
const RECOVERY_LIMIT: Duration = Duration::from_secs(60);

/// `p` (0..=1) of sorted `v`.
fn percentile(v: &[u64], p: f64) -> u64 {
    v.get(((v.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(0)
}

/// Live agent-role children, from `ps`: pid and agent name.
fn agent_children(home: &Path) -> Vec<(i32, String)> {
    children_of(home, &["agent"])
}

/// Cgroup directories (any hierarchy, a few levels down) named after one
/// of `ids`: an agent's group left behind.
fn cgroups_named(ids: &[String]) -> Vec<std::path::PathBuf> {
    let mut left = Vec::new();
    let mut stack = vec![(std::path::PathBuf::from("/sys/fs/cgroup"), 0)];
    while let Some((dir, depth)) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if ids.iter().any(|id| e.file_name() == id.as_str()) {
                left.push(e.path());
            } else if depth < 4 {
                stack.push((e.path(), depth + 1));
            }
        }
    }
    left
}

/// What a left cgroup holds, for a post-mortem: each group below it and
/// the processes it lists (pid, then `/proc/<pid>/stat`'s name, state and
/// parent), or that it lists none.
fn cgroup_contents(dir: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
        let shown: Vec<String> = procs
            .split_whitespace()
            .map(|p| {
                let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
                let fields: Vec<&str> = stat.split_whitespace().take(4).collect();
                format!(
                    "{p} {}",
                    fields.get(1..4).map(|f| f.join(" ")).unwrap_or_default()
                )
            })
            .collect();
        let rel = d.strip_prefix(dir).unwrap_or(&d).display().to_string();
        lines.push(format!(
            "{}: {}",
            if rel.is_empty() { "." } else { &rel },
            if shown.is_empty() {
                "no process".to_string()
            } else {
                shown.join(", ")
            }
        ));
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
    }
    lines
}

/// Live children with one of `roles`, from `ps`: pid and agent name.
fn children_of(home: &Path, roles: &[&str]) -> Vec<(i32, String)> {
    let o = run(home, &["ps", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    v["children"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| roles.iter().any(|role| r["role"] == *role) && r["state"] == "running")
        .filter_map(|r| {
            let pid = r["pid"].as_i64()? as i32;
            Some((pid, r["agent_name"].as_str()?.to_string()))
        })
        .collect()
}

/// The index of agent `name` (`a<i>`).
fn index_of(name: &str) -> Option<usize> {
    name.strip_prefix('a')?.parse().ok()
}

/// Wait until agent `name` has no memory worker running or waiting (the
/// queue is durable: a restarted supervisor resumes it). Whether it drained.
fn workers_drained(home: &Path, name: &str, secs: u64) -> bool {
    common::wait_until(secs, || {
        let o = run(home, &["reflect", "status", "-a", name, "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        o.status.success()
            && v["worker"].is_null()
            && v["workers_waiting"] == 0
            && v["workers_kept"] == 0
    })
}

/// The final sync of agent `name` is clean and the remote holds its `main`
/// and passes `git fsck`; what is wrong otherwise.
fn check_remote(home: &Path, remote: &Path, name: &str, id: &str) -> Vec<String> {
    let mut wrong = Vec::new();
    let o = run(home, &["sync", "-a", name, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    if !matches!(v["status"].as_str(), Some("clean" | "pushed")) {
        wrong.push(format!(
            "{name}: final sync: {v} {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    let rev = |git_dir: &Path| {
        Command::new("git")
            .arg("--git-dir")
            .arg(git_dir)
            .args(["rev-parse", "main"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let bare = remote.join(format!("{id}.git"));
    let local = rev(&home.join("agents").join(id).join("memory.git"));
    if rev(&bare) != local {
        wrong.push(format!(
            "{name}: the remote main is not the local main after a sync"
        ));
    }
    let fsck = Command::new("git")
        .arg("--git-dir")
        .arg(&bare)
        .args(["fsck", "--strict"])
        .output();
    if !fsck.is_ok_and(|o| o.status.success()) {
        wrong.push(format!("{name}: the remote repository fails git fsck"));
    }
    wrong
}

/// Start (or find) the supervisor of `home`, logging at info level so a
/// loss can be traced afterwards in `run/supervisor.log`.
fn start_supervisor(home: &Path) -> bool {
    Command::new(common::bin())
        .args(["supervisor", "start"])
        .env("MINI_LETTA_HOME", home)
        .env("RUST_LOG", "mini_letta=info")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// What the supervisor's log and the repository say about a lost `fact`:
/// the log lines naming it and the refs whose history holds it.
fn trace_lost(home: &Path, id: &str, fact: &str) -> Vec<String> {
    let mut out = Vec::new();
    let log = std::fs::read_to_string(home.join("run/supervisor.log")).unwrap_or_default()
        + &std::fs::read_to_string(clients_log(home)).unwrap_or_default();
    out.extend(
        log.lines()
            .filter(|l| l.contains(fact))
            .map(|l| format!("    log: {}", l.chars().take(400).collect::<String>())),
    );
    let refs = Command::new("git")
        .arg("--git-dir")
        .arg(home.join("agents").join(id).join("memory.git"))
        .args(["log", "--all", "--format=%h %D %s", "-S"])
        .arg(format!("- {fact}"))
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.extend(refs.lines().map(|l| format!("    git: {l}")));
    out
}

/// Every check on one agent; returns what is wrong.
/// Lost facts come with their traces (see [`trace_lost`]).
fn check_agent(
    home: &Path,
    name: &str,
    id: &str,
    facts: &[String],
) -> (Vec<(String, Vec<String>)>, Vec<String>) {
    let (mut lost, mut corrupt) = (Vec::new(), Vec::new());
    let agent = home.join("agents").join(id);
    let fsck = Command::new("git")
        .arg("--git-dir")
        .arg(agent.join("memory.git"))
        .args(["fsck", "--full", "--strict"])
        .output()
        .unwrap();
    if !fsck.status.success() {
        corrupt.push(format!(
            "{name}: git fsck: {}",
            String::from_utf8_lossy(&fsck.stderr)
        ));
    }
    let v = run(home, &["memory", "validate", "--rev", "main", "-a", name]);
    if !v.status.success() {
        corrupt.push(format!(
            "{name}: validator at main: {}",
            String::from_utf8_lossy(&v.stderr)
        ));
    }
    let show = run(home, &["memory", "show", "-a", name, "human.md"]);
    let human = String::from_utf8_lossy(&show.stdout);
    for f in facts {
        if !human.contains(&format!("- {f}")) {
            lost.push((
                format!("{name}: acknowledged fact {f:?} is not in main"),
                trace_lost(home, id, f),
            ));
        }
    }
    let log = agent.join("conversations/default/messages.jsonl");
    if let Ok(text) = std::fs::read_to_string(&log) {
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            // Only the very last line may be torn (a kill mid-append); the
            // next append repairs it.
            let last = i + 1 == lines.len() && !text.ends_with('\n');
            if serde_json::from_str::<serde_json::Value>(l).is_err() && !last {
                corrupt.push(format!(
                    "{name}: messages.jsonl line {} is not whole",
                    i + 1
                ));
            }
        }
    }
    (lost, corrupt)
}

fn main() -> ExitCode {
    let (mut faults, mut seconds, mut agents, mut seed) = (50u64, 120u64, 3usize, 0x5eed_u64);
    // `--keep`: leave the home (logs, repositories) for a post-mortem.
    let mut keep = false;
    // `--kind K` (repeatable): inject only these kinds.
    let mut only: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().and_then(|s| s.parse::<u64>().ok());
        match a.as_str() {
            "--faults" => faults = val().unwrap_or(faults),
            "--seconds" => seconds = val().unwrap_or(seconds),
            "--agents" => agents = val().map(|v| v as usize).unwrap_or(agents),
            "--seed" => seed = val().unwrap_or(seed),
            "--bench" => {}
            "--keep" => keep = true,
            "--kind" => only.extend(args.next()),
            other => {
                eprintln!(
                    "unknown argument {other:?} (--faults N --seconds S --agents K --seed X --kind K --keep)"
                );
                return ExitCode::from(2);
            }
        }
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("soak-faults needs root (quota volumes and agent uids)");
        return ExitCode::from(2);
    }
    let work = common::open_home();
    let home = work.path().to_path_buf();
    // Every commit is synced to this directory of bare repositories by the
    // supervisor (it inherits the variable), so syncs run under the faults.
    let remote = tempfile::tempdir().unwrap();
    // SAFETY: no other thread runs yet.
    unsafe { std::env::set_var("MINI_LETTA_REMOTE_ROOT", remote.path()) };
    let mut ids = Vec::new();
    for i in 0..agents {
        let o = run(
            &home,
            &[
                "agent",
                "create",
                &format!("a{i}"),
                "--disk-mb",
                "64",
                "--json",
            ],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        ids.push(v["id"].as_str().unwrap().to_string());
    }
    assert!(start_supervisor(&home));

    let tally = Arc::new(Mutex::new(Tally::default()));
    let acked: Arc<Mutex<Vec<Vec<String>>>> = Arc::new(Mutex::new(vec![Vec::new(); agents]));
    let stop = Arc::new(AtomicBool::new(false));
    // The load: one client per agent, one turn after another.
    let workers: Vec<_> = (0..agents)
        .map(|i| {
            let (home, tally, acked, stop) =
                (home.clone(), tally.clone(), acked.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                let mut mix = Rng(seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9));
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let name = format!("a{i}");
                    let pick = mix.below(100);
                    if pick >= 92 {
                        // A manual reflection now and then (not waited for).
                        let _ = run_with_deadline(&home, &["reflect", "-a", &name], TURN_DEADLINE);
                        continue;
                    }
                    let delegated = pick >= 78;
                    let fact = if delegated {
                        format!("wfact-{i}-{n}")
                    } else {
                        format!("fact-{i}-{n}")
                    };
                    let text = if delegated {
                        format!("后台记住: {fact}")
                    } else {
                        format!("记住: {fact}")
                    };
                    let o = run_with_deadline(
                        &home,
                        &["chat", "-a", &name, "-p", &text],
                        TURN_DEADLINE,
                    );
                    // The mock names the commit that landed, or says the
                    // worker has the instruction (then it is durable).
                    let said = String::from_utf8_lossy(&o.stdout);
                    let ok = o.status.success()
                        && (said.contains("好的，已更新记忆（提交 ")
                            || (delegated && said.contains("已交给后台记忆工作者")));
                    let mut t = tally.lock().unwrap();
                    if ok {
                        t.acknowledged += 1;
                        acked.lock().unwrap()[i].push(fact);
                    } else {
                        t.failed_turns += 1;
                        let err = String::from_utf8_lossy(&o.stderr);
                        let out = String::from_utf8_lossy(&o.stdout);
                        // Ids and numbers out, so alike failures count as one.
                        let why = err
                            .lines()
                            .find(|l| l.contains("error:"))
                            .or_else(|| out.lines().last())
                            .unwrap_or("(no output)")
                            .split(|c: char| c.is_whitespace() || c == '/')
                            .filter(|w| !w.chars().any(|c| c.is_ascii_digit()))
                            .collect::<Vec<_>>()
                            .join(" ")
                            .chars()
                            .take(120)
                            .collect::<String>();
                        *t.errors.entry(why).or_default() += 1;
                    }
                }
            })
        })
        .collect();

    let mut rng = Rng(seed);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut injected = 0;
    while injected < faults && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200 + rng.below(400)));
        let kind = match rng.below(15) {
            0..=4 => "kill-agent-child",
            5..=6 => "kill-supervisor",
            7..=8 => "disk-full",
            9 => "stop-agent-child",
            10..=11 => "kill-subagent",
            12..=13 => "read-only-remount",
            // No fault: the same measure as a control (a turn of the
            // load's conversation under the load).
            _ => CONTROL,
        };
        if kind != CONTROL && !only.is_empty() && !only.iter().any(|k| k == kind) {
            continue;
        }
        let t0 = Instant::now();
        // The agent whose next turn measures the recovery (a fault that
        // hits no one agent: a random one).
        let mut hit = rng.below(agents as u64) as usize;
        // What the fault itself took, for the slowest recoveries' report.
        let mut note = format!(
            "at {:.3}: ",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0)
        );
        match kind {
            "kill-agent-child" => {
                let kids = agent_children(&home);
                let Some((pid, name)) = kids.get(rng.below(kids.len() as u64) as usize) else {
                    continue;
                };
                hit = index_of(name).unwrap_or(hit);
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(*pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            "kill-subagent" => {
                let kids = children_of(&home, &["reflection", "memory-worker"]);
                let Some((pid, name)) = kids.get(rng.below(kids.len() as u64) as usize) else {
                    continue;
                };
                hit = index_of(name).unwrap_or(hit);
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(*pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            "kill-supervisor" => {
                if let Some(pid) = supervisor_pid(&home) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                // Recovery: a new supervisor answers.
                let mut up = false;
                for _ in 0..100 {
                    if start_supervisor(&home) {
                        up = true;
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                note += &format!("restarted in {} ms; ", t0.elapsed().as_millis());
                if !up {
                    tally
                        .lock()
                        .unwrap()
                        .corrupt
                        .push("the supervisor did not restart".into());
                }
            }
            CONTROL => {}
            "stop-agent-child" => {
                // Stopped past its client's deadline: the client gives up
                // and goes away, and the supervisor kills the turn.
                let kids = agent_children(&home);
                let Some((pid, name)) = kids.get(rng.below(kids.len() as u64) as usize) else {
                    continue;
                };
                hit = index_of(name).unwrap_or(hit);
                let pid = *pid;
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGSTOP,
                );
                // The person's next turn, from the moment of the stop.
                let r = next_turn_ms(&home, &format!("a{hit}"), t0);
                record_recovery(&tally, kind, r);
                // Then the stopped child must be gone (killed on its
                // client's departure).
                let gone = common::wait_until(TURN_DEADLINE.as_secs() + 10, || {
                    !agent_children(&home).iter().any(|(p, _)| *p == pid)
                });
                if !gone {
                    tally
                        .lock()
                        .unwrap()
                        .corrupt
                        .push(format!("a stopped child ({pid}) was never reclaimed"));
                }
            }
            "read-only-remount" => {
                // The agent's volume turns read-only under its turns, then
                // writable again.
                let i = hit;
                let dir = home.join("agents").join(&ids[i]);
                let remount = |opt: &str| {
                    // Busy (a file open for writing) refuses `ro`: no
                    // fault this time, and nothing to print.
                    Command::new("mount")
                        .args(["-o", &format!("remount,{opt}")])
                        .arg(&dir)
                        .output()
                        .is_ok_and(|o| o.status.success())
                };
                if remount("ro") {
                    std::thread::sleep(Duration::from_millis(300 + rng.below(400)));
                    if !remount("rw") {
                        tally
                            .lock()
                            .unwrap()
                            .corrupt
                            .push(format!("cannot remount {} writable", dir.display()));
                    }
                } else {
                    continue;
                }
            }
            _ => {
                let i = hit;
                let name = format!("a{i}");
                let fill = "for bs in 64k 1k 1; do dd if=/dev/zero of=tmp/fill-$bs bs=$bs 2>/dev/null; done; sleep 0.3; rm -f tmp/fill-*";
                // Bounded: a `sandbox run` that finds no supervisor runs
                // one in-process and drains it (for at most its drain
                // limit) before it returns; the soak does not wait so long.
                let _ = run_with_deadline(
                    &home,
                    &["sandbox", "run", "-a", &name, "--", "sh", "-c", fill],
                    TURN_DEADLINE,
                );
                // Space returns even when the run was cut short (its
                // supervisor killed): the operator frees it.
                if let Ok(entries) =
                    std::fs::read_dir(home.join("agents").join(&ids[i]).join("tmp"))
                {
                    for e in entries.flatten() {
                        if e.file_name().to_string_lossy().starts_with("fill-") {
                            let _ = std::fs::remove_file(e.path());
                        }
                    }
                }
            }
        }
        if kind != CONTROL {
            injected += 1;
            *tally.lock().unwrap().faults.entry(kind).or_default() += 1;
        }
        // A full disk or a read-only volume is a fault while it lasts:
        // recovery counts from its end (the space freed, the volume
        // writable again); the others are over as they happen.
        let from = match kind {
            "disk-full" | "read-only-remount" => Instant::now(),
            _ => t0,
        };
        if kind != "stop-agent-child" {
            let (ms, tries) = next_turn_ms(&home, &format!("a{hit}"), from);
            record_recovery(&tally, kind, (ms, format!("{note}{tries}")));
        }
    }
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        let _ = w.join();
    }
    // Final checks, with a live supervisor, then its stop leaves nothing.
    let _ = start_supervisor(&home);
    let acked = acked.lock().unwrap().clone();
    let mut t = tally.lock().unwrap();
    for (i, id) in ids.iter().enumerate() {
        let name = format!("a{i}");
        if !workers_drained(&home, &name, 300) {
            t.corrupt
                .push(format!("{name}: the memory-worker queue did not drain"));
        }
        let (lost, corrupt) = check_agent(&home, &name, id, &acked[i]);
        t.lost.extend(lost);
        t.corrupt.extend(corrupt);
        t.corrupt
            .extend(check_remote(&home, remote.path(), &name, id));
    }
    let _ = run(&home, &["supervisor", "stop", "--timeout", "5"]);
    let uids: Vec<u32> = ids
        .iter()
        .filter_map(|id| {
            let rec =
                std::fs::read_to_string(home.join("agents").join(id).join("agent.json")).ok()?;
            serde_json::from_str::<serde_json::Value>(&rec).ok()?["sandbox_uid"]
                .as_u64()
                .map(|u| u as u32)
        })
        .collect();
    let leftovers: Vec<u32> = uids
        .iter()
        .filter_map(|u| mini_letta::sandbox::identity::process_of_uid(*u))
        .collect();
    let h = mini_letta::paths::Home::at(&home);
    for id in &ids {
        let _ = mini_letta::sandbox::volume::unmount(&h, id);
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mounted = mounts
        .lines()
        .filter(|l| l.contains(&*home.to_string_lossy()))
        .count();
    // The stopped supervisor removed its agents' (empty) cgroups.
    let cgroups = cgroups_named(&ids);

    let mut all: Vec<u64> = t
        .recovery_ms
        .iter()
        .filter(|(k, _)| **k != CONTROL)
        .flat_map(|(_, v)| v.iter().copied())
        .collect();
    all.sort_unstable();
    for v in t.recovery_ms.values_mut() {
        v.sort_unstable();
    }
    println!("faults injected   {injected} {:?}", t.faults);
    println!(
        "turns acknowledged {} (failed {})",
        t.acknowledged, t.failed_turns
    );
    println!("lost              {}", t.lost.len());
    println!("corrupt           {}", t.corrupt.len());
    println!(
        "recovery ms       p50 {} p99 {} max {} (fault -> the next turn of the agent it hit answers)",
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        all.last().copied().unwrap_or(0)
    );
    for (kind, v) in &t.recovery_ms {
        println!(
            "  {kind:<18} n {:>3}  p50 {:>6}  p99 {:>6}  max {:>6}",
            v.len(),
            percentile(v, 0.5),
            percentile(v, 0.99),
            v.last().copied().unwrap_or(0)
        );
    }
    for (ms, kind, tries) in &t.slowest {
        println!("  slow: {ms} ms after {kind}: {tries}");
    }
    println!(
        "leftover processes {} mounts {} cgroups {}",
        leftovers.len(),
        mounted,
        cgroups.len()
    );
    for c in &cgroups {
        println!("  cgroup left: {}", c.display());
        for line in cgroup_contents(c) {
            println!("    {line}");
        }
    }
    for (l, trace) in &t.lost {
        println!("  {l}");
        for line in trace {
            println!("  {line}");
        }
    }
    for l in &t.corrupt {
        println!("  {l}");
    }
    let mut errors: Vec<_> = t.errors.iter().collect();
    errors.sort_by(|a, b| b.1.cmp(a.1));
    for (why, n) in errors.iter().take(6) {
        println!("  failed turns: {n:>5}  {why}");
    }
    if keep {
        println!("home kept at {}", work.keep().display());
    }
    if t.lost.is_empty()
        && t.corrupt.is_empty()
        && leftovers.is_empty()
        && mounted == 0
        && cgroups.is_empty()
    {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
