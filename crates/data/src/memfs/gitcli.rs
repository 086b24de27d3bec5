//! The `git` command line, run by the supervisor for everything that reaches
//! a remote (fetch, push, ls-remote, clone's fetch, the mirror's push), so
//! the operator's credential helpers and ssh configuration apply.
//!
//! Every command names its git directory with `--git-dir` (never discovered
//! from a working directory a child can write), never prompts, and runs with
//! hooks, fsmonitor and the `ext::` transport off, so nothing a repository's
//! configuration or a remote URL says can make git run a program as the
//! supervisor.
//!
//! Nor does git read any repository but the ones named: replace refs and
//! the commit-graph are off, the environment keeps no `GIT_*` variable
//! that relocates or adds object stores, config or grafts, and git cannot
//! be told to ignore `objects/info/alternates`, `info/grafts` or `shallow`
//! — so a command on a git directory, or on a directory remote, holding
//! one is refused before git starts ([`check`]). On a directory remote
//! git runs `upload-pack` / `receive-pack` itself, in that directory and
//! without our `-c` settings: they are given their own ([`command`]), so
//! the remote's hooks never run as the supervisor.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

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
pub(crate) fn running_on(git_dir: &Path) -> bool {
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
///
/// Call [`check`] first (as [`run`] and [`prepare`] do): only it refuses
/// a repository or remote git would read beyond.
pub fn command(git_dir: Option<&Path>, args: &[&str]) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new("git");
    cmd.process_group(0);
    if let Some(dir) = git_dir {
        cmd.arg("--git-dir").arg(dir);
    }
    cmd.arg("--no-replace-objects");
    for setting in SAFE_CONFIG {
        cmd.arg("-c").arg(setting);
    }
    match (args.split_first(), remote_url(args).and_then(local_remote)) {
        (Some((sub, rest)), Some(_)) => {
            // The program git starts in a directory remote, hardened alike.
            let (option, program) = if *sub == "push" {
                ("--receive-pack", "receive-pack")
            } else {
                ("--upload-pack", "upload-pack")
            };
            cmd.arg(sub)
                .arg(format!("{option}={}", remote_program(program)))
                .args(rest);
        }
        _ => {
            cmd.args(args);
        }
    }
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_none_or(|k| !kept_env(k)) {
            cmd.env_remove(key);
        }
    }
    cmd.env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_NO_REPLACE_OBJECTS", "1")
        .stdin(Stdio::null());
    cmd
}

/// `-c` settings of every git run (and of the programs git starts in a
/// directory remote): no hooks, fsmonitor, `ext::` transport, signing,
/// commit-graph (a planted one would rewrite parents), alternate refs or
/// automatic gc in a repository root works on.
const SAFE_CONFIG: &[&str] = &[
    "commit.gpgsign=false",
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "protocol.ext.allow=never",
    // Only the transports a remote root may name (memfs::remote_root); a
    // remote helper (`fd::`, `ext::`, any `X::`) is never run. `file`
    // serves the checked directory roots git reaches (ls-remote, clone).
    "protocol.allow=never",
    "protocol.file.allow=always",
    "protocol.ssh.allow=always",
    "protocol.git.allow=always",
    "protocol.http.allow=always",
    "protocol.https.allow=always",
    "core.commitGraph=false",
    "fetch.writeCommitGraph=false",
    // A command that lists no refs: alternates are refused anyway.
    "core.alternateRefsCommand=true",
    "gc.auto=0",
    "maintenance.auto=false",
    "receive.autogc=false",
    // Never write a pushed branch into a directory remote's checkout.
    "receive.denyCurrentBranch=refuse",
];

/// Inherited `GIT_*` variables kept: how to reach and authenticate to a
/// remote, the operator's own config files, identity and tracing. Every
/// other one (`GIT_DIR`, `GIT_OBJECT_DIRECTORY`,
/// `GIT_ALTERNATE_OBJECT_DIRECTORIES`, `GIT_GRAFT_FILE`, `GIT_SHALLOW_FILE`,
/// `GIT_REPLACE_REF_BASE`, `GIT_CONFIG_PARAMETERS`, `GIT_TEMPLATE_DIR`, …)
/// is removed: it could point git at another repository's data.
const KEPT_ENV: &[&str] = &[
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_SSH_VARIANT",
    "GIT_ASKPASS",
    "GIT_SSL_NO_VERIFY",
    "GIT_SSL_CAINFO",
    "GIT_SSL_CAPATH",
    "GIT_SSL_CERT",
    "GIT_SSL_KEY",
    "GIT_HTTP_USER_AGENT",
    "GIT_HTTP_LOW_SPEED_LIMIT",
    "GIT_HTTP_LOW_SPEED_TIME",
    "GIT_PROXY_COMMAND",
    "GIT_ALLOW_PROTOCOL",
    "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_SYSTEM",
    "GIT_CONFIG_NOSYSTEM",
    "GIT_EXEC_PATH",
    "GIT_AUTHOR_NAME",
    "GIT_AUTHOR_EMAIL",
    "GIT_AUTHOR_DATE",
    "GIT_COMMITTER_NAME",
    "GIT_COMMITTER_EMAIL",
    "GIT_COMMITTER_DATE",
    "GIT_TRACE",
    "GIT_TRACE_PACKET",
    "GIT_TRACE_CURL",
    "GIT_CURL_VERBOSE",
];

/// Whether an inherited variable reaches git: any but a `GIT_*` one not
/// in [`KEPT_ENV`].
fn kept_env(key: &str) -> bool {
    !key.starts_with("GIT_") || KEPT_ENV.contains(&key)
}

/// The shell command git runs for `program` in a directory remote.
fn remote_program(program: &str) -> String {
    let mut cmd = String::from("git --no-replace-objects");
    for setting in SAFE_CONFIG {
        cmd.push_str(" -c ");
        cmd.push_str(setting);
    }
    cmd.push(' ');
    cmd.push_str(program);
    cmd
}

/// The remote a command talks to: the argument after `--` of `fetch`,
/// `push`, `ls-remote` and `clone`.
fn remote_url<'a>(args: &[&'a str]) -> Option<&'a str> {
    let (sub, rest) = args.split_first()?;
    if !matches!(*sub, "fetch" | "push" | "ls-remote" | "clone") {
        return None;
    }
    let at = rest.iter().position(|a| *a == "--")?;
    rest.get(at + 1).copied()
}

/// The directory a remote URL names when git reaches it on this host
/// (`file://…` or a path; not `host:path`, which is ssh).
fn local_remote(url: &str) -> Option<PathBuf> {
    if let Some(path) = url.strip_prefix("file://") {
        return Some(PathBuf::from(path));
    }
    if url.contains("://") {
        return None;
    }
    match (url.find(':'), url.find('/')) {
        (Some(colon), Some(slash)) if colon < slash => None,
        (Some(_), None) => None,
        _ => Some(PathBuf::from(url)),
    }
}

/// Refuse a git command that would read beyond the repositories it names:
/// `git_dir`, or a directory remote, holding a file of
/// [`crate::paths::MemoryGitDir::foreign_history_files`] (git cannot be
/// told to ignore them).
pub fn check(git_dir: Option<&Path>, args: &[&str]) -> Result<(), GitCliError> {
    let refuse = |e: crate::memfs::repo::RepoError| GitCliError {
        command: args.first().copied().unwrap_or("").to_string(),
        message: e.to_string(),
    };
    if let Some(dir) = git_dir {
        crate::memfs::repo::refuse_planted(dir).map_err(refuse)?;
    }
    if let Some(path) = remote_url(args).and_then(local_remote) {
        // Where git looks for the repository of a path, in its order.
        let with = |suffix: &str| {
            let mut p = path.clone().into_os_string();
            p.push(suffix);
            PathBuf::from(p)
        };
        for candidate in [
            path.join(".git"),
            path.clone(),
            with(".git/.git"),
            with(".git"),
        ] {
            if candidate.is_dir() {
                crate::memfs::repo::refuse_planted(&candidate).map_err(refuse)?;
            }
        }
    }
    Ok(())
}

/// [`check`], then [`command`]: a git command ready to start.
pub fn prepare(git_dir: Option<&Path>, args: &[&str]) -> Result<Command, GitCliError> {
    check(git_dir, args)?;
    Ok(command(git_dir, args))
}

/// Run `git` with a bounded wait ([`GIT_TIMEOUT`]) and collect its output.
pub fn run(git_dir: Option<&Path>, args: &[&str]) -> Result<GitRun, GitCliError> {
    let name = args.first().copied().unwrap_or("").to_string();
    let fail = |message: String| GitCliError {
        command: name.clone(),
        message,
    };
    let mut child = prepare(git_dir, args)?
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fail(e.to_string()))?;
    let (out, err) = drain(&mut child);
    // Most local git steps take a few milliseconds: look often at first,
    // then back off, so the wait does not dwarf the work.
    let pace = crate::retry::Policy::backoff(
        u32::MAX,
        Duration::from_millis(1),
        Duration::from_millis(20),
    )
    .within(GIT_TIMEOUT);
    let Some(status) =
        crate::retry::wait_child(&mut child, &pace).map_err(|e| fail(e.to_string()))?
    else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(fail(format!("timed out after {GIT_TIMEOUT:?}")));
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
    fn no_variable_points_git_elsewhere() {
        for gone in [
            "GIT_DIR",
            "GIT_OBJECT_DIRECTORY",
            "GIT_ALTERNATE_OBJECT_DIRECTORIES",
            "GIT_GRAFT_FILE",
            "GIT_SHALLOW_FILE",
            "GIT_REPLACE_REF_BASE",
            "GIT_CONFIG_PARAMETERS",
            "GIT_CONFIG_COUNT",
            "GIT_CONFIG_KEY_0",
            "GIT_TEMPLATE_DIR",
            "GIT_COMMON_DIR",
            "GIT_INDEX_FILE",
        ] {
            assert!(!kept_env(gone), "{gone}");
        }
        for kept in ["PATH", "HOME", "GIT_SSH_COMMAND", "GIT_CONFIG_GLOBAL"] {
            assert!(kept_env(kept), "{kept}");
        }
        let cmd = command(None, &["version"]);
        let envs: Vec<_> = cmd.get_envs().collect();
        assert!(envs.contains(&(
            std::ffi::OsStr::new("GIT_NO_REPLACE_OBJECTS"),
            Some(std::ffi::OsStr::new("1"))
        )));
    }

    fn args_of(cmd: &Command) -> Vec<String> {
        cmd.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn directory_remotes_run_hardened_programs() {
        for (url, local) in [
            ("/srv/remotes/a.git", true),
            ("relative/a.git", true),
            ("file:///srv/a.git", true),
            ("ssh://host/a.git", false),
            ("https://host/a.git", false),
            ("host:a.git", false),
            ("git@host:dir/a.git", false),
        ] {
            assert_eq!(local_remote(url).is_some(), local, "{url}");
            let push = args_of(&command(None, &["push", "--porcelain", "--", url, "a:b"]));
            let fetch = args_of(&command(None, &["fetch", "--", url, "a:b"]));
            let hardened = |args: &[String], option: &str| {
                args.iter().any(|a| {
                    a.starts_with(option)
                        && a.contains("core.hooksPath=/dev/null")
                        && a.contains("receive.denyCurrentBranch=refuse")
                        && a.contains("--no-replace-objects")
                })
            };
            assert_eq!(hardened(&push, "--receive-pack="), local, "{url}: {push:?}");
            assert_eq!(
                hardened(&fetch, "--upload-pack="),
                local,
                "{url}: {fetch:?}"
            );
            // The URL is still the argument after `--`.
            let at = push.iter().position(|a| a == "--").unwrap();
            assert_eq!(push[at + 1], url);
        }
    }

    /// A bare repository with one commit on `main`; its id.
    fn bare_with_commit(dir: &Path, text: &str) -> git2::Oid {
        let repo = git2::Repository::init_bare(dir).unwrap();
        let sig = git2::Signature::now("t", "t@example.com").unwrap();
        let blob = repo.blob(text.as_bytes()).unwrap();
        let mut tb = repo.treebuilder(None).unwrap();
        tb.insert("a.md", blob, 0o100644).unwrap();
        let tree = repo.find_tree(tb.write().unwrap()).unwrap();
        repo.commit(Some("refs/heads/main"), &sig, &sig, text, &tree, &[])
            .unwrap()
    }

    #[test]
    fn replace_refs_are_ignored() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("r.git");
        let own = bare_with_commit(&dir, "own");
        let repo = git2::Repository::open_bare(&dir).unwrap();
        let sig = git2::Signature::now("t", "t@example.com").unwrap();
        let tree = repo.find_commit(own).unwrap().tree().unwrap();
        let other = repo.commit(None, &sig, &sig, "other", &tree, &[]).unwrap();
        repo.reference(&format!("refs/replace/{own}"), other, false, "")
            .unwrap();
        let shown = run(Some(&dir), &["log", "-1", "--format=%s", "main"])
            .unwrap()
            .checked("log")
            .unwrap();
        assert_eq!(shown.stdout.trim(), "own");
    }

    #[test]
    fn planted_files_refuse_the_command() {
        let tmp = tempfile::tempdir().unwrap();
        let local = tmp.path().join("local.git");
        let remote = tmp.path().join("remote.git");
        bare_with_commit(&local, "local");
        bare_with_commit(&remote, "remote");
        let url = remote.to_str().unwrap();
        let fetch = ["fetch", "--", url, "refs/heads/main:refs/remotes/r/main"];
        assert!(run(Some(&local), &fetch).unwrap().ok);
        for (dir, rel) in [
            (&local, "objects/info/alternates"),
            (&remote, "objects/info/alternates"),
            (&local, "shallow"),
            (&remote, "info/grafts"),
        ] {
            let planted = dir.join(rel);
            std::fs::create_dir_all(planted.parent().unwrap()).unwrap();
            std::fs::write(&planted, "\n").unwrap();
            let e = run(Some(&local), &fetch).unwrap_err();
            assert!(e.message.contains(rel), "{rel}: {e}");
            std::fs::remove_file(&planted).unwrap();
        }
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
