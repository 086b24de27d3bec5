//! The post-commit mirror (book chapter 18, exercise 2): when the memory
//! repository's *local* git configuration names
//! `mini-letta.memoryRepository.url`, every new `main` is pushed there in
//! the background and logged to `memory.git/mirror.log`. Only `main` is ever
//! pushed (worktree branches never mirror), never forced, and a commit never
//! waits for it: a failed or slow mirror is a line in the log.
//!
//! The supervisor commits through libgit2, which runs no hooks, so the
//! places that move `main` call [`main_moved`]; a person's `git commit` in
//! the checkout runs the `post-commit` hook ([`hook_script`]) instead. The
//! URL comes from `memory.git/config`, which children cannot write.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Mutex, OnceLock};

use crate::paths::MemoryGitDir;

/// The local configuration key naming the mirror.
pub const URL_KEY: &str = "mini-letta.memoryRepository.url";

/// The first line of the `post-commit` hook mini-letta writes.
pub const HOOK_MARKER: &str = "# mini-letta post-commit hook";

/// The mirror URL configured in `git_dir/config` (that file only: a global
/// or system setting does not make every agent mirror to one place).
pub(crate) fn configured_url(git_dir: &Path) -> Option<String> {
    let cfg = git2::Config::open(&MemoryGitDir::new(git_dir).config_file()).ok()?;
    let url = cfg.get_string(URL_KEY).ok()?;
    let url = url.trim().trim_end_matches('/').to_string();
    (!url.is_empty()).then_some(url)
}

/// Per git directory: a push is running, and whether `main` moved again
/// since it started (then one more push follows it).
fn in_flight() -> &'static Mutex<HashMap<PathBuf, bool>> {
    static MAP: OnceLock<Mutex<HashMap<PathBuf, bool>>> = OnceLock::new();
    MAP.get_or_init(|| Mutex::new(HashMap::new()))
}

/// A commit was made on `repo`'s `HEAD`: mirror it when that is `main` of
/// the main checkout (a worktree's branch never mirrors).
pub(crate) fn head_committed(repo: &git2::Repository) {
    if repo.is_worktree() {
        return;
    }
    let on_main = repo
        .head()
        .ok()
        .is_some_and(|h| h.name().ok() == Some("refs/heads/main"));
    if on_main {
        main_moved(repo.commondir());
    }
}

/// `main` of the repository at `git_dir` (the common git directory) moved:
/// push it to the mirror in the background when one is configured. Returns
/// at once; what happens is logged in `mirror.log`.
pub fn main_moved(git_dir: &Path) {
    if configured_url(git_dir).is_none() {
        return;
    }
    let key = git_dir.to_path_buf();
    {
        let Ok(mut map) = in_flight().lock() else {
            return;
        };
        if let Some(again) = map.get_mut(&key) {
            *again = true;
            return;
        }
        map.insert(key.clone(), false);
    }
    let spawned = std::thread::Builder::new()
        .name("memory-mirror".into())
        .spawn(move || {
            loop {
                push_once(&key);
                let Ok(mut map) = in_flight().lock() else {
                    return;
                };
                if map.get(&key) == Some(&true) {
                    map.insert(key.clone(), false);
                } else {
                    map.remove(&key);
                    return;
                }
            }
        });
    if spawned.is_err()
        && let Ok(mut map) = in_flight().lock()
    {
        map.remove(git_dir);
    }
}

/// One push of `main`, logged: a header line, git's output, `exit=<code>`.
/// The push runs under `sh` in a process group of its own with the log as
/// its output, so the `exit=` line is written even when this process ends
/// first (a one-shot CLI); this thread only reaps it.
fn push_once(git_dir: &Path) {
    let Some(url) = configured_url(git_dir) else {
        return;
    };
    let log_path = MemoryGitDir::new(git_dir).mirror_log();
    let Ok(mut log) = OpenOptions::new().create(true).append(true).open(&log_path) else {
        tracing::warn!("cannot open {}", log_path.display());
        return;
    };
    let short = crate::memfs::repo::open_bare(git_dir)
        .ok()
        .and_then(|r| r.refname_to_id("refs/heads/main").ok())
        .map(|id| id.to_string()[..7].to_string())
        .unwrap_or_else(|| "-------".into());
    let now = crate::clock::now_rfc3339();
    let _ = writeln!(log, "--- {now} {short} on main ---");
    let (Ok(out), Ok(err)) = (log.try_clone(), log.try_clone()) else {
        return;
    };
    let prepared = crate::memfs::gitcli::prepare(
        Some(git_dir),
        &[
            "push",
            "--quiet",
            "--",
            &url,
            "refs/heads/main:refs/heads/main",
        ],
    );
    let cmd = match prepared {
        Ok(cmd) => cmd,
        Err(e) => {
            let _ = writeln!(log, "{e}\nexit=1");
            return;
        }
    };
    // `sh -c '"$@"; echo exit=$?' sh git …`: the arguments stay arguments.
    let program = cmd.get_program().to_owned();
    let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
    let envs: Vec<_> = cmd
        .get_envs()
        .map(|(k, v)| (k.to_owned(), v.map(|v| v.to_owned())))
        .collect();
    let mut sh = std::process::Command::new("sh");
    sh.arg("-c")
        .arg("\"$@\"; echo \"exit=$?\"")
        .arg("sh")
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    for (k, v) in envs {
        match v {
            Some(v) => sh.env(k, v),
            None => sh.env_remove(k),
        };
    }
    match sh.spawn() {
        Ok(mut child) => {
            let _ = child.wait();
        }
        Err(e) => {
            let _ = writeln!(log, "cannot start git push: {e}\nexit=127");
        }
    }
}

/// The `post-commit` hook: the same mirror for a person's `git commit` in
/// the checkout. Plain `sh` and git, so it needs no binary path.
pub(crate) fn hook_script() -> String {
    format!(
        "#!/bin/sh\n\
{HOOK_MARKER}: mirror main to {URL_KEY} when it is set.\n\
# Written by mini-letta; do not edit. Never blocks or fails a commit.\n\
url=$(git config --local --get {URL_KEY}) || exit 0\n\
[ -n \"$url\" ] || exit 0\n\
branch=$(git symbolic-ref --quiet --short HEAD) || exit 0\n\
[ \"$branch\" = main ] || exit 0\n\
log=\"$(git rev-parse --git-common-dir)/mirror.log\"\n\
(\n\
  echo \"--- $(date -u +%Y-%m-%dT%H:%M:%SZ) $(git rev-parse --short=7 HEAD) on main ---\"\n\
  git push --quiet -- \"$url\" refs/heads/main:refs/heads/main\n\
  echo \"exit=$?\"\n\
) >>\"$log\" 2>&1 </dev/null &\n\
exit 0\n"
    )
}
