//! Palace under load (`scripts/load-palace`): an agent with a long history
//! (default 1,000 commits), `palace serve --port 0`, and many concurrent
//! clients (default 200) each fetching the history page (the heaviest
//! page: up to 500 commits with diff stats) a few times (default 5;
//! `--quick`: 2) over raw HTTP/1.1 on loopback.
//!
//! Prints latency p50/p90/p99/max, errors (anything but a complete 200),
//! requests per second, and the server's resident memory (VmRSS) before,
//! at its peak during, and after the load. Exits 1 if any request failed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

#[path = "../tests/common/mod.rs"]
mod common;

use common::{bin, create_agent, open_home};

struct Args {
    commits: usize,
    clients: usize,
    requests: usize,
}

fn args() -> Args {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let quick = argv.iter().any(|a| a == "--quick");
    let mut a = Args {
        commits: 1000,
        clients: 200,
        requests: if quick { 2 } else { 5 },
    };
    let mut i = 0;
    while i < argv.len() {
        let value = argv.get(i + 1).and_then(|v| v.parse::<usize>().ok());
        match (argv[i].as_str(), value) {
            ("--commits", Some(v)) => a.commits = v.max(1),
            ("--clients", Some(v)) => a.clients = v.max(1),
            ("--requests", Some(v)) => a.requests = v.max(1),
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

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// VmRSS of `pid` in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// `n` commits on top of `main` in the agent's `memory.git`, written with
/// libgit2 directly (each one a valid tree: `human.md` keeps its
/// frontmatter and gains a line; every tenth also touches `persona.md`).
fn grow_history(git_dir: &Path, n: usize) {
    let repo = git2::Repository::open_bare(git_dir).unwrap();
    let sig = git2::Signature::now("mini-letta", "agent@mini-letta.invalid").unwrap();
    let mut head = repo
        .find_commit(repo.refname_to_id("refs/heads/main").unwrap())
        .unwrap();
    let blob_text = |tree: &git2::Tree, name: &str| -> String {
        let e = tree.get_name(name).unwrap();
        let b = repo.find_blob(e.id()).unwrap();
        String::from_utf8(b.content().to_vec()).unwrap()
    };
    let root = head.tree().unwrap();
    let mut human = blob_text(&root, "human.md");
    let mut persona = blob_text(&root, "persona.md");
    for i in 0..n {
        let tree = head.tree().unwrap();
        let mut b = repo.treebuilder(Some(&tree)).unwrap();
        human.push_str(&format!(
            "- fact number {i}: the owl saw {} voles\n",
            i * 7 % 101
        ));
        let oid = repo.blob(human.as_bytes()).unwrap();
        b.insert("human.md", oid, 0o100644).unwrap();
        let mut subject = format!("memory insert: human.md ({i})");
        if i % 10 == 0 {
            persona.push_str(&format!("- habit {i}\n"));
            let oid = repo.blob(persona.as_bytes()).unwrap();
            b.insert("persona.md", oid, 0o100644).unwrap();
            subject.push_str(" and persona.md");
        }
        let tree = repo.find_tree(b.write().unwrap()).unwrap();
        let id = repo
            .commit(
                Some("refs/heads/main"),
                &sig,
                &sig,
                &subject,
                &tree,
                &[&head],
            )
            .unwrap();
        head = repo.find_commit(id).unwrap();
    }
}

/// One GET over a fresh connection; Ok(latency) for a complete 200.
fn get(addr: &str, path: &str) -> Result<Duration, String> {
    let t = Instant::now();
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| format!("read: {e}"))?;
    let elapsed = t.elapsed();
    let text = String::from_utf8_lossy(&raw);
    let status = text.split_whitespace().nth(1).unwrap_or("?");
    if status != "200" {
        return Err(format!("status {status}"));
    }
    if !text.trim_end().ends_with("</html>") {
        return Err("incomplete body".into());
    }
    Ok(elapsed)
}

fn main() -> ExitCode {
    let a = args();
    let home = open_home();
    let id = create_agent(home.path(), &["owl"]);
    let git_dir = home.path().join("agents").join(&id).join("memory.git");
    let t = Instant::now();
    grow_history(&git_dir, a.commits);
    println!(
        "history: {} commits written in {:.1} s",
        a.commits,
        t.elapsed().as_secs_f64()
    );

    let mut server = Command::new(bin())
        .args(["palace", "serve", "--port", "0"])
        .env("MINI_LETTA_HOME", home.path())
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let pid = server.id();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http://"))
        .map(|w| w.trim_end_matches('/').to_string())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    let path = format!("/a/{id}/history.html");

    let rss_before = rss_kib(pid);
    // One request alone: the page's cost without contention.
    let solo: Vec<f64> = (0..3)
        .map(|_| get(&addr, &path).unwrap().as_secs_f64() * 1000.0)
        .collect();
    println!(
        "one client: {:.1} / {:.1} / {:.1} ms (first, second, third request)",
        solo[0], solo[1], solo[2]
    );

    let peak = Arc::new(AtomicU64::new(rss_kib(pid)));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };

    let barrier = Arc::new(Barrier::new(a.clients + 1));
    let workers: Vec<_> = (0..a.clients)
        .map(|_| {
            let (barrier, addr, path) = (barrier.clone(), addr.clone(), path.clone());
            let n = a.requests;
            std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || {
                    barrier.wait();
                    (0..n).map(|_| get(&addr, &path)).collect::<Vec<_>>()
                })
                .unwrap()
        })
        .collect();
    barrier.wait();
    let t = Instant::now();
    let mut lat = Vec::new();
    let mut errors = Vec::new();
    for w in workers {
        for r in w.join().unwrap() {
            match r {
                Ok(d) => lat.push(d.as_secs_f64() * 1000.0),
                Err(e) => errors.push(e),
            }
        }
    }
    let wall = t.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let rss_after = rss_kib(pid);

    lat.sort_by(|x, y| x.total_cmp(y));
    let total = a.clients * a.requests;
    println!(
        "load: {} clients x {} GET {path} = {total} requests in {wall:.1} s",
        a.clients, a.requests
    );
    println!(
        "latency ms: p50 {:.1}  p90 {:.1}  p99 {:.1}  max {:.1}",
        percentile(&lat, 0.50),
        percentile(&lat, 0.90),
        percentile(&lat, 0.99),
        lat.last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "errors: {} of {total}{}",
        errors.len(),
        errors
            .first()
            .map(|e| format!(" (first: {e})"))
            .unwrap_or_default()
    );
    println!("throughput: {:.1} requests/s", lat.len() as f64 / wall);
    println!(
        "server RSS MiB: before {:.1}  peak {:.1}  after {:.1}",
        mib(rss_before),
        mib(peak.load(Ordering::Relaxed)),
        mib(rss_after)
    );
    let _ = server.kill();
    let _ = server.wait();
    if errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
