//! Several homes sharing one remote root (a directory of bare
//! repositories): the CLI run with the root in its environment, and git as
//! an operator (or an attacker with write access to the root) runs it.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use super::{bin, stderr, stdout};

/// `mini-letta ARGS` on `home` with the shared remote `root`.
pub fn on(home: &Path, root: &Path, args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .env("MINI_LETTA_HOME", home)
        .env("MINI_LETTA_REMOTE_ROOT", root)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

/// The stdout of a command that must have succeeded.
pub fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    stdout(&o)
}

/// The JSON a command that must have succeeded printed.
pub fn json(o: Output) -> Value {
    let text = ok(o);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// How an operator runs git in an agent's checkout: it belongs to the
/// agent's uid once the agent has run, so git wants it declared safe.
pub const OPERATOR: [&str; 6] = [
    "-c",
    "safe.directory=*",
    "-c",
    "user.name=Operator",
    "-c",
    "user.email=op@example.com",
];

/// `git ARGS` as the operator, in `dir`.
pub fn git(dir: &Path, args: &[&str]) -> Output {
    Command::new("git")
        .args(OPERATOR)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
}

/// [`git`] that must succeed; its stdout.
pub fn git_ok(dir: &Path, args: &[&str]) -> String {
    let o = git(dir, args);
    assert!(
        o.status.success(),
        "git {args:?}: {}{}",
        stdout(&o),
        stderr(&o)
    );
    stdout(&o)
}

/// `main` of the git directory `git_dir`.
pub fn main_of(git_dir: &Path) -> String {
    git_ok(
        Path::new("/"),
        &["--git-dir", git_dir.to_str().unwrap(), "rev-parse", "main"],
    )
    .trim()
    .to_string()
}

/// Whether the git directory `git_dir` holds object `oid`.
pub fn has_object(git_dir: &Path, oid: &str) -> bool {
    Command::new("git")
        .arg("--git-dir")
        .arg(git_dir)
        .args(["cat-file", "-e", oid])
        .status()
        .unwrap()
        .success()
}

/// The object id `rev:path` names in the git directory `git_dir`.
pub fn object_at(git_dir: &Path, spec: &str) -> String {
    git_ok(
        Path::new("/"),
        &["--git-dir", git_dir.to_str().unwrap(), "rev-parse", spec],
    )
    .trim()
    .to_string()
}
