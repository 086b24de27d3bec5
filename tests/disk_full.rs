//! A full disk mid-commit and mid-append: the user gets a clear error,
//! nothing acknowledged is lost, and once space returns the repository is
//! valid (`git fsck`, the validator at `main`) and the conversation log
//! parses line by line. The full disk is an agent's quota volume filled to
//! the last byte by its own confined child.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;

use common::{confinement_or_skip, run, stderr, stdout};
use serde_json::Value;

/// Fill every block of the agent's volume from inside (big blocks, then
/// bytes). Inodes stay free: a new file can still be made, but nothing
/// grows past the slack of its last block — writes fail half-way.
const FILL: &str =
    "for bs in 64k 1k 1; do dd if=/dev/zero of=tmp/fill-$bs bs=$bs 2>/dev/null; done; true";

/// Stops the supervisor and unmounts the agent's quota volume, however the
/// test ends.
struct Cleanup<'a>(&'a Path, String);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let _ = run(self.0, &["supervisor", "stop", "--timeout", "5"]);
        let _ = mini_letta::sandbox::volume::unmount(&mini_letta::paths::Home::at(self.0), &self.1);
    }
}

fn fsck(git_dir: &Path) {
    let o = Command::new("git")
        .arg("--git-dir")
        .arg(git_dir)
        .args(["fsck", "--full", "--strict"])
        .output()
        .unwrap();
    assert!(o.status.success(), "git fsck: {}", stderr(&o));
}

/// Every line of the log is a whole message (no fragment kept anywhere).
fn log_lines_parse(log: &Path) -> usize {
    let text = std::fs::read_to_string(log).unwrap();
    assert!(text.is_empty() || text.ends_with('\n'), "a torn last line");
    for (i, line) in text.lines().enumerate() {
        serde_json::from_str::<Value>(line)
            .unwrap_or_else(|e| panic!("line {} is not whole: {e}: {line:?}", i + 1));
    }
    text.lines().count()
}

#[test]
fn a_full_disk_loses_nothing_acknowledged() {
    if !confinement_or_skip("a_full_disk_loses_nothing_acknowledged") {
        return;
    }
    let dir = common::open_home();
    let home = dir.path();
    let id = common::create_agent(home, &["q", "--disk-mb", "8"]);
    let _cleanup = Cleanup(home, id.clone());
    let agent = home.join("agents").join(&id);
    let log = agent.join("conversations/default/messages.jsonl");
    assert!(run(home, &["supervisor", "start"]).status.success());

    let o = run(home, &["chat", "-a", "q", "-p", "记住: one"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(home, &["sandbox", "run", "-a", "q", "--", "sh", "-c", FILL]);
    assert!(o.status.success(), "{}", stderr(&o));

    // Every turn fails while the disk is full — clearly, and without harm.
    for fact in ["two", "three"] {
        let o = run(home, &["chat", "-a", "q", "-p", &format!("记住: {fact}")]);
        assert!(!o.status.success(), "a turn on a full disk said it worked");
        assert!(
            stderr(&o).contains("No space left on device"),
            "{}",
            stderr(&o)
        );
        fsck(&agent.join("memory.git"));
        log_lines_parse(&log);
    }
    let o = run(home, &["memory", "validate", "--rev", "main", "-a", "q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let human = stdout(&run(home, &["memory", "show", "-a", "q", "human.md"]));
    assert!(
        human.contains("- one"),
        "an acknowledged fact was lost: {human}"
    );

    // Space returns: the next turn works and the history is whole.
    let o = run(
        home,
        &[
            "sandbox",
            "run",
            "-a",
            "q",
            "--",
            "sh",
            "-c",
            "rm -f tmp/fill-*",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(home, &["chat", "-a", "q", "-p", "记住: four"]);
    assert!(o.status.success(), "{}", stderr(&o));
    fsck(&agent.join("memory.git"));
    let o = run(home, &["memory", "validate", "--rev", "main", "-a", "q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let human = stdout(&run(home, &["memory", "show", "-a", "q", "human.md"]));
    assert!(
        human.contains("- one") && human.contains("- four"),
        "{human}"
    );
    let lines = log_lines_parse(&log);
    let o = run(
        home,
        &[
            "attach",
            "-a",
            "q",
            "--no-follow",
            "--json",
            "--last",
            "1000",
        ],
    );
    let shown = stdout(&o).lines().count();
    assert_eq!(shown, lines, "every stored line is a message attach shows");
}

/// A write cut short half-way through a line (the file-size limit here, a
/// full disk elsewhere) leaves no fragment: the failed append is undone,
/// and a torn tail left by a crash is cut off by the next append.
#[test]
fn a_write_cut_short_leaves_no_fragment() {
    if !confinement_or_skip("a_write_cut_short_leaves_no_fragment") {
        return;
    }
    let dir = common::open_home();
    let home = dir.path();
    let id = common::create_agent(home, &["q"]);
    let agent = home.join("agents").join(&id);
    let o = run(home, &["chat", "-a", "q", "-p", "hello"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let log = agent.join("conversations/default/messages.jsonl");
    // Grow the log to just under 1 MiB with one valid message, then let the
    // agent's files grow to 1 MiB at most: its next line is cut short.
    let mut text = std::fs::read_to_string(&log).unwrap();
    let pad = (1 << 20) - 300 - text.len();
    text.push_str(&format!(
        "{{\"id\":\"msg-000900\",\"role\":\"assistant\",\"parts\":[{{\"type\":\"text\",\"text\":\"{}\"}}],\"ts\":\"2026-01-01T00:00:00Z\"}}\n",
        "x".repeat(pad)
    ));
    std::fs::write(&log, &text).unwrap();
    let profiles = home.join("sandbox-profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    let agent_profile = include_str!("../sandbox-profiles/agent.toml")
        .replace("file_size_mb = 1024", "file_size_mb = 1");
    assert!(agent_profile.contains("file_size_mb = 1\n"));
    std::fs::write(profiles.join("agent.toml"), agent_profile).unwrap();
    let before = std::fs::metadata(&log).unwrap().len();
    let o = run(home, &["chat", "-a", "q", "-p", "记住: cut"]);
    assert!(!o.status.success(), "a cut-short turn said it worked");
    assert!(stderr(&o).contains("File too large"), "{}", stderr(&o));
    assert_eq!(
        std::fs::metadata(&log).unwrap().len(),
        before,
        "a fragment was kept"
    );
    log_lines_parse(&log);

    // A crash mid-append (a torn tail) is cut off by the next append.
    std::fs::remove_file(profiles.join("agent.toml")).unwrap();
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    std::io::Write::write_all(&mut f, b"{\"id\":\"msg-000901\",\"ro").unwrap();
    drop(f);
    let o = run(home, &["chat", "-a", "q", "-p", "记住: whole"]);
    assert!(o.status.success(), "{}", stderr(&o));
    log_lines_parse(&log);
    let human = stdout(&run(home, &["memory", "show", "-a", "q", "human.md"]));
    assert!(human.contains("- whole"), "{human}");
}

/// An instruction a turn acknowledged ("the memory worker has it") waits out
/// a full disk: its worker cannot start (no room for a worktree), it is
/// kept and tried again, and once space returns it lands in `main`.
#[test]
fn an_acknowledged_worker_instruction_outlives_a_full_disk() {
    if !confinement_or_skip("an_acknowledged_worker_instruction_outlives_a_full_disk") {
        return;
    }
    let dir = common::open_home();
    let home = dir.path();
    let id = common::create_agent(home, &["q", "--disk-mb", "8"]);
    let _cleanup = Cleanup(home, id.clone());
    let agent = home.join("agents").join(&id);
    let paths = mini_letta::paths::Home::at(home).agent(&id).unwrap();
    // What `worker.start` keeps when it acknowledges an instruction (the
    // turn that asked would have said so), then the disk fills to the last
    // block, root's reserve included.
    let item = mini_letta::reflection::queue::push(
        &paths,
        "记住: outlived the full disk",
        None,
        time::OffsetDateTime::now_utc(),
    )
    .unwrap();
    std::fs::create_dir_all(agent.join("tmp")).unwrap();
    let fill = Command::new("sh")
        .arg("-c")
        .arg(FILL)
        .current_dir(&agent)
        .status()
        .unwrap();
    assert!(fill.success());
    let free = nix::sys::statvfs::statvfs(&agent)
        .unwrap()
        .blocks_available();
    assert_eq!(free, 0, "the volume was not filled");
    assert!(run(home, &["supervisor", "start"]).status.success());
    let status = || -> Value {
        serde_json::from_slice(&run(home, &["reflect", "status", "-a", "q", "--json"]).stdout)
            .unwrap_or_default()
    };
    // The resumed worker cannot start; the instruction stays.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let human = stdout(&run(home, &["memory", "show", "-a", "q", "human.md"]));
    assert!(!human.contains("outlived"), "{human}");
    assert_eq!(status()["workers_kept"], 1, "{}", status());
    let said = stdout(&run(home, &["reflect", "status", "-a", "q"]));
    assert!(said.contains("1 kept until applied"), "{said}");
    let log = std::fs::read_to_string(home.join("run/supervisor.log")).unwrap_or_default();
    assert!(
        log.contains("a memory worker could not start") && log.contains(&item.id),
        "{log}"
    );

    // Space returns: a later run applies it, and nothing is left queued.
    for e in std::fs::read_dir(agent.join("tmp")).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("fill-") {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
    let landed = common::wait_until(90, || {
        stdout(&run(home, &["memory", "show", "-a", "q", "human.md"]))
            .contains("- outlived the full disk")
    });
    assert!(landed, "the instruction never landed: {}", status());
    assert!(
        common::wait_until(30, || status()["workers_kept"] == 0),
        "{}",
        status()
    );
    fsck(&agent.join("memory.git"));
    let o = run(home, &["memory", "validate", "--rev", "main", "-a", "q"]);
    assert!(o.status.success(), "{}", stderr(&o));
}
