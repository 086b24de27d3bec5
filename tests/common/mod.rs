//! Helpers shared by the integration tests: real git repositories built with
//! git2 in temporary directories, and the built binary.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use git2::{IndexAddOption, Repository, Signature};

/// A repository in a temporary directory.
pub struct TestRepo {
    pub dir: tempfile::TempDir,
    pub repo: Repository,
}

impl TestRepo {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = git2::RepositoryInitOptions::new();
        opts.initial_head("main");
        let repo = Repository::init_opts(dir.path(), &opts).unwrap();
        Self { dir, repo }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Write a file into the working tree (creating directories).
    pub fn write(&self, rel: &str, contents: impl AsRef<[u8]>) -> &Self {
        let p = self.dir.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, contents).unwrap();
        self
    }

    pub fn remove(&self, rel: &str) -> &Self {
        std::fs::remove_file(self.dir.path().join(rel)).unwrap();
        self
    }

    /// Stage the whole working tree (additions, changes, deletions).
    pub fn stage_all(&self) {
        let mut index = self.repo.index().unwrap();
        index
            .add_all(["*"], IndexAddOption::DEFAULT | IndexAddOption::FORCE, None)
            .unwrap();
        index.update_all(["*"], None).unwrap();
        index.write().unwrap();
    }

    /// Stage only `rel`.
    pub fn stage(&self, rel: &str) {
        let mut index = self.repo.index().unwrap();
        index.add_path(Path::new(rel)).unwrap();
        index.write().unwrap();
    }

    /// Stage everything and commit; returns the commit id.
    pub fn commit_all(&self, message: &str) -> git2::Oid {
        self.stage_all();
        let mut index = self.repo.index().unwrap();
        let tree_id = index.write_tree().unwrap();
        let tree = self.repo.find_tree(tree_id).unwrap();
        let sig = Signature::now("Test", "test@example.com").unwrap();
        let parent = self.repo.head().ok().and_then(|h| h.peel_to_commit().ok());
        let parents: Vec<&git2::Commit> = parent.iter().collect();
        self.repo
            .commit(Some("HEAD"), &sig, &sig, message, &tree, &parents)
            .unwrap()
    }

    /// Write `files` and commit them.
    pub fn with_files(files: &[(&str, &str)]) -> Self {
        let r = Self::new();
        for (p, c) in files {
            r.write(p, c);
        }
        r.commit_all("test");
        r
    }
}

/// The `mini-letta` binary built for these tests.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_mini-letta"))
}

/// The agent-side program (`mini-letta-agent`), which holds the internal
/// commands children run (`channel call`, `channel ping`).
pub fn agent_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_mini-letta-agent"))
}

/// Run the binary with `args` under `home`.
pub fn run(home: &Path, args: &[&str]) -> Output {
    run_bin(&bin(), home, args)
}

/// Run `bin` (a build of `mini-letta`) with `args` under `home`.
pub fn run_bin(bin: &Path, home: &Path, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .env("MINI_LETTA_HOME", home)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A fresh home agent uids can traverse (a plain temporary directory is
/// 0700, which would stop every confined child at its first step).
pub fn open_home() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    dir
}

/// `agent create` with `args` (name first) under `home`; the new id.
pub fn create_agent(home: &Path, args: &[&str]) -> String {
    let mut all = vec!["agent", "create"];
    all.extend_from_slice(args);
    all.push("--json");
    let o = run(home, &all);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["id"].as_str().unwrap().to_string()
}

/// A background supervisor on a fresh home with one agent per name given;
/// stopped (and killed if need be) on drop.
pub struct Daemon {
    pub home: tempfile::TempDir,
    pub agents: Vec<String>,
}

impl Daemon {
    pub fn start(agent_names: &[&str]) -> Self {
        Self::start_with_env(agent_names, &[])
    }

    pub fn start_with_env(agent_names: &[&str], env: &[(&str, &str)]) -> Self {
        let home = tempfile::tempdir().unwrap();
        let mut agents = Vec::new();
        for name in agent_names {
            let o = run(home.path(), &["agent", "create", name, "--json"]);
            assert!(o.status.success(), "{}", stderr(&o));
            let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
            agents.push(v["id"].as_str().unwrap().to_string());
        }
        let mut cmd = Command::new(bin());
        cmd.args(["supervisor", "start"])
            .env("MINI_LETTA_HOME", home.path());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        Self { home, agents }
    }

    pub fn path(&self) -> &Path {
        self.home.path()
    }

    pub fn mini_home(&self) -> mini_letta::paths::Home {
        mini_letta::paths::Home::at(self.home.path())
    }

    pub fn client(&self) -> mini_letta::protocol::client::Client {
        mini_letta::supervisor::connect(&self.mini_home()).unwrap()
    }

    pub fn pid(&self) -> u32 {
        self.client().server_pid
    }

    pub fn memory_dir(&self, agent: usize) -> PathBuf {
        self.home
            .path()
            .join("agents")
            .join(&self.agents[agent])
            .join("memory")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = run(self.home.path(), &["supervisor", "stop", "--timeout", "5"]);
    }
}

/// Whether `pid` is gone (or a zombie nobody reaped yet).
pub fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit(')')
            .next()
            .map(|r| r.trim_start().starts_with('Z'))
            .unwrap_or(false),
    }
}

/// Poll `cond` for up to `secs` seconds.
pub fn wait_until(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    cond()
}

/// Whether this process may run a test that needs root (chown, other uids);
/// when not, [`skip`] (loud, and a failure under `MINI_LETTA_REQUIRE_SANDBOX=1`).
pub fn require_root(test: &str) -> bool {
    nix::unistd::geteuid().is_root()
        || skip(&format!(
            "{test} needs root (it chowns and checks ownership)"
        ))
}
pub mod cluster;
pub mod etcd;
pub mod http;
pub mod pty;
pub mod remote;
pub mod rng;
pub mod user;

/// Whether this host confines children fully (level L0, as root); when not,
/// says why loudly — and under `MINI_LETTA_REQUIRE_SANDBOX=1` (CI) fails
/// instead, so a missing kernel feature can never pass silently.
pub fn confinement_or_skip(test: &str) -> bool {
    let o = Command::new(bin())
        .args(["sandbox", "status", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    let why = if !nix::unistd::geteuid().is_root() {
        Some("not root: agent uids cannot be switched".to_string())
    } else if v["level"] != "L0" {
        Some(format!(
            "sandbox level {} (need L0): {}",
            v["level"], v["missing"]
        ))
    } else {
        None
    };
    match why {
        None => true,
        Some(why) => skip(&format!("{test}: {why}")),
    }
}

/// Skip a test that needs something this host lacks: loudly, and never
/// silently in CI — under `MINI_LETTA_REQUIRE_SANDBOX=1` this fails the
/// test instead. Returns false, for `if !… { return skip(…) }`.
pub fn skip(why: &str) -> bool {
    skip_or_fail(why);
    false
}

/// The variable that turns a missing sandbox prerequisite from a skip into
/// a failure (CI on a host that must confine sets it).
pub const REQUIRE_SANDBOX_ENV: &str = "MINI_LETTA_REQUIRE_SANDBOX";

/// Say loudly that a test is skipped; under `MINI_LETTA_REQUIRE_SANDBOX=1`
/// fail instead, so a CI job that expects confinement cannot pass by
/// skipping.
pub fn skip_or_fail(reason: &str) {
    eprintln!("SKIPPED (loudly): {reason}");
    if std::env::var(REQUIRE_SANDBOX_ENV).as_deref() == Ok("1") {
        panic!("{REQUIRE_SANDBOX_ENV}=1 but the test had to be skipped: {reason}");
    }
}

/// Whether program `name` is on this host's PATH; when it is not, say so
/// loudly (and fail under `MINI_LETTA_REQUIRE_SANDBOX=1`, where CI
/// installs it).
#[allow(dead_code)]
pub fn tool_present(name: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(name).is_file()));
    if !found {
        skip_or_fail(&format!("{name} is not installed"));
    }
    found
}

/// The hostile test child (`tests/hostile/child.c`), built once per test
/// binary with the system C compiler into a directory agent uids can read.
pub fn hostile_child() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            // Kept for the test process's life (the binary is shared by
            // its tests); a unique name, so parallel test processes never
            // race on one build.
            let dir = tempfile::Builder::new()
                .prefix("mini-letta-hostile-")
                .tempdir()
                .unwrap()
                .keep();
            std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
            let out = dir.join("child");
            let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostile/child.c");
            let o = Command::new("cc")
                .arg("-O1")
                .arg("-o")
                .arg(&out)
                .arg(&src)
                .output()
                .expect("the C compiler (cc) is needed to build the hostile test child");
            assert!(o.status.success(), "cc failed: {}", stderr(&o));
            out
        })
        .clone()
}

/// mini-letta's programs as installed side by side in `dir`, with the
/// agent program replaced by the shell `script`: a copy of the CLI and of
/// the child stage, and a hostile `mini-letta-agent`. Returns the CLI.
pub fn install_with_agent_program(dir: &Path, script: &str) -> PathBuf {
    let cli = dir.join("mini-letta");
    std::fs::copy(bin(), &cli).unwrap();
    let stage = bin().with_file_name("mini-letta-stage2");
    std::fs::copy(&stage, dir.join("mini-letta-stage2")).unwrap();
    let agent = dir.join("mini-letta-agent");
    std::fs::write(&agent, script).unwrap();
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    cli
}
