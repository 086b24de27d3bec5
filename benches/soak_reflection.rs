//! Reflection soak (`scripts/soak-reflection`): under one running
//! supervisor, a few agents whose memory is written concurrently by the main
//! agent (`记住: X` commits on `main` at once), by memory workers
//! (`后台记住: X`, committed in a worktree and merged when the worker exits)
//! and by reflections (manual `reflect` launches, plus step-count
//! reflections that fire by themselves every 3 steps and promote the
//! first-person `我喜欢 X` lines the clients say). Operations are chosen up
//! front by a deterministic generator and issued by a few concurrent client
//! threads, each on its own conversation (turns of one conversation are
//! serialized by the product, so distinct conversations are what make the
//! main agent's commits truly concurrent with each other).
//!
//! Every ~50 operations and at the end: `git fsck --strict` and the
//! validator at `main`, and every acknowledged `记住:` fact in `main`. At the
//! end, once no sub-agent runs: the validator at every commit of `main`
//! (`git rev-list main`), no `mini-letta/*` branch but memory-worker ones
//! kept after a conflict, no worktree, no `reflection.lock`, a clean
//! checkout, every acknowledged worker fact in `main` (or on its kept
//! branch), every fact a merged reflection reported in `main`, and every
//! `我喜欢 X` a conversation's reflection cursor has passed in `main` (the
//! cursor only advances on `merged` / `no_changes`, so a fact behind it that
//! is not in `main` was lost by a reflection).
//!
//! Before the end checks the soak waits until every acknowledged worker has
//! finished (a `merge(memory-worker)` on main or a branch kept after a
//! conflict), not only until `reflect status` and `ps` are quiet: a queued
//! worker shows as `worker: null`, and `supervisor stop` drops the queue.
//! An intermediate `git fsck` runs against a live writer; its errors that
//! only say an object was written after fsck listed the objects are counted
//! apart ("fsck races"), the end check admits none. A failed run keeps its
//! home and prints where.
//!
//! Faults: memory workers are killed (SIGKILL) mid-instruction — a watcher
//! sees each running `memory-worker` child in `ps` and kills one in
//! `--kill-one-in N` (default 3; 0: none) after a random pause of up to
//! 120 ms, before or after its commit. A killed worker's instruction must be
//! run again and land: what it merged stays, the rest comes with the next
//! run. Instructions left `failed` (eight failed runs) are counted apart
//! from lost ones.
//!
//! Bounded: `--ops N` (default 500) and `--seconds S` (default 300),
//! whichever comes first; `--agents K` (default 2), `--clients C` (default
//! 4), `--seed X`. Needs root and full confinement (children run confined,
//! strict isolation); exits 2 without them, 1 on any loss or corruption.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

// The integration tests' helpers: the built binary, `run`, `open_home`.
#[path = "../tests/common/mod.rs"]
mod common;

use common::run;

use common::rng::Rng;

/// How long one client command may take before it is killed and counted
/// as failed (a hung turn must not hang the soak).
const OP_DEADLINE: Duration = Duration::from_secs(60);
/// How long the end waits for running and queued sub-agents to finish
/// (killed workers' instructions run again after pauses of up to 2 min).
const DRAIN: Duration = Duration::from_secs(300);
/// The longest pause before a worker chosen to be killed is killed
/// (`--kill-one-in`): a mock worker lives a few hundred milliseconds.
const KILL_AFTER_MS: u64 = 120;
/// Steps between automatic reflections: small, so that step-count
/// reflections keep firing while the clients write.
const STEP_COUNT: &str = "3";
/// Operations between intermediate checks.
const CHECK_EVERY: usize = 50;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Kind {
    /// `记住: kfactNz`: the main agent commits on `main` within the turn.
    Remember,
    /// `后台记住: wfactNz`: a memory worker, merged when it exits.
    Worker,
    /// `我喜欢 rfactNz`: a first-person fact for reflections to promote.
    Say,
    /// `reflect -a A --wait --json`: a manual reflection.
    Reflect,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Remember => "remember",
            Kind::Worker => "worker",
            Kind::Say => "say-fact",
            Kind::Reflect => "reflect",
        }
    }
}

/// Fact names end in `z` so that none is a prefix (or, with distinct
/// letters up front, a substring) of another: the mock skips a fact its
/// parent memory already `contains`, and `fact1` would be inside `fact12`.
fn fact(kind: Kind, n: usize) -> String {
    match kind {
        Kind::Remember => format!("kfact{n}z"),
        Kind::Worker => format!("wfact{n}z"),
        _ => format!("rfact{n}z"),
    }
}

#[derive(Default)]
struct Tally {
    ops: BTreeMap<&'static str, u64>,
    acknowledged: BTreeMap<&'static str, u64>,
    /// Per agent: acknowledged `记住:` facts (must be in `main` at once).
    remembered: Vec<Vec<String>>,
    /// Per agent: acknowledged worker facts (in `main` once it finished).
    delegated: Vec<Vec<String>>,
    /// Manual launches refused, by reason.
    refusals: BTreeMap<String, u64>,
    /// Per agent: reflection results by branch (unique per reflection).
    reflections: Vec<BTreeMap<String, Value>>,
    /// Per agent: memory-worker results by branch (unique per run), from
    /// `reflections/last-worker.json`.
    workers: Vec<BTreeMap<String, Value>>,
    failed_ops: BTreeMap<String, u64>,
    lost: Vec<String>,
    corrupt: Vec<String>,
    /// Intermediate fsck errors that were races with a live writer.
    fsck_races: Vec<String>,
    checks: u64,
    /// Memory-worker children seen running, and those killed.
    workers_seen: u64,
    worker_kills: u64,
    /// Acknowledged worker facts whose instruction was left `failed`
    /// (visible, not silently lost).
    failed_visible: Vec<String>,
}

/// `run`, but a client that has not finished by `deadline` is killed.
fn run_with_deadline(home: &Path, args: &[&str], deadline: Duration) -> Output {
    let mut child = Command::new(common::bin())
        .args(args)
        .env("MINI_LETTA_HOME", home)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let end = Instant::now() + deadline;
    while Instant::now() < end {
        if let Ok(Some(_)) = child.try_wait() {
            return child.wait_with_output().unwrap();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    child.wait_with_output().unwrap()
}

fn git(git_dir: &Path, args: &[&str]) -> Output {
    Command::new("git")
        .arg("--git-dir")
        .arg(git_dir)
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Why a command failed, with ids and numbers out so alike failures count
/// as one.
fn why(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    let out = String::from_utf8_lossy(&o.stdout);
    err.lines()
        .find(|l| l.contains("error"))
        .or_else(|| out.lines().last())
        .unwrap_or("(no output)")
        .split(|c: char| c.is_whitespace() || c == '/')
        .filter(|w| !w.chars().any(|c| c.is_ascii_digit()))
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(120)
        .collect()
}

/// The `- ` lines of `human.md` at `rev`.
fn human_lines(git_dir: &Path, rev: &str) -> BTreeSet<String> {
    text(&git(git_dir, &["show", &format!("{rev}:human.md")]))
        .lines()
        .map(str::to_string)
        .collect()
}

/// `git fsck --strict` and the validator at `main`: what is wrong, and
/// the fsck errors that were races with a live writer. `git fsck --full`
/// lists the objects first and reads the refs, reflogs and worktree HEADs
/// after, so a commit made in between shows as `invalid reflog entry <id>`
/// or `missing <type> <id>`, and a worktree being created as `detached HEAD
/// points at nothing`, although nothing is wrong. While the load runs
/// (`live`) a failure is a race only when every error line is one of those
/// and every object it names exists once fsck is done; the end check, on a
/// quiet repository, admits none.
fn repo_whole(home: &Path, name: &str, git_dir: &Path, live: bool) -> (Vec<String>, Vec<String>) {
    let (mut bad, mut races) = (Vec::new(), Vec::new());
    let fsck = git(git_dir, &["fsck", "--full", "--strict"]);
    if !fsck.status.success() {
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&fsck.stderr),
            String::from_utf8_lossy(&fsck.stdout)
        );
        // Dangling objects are normal (a discarded branch) and not errors.
        let errors: Vec<&str> = all
            .lines()
            .filter(|l| !l.starts_with("dangling ") && !l.trim().is_empty())
            .collect();
        let exists = |id: &str| {
            git(git_dir, &["cat-file", "-e", id.trim()])
                .status
                .success()
        };
        let race = live
            && !errors.is_empty()
            && errors.iter().all(|l| {
                if let Some((_, id)) = l.split_once(": invalid reflog entry ") {
                    exists(id)
                } else if let Some(rest) = l.strip_prefix("missing ") {
                    // `missing <type> <id>`: an object of a commit made
                    // after fsck listed the objects.
                    rest.split_whitespace().nth(1).is_some_and(exists)
                } else {
                    l.starts_with("error: worktrees/")
                        && l.ends_with("/HEAD: detached HEAD points at nothing")
                }
            });
        let shown = errors.join("\n");
        if race {
            races.push(format!("{name}: git fsck during the load: {shown}"));
        } else {
            bad.push(format!("{name}: git fsck: {shown}"));
        }
    }
    if let Some(e) = validate(home, name, "main") {
        bad.push(e);
    }
    (bad, races)
}

/// The validator at `rev`: `None` when it says ok.
fn validate(home: &Path, name: &str, rev: &str) -> Option<String> {
    let o = run(
        home,
        &["memory", "validate", "-a", name, "--rev", rev, "--json"],
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    (!(o.status.success() && v["ok"] == Value::Bool(true))).then(|| {
        format!(
            "{name}: validator at {rev}: {}{}",
            text(&o).trim(),
            String::from_utf8_lossy(&o.stderr).trim()
        )
    })
}

/// Record a reflection result (from `--wait` or `last-result.json`), once
/// per reflection: its branch names it.
fn record_result(t: &mut Tally, agent: usize, r: &Value) {
    if let Some(b) = r["branch"].as_str() {
        t.reflections[agent]
            .entry(b.to_string())
            .or_insert_with(|| r.clone());
    }
}

/// Record a memory worker's result (`last-worker.json`), once per run.
fn record_worker(t: &mut Tally, agent: usize, r: &Value) {
    if let Some(b) = r["branch"].as_str() {
        t.workers[agent]
            .entry(b.to_string())
            .or_insert_with(|| r.clone());
    }
}

/// Kinds of merge conflict, told apart by the soak itself from the three
/// versions a `merge_conflict` result names (`conflicts`).
#[derive(Default)]
struct Conflicts {
    /// Every conflicted file was only appended to by both sides: a merge
    /// that should have been made line-wise (must be 0).
    append_only: u64,
    /// At least one file was changed otherwise by a side.
    genuine: u64,
    /// A worker's merge met only uncommitted checkout edits (run again).
    checkout: u64,
    /// A result without the three versions.
    unknown: u64,
    /// Of all the above: reflections, workers.
    reflection: u64,
    worker: u64,
}

impl Conflicts {
    fn total(&self) -> u64 {
        self.append_only + self.genuine + self.checkout + self.unknown
    }
}

/// The contents of blob `id`, `None` when absent.
fn blob(git_dir: &Path, id: &Value) -> Option<Vec<u8>> {
    let o = git(git_dir, &["cat-file", "blob", id.as_str()?]);
    o.status.success().then_some(o.stdout)
}

/// Whether both sides of a conflicted file only appended to its merge base.
fn appended_only(git_dir: &Path, sides: &Value) -> bool {
    let (Some(base), Some(ours), Some(theirs)) = (
        blob(git_dir, &sides["base"]),
        blob(git_dir, &sides["ours"]),
        blob(git_dir, &sides["theirs"]),
    ) else {
        return false;
    };
    ours.starts_with(&base) && theirs.starts_with(&base)
}

/// Classify every `merge_conflict` result of one agent.
fn classify_conflicts(git_dir: &Path, results: &[&Value], c: &mut Conflicts) {
    for r in results.iter().filter(|r| r["status"] == "merge_conflict") {
        let files = r["conflicts"].as_array().cloned().unwrap_or_default();
        if r["checkout_dirty"] == Value::Bool(true) {
            c.checkout += 1;
        } else if files.is_empty() {
            c.unknown += 1;
        } else if files.iter().all(|f| appended_only(git_dir, f)) {
            c.append_only += 1;
        } else {
            c.genuine += 1;
        }
    }
}

/// The facts a merged reflection's report says it added (`New facts:`).
fn reported_facts(r: &Value) -> Vec<String> {
    let report = r["report"].as_str().unwrap_or("");
    report
        .lines()
        .skip_while(|l| !l.starts_with("New facts:"))
        .skip(1)
        .take_while(|l| l.starts_with("- "))
        .map(str::to_string)
        .collect()
}

/// Memory workers that finished with their commit: `merge(memory-worker)`
/// commits on main plus memory-worker branches kept after a conflict.
fn workers_finished(git_dir: &Path) -> usize {
    let merges = text(&git(git_dir, &["log", "--format=%s", "main"]))
        .lines()
        .filter(|s| s.starts_with("merge(memory-worker)"))
        .count();
    // A running worker has a branch too, and its worktree.
    let worktrees = git_dir.with_file_name("memory-worktrees");
    let kept = text(&git(
        git_dir,
        &[
            "for-each-ref",
            "--format=%(refname:lstrip=3)",
            "refs/heads/mini-letta/memory-worker/",
        ],
    ))
    .lines()
    .filter(|suffix| !worktrees.join(format!("memory-worker-{suffix}")).exists())
    .count();
    merges + kept
}

/// Whether a sub-agent of `name` runs or waits: the reflection status's
/// `running`/`worker`, and `ps` children of those roles.
fn sub_agents_busy(home: &Path, names: &[String]) -> bool {
    let ps = run(home, &["ps", "--json"]);
    let v: Value = serde_json::from_slice(&ps.stdout).unwrap_or_default();
    let kids = v["children"].as_array().into_iter().flatten().any(|c| {
        (c["role"] == "reflection" || c["role"] == "memory-worker") && c["state"] == "running"
    });
    // An instruction still pending (waiting to run again after a killed
    // run) keeps the agent busy; one left failed does not.
    kids || names.iter().any(|n| {
        let s = run(home, &["reflect", "status", "-a", n, "--json"]);
        let v: Value = serde_json::from_slice(&s.stdout).unwrap_or_default();
        let pending =
            v["workers_kept"].as_u64().unwrap_or(0) > v["workers_failed"].as_u64().unwrap_or(0);
        !v["running"].is_null() || !v["worker"].is_null() || !v["lock"].is_null() || pending
    })
}

/// The worker-kill fault: each `memory-worker` child seen running is
/// killed with probability `1 / one_in`, after a random pause.
fn kill_workers(home: &Path, one_in: u64, seed: u64, stop: &AtomicBool, tally: &Mutex<Tally>) {
    let mut rng = Rng(seed ^ 0x6b11_1e55);
    let mut seen = BTreeSet::new();
    while !stop.load(Ordering::SeqCst) {
        let ps = run(home, &["ps", "--json"]);
        let v: Value = serde_json::from_slice(&ps.stdout).unwrap_or_default();
        let fresh: Vec<(u64, i32)> = v["children"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["role"] == "memory-worker" && c["state"] == "running")
            .filter_map(|c| Some((c["id"].as_u64()?, c["pid"].as_u64()? as i32)))
            .filter(|(id, _)| seen.insert(*id))
            .collect();
        for (_, pid) in fresh {
            tally.lock().unwrap().workers_seen += 1;
            if one_in == 0 || rng.below(one_in) != 0 {
                continue;
            }
            // Its start time, so that a pid reused meanwhile is spared.
            let Some(started) = start_time(pid) else {
                continue;
            };
            std::thread::sleep(Duration::from_millis(rng.below(KILL_AFTER_MS)));
            if start_time(pid) != Some(started) {
                continue;
            }
            let killed = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            if killed.is_ok() {
                tally.lock().unwrap().worker_kills += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// When process `pid` started (field 22 of `/proc/<pid>/stat`); `None`
/// once it is gone or a zombie.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let mut fields = rest.split_whitespace();
    if fields.next()? == "Z" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Worker instructions of `agent` left `failed`, by instruction text.
fn failed_instructions(home: &Path, name: &str) -> Vec<String> {
    let s = run(home, &["reflect", "status", "-a", name, "--json"]);
    let v: Value = serde_json::from_slice(&s.stdout).unwrap_or_default();
    v["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|w| w["status"] == "failed")
        .filter_map(|w| w["instruction"].as_str().map(str::to_string))
        .collect()
}

/// The user's own words of a `messages.jsonl` row (its last text part).
fn user_words(row: &Value) -> Option<String> {
    (row["role"] == "user").then_some(())?;
    row["parts"]
        .as_array()?
        .iter()
        .rev()
        .find_map(|p| p["text"].as_str())
        .map(|s| s.trim().to_string())
}

/// `我喜欢 rfact…` lines a conversation's reflection cursor has passed.
fn consumed_says(conv: &Path) -> Vec<String> {
    let state: Value = std::fs::read(conv.join("reflection-state.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let Some(cursor) = state["reflectedThroughMessageId"].as_str() else {
        return Vec::new();
    };
    let log = std::fs::read_to_string(conv.join("messages.jsonl")).unwrap_or_default();
    let rows: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let Some(end) = rows.iter().position(|r| r["id"] == cursor) else {
        return Vec::new();
    };
    rows[..=end]
        .iter()
        .filter_map(user_words)
        .filter(|w| w.starts_with("我喜欢 rfact"))
        .collect()
}

#[derive(Default)]
struct Final {
    commits_validated: u64,
    merges_reflection: u64,
    merges_worker: u64,
    kept_worker_branches: u64,
    worker_facts_on_kept: u64,
    consumed_says: u64,
    reflection_facts_checked: u64,
    duplicate_lines: u64,
    human_lines: u64,
}

/// The end checks on one agent.
fn check_agent_end(home: &Path, i: usize, id: &str, t: &mut Tally, f: &mut Final) {
    let name = format!("a{i}");
    let agent = home.join("agents").join(id);
    let git_dir = agent.join("memory.git");
    let (bad, races) = repo_whole(home, &name, &git_dir, false);
    t.corrupt.extend(bad);
    t.fsck_races.extend(races);
    // History: the validator at every commit reachable from main.
    let revs = text(&git(&git_dir, &["rev-list", "main"]));
    for rev in revs.lines() {
        f.commits_validated += 1;
        if let Some(e) = validate(home, &name, rev) {
            t.corrupt.push(e);
        }
    }
    let subjects = text(&git(&git_dir, &["log", "--format=%P|%s", "main"]));
    for l in subjects.lines() {
        let (parents, subject) = l.split_once('|').unwrap_or(("", l));
        let merge = subject.starts_with("merge(");
        if merge && parents.split_whitespace().count() != 2 {
            t.corrupt
                .push(format!("{name}: merge commit without two parents: {l}"));
        }
        if subject.starts_with("merge(reflection)") {
            f.merges_reflection += 1;
        } else if subject.starts_with("merge(memory-worker)") {
            f.merges_worker += 1;
        }
    }
    // Branches: only memory-worker branches kept after a conflict.
    let refs = text(&git(
        &git_dir,
        &[
            "for-each-ref",
            "--format=%(refname:short)",
            "refs/heads/mini-letta/",
        ],
    ));
    let mut kept_lines = BTreeSet::new();
    for b in refs.lines() {
        if b.starts_with("mini-letta/memory-worker/") {
            f.kept_worker_branches += 1;
            kept_lines.extend(human_lines(&git_dir, b));
        } else {
            t.corrupt.push(format!("{name}: branch {b} left behind"));
        }
    }
    let worktrees: Vec<String> = std::fs::read_dir(agent.join("memory-worktrees"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    if !worktrees.is_empty() {
        t.corrupt
            .push(format!("{name}: memory-worktrees/ holds {worktrees:?}"));
    }
    let wt_list = text(&git(&git_dir, &["worktree", "list"]));
    if wt_list.lines().count() != 1 {
        t.corrupt
            .push(format!("{name}: git worktree list: {}", wt_list.trim()));
    }
    if agent.join("reflection.lock").exists() {
        t.corrupt.push(format!("{name}: reflection.lock left"));
    }
    // The checkout matches main once every merge is done.
    let status = Command::new("git")
        .args(["-c", "safe.directory=*", "-C"])
        .arg(agent.join("memory"))
        .args(["status", "--porcelain"])
        .output()
        .unwrap();
    if !status.status.success() || !status.stdout.is_empty() {
        t.corrupt.push(format!(
            "{name}: memory checkout differs from main: {}{}",
            text(&status).trim(),
            String::from_utf8_lossy(&status.stderr).trim()
        ));
    }

    let main_text = text(&git(&git_dir, &["show", "main:human.md"]));
    if main_text.contains("<<<<<<<") || main_text.contains(">>>>>>>") {
        t.corrupt
            .push(format!("{name}: conflict markers in main:human.md"));
    }
    let lines: Vec<&str> = main_text.lines().filter(|l| l.starts_with("- ")).collect();
    let human: BTreeSet<String> = lines.iter().map(|l| l.to_string()).collect();
    f.human_lines += lines.len() as u64;
    f.duplicate_lines += (lines.len() - human.len()) as u64;
    for k in &t.remembered[i] {
        if !human.contains(&format!("- {k}")) {
            t.lost
                .push(format!("{name}: acknowledged `记住: {k}` not in main"));
        }
    }
    let failed = failed_instructions(home, &name);
    for w in t.delegated[i].clone() {
        let line = format!("- {w}");
        if human.contains(&line) {
            continue;
        }
        if kept_lines.contains(&line) {
            f.worker_facts_on_kept += 1;
        } else if failed.iter().any(|f| f.contains(&w)) {
            t.failed_visible.push(format!(
                "{name}: worker fact {w}: its instruction failed (kept, shown)"
            ));
        } else {
            t.lost.push(format!(
                "{name}: acknowledged worker fact {w} neither in main nor on a kept branch"
            ));
        }
    }
    let merged: Vec<Value> = t.reflections[i]
        .values()
        .filter(|r| r["status"] == "merged")
        .cloned()
        .collect();
    for r in merged {
        for l in reported_facts(&r) {
            f.reflection_facts_checked += 1;
            if !human.contains(&l) {
                t.lost.push(format!(
                    "{name}: merged reflection {} reported {l:?}, not in main",
                    r["branch"]
                ));
            }
        }
    }
    let convs = std::fs::read_dir(agent.join("conversations"))
        .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<PathBuf>>())
        .unwrap_or_default();
    for c in convs {
        for said in consumed_says(&c) {
            f.consumed_says += 1;
            if !human.contains(&format!("- {said}")) {
                t.lost.push(format!(
                    "{name}: {said:?} is behind {}'s reflection cursor but not in main",
                    c.file_name().unwrap_or_default().to_string_lossy()
                ));
            }
        }
    }
}

fn main() -> ExitCode {
    let (mut ops, mut seconds, mut agents, mut clients, mut seed) =
        (500usize, 300u64, 2usize, 4usize, 0x5eed_u64);
    let mut kill_one_in = 3u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().and_then(|s| s.parse::<u64>().ok());
        match a.as_str() {
            "--ops" => ops = val().map(|v| v as usize).unwrap_or(ops),
            "--seconds" => seconds = val().unwrap_or(seconds),
            "--agents" => agents = val().map(|v| (v as usize).max(1)).unwrap_or(agents),
            "--clients" => clients = val().map(|v| (v as usize).max(1)).unwrap_or(clients),
            "--seed" => seed = val().unwrap_or(seed),
            "--kill-one-in" => kill_one_in = val().unwrap_or(kill_one_in),
            "--bench" => {}
            other => {
                eprintln!(
                    "unknown argument {other:?} (--ops N --seconds S --agents K --clients C --seed X --kill-one-in N)"
                );
                return ExitCode::from(2);
            }
        }
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "soak-reflection needs root: reflections and memory workers are confined children \
             run as the agent's uid with strict isolation"
        );
        return ExitCode::from(2);
    }
    let status = Command::new(common::bin())
        .args(["sandbox", "status", "--json"])
        .output()
        .unwrap();
    let sandbox: Value = serde_json::from_slice(&status.stdout).unwrap_or_default();
    if sandbox["level"] != "L0" {
        eprintln!(
            "soak-reflection needs full confinement (sandbox level L0), this host has {}: missing {}",
            sandbox["level"], sandbox["missing"]
        );
        return ExitCode::from(2);
    }

    let work = common::open_home();
    let home = work.path().to_path_buf();
    let mut ids = Vec::new();
    let names: Vec<String> = (0..agents).map(|i| format!("a{i}")).collect();
    for n in &names {
        let o = run(&home, &["agent", "create", n, "--json"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        ids.push(v["id"].as_str().unwrap().to_string());
        let s = run(
            &home,
            &[
                "reflect",
                "settings",
                "-a",
                n,
                "--trigger",
                "step-count",
                "--step-count",
                STEP_COUNT,
            ],
        );
        assert!(s.status.success(), "{}", String::from_utf8_lossy(&s.stderr));
    }
    let up = run(&home, &["supervisor", "start"]);
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );

    // The whole plan, from one generator: which agent, which kind.
    let mut rng = Rng(seed);
    let plan: Arc<Vec<(usize, Kind)>> = Arc::new(
        (0..ops)
            .map(|_| {
                let agent = rng.below(agents as u64) as usize;
                let kind = match rng.below(20) {
                    0..=6 => Kind::Remember,
                    7..=10 => Kind::Worker,
                    11..=16 => Kind::Say,
                    _ => Kind::Reflect,
                };
                (agent, kind)
            })
            .collect(),
    );

    let tally = Arc::new(Mutex::new(Tally {
        remembered: vec![Vec::new(); agents],
        delegated: vec![Vec::new(); agents],
        reflections: vec![BTreeMap::new(); agents],
        workers: vec![BTreeMap::new(); agents],
        ..Tally::default()
    }));
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);

    // Results of step-count reflections exist only as `last-result.json`
    // (overwritten by the next): a watcher records each one it sees. One
    // reflection at a time runs per agent, each for well over the poll
    // interval, so few can slip by; the count of those is printed.
    // The fault: workers killed mid-instruction while the load runs.
    let killing = Arc::new(AtomicBool::new(false));
    let killer = {
        let (home, tally, killing) = (home.clone(), tally.clone(), killing.clone());
        std::thread::spawn(move || kill_workers(&home, kill_one_in, seed, &killing, &tally))
    };
    let watcher = {
        let (home, ids, tally, done) = (home.clone(), ids.clone(), tally.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                for (i, id) in ids.iter().enumerate() {
                    let p = home
                        .join("agents")
                        .join(id)
                        .join("reflections/last-result.json");
                    if let Some(v) = std::fs::read(p)
                        .ok()
                        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                    {
                        record_result(&mut tally.lock().unwrap(), i, &v);
                    }
                    let p = home
                        .join("agents")
                        .join(id)
                        .join("reflections/last-worker.json");
                    if let Some(v) = std::fs::read(p)
                        .ok()
                        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                    {
                        record_worker(&mut tally.lock().unwrap(), i, &v);
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };

    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let (home, ids, tally, next, plan) = (
                home.clone(),
                ids.clone(),
                tally.clone(),
                next.clone(),
                plan.clone(),
            );
            std::thread::spawn(move || {
                let conversation = format!("c{c}");
                loop {
                    let n = next.fetch_add(1, Ordering::SeqCst);
                    if n >= plan.len() || Instant::now() >= deadline {
                        break;
                    }
                    let (agent, kind) = plan[n];
                    let name = format!("a{agent}");
                    let f = fact(kind, n);
                    let prompt = match kind {
                        Kind::Remember => format!("记住: {f}"),
                        Kind::Worker => format!("后台记住: {f}"),
                        _ => format!("我喜欢 {f}"),
                    };
                    let o = match kind {
                        Kind::Reflect => run_with_deadline(
                            &home,
                            &["reflect", "-a", &name, "--wait", "--json"],
                            OP_DEADLINE,
                        ),
                        _ => run_with_deadline(
                            &home,
                            &[
                                "chat",
                                "-a",
                                &name,
                                "--conversation",
                                &conversation,
                                "-p",
                                &prompt,
                            ],
                            OP_DEADLINE,
                        ),
                    };
                    let out = text(&o);
                    // `reflect --wait` exits non-zero for a result other
                    // than merged / no_changes: its JSON is the answer.
                    let ok = match kind {
                        Kind::Remember => {
                            o.status.success() && out.contains("好的，已更新记忆（提交 ")
                        }
                        Kind::Worker => o.status.success() && out.contains("已交给后台记忆工作者处理"),
                        Kind::Say => o.status.success() && out.contains(&prompt),
                        Kind::Reflect => serde_json::from_str::<Value>(&out)
                            .is_ok_and(|v| v["launched"].is_boolean()),
                    };
                    {
                        let mut t = tally.lock().unwrap();
                        *t.ops.entry(kind.name()).or_default() += 1;
                        if !ok {
                            *t.failed_ops
                                .entry(format!("{}: {}", kind.name(), why(&o)))
                                .or_default() += 1;
                        } else {
                            *t.acknowledged.entry(kind.name()).or_default() += 1;
                            match kind {
                                Kind::Remember => t.remembered[agent].push(f),
                                Kind::Worker => t.delegated[agent].push(f),
                                Kind::Say => {}
                                Kind::Reflect => {
                                    let v: Value = serde_json::from_str(&out).unwrap();
                                    if v["launched"] == Value::Bool(true) {
                                        record_result(&mut t, agent, &v["result"]);
                                    } else {
                                        let r = v["reason"].as_str().unwrap_or("?").to_string();
                                        *t.refusals.entry(r).or_default() += 1;
                                    }
                                }
                            }
                        }
                    }
                    // An intermediate check while the others write: the
                    // repositories whole and every `记住:` acknowledged so
                    // far in main (that one commits on main within the turn).
                    if (n + 1) % CHECK_EVERY == 0 {
                        let remembered = tally.lock().unwrap().remembered.clone();
                        let (mut bad, mut races, mut lost) = (Vec::new(), Vec::new(), Vec::new());
                        for (i, id) in ids.iter().enumerate() {
                            let name = format!("a{i}");
                            let git_dir = home.join("agents").join(id).join("memory.git");
                            let (b, r) = repo_whole(&home, &name, &git_dir, true);
                            bad.extend(
                                b.into_iter()
                                    .map(|e| format!("{e} (check after op {})", n + 1)),
                            );
                            races.extend(r);
                            let human = human_lines(&git_dir, "main");
                            for k in &remembered[i] {
                                if !human.contains(&format!("- {k}")) {
                                    lost.push(format!(
                                        "{name}: acknowledged `记住: {k}` not in main (check after op {})",
                                        n + 1
                                    ));
                                }
                            }
                        }
                        let mut t = tally.lock().unwrap();
                        t.checks += 1;
                        t.corrupt.extend(bad);
                        t.fsck_races.extend(races);
                        t.lost.extend(lost);
                    }
                }
            })
        })
        .collect();
    for th in threads {
        let _ = th.join();
    }
    let load_time = start.elapsed();
    // Kills stop with the load: what they left must now settle.
    killing.store(true, Ordering::SeqCst);
    let _ = killer.join();

    // Let every started or queued worker and reflection finish. `reflect
    // status` and `ps` alone cannot tell: a queued worker, or one being
    // prepared, shows as `worker: null` with no child, and `supervisor stop`
    // drops the queue. So the end waits until every acknowledged worker has
    // finished (each one commits its fact: a merge on main or a branch kept
    // after a conflict) and then for status and `ps` to stay quiet; it gives
    // up when no worker finished for `STALL` (longer than the longest
    // pause before a killed worker's instruction runs again).
    const STALL: Duration = Duration::from_secs(150);
    let delegated: Vec<usize> = tally
        .lock()
        .unwrap()
        .delegated
        .iter()
        .map(Vec::len)
        .collect();
    let drain_start = Instant::now();
    let (mut quiet, mut finished_before, mut progress_at) = (0, 0, Instant::now());
    while quiet < 3 && drain_start.elapsed() < DRAIN && progress_at.elapsed() < STALL {
        let finished: Vec<usize> = ids
            .iter()
            .map(|id| workers_finished(&home.join("agents").join(id).join("memory.git")))
            .collect();
        let total: usize = finished.iter().sum();
        if total != finished_before {
            (finished_before, progress_at) = (total, Instant::now());
        }
        let all_done = finished.iter().zip(&delegated).all(|(f, d)| f >= d);
        if !all_done || sub_agents_busy(&home, &names) {
            quiet = 0;
        } else {
            quiet += 1;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let drained = quiet >= 3;
    let drain_time = drain_start.elapsed();
    // The watcher's last look, after everything finished.
    std::thread::sleep(Duration::from_millis(50));
    done.store(true, Ordering::SeqCst);
    let _ = watcher.join();

    let mut t = tally.lock().unwrap();
    if !drained {
        t.corrupt.push(format!(
            "sub-agents not drained {:.0}s after the load (acknowledged workers unfinished or still running)",
            drain_time.as_secs_f64()
        ));
    }
    let mut f = Final::default();
    let check_start = Instant::now();
    for (i, id) in ids.iter().enumerate() {
        check_agent_end(&home, i, id, &mut t, &mut f);
    }
    let check_time = check_start.elapsed();
    let mut conflicts = Conflicts::default();
    for (i, id) in ids.iter().enumerate() {
        let git_dir = home.join("agents").join(id).join("memory.git");
        let before = conflicts.total();
        let refl: Vec<&Value> = t.reflections[i].values().collect();
        classify_conflicts(&git_dir, &refl, &mut conflicts);
        let mid = conflicts.total();
        conflicts.reflection += mid - before;
        let work: Vec<&Value> = t.workers[i].values().collect();
        classify_conflicts(&git_dir, &work, &mut conflicts);
        conflicts.worker += conflicts.total() - mid;
    }
    if conflicts.append_only > 0 {
        t.corrupt.push(format!(
            "{} merges conflicted although both sides only appended lines (must merge line-wise)",
            conflicts.append_only
        ));
    }
    // Reflections that ran, from their prompt caches (one per launch that
    // reached its child), against the results recorded.
    let launched: usize = ids
        .iter()
        .map(|id| {
            std::fs::read_dir(
                home.join("agents")
                    .join(format!("{id}~reflection/conversations")),
            )
            .map(|d| d.count())
            .unwrap_or(0)
        })
        .sum();
    let stop = run(&home, &["supervisor", "stop", "--timeout", "5"]);
    if !stop.status.success() {
        t.corrupt.push(format!(
            "supervisor stop: {}",
            String::from_utf8_lossy(&stop.stderr).trim()
        ));
    }
    let wall = start.elapsed();

    let mut by_status: BTreeMap<String, u64> = BTreeMap::new();
    for r in t.reflections.iter().flat_map(|m| m.values()) {
        *by_status
            .entry(r["status"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
    }
    let recorded: usize = t.reflections.iter().map(BTreeMap::len).sum();
    let issued: u64 = t.ops.values().sum();
    let acked: u64 = t.acknowledged.values().sum();
    let get = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    let other_refusals: u64 = t
        .refusals
        .iter()
        .filter(|(k, _)| *k != "already_active" && *k != "parent_dirty")
        .map(|(_, v)| v)
        .sum();
    println!(
        "operations        {issued} of {ops} {:?} ({} clients, {} agents, seed {seed:#x})",
        t.ops, clients, agents
    );
    println!("acknowledged      {acked} {:?}", t.acknowledged);
    println!(
        "reflections       {} results seen ({} launched): merged {} no_changes {} failed {} parent_dirty {} merge_conflict {} other {}",
        recorded,
        launched,
        get(&by_status, "merged"),
        get(&by_status, "no_changes"),
        get(&by_status, "failed"),
        get(&by_status, "parent_dirty"),
        get(&by_status, "merge_conflict"),
        recorded as u64
            - [
                "merged",
                "no_changes",
                "failed",
                "parent_dirty",
                "merge_conflict"
            ]
            .iter()
            .map(|k| get(&by_status, k))
            .sum::<u64>()
    );
    println!(
        "manual refusals   already_active {} parent_dirty {} other {} {:?}",
        get(&t.refusals, "already_active"),
        get(&t.refusals, "parent_dirty"),
        other_refusals,
        t.refusals
    );
    println!(
        "merges on main    reflection {} memory-worker {}",
        f.merges_reflection, f.merges_worker
    );
    println!(
        "worker conflicts  {} kept branches ({} acknowledged worker facts on them)",
        f.kept_worker_branches, f.worker_facts_on_kept
    );
    let worker_runs: usize = t.workers.iter().map(BTreeMap::len).sum();
    println!(
        "conflicts         append-only {} (must be 0), true {}, checkout-only {}, unclassified {} (reflections {}, workers {}; of {recorded} reflection and {worker_runs} worker results seen)",
        conflicts.append_only,
        conflicts.genuine,
        conflicts.checkout,
        conflicts.unknown,
        conflicts.reflection,
        conflicts.worker,
    );
    println!(
        "checked           {} commits validated (every commit of main), {} intermediate checks, {} merged-reflection facts, {} cursor-consumed says, {} human.md lines ({} duplicates)",
        f.commits_validated,
        t.checks,
        f.reflection_facts_checked,
        f.consumed_says,
        f.human_lines,
        f.duplicate_lines
    );
    println!(
        "worker kills      {} of {} memory-worker children seen (one in {kill_one_in}); {} instructions left failed (visible)",
        t.worker_kills,
        t.workers_seen,
        t.failed_visible.len()
    );
    println!("lost              {}", t.lost.len());
    println!("corrupt           {}", t.corrupt.len());
    println!(
        "fsck races        {} (intermediate fsck errors of a live writer: a commit made or a worktree created while fsck ran)",
        t.fsck_races.len()
    );
    println!(
        "wall time         {:.1}s (load {:.1}s, drain {:.1}s, end checks {:.1}s), {:.1} ops/s under load",
        wall.as_secs_f64(),
        load_time.as_secs_f64(),
        drain_time.as_secs_f64(),
        check_time.as_secs_f64(),
        issued as f64 / load_time.as_secs_f64().max(0.001)
    );
    for l in t
        .lost
        .iter()
        .chain(&t.failed_visible)
        .chain(&t.corrupt)
        .chain(&t.fsck_races)
        .take(40)
    {
        println!("  {l}");
    }
    let mut errors: Vec<_> = t.failed_ops.iter().collect();
    errors.sort_by(|a, b| b.1.cmp(a.1));
    for (why, n) in errors.iter().take(8) {
        println!("  failed ops: {n:>5}  {why}");
    }
    if t.lost.is_empty() && t.corrupt.is_empty() {
        ExitCode::SUCCESS
    } else {
        // Kept for a post-mortem.
        println!("home kept at {}", work.keep().display());
        ExitCode::FAILURE
    }
}
