//! Egress load (`scripts/bench-egress`): confined commands fetching through
//! the supervisor's proxy.
//!
//! 1. throughput — one confined command fetches a large body through the
//!    proxy; the same curl fetches it directly on the host's loopback; the
//!    ratio of the two rates;
//! 2. load — `--commands` (default 50) confined commands at once, each
//!    fetching 1 MiB through the proxy (`sandbox run … curl`): all must
//!    complete whole, while the supervisor's threads and resident memory
//!    are sampled (their peaks against the idle supervisor's).
//!
//! Needs root (agent uids, namespaces) and curl. Exits 1 when a command
//! fails or a body comes back short.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[path = "../tests/common/mod.rs"]
mod common;
mod support;

use support::bin;

/// Run the binary under test with `args` under `home`.
fn run(home: &Path, args: &[&str]) -> std::process::Output {
    common::run_bin(&bin(), home, args)
}

const MIB: usize = 1 << 20;

struct Args {
    commands: usize,
    big_mib: usize,
    rounds: usize,
}

fn args() -> Args {
    let mut a = Args {
        commands: 50,
        big_mib: 256,
        rounds: 7,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let value = argv.get(i + 1).and_then(|v| v.parse::<usize>().ok());
        match (argv[i].as_str(), value) {
            ("--commands", Some(v)) => a.commands = v.max(1),
            ("--big-mib", Some(v)) => a.big_mib = v.max(1),
            ("--quick", _) => {
                a.commands = 10;
                a.big_mib = 32;
                a.rounds = 3;
                i += 1;
                continue;
            }
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

/// An HTTP server on the host's loopback: `/Nm` answers N MiB.
fn server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    return;
                }
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
                        break;
                    }
                }
                let path = line.split_whitespace().nth(1).unwrap_or("/1m");
                let mib: usize = path
                    .trim_start_matches('/')
                    .trim_end_matches('m')
                    .parse()
                    .unwrap_or(1);
                let mut out = stream;
                let _ = write!(
                    out,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    mib * MIB
                );
                let chunk = vec![b'x'; MIB];
                for _ in 0..mib {
                    if out.write_all(&chunk).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// `Threads` and `VmRSS` (KiB) of `pid`.
fn sample(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("Threads:"), field("VmRSS:"))
}

/// curl's `size_download time_total` for one fetch.
fn curl_numbers(out: &str) -> Option<(f64, f64)> {
    let mut it = out.split_whitespace();
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

fn confined_curl(home: &Path, url: &str) -> Option<(f64, f64)> {
    let o = run(
        home,
        &[
            "sandbox",
            "run",
            "-a",
            "bench",
            "--",
            "curl",
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{size_download} %{time_total}",
            url,
        ],
    );
    if !o.status.success() {
        eprintln!("confined fetch failed: {}", common::stderr(&o));
        return None;
    }
    curl_numbers(&common::stdout(&o))
}

fn main() -> ExitCode {
    support::say_binary();
    let a = args();
    if !nix::unistd::geteuid().is_root() {
        eprintln!("bench-egress needs root (agent uids, network namespaces)");
        return ExitCode::FAILURE;
    }
    let home = common::open_home();
    let h = home.path();
    let port = server();
    assert!(run(h, &["agent", "create", "bench"]).status.success());
    let allow = format!("localhost:{port}");
    assert!(
        run(h, &["agent", "set-network", "bench", "--allow", &allow])
            .status
            .success()
    );
    let o = Command::new(bin())
        .args(["supervisor", "start"])
        .env("MINI_LETTA_HOME", h)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", common::stderr(&o));
    let pid = mini_letta::supervisor::connect(&mini_letta::paths::Home::at(h))
        .unwrap()
        .server_pid;
    let failed = bench(h, port, pid, &a);
    let _ = run(h, &["supervisor", "stop", "--timeout", "5"]);
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn bench(h: &Path, port: u16, pid: u32, a: &Args) -> bool {
    // Warm up: the launch path, the agent's uid and cgroups.
    if confined_curl(h, &format!("http://localhost:{port}/1m")).is_none() {
        return true;
    }
    // Direct and proxied fetches alternate; each figure is MiB/s as curl
    // measured it (so the launch of the confined command is not in it).
    let big = format!("http://localhost:{port}/{}m", a.big_mib);
    let rate = |got: Option<(f64, f64)>| {
        let (n, t) = got.expect("a throughput fetch failed");
        assert_eq!(n as usize, a.big_mib * MIB, "a short body");
        n / t.max(1e-9) / MIB as f64
    };
    let rounds = support::alternate(
        a.rounds,
        vec![
            support::Case::new("through the proxy (confined curl)", || {
                rate(confined_curl(h, &big))
            }),
            support::Case::new("direct loopback (curl)", || {
                let direct = Command::new("curl")
                    .args(["-sS", "--noproxy", "*", "-o", "/dev/null", "-w"])
                    .arg("%{size_download} %{time_total}")
                    .arg(&big)
                    .output()
                    .unwrap();
                rate(curl_numbers(&String::from_utf8_lossy(&direct.stdout)))
            }),
        ],
    );
    rounds.print(&format!("throughput, {} MiB", a.big_mib), "MiB/s");

    let (idle_threads, idle_rss) = sample(pid);
    let stop = Arc::new(AtomicBool::new(false));
    let (peak_threads, peak_rss) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let sampler = {
        let (stop, pt, pr) = (stop.clone(), peak_threads.clone(), peak_rss.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let (t, r) = sample(pid);
                pt.fetch_max(t, Ordering::Relaxed);
                pr.fetch_max(r, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let started = Instant::now();
    let url = format!("http://localhost:{port}/1m");
    let workers: Vec<_> = (0..a.commands)
        .map(|_| {
            let (home, url) = (h.to_path_buf(), url.clone());
            std::thread::spawn(move || confined_curl(&home, &url))
        })
        .collect();
    let results: Vec<Option<(f64, f64)>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let wall = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let whole = results
        .iter()
        .filter(|r| r.is_some_and(|(n, _)| n as usize == MIB))
        .count();
    let mut times: Vec<f64> = results.iter().flatten().map(|(_, t)| *t).collect();
    times.sort_by(|x, y| x.total_cmp(y));
    let p = |q: f64| {
        times
            .get(((times.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    println!(
        "load: {whole}/{} confined commands fetched 1 MiB each through the proxy at once in {:.2}s \
         (fetch p50 {:.0} ms, p95 {:.0} ms)",
        a.commands,
        wall.as_secs_f64(),
        p(0.5) * 1000.0,
        p(0.95) * 1000.0
    );
    println!(
        "supervisor: threads {idle_threads} idle, {} at peak; RSS {} MiB idle, {} MiB at peak",
        peak_threads.load(Ordering::Relaxed),
        idle_rss / 1024,
        peak_rss.load(Ordering::Relaxed) / 1024
    );
    let records = run(h, &["agent", "network-log", "bench", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&records.stdout).unwrap_or_default();
    let allowed = v["records"].as_array().map_or(0, |r| {
        r.iter().filter(|r| r["verdict"] == "allowed").count()
    });
    println!("network log: {allowed} allowed attempts recorded");
    whole != a.commands
}
