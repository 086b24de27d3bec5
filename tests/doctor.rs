//! `mini-letta doctor`: a healthy agent is reported healthy (exit 0), and
//! each seeded problem is found by its check, with a fix, and exit 1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;
use mini_letta::paths::Home;
use mini_letta::protocol::messages::{Part, Role};
use mini_letta::store::conversation::{Conversation, StoredMessage};
use serde_json::Value;

struct Agent {
    home: tempfile::TempDir,
    id: String,
}

impl Agent {
    fn new() -> Self {
        let home = open_home();
        let id = create_agent(home.path(), &["owl"]);
        Agent { home, id }
    }
    fn h(&self) -> &Path {
        self.home.path()
    }
    fn dir(&self) -> PathBuf {
        self.h().join("agents").join(&self.id)
    }
    fn memory(&self) -> PathBuf {
        self.dir().join("memory")
    }
    fn git_dir(&self) -> PathBuf {
        self.dir().join("memory.git")
    }
    fn paths(&self) -> mini_letta::paths::AgentPaths {
        Home::at(self.h()).agent(&self.id).unwrap()
    }
    /// `doctor -a owl --json` with `env`: the diagnosis and the exit code.
    fn doctor(&self, env: &[(&str, &str)]) -> (Value, i32) {
        let mut c = Command::new(bin());
        c.args(["doctor", "-a", "owl", "--json"])
            .env("MINI_LETTA_HOME", self.h())
            .env_remove("RUST_LOG")
            .env_remove("MINI_LETTA_REMOTE_ROOT")
            .env_remove("MINI_LETTA_SANDBOX_DISABLE");
        for (k, v) in env {
            c.env(k, v);
        }
        let o = c.output().unwrap();
        let v: Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&o), stderr(&o)));
        (v, o.status.code().unwrap())
    }
    /// Commit everything in the checkout with git, skipping the hook (what
    /// an operator bypassing the validator would do).
    fn force_commit(&self, message: &str) {
        git(&self.memory(), &["add", "-A"]);
        git(&self.memory(), &["commit", "--no-verify", "-qm", message]);
    }
}

fn git(dir: &Path, args: &[&str]) -> Output {
    let o = Command::new("git")
        .args([
            "-c",
            "safe.directory=*",
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@x",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "git {args:?}: {}", stderr(&o));
    o
}

/// The findings of `check` whose severity is not `info`.
fn problems<'a>(v: &'a Value, check: &str) -> Vec<&'a Value> {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == check && f["severity"] != "info")
        .collect()
}

/// One problem of `check`, with a fix, and exit status 1.
fn found(v: &Value, code: i32, check: &str, severity: &str, needle: &str) {
    let p = problems(v, check);
    assert_eq!(code, 1, "{v}");
    assert_eq!(v["healthy"], false, "{v}");
    assert!(
        p.iter().any(|f| f["severity"] == severity
            && f["message"].as_str().unwrap().contains(needle)
            && !f["fix"].as_str().unwrap().is_empty()),
        "no {severity} {check} finding mentioning {needle:?}: {v}"
    );
}

/// Whether this host confines at L0 (otherwise the sandbox check reports).
fn host_is_l0() -> bool {
    mini_letta::sandbox::report::SandboxReport::probe().level
        == mini_letta::sandbox::report::Level::L0
}

#[test]
fn a_healthy_agent_is_healthy() {
    let a = Agent::new();
    let (v, code) = a.doctor(&[]);
    let non_info: Vec<&Value> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["severity"] != "info")
        .collect();
    if host_is_l0() {
        assert!(non_info.is_empty(), "{v}");
        assert_eq!(code, 0, "{v}");
        assert_eq!(v["healthy"], true);
    } else {
        eprintln!("NOTE: this host confines below L0; only the sandbox check may report");
        assert!(non_info.iter().all(|f| f["check"] == "sandbox"), "{v}");
    }
    assert_eq!(v["checks"].as_array().unwrap().len(), 12, "{v}");
    // The text form: one line per finding, the agent named.
    let o = run(a.h(), &["doctor"]);
    assert!(stdout(&o).starts_with("owl ("), "{}", stdout(&o));
}

#[test]
fn uncommitted_changes_and_an_unfinished_merge() {
    let a = Agent::new();
    std::fs::write(a.memory().join("scratch.md"), "x\n").unwrap();
    let (v, code) = a.doctor(&[]);
    found(&v, code, "git_status", "warning", "scratch.md");
    std::fs::remove_file(a.memory().join("scratch.md")).unwrap();
    let head = git(&a.memory(), &["rev-parse", "HEAD"]);
    std::fs::write(a.git_dir().join("MERGE_HEAD"), head.stdout).unwrap();
    let (v, code) = a.doctor(&[]);
    found(&v, code, "git_status", "error", "merge is in progress");
}

#[test]
fn committed_memory_failing_the_validator() {
    let a = Agent::new();
    // A file in a directory with no MEMORY.md index.
    std::fs::create_dir(a.memory().join("notes")).unwrap();
    std::fs::write(
        a.memory().join("notes/loose.md"),
        "---\nname: loose\ndescription: Not indexed\n---\n\nx\n",
    )
    .unwrap();
    a.force_commit("bypass the validator");
    let (v, code) = a.doctor(&[]);
    found(&v, code, "validator", "error", "fails validation");
}

#[test]
fn a_file_near_its_size_limit() {
    let a = Agent::new();
    // 17,000 of the default 20,000 characters: 85 %.
    let body = "记".repeat(17_000 - 60);
    let text = format!("---\nname: big\ndescription: A big file\n---\n\n{body}\n");
    std::fs::write(a.memory().join("big.md"), text).unwrap();
    a.force_commit("a big file");
    let (v, code) = a.doctor(&[]);
    found(&v, code, "file_size", "warning", "big.md");
    let f = problems(&v, "file_size")[0]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(f.contains("of 20000 characters (8"), "{f}");
}

#[test]
fn a_broken_link_in_a_memory_index() {
    let a = Agent::new();
    let index = std::fs::read_to_string(a.memory().join("MEMORY.md")).unwrap();
    std::fs::write(
        a.memory().join("MEMORY.md"),
        format!("{index}- [gone](projects/gone.md) — a file that is not there\n"),
    )
    .unwrap();
    a.force_commit("a broken link");
    let (v, code) = a.doctor(&[]);
    found(&v, code, "index_links", "warning", "projects/gone.md");
}

#[test]
fn a_conversation_overdue_for_reflection() {
    let a = Agent::new();
    let paths = a.paths();
    let mut conv = Conversation::open(&paths, "default").unwrap();
    for i in 0..51 {
        let id = conv.next_id();
        conv.append(StoredMessage::new(
            id,
            Role::User,
            vec![Part::text(format!("q{i}"))],
        ))
        .unwrap();
        let id = conv.next_id();
        conv.append(StoredMessage::new(
            id,
            Role::Assistant,
            vec![Part::text(format!("a{i}"))],
        ))
        .unwrap();
    }
    let (v, code) = a.doctor(&[]);
    found(&v, code, "reflection_due", "warning", "51 steps");
}

#[test]
fn a_stale_reflection_lock() {
    let a = Agent::new();
    // Taken by a process that then dies without releasing it.
    let mut owner = Command::new("sleep").arg("30").spawn().unwrap();
    let got = mini_letta::reflection::lock::try_acquire(&a.paths(), owner.id()).unwrap();
    assert!(matches!(
        got,
        mini_letta::reflection::lock::Acquire::Acquired { .. }
    ));
    owner.kill().unwrap();
    owner.wait().unwrap();
    let (v, code) = a.doctor(&[]);
    found(&v, code, "reflection_lock", "warning", "stale");
}

#[test]
fn orphan_worktrees_and_kept_branches() {
    let a = Agent::new();
    let wt = mini_letta::memfs::worktree::create(
        &a.paths(),
        mini_letta::memfs::worktree::Label::Reflection,
    )
    .unwrap();
    let (v, code) = a.doctor(&[]);
    found(&v, code, "worktrees", "warning", &wt.name);
    git(
        &a.memory(),
        &["branch", "mini-letta/memory-worker/20260101000000-deadbeef"],
    );
    let (v, code) = a.doctor(&[]);
    found(&v, code, "worktrees", "warning", "kept unmerged");
}

#[test]
fn a_memory_worker_instruction_that_keeps_failing() {
    use mini_letta::reflection::queue;
    let a = Agent::new();
    let item = queue::push(
        &a.paths(),
        "记住: a fact the disk had no room for",
        None,
        time::OffsetDateTime::now_utc(),
    )
    .unwrap();
    for _ in 1..queue::FAILING_AFTER {
        queue::note_attempt(&a.paths(), &item.id).unwrap();
    }
    // One failure short: kept, nothing to report yet.
    let (v, _) = a.doctor(&[]);
    assert!(problems(&v, "worktrees").is_empty(), "{v:#}");
    queue::note_attempt(&a.paths(), &item.id).unwrap();
    let (v, code) = a.doctor(&[]);
    found(&v, code, "worktrees", "warning", &item.id);
    found(
        &v,
        code,
        "worktrees",
        "warning",
        "a fact the disk had no room for",
    );
}

#[test]
fn commits_the_remote_lacks() {
    let a = Agent::new();
    let remote = tempfile::tempdir().unwrap();
    let root = remote.path().to_str().unwrap();
    let o = Command::new(bin())
        .args(["sync", "-a", "owl"])
        .env("MINI_LETTA_HOME", a.h())
        .env("MINI_LETTA_REMOTE_ROOT", root)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let (v, code) = a.doctor(&[("MINI_LETTA_REMOTE_ROOT", root)]);
    assert!(problems(&v, "sync").is_empty(), "{v}");
    let _ = code;
    let human = std::fs::read_to_string(a.memory().join("human.md")).unwrap();
    std::fs::write(a.memory().join("human.md"), format!("{human}- 新的\n")).unwrap();
    git(&a.memory(), &["commit", "-qam", "a local change"]);
    let (v, code) = a.doctor(&[("MINI_LETTA_REMOTE_ROOT", root)]);
    found(
        &v,
        code,
        "sync",
        "warning",
        "1 memory commit(s) not yet on the remote",
    );
}

#[test]
fn a_sandbox_below_what_the_host_gives() {
    let a = Agent::new();
    let (v, code) = a.doctor(&[("MINI_LETTA_SANDBOX_DISABLE", "namespaces")]);
    found(&v, code, "sandbox", "warning", "below L0");
}

#[test]
fn a_stale_recall_index() {
    let a = Agent::new();
    let paths = a.paths();
    let mut conv = Conversation::open(&paths, "default").unwrap();
    for i in 0..3 {
        let id = conv.next_id();
        conv.append(StoredMessage::new(
            id,
            Role::User,
            vec![Part::text(format!("海边 {i}"))],
        ))
        .unwrap();
    }
    drop(conv);
    let o = run(a.h(), &["recall", "reindex", "-a", "owl"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // A log replaced by a shorter one: the index no longer matches it.
    let log = a.dir().join("conversations/default/messages.jsonl");
    let text = std::fs::read_to_string(&log).unwrap();
    let first = text.lines().next().unwrap();
    std::fs::write(&log, format!("{first}\n")).unwrap();
    let (v, code) = a.doctor(&[]);
    found(&v, code, "recall_index", "warning", "stale");
}

/// Issue 44: with `config.toml` broken (`[model` unclosed) every turn
/// failed while doctor said "healthy" (and `agent show` named the built-in
/// default model). Doctor now reads the file as a turn does.
#[test]
fn a_config_file_no_turn_can_read() {
    let a = Agent::new();
    std::fs::write(a.h().join("config.toml"), "[model\ndefault = \"mock\"\n").unwrap();
    let (v, code) = a.doctor(&[]);
    found(&v, code, "config", "error", "no turn can run");
    let f = problems(&v, "config");
    assert!(
        f[0]["fix"].as_str().unwrap().contains("config.toml"),
        "the fix names the file: {v}"
    );
    // What the finding foretells: the turn fails.
    let o = run(a.h(), &["chat", "-a", "owl", "-p", "hello"]);
    assert!(!o.status.success(), "{}", stdout(&o));
    // Fixed, the finding is gone.
    std::fs::write(a.h().join("config.toml"), "[model]\ndefault = \"mock\"\n").unwrap();
    let (v, _) = a.doctor(&[]);
    assert!(problems(&v, "config").is_empty(), "{v}");
}

/// Issue 44: as root with the home under a private (0700) directory,
/// agent uids cannot reach it and no turn runs (chat says so); doctor said
/// "healthy". It now makes the same check as a turn.
#[test]
fn a_home_agent_uids_cannot_reach() {
    if !require_root("doctor: a home agent uids cannot reach") {
        return;
    }
    let outer = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(outer.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let home = outer.path().join("home");
    std::fs::create_dir(&home).unwrap();
    create_agent(&home, &["owl"]);
    let o = Command::new(bin())
        .args(["doctor", "-a", "owl", "--json"])
        .env("MINI_LETTA_HOME", &home)
        .env_remove("RUST_LOG")
        .env_remove("MINI_LETTA_REMOTE_ROOT")
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    found(
        &v,
        o.status.code().unwrap(),
        "home",
        "error",
        "not searchable by others",
    );
    let o = run(&home, &["chat", "-a", "owl", "-p", "hello"]);
    assert!(!o.status.success(), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("not searchable by others"),
        "{}",
        stderr(&o)
    );
}
