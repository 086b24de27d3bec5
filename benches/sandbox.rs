//! Confinement benchmark: median time from a launch request to the child's
//! first frame on its channel, per isolation level (L0 full stack, L2 without
//! namespaces, off), next to a bare `bwrap … true` and a bare fork+exec of
//! `true` measured in the same run; then the memory footprint of 500 idle
//! confined children.
//!
//! Run: `cargo bench --bench sandbox` (or `scripts/bench-sandbox`); pass
//! `--quick` for fewer runs and 100 idle children. Needs root for uid
//! switching (as in production); prints SKIPPED otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mini_letta::paths::Home;
use mini_letta::protocol::client::Client;
use mini_letta::protocol::{Call, SpawnParams, StdioMode};

use support::median;

fn p90(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[(v.len() * 9 / 10).min(v.len() - 1)]
}

fn bin() -> std::path::PathBuf {
    support::bin()
}

fn run(home: &Path, env: &[(&str, &str)], args: &[&str]) -> String {
    let mut c = Command::new(bin());
    c.args(args)
        .env("MINI_LETTA_HOME", home)
        .env_remove("MINI_LETTA_SANDBOX_DISABLE");
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn create_agents(home: &Path, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let out = run(home, &[], &["agent", "create", &format!("a{i}"), "--json"]);
            serde_json::from_str::<serde_json::Value>(&out).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

fn spawn(c: &mut Client, agent: &str, isolation: &str, argv: &[&str]) -> (u64, u32) {
    let v = c
        .call_json(Call::Spawn(SpawnParams {
            agent: agent.into(),
            role: "agent".into(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            stdio: StdioMode::Null,
            workspace: None,
            isolation: Some(isolation.into()),
            model: None,
        }))
        .unwrap();
    (
        v["child"].as_u64().unwrap(),
        v["pid"].as_u64().unwrap() as u32,
    )
}

/// A supervisor with one agent, under `disable` (layers switched off).
struct Level {
    home: tempfile::TempDir,
    client: Client,
    agent: String,
    isolation: &'static str,
    ids: Vec<u64>,
}

impl Level {
    fn start(disable: Option<&str>, isolation: &'static str) -> Level {
        let home = tempfile::tempdir().unwrap();
        let env: Vec<(&str, &str)> = disable
            .map(|d| vec![("MINI_LETTA_SANDBOX_DISABLE", d)])
            .unwrap_or_default();
        run(home.path(), &env, &["supervisor", "start"]);
        let agent = create_agents(home.path(), 1).remove(0);
        let client = Client::connect(&Home::at(home.path()).supervisor_socket()).unwrap();
        Level {
            home,
            client,
            agent,
            isolation,
            ids: Vec::new(),
        }
    }

    /// Launch `true` (its first frame is read from the child table later).
    fn launch(&mut self) -> f64 {
        let id = spawn(&mut self.client, &self.agent, self.isolation, &["true"]).0;
        self.ids.push(id);
        std::thread::sleep(Duration::from_millis(20));
        0.0
    }

    /// Launch → first frame (µs) of each launch, from the child table.
    fn first_frames(mut self) -> Vec<f64> {
        std::thread::sleep(Duration::from_millis(300));
        let ps = self.client.call_json(Call::Ps {}).unwrap();
        let out = ps["children"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| self.ids.contains(&r["id"].as_u64().unwrap_or(0)))
            .filter_map(|r| r["first_frame_us"].as_f64())
            .collect();
        run(self.home.path(), &[], &["supervisor", "stop"]);
        out
    }
}

/// Microseconds a command took to run to its exit.
fn time_cmd(mut c: Command) -> f64 {
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let t = Instant::now();
    let s = c.status().unwrap();
    assert!(s.success());
    t.elapsed().as_secs_f64() * 1e6
}

fn descendants(pid: u32) -> Vec<u32> {
    mini_letta::sandbox::proc_tree::process_tree(pid)
}

/// Proportional set size of a process, in KiB.
fn pss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Pss:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// The seccomp programs one child installs, per role.
fn seccomp_programs(role: mini_letta::sandbox::seccomp::Role) -> Vec<seccompiler::BpfProgram> {
    let opts = mini_letta::sandbox::seccomp::Options {
        no_network: true,
        private_ipc: true,
        egress: false,
    };
    vec![mini_letta::sandbox::seccomp::program(role, opts).unwrap()]
}

/// Size of the seccomp filter, and the time to build it and to install it
/// (the `seccomp()` call: the kernel checks and converts the program and
/// emulates it for its per-syscall cache) in a fresh child, as stage 2
/// does on every launch. Run before any thread exists: the children only
/// make raw calls.
fn seccomp_cost(runs: usize) {
    use mini_letta::sandbox::seccomp::Role;
    println!(
        "{:<64} {:>10} {:>10}",
        "seccomp filter per role (instructions, µs)", "build", "install"
    );
    for role in Role::ALL {
        let builds: Vec<f64> = (0..runs)
            .map(|_| {
                let t = Instant::now();
                let p = seccomp_programs(role);
                let us = t.elapsed().as_secs_f64() * 1e6;
                assert!(!p.is_empty());
                us
            })
            .collect();
        let progs = seccomp_programs(role);
        let instructions: usize = progs.iter().map(Vec::len).sum();
        let installs: Vec<f64> = (0..runs).map(|_| install_in_child(&progs)).collect();
        println!(
            "{:<64} {:>10.1} {:>10.1}",
            format!(
                "{role}: {instructions} instructions in {} filter(s)",
                progs.len()
            ),
            median(builds),
            median(installs)
        );
    }
}

/// Fork; the child installs `progs` and reports the nanoseconds it took.
fn install_in_child(progs: &[seccompiler::BpfProgram]) -> f64 {
    let mut fds = [0i32; 2];
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let now = |ts: &mut libc::timespec| unsafe {
            libc::clock_gettime(libc::CLOCK_MONOTONIC, ts);
            ts.tv_sec * 1_000_000_000 + ts.tv_nsec
        };
        let t0 = now(&mut ts);
        let mut ok = true;
        for p in progs {
            ok &= seccompiler::apply_filter(p).is_ok();
        }
        let ns: i64 = if ok { now(&mut ts) - t0 } else { -1 };
        unsafe {
            libc::write(fds[1], (&ns as *const i64).cast(), 8);
            libc::_exit(0);
        }
    }
    let mut ns: i64 = -1;
    unsafe {
        libc::close(fds[1]);
        libc::read(fds[0], (&mut ns as *mut i64).cast(), 8);
        libc::close(fds[0]);
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
    }
    assert!(ns >= 0, "installing the filter failed");
    ns as f64 / 1000.0
}

/// Whole processes, as a user waits for them: `mini-letta sandbox run --
/// true` with a supervisor running and embedded (no supervisor: the CLI
/// runs one for the call), alternated with a bare `bwrap --unshare-all
/// --ro-bind / / true` (no confinement of ours at all).
fn whole_launch(runs: usize) {
    let served = tempfile::tempdir().unwrap();
    let embedded = tempfile::tempdir().unwrap();
    for home in [served.path(), embedded.path()] {
        run(home, &[], &["agent", "create", "bench"]);
    }
    run(served.path(), &[], &["supervisor", "start"]);
    let launch = |home: &Path| {
        let mut c = Command::new(bin());
        c.args(["sandbox", "run", "-a", "bench", "--", "true"])
            .env("MINI_LETTA_HOME", home)
            .env_remove("MINI_LETTA_SANDBOX_DISABLE");
        c
    };
    let once = |mut c: Command| {
        c.stdin(Stdio::null()).stdout(Stdio::null());
        support::time_ms(|| assert!(c.status().unwrap().success()))
    };
    // One untimed call each: the embedded supervisor's first start sets
    // up what later ones reuse.
    once(launch(served.path()));
    once(launch(embedded.path()));
    let rounds = support::alternate(
        runs,
        vec![
            support::Case::new("sandbox run -- true (supervisor)", || {
                once(launch(served.path()))
            }),
            support::Case::new("sandbox run -- true (embedded)", || {
                once(launch(embedded.path()))
            }),
            support::Case::new("bwrap --unshare-all --ro-bind / / true", || {
                let mut c = Command::new("/usr/bin/bwrap");
                c.args(["--unshare-all", "--ro-bind", "/", "/", "true"]);
                once(c)
            }),
        ],
    );
    rounds.print("confined launch, whole processes", "ms");
    run(served.path(), &[], &["supervisor", "stop"]);
}

fn main() {
    support::say_binary();
    if !nix::unistd::geteuid().is_root() {
        println!(
            "SKIPPED: the sandbox benchmark needs root (per-agent uids), as the supervisor does in production"
        );
        return;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let runs = if quick { 10 } else { 30 };
    let idle = if quick { 100 } else { 500 };
    seccomp_cost(if quick { 50 } else { 200 });
    whole_launch(runs);

    // Every level launches in each round, beside the bare yardsticks.
    let mut levels = [
        Level::start(None, "strict"),
        Level::start(Some("namespaces"), "strict"),
        Level::start(None, "off"),
    ];
    let [l0, l2, off] = &mut levels;
    let rounds = support::alternate(
        runs,
        vec![
            support::Case::new("bare", || time_cmd(Command::new("/bin/true"))),
            support::Case::new("bwrap", || {
                let mut c = Command::new("/usr/bin/bwrap");
                c.args(mini_letta::sandbox::namespaces::BWRAP_BASE_ARGS)
                    .args(["--", "/bin/true"]);
                std::os::unix::process::CommandExt::uid(&mut c, 299_998);
                std::os::unix::process::CommandExt::gid(&mut c, 299_998);
                time_cmd(c)
            }),
            support::Case::new("L0", || l0.launch()),
            support::Case::new("L2", || l2.launch()),
            support::Case::new("off", || off.launch()),
        ],
    );
    let [l0, l2, off] = levels;
    let rows = vec![
        (
            "bare fork+exec of true (µs, exit)",
            rounds.samples[0].clone(),
        ),
        (
            "bare bwrap --unshare-all true (µs, exit)",
            rounds.samples[1].clone(),
        ),
        (
            "L0 strict: uid+namespaces+landlock+seccomp+cgroup (µs, 1st frame)",
            l0.first_frames(),
        ),
        (
            "L2 strict: uid+landlock+seccomp+cgroup (µs, 1st frame)",
            l2.first_frames(),
        ),
        ("off: no confinement (µs, 1st frame)", off.first_frames()),
    ];
    println!(
        "{:<64} {:>10} {:>10}",
        "launch (levels alternated)", "median", "p90"
    );
    let bwrap_median = median(rows[1].1.clone());
    for (label, v) in &rows {
        println!(
            "{label:<64} {:>10.0} {:>10.0}",
            median(v.clone()),
            p90(v.clone())
        );
    }
    let l0 = median(rows[2].1.clone());
    println!(
        "full stack / bare bwrap: {:.2}x (target <= 1.2x)",
        l0 / bwrap_median
    );

    // Memory of idle confined children (50 agents, spread to stay under
    // each agent's pids limit).
    let home = tempfile::tempdir().unwrap();
    run(home.path(), &[], &["supervisor", "start"]);
    let agents = create_agents(home.path(), 50);
    let mut c = Client::connect(&Home::at(home.path()).supervisor_socket()).unwrap();
    let mut pids = Vec::new();
    let t = Instant::now();
    for i in 0..idle {
        pids.push(
            spawn(
                &mut c,
                &agents[i % agents.len()],
                "strict",
                &["sleep", "600"],
            )
            .1,
        );
    }
    let spawn_secs = t.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(2));
    let procs: Vec<u32> = pids.iter().flat_map(|p| descendants(*p)).collect();
    let total_kib: u64 = procs.iter().map(|p| pss_kib(*p)).sum();
    println!(
        "{idle} idle confined children: {} processes, {:.1} MiB PSS in total, {:.0} KiB per child; launched in {spawn_secs:.1} s",
        procs.len(),
        total_kib as f64 / 1024.0,
        total_kib as f64 / idle as f64
    );
    run(home.path(), &[], &["supervisor", "stop", "--timeout", "30"]);
}
