//! Validated-commit benchmark: on one agent repository made by `mini-letta
//! agent create` (so the real pre-commit hook is installed), prints the
//! median time of one validated commit through the library
//! (`memfs::commit::commit_paths`) and through `git commit -- <path>` with
//! the hook (which runs `mini-letta memory validate --staged`), their ratio,
//! and `git commit --no-verify` for the cost of git alone.
//!
//! Run: `cargo bench --bench commit` (or `scripts/bench-commit`); pass
//! `--quick` for 10 commits per case instead of 60. `--files N` grows the
//! repository first (N extra memory files in indexed directories).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use git2::Signature;
use mini_letta::memfs::commit::{CommitOptions, commit_paths};
use mini_letta::memfs::repo;

fn git(mem: &Path, args: &[&str]) {
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
        .arg(mem)
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
    format!("---\nname: {name}\ndescription: Benchmark file.\n---\niteration {i}\n")
}

fn main() {
    support::say_binary();
    let args: Vec<String> = std::env::args().collect();
    let runs = if args.iter().any(|a| a == "--quick") {
        10
    } else {
        60
    };
    let files: usize = args
        .iter()
        .position(|a| a == "--files")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);

    let home = tempfile::tempdir().unwrap();
    let o = Command::new(support::bin())
        .args(["agent", "create", "bench", "--json"])
        .env("MINI_LETTA_HOME", home.path())
        .output()
        .unwrap();
    assert!(o.status.success());
    let id = serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mem = home.path().join("agents").join(id).join("memory");
    if files > 0 {
        for d in 0..files.div_ceil(40) {
            let dir = mem.join(format!("area-{d:03}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("MEMORY.md"), "# Area\n").unwrap();
        }
        for i in 0..files {
            let p = mem.join(format!("area-{:03}/file-{i}.md", i / 40));
            std::fs::write(p, content(&format!("File {i}"), 0)).unwrap();
        }
        git(&mem, &["add", "-A"]);
        git(&mem, &["commit", "-q", "--no-verify", "-m", "grow"]);
    }

    // The library's validated, path-limited commit, and `git commit` with
    // the installed hook and without it, the same shape of commit each,
    // alternated.
    let repository = repo::open(&mem).unwrap();
    let opts = CommitOptions::for_repo(&repository, false);
    let sig = Signature::now("Bench", "bench@example.com").unwrap();
    let paths = ["lib-bench.md".to_string()];
    std::fs::write(mem.join("git-bench.md"), content("Git Bench", 0)).unwrap();
    git(&mem, &["add", "git-bench.md"]);
    git(&mem, &["commit", "-q", "-m", "seed"]);
    let edits = std::cell::Cell::new(0usize);
    let git_commit = |no_verify: bool| {
        edits.set(edits.get() + 1);
        std::fs::write(mem.join("git-bench.md"), content("Git Bench", edits.get())).unwrap();
        let mut args = vec!["commit", "-q", "-m", "bench"];
        if no_verify {
            args.push("--no-verify");
        }
        args.extend(["--", "git-bench.md"]);
        support::time_ms(|| git(&mem, &args))
    };
    let rounds = support::alternate(
        runs,
        vec![
            support::Case::new("library commit_paths", || {
                edits.set(edits.get() + 1);
                std::fs::write(mem.join(&paths[0]), content("Lib Bench", edits.get())).unwrap();
                let t = Instant::now();
                let out = commit_paths(&repository, &paths, "bench", &sig, &opts).unwrap();
                let ms = t.elapsed().as_secs_f64() * 1000.0;
                assert!(out.commit.is_some());
                ms
            }),
            support::Case::new("git commit --no-verify", || git_commit(true)),
            support::Case::new("git commit -- PATH with hook", || git_commit(false)),
        ],
    );
    rounds.print(
        &format!(
            "validated commit, repository of {} files",
            3 + files + files.div_ceil(40) + 2
        ),
        "ms",
    );
}
