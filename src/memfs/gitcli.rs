//! The `git` command line, run by the supervisor for everything that reaches
//! a remote (fetch, push, ls-remote, clone's fetch, the mirror's push), so
//! the operator's credential helpers and ssh configuration apply.
//!
//! Every command names its git directory with `--git-dir` (never discovered
//! from a working directory a child can write), never prompts, and runs with
//! hooks, fsmonitor and the `ext::` transport off, so nothing a repository's
//! configuration or a remote URL says can make git run a program as the
//! supervisor.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Bound on each git command (network operations included).
pub const GIT_TIMEOUT: Duration = Duration::from_secs(120);

/// A git command that could not run or failed.
#[derive(Debug, thiserror::Error)]
#[error("git {command} failed: {message}")]
pub struct GitCliError {
    pub command: String,
    pub message: String,
}

/// Output of one git command.
#[derive(Debug)]
pub struct GitRun {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl GitRun {
    /// `Ok(self)` when git succeeded, else its stderr as the error.
    pub fn checked(self, command: &str) -> Result<Self, GitCliError> {
        if self.ok {
            Ok(self)
        } else {
            Err(GitCliError {
                command: command.to_string(),
                message: self.stderr.trim().to_string(),
            })
        }
    }
}

/// Whether a git process started by [`command`] for `git_dir` is running
/// (found by its `--git-dir` argument in `/proc`): one left running by a
/// killed supervisor still owns the locks it took.
pub fn running_on(git_dir: &Path) -> bool {
    // libgit2 names a git directory with a trailing slash; we pass none.
    let trim = |b: &[u8]| -> Vec<u8> {
        let mut v = b.to_vec();
        while v.len() > 1 && v.last() == Some(&b'/') {
            v.pop();
        }
        v
    };
    let want = trim(git_dir.as_os_str().as_encoded_bytes());
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return true;
    };
    procs.flatten().any(|p| {
        let is_pid = p
            .file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()));
        is_pid
            && std::fs::read(p.path().join("cmdline")).is_ok_and(|cmd| {
                let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
                args.windows(2)
                    .any(|w| w[0] == b"--git-dir" && trim(w[1]) == want)
            })
    })
}

/// A `git` command with the supervisor's safe defaults, not yet started.
///
/// git runs in a process group of its own: a SIGKILL sent to the caller's
/// group (a CLI killed with its group) must not land inside git while it
/// holds a ref or index lock, which would leave a `*.lock` behind that stops
/// every later fetch or push (for a directory remote, `git receive-pack`
/// runs here too and would leave it in the remote). A git left without its
/// parent finishes its step, or stops at its next write to the closed pipes,
/// and git removes its locks on SIGPIPE.
pub fn command(git_dir: Option<&Path>, args: &[&str]) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new("git");
    cmd.process_group(0);
    if let Some(dir) = git_dir {
        cmd.arg("--git-dir").arg(dir);
    }
    cmd.args([
        "-c",
        "commit.gpgsign=false",
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "core.fsmonitor=false",
        "-c",
        "protocol.ext.allow=never",
    ])
    .args(args)
    .env("GIT_TERMINAL_PROMPT", "0")
    .env_remove("GIT_DIR")
    .env_remove("GIT_WORK_TREE")
    .env_remove("GIT_INDEX_FILE")
    .stdin(Stdio::null());
    cmd
}

/// Run `git` with a bounded wait ([`GIT_TIMEOUT`]) and collect its output.
pub fn run(git_dir: Option<&Path>, args: &[&str]) -> Result<GitRun, GitCliError> {
    let name = args.first().copied().unwrap_or("").to_string();
    let fail = |message: String| GitCliError {
        command: name.clone(),
        message,
    };
    let mut child = command(git_dir, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fail(e.to_string()))?;
    let (out, err) = drain(&mut child);
    let deadline = Instant::now() + GIT_TIMEOUT;
    // Most local git steps take a few milliseconds: poll often at first,
    // then back off, so the wait does not dwarf the work.
    let mut nap = Duration::from_millis(1);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(20));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(fail(format!("timed out after {GIT_TIMEOUT:?}")));
            }
            Err(e) => return Err(fail(e.to_string())),
        }
    };
    Ok(GitRun {
        ok: status.success(),
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

/// `git fetch` of `specs` from `url` into `git_dir`: no tags, no
/// `FETCH_HEAD` (the refs named are the only writes).
pub fn fetch(git_dir: &Path, url: &str, specs: &[&str]) -> Result<GitRun, GitCliError> {
    let mut args = vec!["fetch", "--no-tags", "--no-write-fetch-head", "--", url];
    args.extend_from_slice(specs);
    run(Some(git_dir), &args)
}

type Drained = std::thread::JoinHandle<String>;

/// Read both pipes on threads, so a chatty git never blocks on a full pipe.
fn drain(child: &mut Child) -> (Drained, Drained) {
    fn reader(pipe: Option<Box<dyn Read + Send>>) -> Drained {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    }
    (
        reader(child.stdout.take().map(|p| Box::new(p) as _)),
        reader(child.stderr.take().map(|p| Box::new(p) as _)),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn ext_transport_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let url = format!("ext::sh -c touch% {}", marker.display());
        let run = run(None, &["ls-remote", "--", &url]).unwrap();
        assert!(!run.ok);
        assert!(!marker.exists(), "the ext:: transport ran a command");
    }

    #[test]
    fn failures_carry_stderr() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.git");
        let e = run(None, &["ls-remote", "--", missing.to_str().unwrap()])
            .unwrap()
            .checked("ls-remote")
            .unwrap_err();
        assert_eq!(e.command, "ls-remote");
        assert!(!e.message.is_empty());
    }
}
