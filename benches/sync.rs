//! Remote sync benchmark: one agent (made with `store::create` in a
//! temporary home) grown to 500 memory files in indexed directories and
//! 1,000 commits, synced once to a directory of bare repositories; then
//! median and p90 of:
//!
//! * `memfs::sync::sync` with nothing to do (`clean`);
//! * `memfs::sync::sync` after one small local commit (`pushed`; only the
//!   sync is timed, not the commit);
//! * the plain git CLI doing the same in a normal checkout cloned from the
//!   same bare repository. Our sync reaches a directory remote in-process
//!   (`memfs::transport`: no git process; the remote's path check first),
//!   reads the remote `main`, compares the histories, and only when local is
//!   ahead validates, copies the new objects and moves the remote ref under
//!   its lock. The git equivalent timed here is `git fetch origin` followed
//!   by `git push origin main`: the fetch brings the remote tip, and the
//!   push does the comparison itself (it refuses a non-fast-forward, and
//!   with nothing new it still asks the remote for its refs and reports
//!   "Everything up-to-date"). `git pull --ff-only` would add a merge step
//!   that has nothing to do in either case, so it is left out;
//! * the CLI end to end, `mini-letta sync -a NAME --json` with nothing to
//!   do (process start, the embedded supervisor, the sync).
//!
//! The ratio column is ours / git (below 1: ours is faster).
//!
//! Run: `cargo bench --bench sync` (or `scripts/bench-sync`); pass
//! `--quick` for 10 runs per case instead of 40.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use git2::Signature;
use mini_letta::memfs::commit::{CommitOptions, commit_paths};
use mini_letta::memfs::repo::open_agent;
use mini_letta::memfs::sync::{SyncStatus, remote_url, sync};
use mini_letta::paths::{AgentPaths, Home};
use mini_letta::store;

const BIN: &str = env!("CARGO_BIN_EXE_mini-letta");
const FILES: usize = 500;
const COMMITS: usize = 1_000;
const PER_DIR: usize = 40;

fn percentile(v: &[Duration], p: f64) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Plain git with no user or system configuration, in `dir`.
fn git(dir: &Path, args: &[&str]) {
    let o = Command::new("git")
        .args([
            "-c",
            "user.name=Bench",
            "-c",
            "user.email=bench@example.com",
            "-c",
            "commit.gpgsign=false",
            "-C",
        ])
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn content(name: &str, i: usize) -> String {
    format!("---\nname: {name}\ndescription: Benchmark file.\n---\n\niteration {i}\n")
}

fn file_path(i: usize) -> String {
    format!("area-{:03}/file-{i}.md", i / PER_DIR)
}

/// Write `rel` in the checkout with iteration `i` and commit it.
fn commit_one(paths: &AgentPaths, rel: &str, i: usize) {
    let mem = paths.memory_dir();
    std::fs::write(mem.join(rel), content(&format!("File {rel}"), i)).unwrap();
    let repo = open_agent(paths).unwrap();
    let sig = Signature::now("Bench", "bench@example.com").unwrap();
    let out = commit_paths(
        &repo,
        &[rel.to_string()],
        "bench: one change",
        &sig,
        &CommitOptions::for_repo(&repo, false),
    )
    .unwrap();
    assert!(out.commit.is_some(), "nothing to commit");
}

/// 500 files in indexed directories (one commit), then one-file changes
/// up to 1,000 commits in all.
fn grow(paths: &AgentPaths) {
    let mem = paths.memory_dir();
    let mut rels = Vec::new();
    for d in 0..FILES.div_ceil(PER_DIR) {
        let dir = format!("area-{d:03}");
        std::fs::create_dir_all(mem.join(&dir)).unwrap();
        std::fs::write(mem.join(&dir).join("MEMORY.md"), "# Area\n").unwrap();
        rels.push(format!("{dir}/MEMORY.md"));
    }
    for i in 0..FILES {
        let rel = file_path(i);
        std::fs::write(mem.join(&rel), content(&format!("File {rel}"), 0)).unwrap();
        rels.push(rel);
    }
    let repo = open_agent(paths).unwrap();
    let sig = Signature::now("Bench", "bench@example.com").unwrap();
    let out = commit_paths(
        &repo,
        &rels,
        "bench: grow",
        &sig,
        &CommitOptions::for_repo(&repo, false),
    )
    .unwrap();
    assert!(out.commit.is_some(), "nothing to commit");
    let mut walk = repo.revwalk().unwrap();
    walk.push_head().unwrap();
    let have = walk.count();
    for n in have..COMMITS {
        commit_one(paths, &file_path(n % FILES), n);
    }
}

fn time_lib(paths: &AgentPaths, id: &str, root: &str, runs: usize, change: bool) -> Vec<Duration> {
    let want = if change {
        SyncStatus::Pushed
    } else {
        SyncStatus::Clean
    };
    let mut v = Vec::new();
    // One untimed warm-up run.
    for i in 0..=runs {
        if change {
            commit_one(paths, "area-000/file-0.md", COMMITS + i);
        }
        let t = Instant::now();
        let out = sync(paths, id, Some(root), &committer(paths)).unwrap();
        let took = t.elapsed();
        assert_eq!(out.status, want, "{out:?}");
        if i > 0 {
            v.push(took);
        }
    }
    v
}

fn time_git(clone: &Path, runs: usize, change: bool) -> Vec<Duration> {
    let mut v = Vec::new();
    for i in 0..=runs {
        if change {
            std::fs::write(
                clone.join("area-001/file-40.md"),
                content("File area-001/file-40.md", 10_000 + i),
            )
            .unwrap();
            git(clone, &["commit", "-q", "-a", "-m", "bench: one change"]);
        }
        let t = Instant::now();
        git(clone, &["fetch", "-q", "origin"]);
        git(clone, &["push", "-q", "origin", "main"]);
        let took = t.elapsed();
        if i > 0 {
            v.push(took);
        }
    }
    v
}

fn time_cli(home: &Path, root: &str, runs: usize) -> Vec<Duration> {
    let mut v = Vec::new();
    for i in 0..=runs {
        let t = Instant::now();
        let o = Command::new(BIN)
            .args(["sync", "-a", "bench", "--json"])
            .env("MINI_LETTA_HOME", home)
            .env("MINI_LETTA_REMOTE_ROOT", root)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        let took = t.elapsed();
        assert!(
            o.status.success(),
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(s["status"], "clean", "{s}");
        if i > 0 {
            v.push(took);
        }
    }
    v
}

fn row(label: &str, ours: &[Duration], git: Option<&[Duration]>) {
    let (m, p) = (percentile(ours, 0.5), percentile(ours, 0.9));
    let ratio = git
        .map(|g| {
            format!(
                "{:>8.2}x",
                m.as_secs_f64() / percentile(g, 0.5).as_secs_f64()
            )
        })
        .unwrap_or_else(|| format!("{:>9}", "-"));
    println!("  {label:<44} {:>9.2} {:>9.2} {ratio}", ms(m), ms(p));
}

/// The committer the supervisor passes: the agent's.
fn committer(paths: &AgentPaths) -> git2::Signature<'static> {
    mini_letta::store::commit_signature(paths).unwrap()
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let runs = if quick { 10 } else { 40 };

    let tmp = tempfile::tempdir().unwrap();
    let home_dir = tmp.path().join("home");
    std::fs::create_dir_all(&home_dir).unwrap();
    let home = Home::at(&home_dir);
    let record = store::create(&home, "bench", None).unwrap();
    let paths = home.agent(&record.id).unwrap();
    let root: PathBuf = tmp.path().join("remotes");
    let root_s = root.to_str().unwrap().to_string();

    let t = Instant::now();
    grow(&paths);
    let grown = t.elapsed();
    let first = sync(&paths, &record.id, Some(&root_s), &committer(&paths)).unwrap();
    assert_eq!(first.status, SyncStatus::Pushed, "{first:?}");
    eprintln!(
        "setup: {FILES} files, {COMMITS} commits in {:.1} s; first sync pushed {} commit(s)",
        grown.as_secs_f64(),
        first.pushed_commits
    );

    let lib_noop = time_lib(&paths, &record.id, &root_s, runs, false);
    let lib_one = time_lib(&paths, &record.id, &root_s, runs, true);

    // A normal checkout of the same remote for the git CLI.
    let url = remote_url(&root_s, &record.id);
    let clone = tmp.path().join("clone");
    git(
        tmp.path(),
        &[
            "clone",
            "-q",
            "--branch",
            "main",
            &url,
            clone.to_str().unwrap(),
        ],
    );
    let git_noop = time_git(&clone, runs, false);
    let git_one = time_git(&clone, runs, true);

    // The agent picks up the clone's commits (fast-forward), then the CLI
    // has nothing to do.
    let caught_up = sync(&paths, &record.id, Some(&root_s), &committer(&paths)).unwrap();
    assert_eq!(caught_up.status, SyncStatus::Clean, "{caught_up:?}");
    let cli_noop = time_cli(&home_dir, &root_s, runs);

    println!(
        "memory sync to a directory remote, {FILES} files, {COMMITS}+ commits, {runs} runs per case (ms):"
    );
    println!(
        "  {:<44} {:>9} {:>9} {:>9}",
        "case", "median", "p90", "ours/git"
    );
    row("library sync(), no-op", &lib_noop, Some(&git_noop));
    row("library sync(), one new commit", &lib_one, Some(&git_one));
    row("git fetch + git push, no-op", &git_noop, None);
    row("git fetch + git push, one new commit", &git_one, None);
    row(
        "CLI `mini-letta sync --json`, no-op",
        &cli_noop,
        Some(&git_noop),
    );
}
