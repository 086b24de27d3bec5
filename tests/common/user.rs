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
        Some(Self { programs, home })
    }

    /// Its `MINI_LETTA_HOME` (made by its first command, so the user's).
    pub fn home(&self) -> PathBuf {
        self.home.path().join("h")
    }

    /// `mini-letta ARGS` as the user.
    pub fn run(&self, args: &[&str]) -> Output {
        Command::new("runuser")
            .args(["-u", USER, "--"])
            .arg(self.programs.path().join("mini-letta"))
            .args(args)
            .env("MINI_LETTA_HOME", self.home())
            .env_remove("RUST_LOG")
            .current_dir(self.programs.path())
            .output()
            .unwrap()
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
