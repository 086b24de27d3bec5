//! Shared set-up for the planted-repository attacks (`import.rs`,
//! `live_repo.rs`): a home with a victim tenant whose memory holds a
//! secret, and the checks that the secret never shows anywhere else.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{self, open_home, run, stderr, stdout};

/// Text only the victim's memory holds.
pub const MARKER: &str = "VICTIM-PRIVATE-4b1d9e";

/// A home with agent `victim`, whose `secret.md` holds [`MARKER`].
pub struct Tenants {
    pub home: tempfile::TempDir,
    pub victim_id: String,
    /// The victim's `main` (it holds `secret.md`).
    pub victim_commit: String,
    /// The blob of `secret.md`.
    pub victim_blob: String,
}

impl Tenants {
    pub fn new() -> Self {
        let home = open_home();
        let victim_id = common::create_agent(home.path(), &["victim"]);
        let o = run(
            home.path(),
            &[
                "memory",
                "create",
                "-a",
                "victim",
                "secret.md",
                "--description",
                "Private.",
                "--body",
                MARKER,
            ],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        let t = Tenants {
            victim_commit: String::new(),
            victim_blob: String::new(),
            home,
            victim_id,
        };
        let git_dir = t.victim_git_dir();
        Tenants {
            victim_commit: git(&git_dir, &["rev-parse", "refs/heads/main"]),
            victim_blob: git(&git_dir, &["rev-parse", "refs/heads/main:secret.md"]),
            ..t
        }
    }

    pub fn path(&self) -> &Path {
        self.home.path()
    }

    pub fn agent_dir(&self, id: &str) -> PathBuf {
        self.path().join("agents").join(id)
    }

    pub fn victim_git_dir(&self) -> PathBuf {
        self.agent_dir(&self.victim_id).join("memory.git")
    }

    pub fn victim_objects(&self) -> PathBuf {
        self.victim_git_dir().join("objects")
    }

    /// Every agent directory but the victim's.
    pub fn other_agent_dirs(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.path().join("agents"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .filter(|p| !p.ends_with(&self.victim_id))
            .collect()
    }

    /// The secret is shown by no reader of `agent`, is written into no
    /// file outside the victim's directory, and its blob is in no other
    /// agent's own object store.
    pub fn assert_never_shown(&self, agent: &str) {
        let palace = tempfile::tempdir().unwrap();
        let palace_out = palace.path().join("site");
        let readers: Vec<Vec<&str>> = vec![
            vec!["memory", "show", "-a", agent, "secret.md"],
            vec!["memory", "tree", "-a", agent],
            vec!["memory", "log", "-a", agent],
            vec!["prompt", "-a", agent, "--fresh"],
            vec!["recompile", "-a", agent],
            vec!["prompt", "-a", agent],
            vec![
                "palace",
                "export",
                palace_out.to_str().unwrap(),
                "-a",
                agent,
            ],
        ];
        for args in &readers {
            let o = run(self.path(), args);
            let shown = format!("{}{}", stdout(&o), stderr(&o));
            assert!(
                !shown.contains(MARKER),
                "`{}` showed the other tenant's secret:\n{shown}",
                args.join(" ")
            );
        }
        let mut roots = self.other_agent_dirs();
        roots.push(palace.path().to_path_buf());
        for root in roots {
            assert_no_file_holds(&root, MARKER);
        }
        for dir in self.other_agent_dirs() {
            let git_dir = dir.join("memory.git");
            if git_dir.is_dir() {
                assert!(
                    !holds_object(&git_dir, &self.victim_blob),
                    "{} holds the victim's secret blob",
                    git_dir.display()
                );
            }
        }
    }
}

/// `git ARGS` on `git_dir` with alternates, grafts and replace refs off;
/// its trimmed stdout.
pub fn git(git_dir: &Path, args: &[&str]) -> String {
    let o = git_cmd(git_dir).args(args).output().unwrap();
    assert!(o.status.success(), "git {args:?}: {}", stderr(&o));
    stdout(&o).trim().to_string()
}

fn git_cmd(git_dir: &Path) -> Command {
    let mut c = Command::new("git");
    c.arg("--git-dir")
        .arg(git_dir)
        .arg("--no-replace-objects")
        .env_remove("GIT_ALTERNATE_OBJECT_DIRECTORIES")
        .env_remove("GIT_OBJECT_DIRECTORY")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com");
    c
}

/// Whether `git_dir`'s *own* object store (never an alternate) holds `oid`.
pub fn holds_object(git_dir: &Path, oid: &str) -> bool {
    let objects = git_dir.join("objects");
    if objects.join(&oid[..2]).join(&oid[2..]).is_file() {
        return true;
    }
    let Ok(packs) = std::fs::read_dir(objects.join("pack")) else {
        return false;
    };
    packs.flatten().any(|p| {
        let path = p.path();
        path.extension().is_some_and(|e| e == "idx")
            && Command::new("git")
                .arg("show-index")
                .stdin(std::fs::File::open(&path).unwrap())
                .output()
                .is_ok_and(|o| stdout(&o).contains(oid))
    })
}

/// No regular file under `root` contains `needle`.
pub fn assert_no_file_holds(root: &Path, needle: &str) {
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                let bytes = std::fs::read(e.path()).unwrap_or_default();
                assert!(
                    !bytes.windows(needle.len()).any(|w| w == needle.as_bytes()),
                    "{} holds the other tenant's secret",
                    e.path().display()
                );
            }
        }
    }
}

/// Run `mini-letta ARGS` under `home` with extra environment.
pub fn run_env(home: &Path, args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut c = Command::new(common::bin());
    c.args(args)
        .env("MINI_LETTA_HOME", home)
        .env_remove("RUST_LOG");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}
