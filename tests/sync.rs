//! `mini-letta sync` against a directory of bare repositories: the first
//! sync makes the remote, another host's commit comes back by
//! fast-forward, a dirty checkout is refused, no remote is `skipped`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use serde_json::Value;

fn sync(home: &Path, root: Option<&Path>) -> (Value, bool) {
    let mut c = Command::new(bin());
    c.args(["sync", "-a", "owl", "--json"])
        .env("MINI_LETTA_HOME", home)
        .env_remove("RUST_LOG");
    match root {
        Some(r) => c.env("MINI_LETTA_REMOTE_ROOT", r),
        None => c.env_remove("MINI_LETTA_REMOTE_ROOT"),
    };
    let o = c.output().unwrap();
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&o), stderr(&o)));
    (v, o.status.success())
}

fn git(args: &[&str], dir: &Path) -> String {
    let o = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn sync_makes_the_remote_pulls_another_hosts_commit_and_refuses_a_dirty_checkout() {
    if !confinement_or_skip("sync") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let remote = tempfile::tempdir().unwrap();
    let id = create_agent(h, &["owl"]);
    let o = run(h, &["chat", "-a", "owl", "-p", "记住: 我住在杭州"]);
    assert!(o.status.success(), "{}", stderr(&o));

    // No remote configured.
    let (v, ok) = sync(h, None);
    assert!(ok);
    assert_eq!(v["status"], "skipped", "{v}");

    // First sync: the bare repository is made and main pushed.
    let (v, ok) = sync(h, Some(remote.path()));
    assert!(ok, "{v}");
    assert_eq!(v["status"], "pushed", "{v}");
    let bare = remote.path().join(format!("{id}.git"));
    let remote_main = git(
        &["--git-dir", bare.to_str().unwrap(), "rev-parse", "main"],
        h,
    );
    let local_main = git(
        &[
            "--git-dir",
            h.join(format!("agents/{id}/memory.git")).to_str().unwrap(),
            "rev-parse",
            "main",
        ],
        h,
    );
    assert_eq!(remote_main, local_main);
    let (v, _) = sync(h, Some(remote.path()));
    assert_eq!(v["status"], "clean", "{v}");

    // Another host commits and pushes; this one fast-forwards.
    let other = tempfile::tempdir().unwrap();
    git(&["clone", "-q", bare.to_str().unwrap(), "w"], other.path());
    let w = other.path().join("w");
    let human = std::fs::read_to_string(w.join("human.md")).unwrap();
    std::fs::write(w.join("human.md"), format!("{human}- 我喜欢绿茶\n")).unwrap();
    git(
        &[
            "-c",
            "user.name=B",
            "-c",
            "user.email=b@x",
            "commit",
            "-qam",
            "from host B",
        ],
        &w,
    );
    git(&["push", "-q", "origin", "HEAD:main"], &w);
    let (v, ok) = sync(h, Some(remote.path()));
    assert!(ok, "{v}");
    assert!(
        ["clean", "pushed"].contains(&v["status"].as_str().unwrap()),
        "{v}"
    );
    let checkout = std::fs::read_to_string(h.join(format!("agents/{id}/memory/human.md"))).unwrap();
    assert!(
        checkout.contains("我喜欢绿茶") && checkout.contains("我住在杭州"),
        "{checkout}"
    );
    // The checkout and its index follow: nothing shows as changed.
    let agent_dir = h.join(format!("agents/{id}"));
    let porcelain = git(
        &[
            "--git-dir",
            agent_dir.join("memory.git").to_str().unwrap(),
            "--work-tree",
            agent_dir.join("memory").to_str().unwrap(),
            "status",
            "--porcelain",
        ],
        h,
    );
    assert_eq!(porcelain.trim(), "", "the checkout does not match main");

    // Uncommitted edits: nothing is touched.
    std::fs::write(h.join(format!("agents/{id}/memory/scratch.md")), "x\n").unwrap();
    let (v, ok) = sync(h, Some(remote.path()));
    assert!(!ok);
    assert_eq!(v["status"], "dirty", "{v}");
}

fn chat_with_remote(home: &Path, root: &Path, text: &str) {
    let o = Command::new(bin())
        .args(["chat", "-a", "owl", "-p", text])
        .env("MINI_LETTA_HOME", home)
        .env("MINI_LETTA_REMOTE_ROOT", root)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn a_turn_that_commits_is_synced_and_a_conflict_leaves_a_reminder() {
    if !confinement_or_skip("sync after a turn") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let remote = tempfile::tempdir().unwrap();
    let id = create_agent(h, &["owl"]);
    chat_with_remote(h, remote.path(), "记住: 我住在杭州");
    // The turn's commit reached the remote without a `sync`.
    let bare = remote.path().join(format!("{id}.git"));
    let remote_human = git(
        &["--git-dir", bare.to_str().unwrap(), "show", "main:human.md"],
        h,
    );
    assert!(remote_human.contains("- 我住在杭州"), "{remote_human}");

    // Another host appends where this one is about to: a real conflict.
    let other = tempfile::tempdir().unwrap();
    git(&["clone", "-q", bare.to_str().unwrap(), "w"], other.path());
    let w = other.path().join("w");
    let human = std::fs::read_to_string(w.join("human.md")).unwrap();
    std::fs::write(w.join("human.md"), format!("{human}- 来自另一台主机\n")).unwrap();
    git(
        &[
            "-c",
            "user.name=B",
            "-c",
            "user.email=b@x",
            "commit",
            "-qam",
            "from host B",
        ],
        &w,
    );
    git(&["push", "-q", "origin", "HEAD:main"], &w);
    chat_with_remote(h, remote.path(), "记住: 我喜欢绿茶");
    let pending = std::fs::read_to_string(h.join(format!(
        "agents/{id}/conversations/default/pending-reminders.json"
    )))
    .unwrap();
    assert!(pending.contains("MEMORY GIT CONFLICT"), "{pending}");
    // What the agent can run from its sandbox, not a git recipe.
    assert!(pending.contains("repair_conflict"), "{pending}");
    assert!(!pending.contains("git rebase"), "{pending}");
    // Nothing was lost on either side.
    let local = std::fs::read_to_string(h.join(format!("agents/{id}/memory/human.md"))).unwrap();
    assert!(local.contains("我喜欢绿茶"), "{local}");
    let remote_human = git(
        &["--git-dir", bare.to_str().unwrap(), "show", "main:human.md"],
        h,
    );
    assert!(remote_human.contains("来自另一台主机"), "{remote_human}");
}
