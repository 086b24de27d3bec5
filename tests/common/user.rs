//! An ordinary (non-root) user for the tests that check what one gets
//! (issue 44): created with `useradd` when missing, given copies of the
//! programs in a directory it can reach (the build's may not be), a home
//! of its own, and commands run as it with `runuser`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::{bin, skip, stderr};

/// The user the tests run as.
pub const USER: &str = "mini-letta-probe";

pub struct User {
    programs: tempfile::TempDir,
    home: tempfile::TempDir,
}

impl User {
    /// The user with a fresh home, or `None` (said loudly; a failure under
    /// `MINI_LETTA_REQUIRE_SANDBOX=1`) when this process is not root.
    pub fn create(test: &str) -> Option<Self> {
        if !nix::unistd::geteuid().is_root() {
            skip(&format!("{test}: needs root to create and become a user"));
            return None;
        }
        if Command::new("id").arg(USER).output().unwrap().status.code() != Some(0) {
            let o = Command::new("useradd")
                .args(["--no-create-home", "--shell", "/usr/sbin/nologin", USER])
                .output()
                .unwrap();
            assert!(o.status.success(), "useradd: {}", stderr(&o));
        }
        let programs = tempfile::tempdir().unwrap();
        std::fs::set_permissions(programs.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        for name in ["mini-letta", "mini-letta-agent", "mini-letta-stage2"] {
            let to = programs.path().join(name);
            std::fs::copy(bin().with_file_name(name), &to).unwrap();
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let home = tempfile::tempdir().unwrap();
        std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let user = Self { programs, home };
        // Its own `HOME`, where per-user state (agent uids) is kept.
        let own = user.user_home();
        std::fs::create_dir(&own).unwrap();
        let uid = user.uid();
        std::os::unix::fs::chown(&own, Some(uid), Some(uid)).unwrap();
        Some(user)
    }

    /// Its `HOME`.
    pub fn user_home(&self) -> PathBuf {
        self.home.path().join("u")
    }

    /// Its `MINI_LETTA_HOME` (made by its first command, so the user's).
    pub fn home(&self) -> PathBuf {
        self.home.path().join("h")
    }

    /// `mini-letta ARGS` as the user.
    pub fn run(&self, args: &[&str]) -> Output {
        self.run_env(args, &[])
    }

    /// `mini-letta ARGS` as the user, with `env` set.
    pub fn run_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", USER, "--"]);
        self.user_command(&mut cmd, args, env);
        cmd.output().unwrap()
    }

    /// `mini-letta ARGS` as the user on a host with no cgroups at all: in
    /// a mount namespace of its own whose `/sys/fs/cgroup` is an empty
    /// tmpfs (a machine that mounts none, or hides them).
    pub fn run_without_cgroups(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(r#"mount -t tmpfs none /sys/fs/cgroup && exec runuser -u "$0" -- "$@""#)
            .arg(USER);
        self.user_command(&mut cmd, args, env);
        cmd.output().unwrap()
    }

    fn user_command(&self, cmd: &mut Command, args: &[&str], env: &[(&str, &str)]) {
        // runuser sets HOME to the user's passwd entry: given after it.
        cmd.arg("env")
            .arg(format!("HOME={}", self.user_home().display()))
            .arg(self.programs.path().join("mini-letta"))
            .args(args)
            .env("MINI_LETTA_HOME", self.home())
            .env_remove("XDG_STATE_HOME")
            .env_remove("RUST_LOG")
            .env_remove("MINI_LETTA_SANDBOX_DISABLE")
            .env_remove("MINI_LETTA_NAMESPACES")
            .current_dir(self.programs.path());
        for (k, v) in env {
            cmd.env(k, v);
        }
    }

    /// Whether this user's processes get per-agent uids from its
    /// subordinate range (`sandbox status` says so), else why not.
    pub fn has_subids(&self) -> Result<(), String> {
        let o = self.run(&["sandbox", "status", "--json"]);
        let v: serde_json::Value =
            serde_json::from_slice(&o.stdout).map_err(|e| format!("sandbox status --json: {e}"))?;
        if v["uid_switch"]["available"] == true {
            Ok(())
        } else {
            Err(v["uid_switch"]["detail"].to_string())
        }
    }

    /// `mini-letta ARGS` as the user with `env` set, started and left running.
    pub fn spawn_env(&self, args: &[&str], env: &[(&str, &str)]) -> std::process::Child {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", USER, "--"]);
        self.user_command(&mut cmd, args, env);
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    }

    /// The user's subordinate uid range (`start`, `count` as mini-letta
    /// uses it), granted with `usermod --add-subuids/--add-subgids` when
    /// `/etc/subuid` or `/etc/subgid` names none.
    pub fn ensure_subids(&self) -> (u32, u32) {
        let range = |file: &str| -> Option<(u32, u32)> {
            std::fs::read_to_string(file).ok()?.lines().find_map(|l| {
                let mut f = l.split(':');
                (f.next()? == USER).then_some(())?;
                Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
            })
        };
        if range("/etc/subuid").is_none() || range("/etc/subgid").is_none() {
            let o = Command::new("usermod")
                .args([
                    "--add-subuids",
                    "400000-465535",
                    "--add-subgids",
                    "400000-465535",
                    USER,
                ])
                .output()
                .unwrap();
            assert!(o.status.success(), "usermod: {}", super::stderr(&o));
        }
        let (start, uids) = range("/etc/subuid").unwrap();
        let (_, gids) = range("/etc/subgid").unwrap();
        (start, uids.min(gids).min(100_000))
    }

    /// The user's uid.
    pub fn uid(&self) -> u32 {
        let o = Command::new("id").args(["-u", USER]).output().unwrap();
        String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
    }

    /// The agent directory of the user's agent whose record names `name`.
    pub fn agent_dir(&self, name: &str) -> PathBuf {
        let agents = self.home().join("agents");
        std::fs::read_dir(&agents)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                std::fs::read_to_string(p.join("agent.json"))
                    .ok()
                    .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                    .is_some_and(|v| v["name"] == name)
            })
            .unwrap_or_else(|| panic!("no agent named {name} in {}", agents.display()))
    }

    /// The memory repository's git directory of its only agent.
    pub fn git_dir(&self) -> PathBuf {
        let agents = self.home().join("agents");
        let agent = std::fs::read_dir(&agents)
            .unwrap()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().starts_with("agent-"))
            .unwrap();
        agent.path().join("memory.git")
    }
}

/// `path` of `HEAD` in the git directory `git_dir`.
pub fn head_file(git_dir: &Path, path: &str) -> String {
    let o = Command::new("git")
        .args(["-c", "safe.directory=*", "--git-dir"])
        .arg(git_dir)
        .args(["show", &format!("HEAD:{path}")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The host pid of a process whose command line is exactly `argv`.
pub fn pid_running(argv: &[&str]) -> Option<u32> {
    let want: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        (std::fs::read(e.path().join("cmdline")).ok()? == want).then_some(pid)
    })
}

/// Poll `f` every 50 ms until it answers or `limit` passes.
pub fn wait_for<T>(limit: std::time::Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
