//! Race harness for the supervisor's trust boundary (`scripts/race-boundary`):
//! a confined hostile child races the supervisor — swapping a directory of
//! its memory with a symlink out of it, turning a file into a FIFO — while
//! the harness drives the supervisor's commit, status and spawn paths as hard
//! as it can. Each race is bounded in time; the report gives attempts and
//! wins (a win: host content in the repository, a request that hung, a host
//! file that changed owner). Exits 1 on any win, 2 when it cannot run (it
//! needs root and full confinement).
//!
//! `--seconds N` per race (default 60).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use mini_letta::paths::Home;
use mini_letta::protocol::client::Client;
use mini_letta::protocol::{Call, ServerFrame, SpawnParams, StdioMode};

// The integration tests' helpers: the built binary, `run`, the hostile child.
#[path = "../tests/common/mod.rs"]
mod common;

use common::run;

struct Race {
    name: &'static str,
    attempts: u64,
    wins: u64,
    note: String,
}

impl Race {
    fn new(name: &'static str) -> Self {
        Race {
            name,
            attempts: 0,
            wins: 0,
            note: String::new(),
        }
    }
}

/// Wait until the attacker `child` has ended.
fn wait_gone(c: &mut Client, child: u64) {
    while live(c, child) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Start the hostile child (confined, role tool) racing for `secs`.
fn attacker(c: &mut Client, agent: &str, hostile: &Path, args: &[&str]) -> u64 {
    let mut argv = vec![hostile.display().to_string()];
    argv.extend(args.iter().map(|s| s.to_string()));
    let v = c
        .call_json(Call::Spawn(SpawnParams {
            agent: agent.into(),
            role: "tool".into(),
            argv,
            stdio: StdioMode::Null,
            workspace: None,
            isolation: Some("strict".into()),
            model: None,
        }))
        .unwrap();
    v["child"].as_u64().unwrap()
}

fn live(c: &mut Client, child: u64) -> bool {
    let rows = c.call_json(Call::Ps {}).unwrap();
    rows["children"].as_array().unwrap().iter().any(|r| {
        r["id"].as_u64() == Some(child) && (r["state"] == "running" || r["state"] == "starting")
    })
}

/// Every object of the repository whose content holds `marker`.
fn objects_with(git_dir: &Path, marker: &[u8]) -> u64 {
    let repo = git2::Repository::open_bare(git_dir).unwrap();
    let odb = repo.odb().unwrap();
    let mut ids = Vec::new();
    odb.foreach(|id| {
        ids.push(*id);
        true
    })
    .unwrap();
    ids.iter()
        .filter(|id| {
            odb.read(**id)
                .map(|o| o.data().windows(marker.len()).any(|w| w == marker))
                .unwrap_or(false)
        })
        .count() as u64
}

fn main() -> ExitCode {
    let mut seconds = 60u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seconds" => seconds = args.next().and_then(|s| s.parse().ok()).unwrap_or(60),
            "--bench" => {}
            other => {
                eprintln!("unknown argument {other:?} (use --seconds N)");
                return ExitCode::from(2);
            }
        }
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("race-boundary needs root (confined children run as agent uids)");
        return ExitCode::from(2);
    }
    let status = run(Path::new("/nonexistent"), &["sandbox", "status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap_or_default();
    if v["level"] != "L0" {
        eprintln!(
            "race-boundary needs full confinement (L0); this host: {}",
            v["level"]
        );
        return ExitCode::from(2);
    }
    let work = common::open_home();
    let hostile = common::hostile_child();
    let home_dir = work.path().join("home");
    std::fs::create_dir(&home_dir).unwrap();
    let home = Home::at(&home_dir);
    let o = run(&home_dir, &["agent", "create", "victim", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let id: String = serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["id"]
        .as_str()
        .unwrap()
        .into();
    let agent = home.agent(&id).unwrap();
    let mem = agent.memory_dir();
    assert!(run(&home_dir, &["supervisor", "start"]).status.success());
    let mut c = mini_letta::supervisor::connect(&home).unwrap();
    c.call_json(Call::Subscribe {}).unwrap();
    let _ = c.set_timeout(Some(Duration::from_secs(5)));
    // A first confined run gives the memory tree to the agent's uid.
    let first = attacker(&mut c, &id, Path::new("/bin/true"), &[]);
    wait_gone(&mut c, first);

    // The attacker runs from the agent's own tmp/ (the only place of ours
    // its confined view shows).
    let inside = agent.tmp_dir().join("hostile");
    std::fs::copy(&hostile, &inside).unwrap();
    let hostile = inside;

    // Host files the attacker aims at.
    let host = work.path().join("host");
    std::fs::create_dir(&host).unwrap();
    let marker = format!("RACE-SECRET-{}", std::process::id());
    std::fs::write(
        host.join("note.md"),
        format!("---\nname: n\ndescription: d\n---\n{marker}\n"),
    )
    .unwrap();
    std::fs::write(host.join("MEMORY.md"), "- note.md\n").unwrap();
    let uid = std::fs::metadata(&mem).unwrap().uid();
    let chown = |p: &Path| nix::unistd::chown(p, Some(uid.into()), Some(uid.into())).unwrap();
    std::fs::create_dir(mem.join("notes")).unwrap();
    std::fs::write(mem.join("notes/MEMORY.md"), "- note.md\n").unwrap();
    std::fs::write(
        mem.join("notes/note.md"),
        "---\nname: n\ndescription: d\n---\nmine\n",
    )
    .unwrap();
    for p in ["notes", "notes/MEMORY.md", "notes/note.md"] {
        chown(&mem.join(p));
    }
    std::os::unix::fs::symlink(&host, mem.join("link")).unwrap();
    nix::unistd::fchownat(
        nix::fcntl::AT_FDCWD,
        &mem.join("link"),
        Some(uid.into()),
        Some(uid.into()),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .unwrap();

    let mut races = Vec::new();
    let secs = seconds.to_string();

    // 1. commit: memory/notes <-> a symlink to a host directory.
    let child = attacker(
        &mut c,
        &id,
        &hostile,
        &["swap", "memory/notes", "memory/link", &secs],
    );
    let mut race = Race::new("commit");
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut control = mini_letta::supervisor::connect(&home).unwrap();
    let _ = control.set_timeout(Some(Duration::from_secs(10)));
    let mut slowest = Duration::ZERO;
    while Instant::now() < deadline {
        let t = Instant::now();
        let _ = control.call_json(Call::MemoryCommit {
            paths: vec!["notes/note.md".into(), "notes/MEMORY.md".into()],
            message: "race".into(),
            agent: Some(id.clone()),
        });
        slowest = slowest.max(t.elapsed());
        race.attempts += 1;
    }
    race.wins = objects_with(&agent.memory_git_dir(), marker.as_bytes());
    race.note = format!(
        "host content in {} object(s); slowest commit {slowest:?}",
        race.wins
    );
    races.push(race);
    wait_gone(&mut c, child);

    // 2. status: a file of the tree turns into a FIFO and back.
    let child = attacker(&mut c, &id, &hostile, &["fifo", "memory/.gitignore", &secs]);
    let mut race = Race::new("status");
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut slowest = Duration::ZERO;
    let _ = control.set_timeout(Some(Duration::from_secs(2)));
    while Instant::now() < deadline {
        let t = Instant::now();
        let r = control.call_json(Call::MemoryStatus {
            agent: Some(id.clone()),
        });
        slowest = slowest.max(t.elapsed());
        race.attempts += 1;
        if r.is_err() && t.elapsed() >= Duration::from_secs(2) {
            // A hang: the status never answered.
            race.wins += 1;
            control = mini_letta::supervisor::connect(&home).unwrap();
            let _ = control.set_timeout(Some(Duration::from_secs(2)));
        }
    }
    race.note = format!("slowest answer {slowest:?}");
    races.push(race);
    wait_gone(&mut c, child);

    // 3. spawn: the supervisor prepares the agent's directories (ownership)
    //    while memory/notes is swapped with a symlink to a host directory.
    let child = attacker(
        &mut c,
        &id,
        &hostile,
        &["swap", "memory/notes", "memory/link", &secs],
    );
    let mut race = Race::new("spawn");
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let _ = control.set_timeout(Some(Duration::from_secs(10)));
    while Instant::now() < deadline {
        let _ = control.call_json(Call::Spawn(SpawnParams {
            agent: id.clone(),
            role: "tool".into(),
            argv: vec!["true".into()],
            stdio: StdioMode::Null,
            workspace: None,
            isolation: Some("strict".into()),
            model: None,
        }));
        race.attempts += 1;
    }
    let changed: Vec<String> = std::fs::read_dir(&host)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .chain(std::iter::once(host.clone()))
        .filter(|p| {
            std::fs::symlink_metadata(p)
                .map(|m| m.uid() != 0)
                .unwrap_or(false)
        })
        .map(|p| p.display().to_string())
        .collect();
    race.wins = changed.len() as u64;
    race.note = if changed.is_empty() {
        "host files still root's".into()
    } else {
        format!("now the agent's: {}", changed.join(", "))
    };
    races.push(race);
    wait_gone(&mut c, child);
    // Drain events so the supervisor sees a reader.
    let _ = c.set_timeout(Some(Duration::from_millis(100)));
    while let Ok(ServerFrame::Event(_)) = c.read_frame() {}

    let _ = run(&home_dir, &["supervisor", "stop", "--timeout", "5"]);
    // The attacker's own count (its stdout is in the supervisor's log): a
    // race with no swaps proves nothing.
    let log = std::fs::read_to_string(home.run_dir().join("supervisor.log")).unwrap_or_default();
    let counts: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split("text=\"").nth(1))
        .filter(|t| t.starts_with("swaps=") || t.starts_with("fifos="))
        .map(|t| t.trim_end_matches('"'))
        .collect();
    println!("attacker: {}", counts.join(", "));
    if std::env::var_os("RACE_BOUNDARY_LOG").is_some() {
        eprintln!("{log}");
    }
    println!("race        attempts      wins  note");
    for r in &races {
        println!("{:<10} {:>9} {:>9}  {}", r.name, r.attempts, r.wins, r.note);
    }
    println!(
        "merge      not implemented yet: worktree merges come with reflection and memory workers"
    );
    let wins: u64 = races.iter().map(|r| r.wins).sum();
    println!("{} race(s), {wins} win(s)", races.len());
    if wins > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
