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

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use git2::Signature;
use mini_letta::memfs::commit::{CommitOptions, commit_paths};
use mini_letta::memfs::repo::open_agent;
use mini_letta::memfs::sync::{SyncStatus, remote_url, sync};
use mini_letta::paths::{AgentPaths, Home};
use mini_letta::store;

const FILES: usize = 500;
const COMMITS: usize = 1_000;
const PER_DIR: usize = 40;

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

/// One library sync, after one new local commit when `change` (ms).
fn lib_once(paths: &AgentPaths, id: &str, root: &str, change: Option<usize>) -> f64 {
    if let Some(i) = change {
        commit_one(paths, "area-000/file-0.md", COMMITS + i);
    }
    let want = if change.is_some() {
        SyncStatus::Pushed
    } else {
        SyncStatus::Clean
    };
    let t = Instant::now();
    let out = sync(paths, id, Some(root), &committer(paths)).unwrap();
    let took = t.elapsed();
    assert_eq!(out.status, want, "{out:?}");
    ms(took)
}

/// `git fetch` + `git push` in a plain clone, after one new commit when
/// `change` (ms).
fn git_once(clone: &Path, change: Option<usize>) -> f64 {
    if let Some(i) = change {
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
    ms(t.elapsed())
}

/// `mini-letta sync --json` with nothing to do (ms).
fn cli_once(home: &Path, root: &str) -> f64 {
    let t = Instant::now();
    let o = Command::new(support::bin())
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
    ms(took)
}

fn row(rounds: &support::Rounds, i: usize, git: Option<usize>) {
    let v = rounds.samples[i].clone();
    let (m, p) = (support::median(v.clone()), support::percentile(v, 90.0));
    let ratio = git
        .map(|g| format!("{:>8.2}x", rounds.ratio(i, g)))
        .unwrap_or_else(|| format!("{:>9}", "-"));
    println!("  {:<44} {m:>9.2} {p:>9.2} {ratio}", rounds.labels[i]);
}

/// The committer the supervisor passes: the agent's.
fn committer(paths: &AgentPaths) -> git2::Signature<'static> {
    mini_letta::store::commit_signature(paths).unwrap()
}

fn main() {
    support::say_binary();
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

    // The git CLI works in a normal checkout of a copy of the remote, so
    // the two never push to one another and every case can alternate.
    let git_root = tmp.path().join("remotes-git");
    let copied = Command::new("cp")
        .arg("-a")
        .arg(&root)
        .arg(&git_root)
        .status()
        .unwrap();
    assert!(copied.success());
    let url = remote_url(git_root.to_str().unwrap(), &record.id);
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
    let n = std::cell::Cell::new(0usize);
    let next = || {
        n.set(n.get() + 1);
        Some(n.get())
    };
    let (id, root_s) = (record.id.as_str(), root_s.as_str());
    // One untimed round first (caches, the remote's first reads).
    lib_once(&paths, id, root_s, None);
    git_once(&clone, None);
    cli_once(&home_dir, root_s);
    let rounds = support::alternate(
        runs,
        vec![
            support::Case::new("library sync(), no-op", || {
                lib_once(&paths, id, root_s, None)
            }),
            support::Case::new("library sync(), one new commit", || {
                lib_once(&paths, id, root_s, next())
            }),
            support::Case::new("git fetch + git push, no-op", || git_once(&clone, None)),
            support::Case::new("git fetch + git push, one new commit", || {
                git_once(&clone, next())
            }),
            support::Case::new("CLI `mini-letta sync --json`, no-op", || {
                cli_once(&home_dir, root_s)
            }),
        ],
    );

    println!(
        "memory sync to a directory remote, {FILES} files, {COMMITS}+ commits, {runs} rounds, cases alternated (ms):"
    );
    println!(
        "  {:<44} {:>9} {:>9} {:>9}",
        "case", "median", "p90", "ours/git"
    );
    row(&rounds, 0, Some(2));
    row(&rounds, 1, Some(3));
    row(&rounds, 2, None);
    row(&rounds, 3, None);
    row(&rounds, 4, Some(2));
    println!("  (ours/git: the median of the ratios of pairs, round by round)");
}
