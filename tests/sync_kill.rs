#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `mini-letta sync` killed with SIGKILL at random points (before the
//! fetch, during it, during the rebase, during the push) while local
//! commits need a rebase onto another host's push: each time the memory
//! repository stays sound (fsck, a valid `main`), and the next
//! uninterrupted sync pushes everything, losing no local commit and leaving
//! no git lock file behind (none a kill left stands in its way).

mod common;

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::rng::Rng;
use common::*;
use git2::Signature;
use mini_letta::memfs::commit::{CommitOptions, commit_paths};
use mini_letta::memfs::repo::open_agent;
use mini_letta::paths::{AgentPaths, Home};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::Value;

const RUNS: u64 = 20;

fn md(name: &str, body: &str) -> String {
    format!("---\nname: {name}\ndescription: {name} notes\n---\n\n{body}\n")
}

/// Plain git with no user or system configuration; stdout.
fn git(dir: &Path, args: &[&str]) -> String {
    let o = git_out(dir, args);
    assert!(
        o.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}

fn git_out(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new("git")
        .args([
            "-c",
            "user.name=Other",
            "-c",
            "user.email=other@example.com",
        ])
        .args(["-c", "commit.gpgsign=false"])
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap()
}

/// Write `rel` in the agent's checkout and commit it through the library.
fn commit_file(paths: &AgentPaths, rel: &str, contents: &str) {
    let p = paths.memory_dir().join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, contents).unwrap();
    let repo = open_agent(paths).unwrap();
    let sig = Signature::now("Local", "local@example.com").unwrap();
    let out = commit_paths(
        &repo,
        &[rel.to_string()],
        &format!("add {rel}"),
        &sig,
        &CommitOptions::for_repo(&repo, false),
    )
    .unwrap();
    assert!(out.commit.is_some(), "nothing committed for {rel}");
}

fn sync_command(home: &Path, root: &Path) -> Command {
    let mut c = Command::new(bin());
    c.args(["sync", "-a", "owl", "--json"])
        .env("MINI_LETTA_HOME", home)
        .env("MINI_LETTA_REMOTE_ROOT", root)
        .env_remove("RUST_LOG");
    c
}

/// An uninterrupted sync; its JSON.
fn sync(home: &Path, root: &Path) -> Value {
    let o = sync_command(home, root).output().unwrap();
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&o), stderr(&o)))
}

/// Another host: commit `rel` in its clone and push it.
fn push_from_other(clone: &Path, rel: &str, contents: &str) {
    let p = clone.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, contents).unwrap();
    git(clone, &["add", "--", rel]);
    git(
        clone,
        &["commit", "-q", "--no-verify", "-m", &format!("add {rel}")],
    );
    git(clone, &["pull", "-q", "--rebase", "origin", "main"]);
    git(clone, &["push", "-q", "origin", "HEAD:main"]);
}

/// Git's own lock files left in `dir` (the repository lock of mini-letta
/// is a flock and may stay).
fn stale_locks(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if e.file_type().unwrap().is_dir() {
            stale_locks(&p, out);
        } else if p.extension().is_some_and(|x| x == "lock")
            && p.file_name().is_some_and(|n| n != "mini-letta-memory.lock")
        {
            out.push(p);
        }
    }
}

/// The checks after a kill and after a sync: the repository is sound and
/// `main` valid.
fn assert_sound(home: &Path, git_dir: &Path, run: u64) {
    let gd = git_dir.to_str().unwrap();
    let fsck = git_out(
        home,
        &["--git-dir", gd, "fsck", "--strict", "--no-progress"],
    );
    assert!(
        fsck.status.success(),
        "run {run}: fsck failed: {}",
        String::from_utf8_lossy(&fsck.stderr)
    );
    let err = String::from_utf8_lossy(&fsck.stderr);
    assert!(
        !err.lines().any(|l| l.starts_with("error")),
        "run {run}: fsck: {err}"
    );
    git(
        home,
        &["--git-dir", gd, "rev-parse", "--verify", "-q", "main"],
    );
    let v = run_validate(home);
    assert!(
        v.status.success(),
        "run {run}: main is not valid: {}",
        stderr(&v)
    );
}

/// Git lock files in the local and the remote repository.
fn locks_in(git_dir: &Path, bare: &Path) -> Vec<PathBuf> {
    let mut locks = Vec::new();
    stale_locks(git_dir, &mut locks);
    stale_locks(bare, &mut locks);
    locks
}

fn run_validate(home: &Path) -> std::process::Output {
    run(home, &["memory", "validate", "-a", "owl", "--rev", "main"])
}

/// Wait for every child of this process (the orphaned git processes the
/// killed CLI left, reparented here).
fn reap_orphans() {
    use nix::errno::Errno;
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {
                assert!(
                    Instant::now() < deadline,
                    "a git left by the CLI still runs"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => break,
        }
    }
}

#[test]
fn a_sync_killed_anywhere_loses_nothing_and_the_next_one_completes() {
    let began = Instant::now();
    // Orphans of the killed CLI are reparented to this process, so the
    // checks below never race a git still finishing its step. (The only
    // test in this binary: no other test's children are reaped.)
    nix::sys::prctl::set_child_subreaper(true).unwrap();
    let home_dir = open_home();
    let home = home_dir.path();
    let remote = tempfile::tempdir().unwrap();
    let root = remote.path();
    let id = create_agent(home, &["owl"]);
    let paths = Home::at(home).agent(&id).unwrap();
    let git_dir = paths.memory_git_dir();
    let gd = git_dir.to_str().unwrap().to_string();

    // Some history, with a directory for each host's notes.
    commit_file(&paths, "local/MEMORY.md", "# Notes made here\n");
    commit_file(&paths, "remote/MEMORY.md", "# Notes made elsewhere\n");
    for i in 0..20 {
        commit_file(
            &paths,
            &format!("local/seed-{i}.md"),
            &md(&format!("seed {i}"), "x"),
        );
    }
    let v = sync(home, root);
    assert_eq!(v["status"], "pushed", "{v}");
    let bare = root.join(format!("{id}.git"));
    let other_dir = tempfile::tempdir().unwrap();
    let clone = other_dir.path().join("w");
    git(
        other_dir.path(),
        &[
            "clone",
            "-q",
            bare.to_str().unwrap(),
            clone.to_str().unwrap(),
        ],
    );

    // How long an uninterrupted sync that rebases takes (median of three).
    let mut took = Vec::new();
    for i in 0..3 {
        push_from_other(
            &clone,
            &format!("remote/c{i}.md"),
            &md("calibrate", "from B"),
        );
        commit_file(
            &paths,
            &format!("local/c{i}.md"),
            &md("calibrate", "from A"),
        );
        let t = Instant::now();
        let v = sync(home, root);
        took.push(t.elapsed());
        assert_eq!(v["status"], "pushed", "{v}");
        assert!(v["backup_ref"].is_string(), "not a rebase: {v}");
    }
    took.sort();
    let full = took[1];
    let span = full.as_millis().max(20) as u64;

    // SYNC_KILL_SEED replays or varies the kill points.
    let seed = std::env::var("SYNC_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_cafe_f00d_1234_u64);
    let mut rng = Rng(seed | 1);
    let mut local_files = Vec::new();
    let mut remote_files = Vec::new();
    let mut killed = 0;
    // Where the kills landed, judged from what they left behind.
    let mut landed: BTreeMap<&str, usize> = BTreeMap::new();
    let mut left_locks = Vec::new();
    for run in 0..RUNS {
        let theirs = format!("remote/r{run}.md");
        push_from_other(&clone, &theirs, &md(&format!("r{run}"), "from B"));
        remote_files.push(theirs);
        for part in ["a", "b"] {
            let ours = format!("local/l{run}{part}.md");
            commit_file(&paths, &ours, &md(&format!("l{run}{part}"), "from A"));
            local_files.push(ours);
        }
        let rev = |dir: &Path, r: &str| {
            let o = git_out(
                home,
                &[
                    "--git-dir",
                    dir.to_str().unwrap(),
                    "rev-parse",
                    "-q",
                    "--verify",
                    r,
                ],
            );
            String::from_utf8_lossy(&o.stdout).trim().to_string()
        };
        let before_local = rev(&git_dir, "main");
        let before_remote = rev(&bare, "main");
        let before_seen = rev(&git_dir, "refs/remotes/origin/main");
        let backups = || {
            git(
                home,
                &["--git-dir", &gd, "for-each-ref", "refs/mini-letta/backup/"],
            )
        };
        let before_backups = backups();

        let delay = Duration::from_millis(rng.below(span));
        let mut child = sync_command(home, root)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = Pid::from_raw(child.id() as i32);
        std::thread::sleep(delay);
        if child.try_wait().unwrap().is_none() {
            killed += 1;
        }
        // The group: the CLI and anything it left in it.
        let _ = killpg(pgid, Signal::SIGKILL);
        child.wait().unwrap();
        // A git the CLI started (in a group of its own) finishes its step
        // and exits; as the subreaper, this process reaps it (and any
        // process of the killed group) here.
        reap_orphans();
        assert!(killpg(pgid, None).is_err(), "run {run}: the group lives on");

        assert_sound(home, &git_dir, run);
        // A lock the dead sync left is allowed only if the next sync
        // clears it (checked below, after that sync).
        left_locks.extend(locks_in(&git_dir, &bare));
        let at = if rev(&bare, "main") != before_remote {
            "after the push"
        } else if rev(&git_dir, "main") != before_local {
            "after the rebase, before the push finished"
        } else if backups() != before_backups {
            "during the rebase"
        } else if rev(&git_dir, "refs/remotes/origin/main") != before_seen {
            "after the fetch"
        } else {
            "before or during the fetch"
        };
        *landed.entry(at).or_default() += 1;

        let v = sync(home, root);
        assert!(
            v["status"] == "pushed" || v["status"] == "clean",
            "run {run} (killed after {delay:?}): {v}"
        );
        let local = git(home, &["--git-dir", &gd, "rev-parse", "main"]);
        let remote_main = git(
            home,
            &["--git-dir", bare.to_str().unwrap(), "rev-parse", "main"],
        );
        assert_eq!(
            local, remote_main,
            "run {run}: local and remote main differ"
        );
        for f in local_files.iter().chain(&remote_files) {
            let o = git_out(
                home,
                &["--git-dir", &gd, "cat-file", "-e", &format!("main:{f}")],
            );
            assert!(o.status.success(), "run {run}: {f} is missing at main");
            assert!(
                paths.memory_dir().join(f).is_file(),
                "run {run}: {f} is missing from the checkout"
            );
        }
        assert_sound(home, &git_dir, run);
        let locks = locks_in(&git_dir, &bare);
        assert!(locks.is_empty(), "run {run}: lock files left: {locks:?}");
    }
    eprintln!(
        "{RUNS} runs, {killed} killed mid-sync (uninterrupted sync {full:?}), {:?} in all; landed: {landed:?}; locks left by a kill (cleared by the next sync): {left_locks:?}",
        began.elapsed()
    );
    assert!(killed >= RUNS / 2, "too few kills landed: {killed}");
}
