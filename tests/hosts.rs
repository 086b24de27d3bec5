//! Several hosts, one memory (book chapter 18, lab 6 without containers):
//! two homes on this machine share a directory of bare repositories. An
//! agent taught on A is cloned on B, record and all, and B's chat knows what
//! A was told; concurrent edits land or conflict, and the book's recipe
//! brings both hosts back together; the post-commit mirror pushes `main`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;

use common::remote::*;
use common::*;
use serde_json::Value;

struct Hosts {
    root: tempfile::TempDir,
    a: tempfile::TempDir,
    b: tempfile::TempDir,
    id: String,
}

impl Hosts {
    /// Host A creates `agent-demo`, teaches it where the user lives (the
    /// turn's commit is synced without asking), and B clones it by name.
    fn taught_and_cloned() -> Self {
        let root = tempfile::tempdir().unwrap();
        let a = open_home();
        let b = open_home();
        let id = create_agent(a.path(), &["agent-demo"]);
        ok(on(
            a.path(),
            root.path(),
            &["chat", "-a", "agent-demo", "-p", "记住: 我住在杭州"],
        ));
        let h = Self { root, a, b, id };
        let v = json(on(
            h.b.path(),
            h.root.path(),
            &["sync", "-a", "agent-demo", "--json"],
        ));
        assert_eq!(v["cloned"], true, "{v}");
        assert_eq!(v["agent"], h.id.as_str(), "{v}");
        h
    }

    /// A one-shot chat with `agent-demo` on `home`, which must succeed.
    fn chat(&self, home: &Path, text: &str) -> String {
        ok(on(
            home,
            self.root.path(),
            &["chat", "-a", "agent-demo", "-p", text],
        ))
    }

    fn bare(&self) -> std::path::PathBuf {
        self.root.path().join(format!("{}.git", self.id))
    }

    fn agent_dir(&self, home: &Path) -> std::path::PathBuf {
        home.join("agents").join(&self.id)
    }

    fn memory(&self, home: &Path) -> std::path::PathBuf {
        self.agent_dir(home).join("memory")
    }

    fn human(&self, home: &Path) -> String {
        std::fs::read_to_string(self.memory(home).join("human.md")).unwrap()
    }

    fn sync(&self, home: &Path) -> Value {
        let o = on(
            home,
            self.root.path(),
            &["sync", "-a", "agent-demo", "--json"],
        );
        serde_json::from_str(&stdout(&o))
            .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&o), stderr(&o)))
    }

    fn main_at(&self, home: &Path) -> String {
        main_of(&self.agent_dir(home).join("memory.git"))
    }

    fn remote_main(&self) -> String {
        main_of(&self.bare())
    }

    fn fsck(&self, home: &Path) {
        let gd = self.agent_dir(home).join("memory.git");
        git_ok(
            Path::new("/"),
            &["--git-dir", gd.to_str().unwrap(), "fsck", "--strict"],
        );
    }
}

#[test]
fn an_agent_taught_on_one_host_is_cloned_on_another_and_knows_the_fact() {
    if !confinement_or_skip("two hosts") {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let a = open_home();
    let b = open_home();
    let id = create_agent(a.path(), &["agent-demo"]);
    ok(on(
        a.path(),
        root.path(),
        &["chat", "-a", "agent-demo", "-p", "记住: 我住在杭州"],
    ));
    // The record travelled with the memory.
    let bare = root.path().join(format!("{id}.git"));
    let record = git_ok(
        Path::new("/"),
        &[
            "--git-dir",
            bare.to_str().unwrap(),
            "show",
            "refs/mini-letta/agent:agent.json",
        ],
    );
    let record: Value = serde_json::from_str(&record).unwrap();
    assert_eq!(record["name"], "agent-demo");
    assert_eq!(record["id"], id.as_str());
    assert!(record.get("sandbox_uid").is_none(), "{record}");

    // B has never seen it; the remote lists it.
    let v = json(on(
        b.path(),
        root.path(),
        &["agent", "list", "--remote", "--json"],
    ));
    let listed = v["agents"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{v}");
    assert_eq!(listed[0]["id"], id.as_str());
    assert_eq!(listed[0]["name"], "agent-demo");
    assert_eq!(listed[0]["local"], false);

    // Lab 6: B's chat clones it first and answers from what A taught.
    let o = on(
        b.path(),
        root.path(),
        &["chat", "-a", "agent-demo", "-p", "你知道我什么？"],
    );
    let answer = ok(o);
    assert!(answer.contains("杭州"), "{answer}");
    let v = json(on(b.path(), root.path(), &["agent", "list", "--json"]));
    assert_eq!(v["agents"][0]["id"], id.as_str(), "{v}");
    assert_eq!(v["agents"][0]["name"], "agent-demo", "{v}");
    let v = json(on(
        b.path(),
        root.path(),
        &["agent", "list", "--remote", "--json"],
    ));
    assert_eq!(v["agents"][0]["local"], true, "{v}");
    let b_git = b.path().join(format!("agents/{id}/memory.git"));
    assert_eq!(main_of(&b_git), main_of(&bare));

    // A third host may not make a second agent of that name.
    let c = open_home();
    let o = on(c.path(), root.path(), &["agent", "create", "agent-demo"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("exists on the remote"),
        "{}",
        stderr(&o)
    );
    // An agent on neither side is a clear error.
    let o = on(c.path(), root.path(), &["chat", "-a", "nobody", "-p", "hi"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("no agent \"nobody\" on the remote"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn edits_to_different_files_on_two_hosts_both_land() {
    if !confinement_or_skip("two hosts, different files") {
        return;
    }
    let h = Hosts::taught_and_cloned();
    let (a, b) = (h.a.path(), h.b.path());
    // A's agent learns something (human.md); B's operator adds a file.
    h.chat(a, "记住: 我喜欢绿茶");
    std::fs::write(
        h.memory(b).join("project.md"),
        "---\nname: project\ndescription: What we are building\n---\n\nA tea shop.\n",
    )
    .unwrap();
    git_ok(&h.memory(b), &["add", "project.md"]);
    git_ok(&h.memory(b), &["commit", "-qm", "add the project"]);
    let v = h.sync(b);
    assert_eq!(v["status"], "pushed", "{v}");
    assert!(v["backup_ref"].is_string(), "a rebase keeps a backup: {v}");
    let v = h.sync(a);
    assert_eq!(v["status"], "clean", "{v}");
    for home in [a, b] {
        assert!(h.human(home).contains("我喜欢绿茶"));
        assert!(h.memory(home).join("project.md").exists());
        assert_eq!(h.main_at(home), h.remote_main());
        h.fsck(home);
    }
}

#[test]
fn the_same_line_edited_on_two_hosts_conflicts_and_the_recipe_converges() {
    if !confinement_or_skip("two hosts, one line") {
        return;
    }
    let h = Hosts::taught_and_cloned();
    let (a, b) = (h.a.path(), h.b.path());
    // Both append a line at the same place of human.md.
    h.chat(a, "记住: 我喜欢绿茶");
    let remote_before = h.remote_main();
    h.chat(b, "记住: 我喜欢咖啡");
    let b_commit = h.main_at(b);

    // B's sync after the turn met the conflict: the remote is A's, B's
    // commit is kept (main and a backup ref), and the reminder names what
    // the agent can run (the operator's recipe is in the README).
    assert_eq!(h.remote_main(), remote_before);
    let pending = std::fs::read_to_string(
        h.agent_dir(b)
            .join("conversations/default/pending-reminders.json"),
    )
    .unwrap();
    assert!(pending.contains("MEMORY GIT CONFLICT"), "{pending}");
    assert!(pending.contains("repair_conflict"), "{pending}");
    assert!(!pending.contains("git pull"), "{pending}");
    let v = h.sync(b);
    assert_eq!(v["status"], "conflict", "{v}");
    let backup = v["backup_ref"].as_str().unwrap().to_string();
    assert!(backup.starts_with("refs/mini-letta/backup/"), "{v}");
    let b_git = h.agent_dir(b).join("memory.git");
    assert_eq!(main_of(&b_git), b_commit, "B's main is unchanged");
    let backed = git_ok(
        Path::new("/"),
        &["--git-dir", b_git.to_str().unwrap(), "rev-parse", &backup],
    );
    assert_eq!(backed.trim(), b_commit);
    assert!(h.human(b).contains("我喜欢咖啡"));

    // The recipe, by B's operator, in the memory directory.
    // As README says: the git directory named, never the checkout's `.git`
    // pointer (the agent's to write).
    let mem = h.memory(b);
    let b_git_dir = h.agent_dir(b).join("memory.git");
    let named = |args: &[&str]| {
        Command::new("git")
            .args(OPERATOR)
            .args(args)
            .env("GIT_DIR", &b_git_dir)
            .env("GIT_WORK_TREE", &mem)
            .env("GIT_EDITOR", "true")
            .current_dir(&mem)
            .output()
            .unwrap()
    };
    let pulled = named(&["pull", "--rebase", "origin", "main"]);
    assert!(!pulled.status.success(), "expected a conflict");
    let text = std::fs::read_to_string(mem.join("human.md")).unwrap();
    assert!(text.contains("<<<<<<<"), "{text}");
    let resolved: String = text
        .lines()
        .filter(|l| {
            !l.starts_with("<<<<<<<") && !l.starts_with("=======") && !l.starts_with(">>>>>>>")
        })
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(mem.join("human.md"), resolved).unwrap();
    let added = named(&["add", "human.md"]);
    assert!(added.status.success(), "{}", stderr(&added));
    let o = named(&["rebase", "--continue"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));

    let v = h.sync(b);
    assert_eq!(v["status"], "pushed", "{v}");
    let v = h.sync(a);
    assert_eq!(v["status"], "clean", "{v}");
    // The operator's git wrote files as root; B's agent still edits them.
    h.chat(b, "记住: 我养了一只猫");
    let v = h.sync(a);
    assert_eq!(v["status"], "clean", "{v}");
    assert!(h.human(a).contains("我养了一只猫"));
    for home in [a, b] {
        let human = h.human(home);
        assert!(
            human.contains("我喜欢绿茶") && human.contains("我喜欢咖啡"),
            "{human}"
        );
        assert!(human.contains("我住在杭州"), "{human}");
        assert_eq!(h.main_at(home), h.remote_main());
        h.fsck(home);
    }
}

#[test]
fn the_mirror_pushes_main_and_only_main_in_the_background() {
    if !confinement_or_skip("mirror") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let id = create_agent(h, &["owl"]);
    let git_dir = h.join(format!("agents/{id}/memory.git"));
    let mirror = tempfile::tempdir().unwrap();
    let mirror_git = mirror.path().join("m.git");
    git_ok(
        Path::new("/"),
        &["init", "-q", "--bare", mirror_git.to_str().unwrap()],
    );
    // Unset: a commit mirrors nothing.
    let o = run(h, &["chat", "-a", "owl", "-p", "记住: 我住在杭州"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!git_dir.join("mirror.log").exists());

    let memory = h.join(format!("agents/{id}/memory"));
    git_ok(
        Path::new("/"),
        &[
            "--git-dir",
            git_dir.to_str().unwrap(),
            "config",
            "mini-letta.memoryRepository.url",
            mirror_git.to_str().unwrap(),
        ],
    );
    let o = run(h, &["chat", "-a", "owl", "-p", "记住: 我喜欢绿茶"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let local = main_of(&git_dir);
    assert!(
        wait_until(20, || {
            std::fs::read_to_string(git_dir.join("mirror.log")).is_ok_and(|l| l.contains("exit=0"))
        }),
        "{:?}",
        std::fs::read_to_string(git_dir.join("mirror.log"))
    );
    assert_eq!(main_of(&mirror_git), local);
    let log = std::fs::read_to_string(git_dir.join("mirror.log")).unwrap();
    assert!(
        log.contains(&format!("{} on main ---", &local[..7])),
        "{log}"
    );

    // A person's commit in the checkout mirrors through the post-commit
    // hook; a branch other than main does not.
    std::fs::write(
        memory.join("human.md"),
        format!(
            "{}- 手工加的\n",
            std::fs::read_to_string(memory.join("human.md")).unwrap()
        ),
    )
    .unwrap();
    git_ok(&memory, &["commit", "-qam", "by hand"]);
    let by_hand = main_of(&git_dir);
    assert!(
        wait_until(20, || main_of(&mirror_git) == by_hand),
        "the post-commit hook did not mirror main"
    );
    git_ok(&memory, &["checkout", "-qb", "side"]);
    std::fs::write(
        memory.join("human.md"),
        format!(
            "{}- 分支上的\n",
            std::fs::read_to_string(memory.join("human.md")).unwrap()
        ),
    )
    .unwrap();
    git_ok(&memory, &["commit", "-qam", "on a side branch"]);
    git_ok(&memory, &["checkout", "-q", "main"]);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let branches = git_ok(
        Path::new("/"),
        &[
            "--git-dir",
            mirror_git.to_str().unwrap(),
            "for-each-ref",
            "--format=%(refname)",
        ],
    );
    assert_eq!(branches.trim(), "refs/heads/main", "only main is mirrored");
    assert_eq!(main_of(&mirror_git), by_hand);
}

#[test]
fn an_unreachable_mirror_never_blocks_a_commit() {
    if !confinement_or_skip("mirror failure") {
        return;
    }
    let home = open_home();
    let h = home.path();
    let id = create_agent(h, &["owl"]);
    let git_dir = h.join(format!("agents/{id}/memory.git"));
    let memory = h.join(format!("agents/{id}/memory"));
    git_ok(
        Path::new("/"),
        &[
            "--git-dir",
            git_dir.to_str().unwrap(),
            "config",
            "mini-letta.memoryRepository.url",
            "/nonexistent/mirror.git",
        ],
    );
    let o = run(h, &["chat", "-a", "owl", "-p", "记住: 我住在杭州"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let human = std::fs::read_to_string(memory.join("human.md")).unwrap();
    assert!(human.contains("我住在杭州"));
    assert!(
        wait_until(20, || {
            std::fs::read_to_string(git_dir.join("mirror.log"))
                .is_ok_and(|l| l.lines().any(|x| x.starts_with("exit=") && x != "exit=0"))
        }),
        "{:?}",
        std::fs::read_to_string(git_dir.join("mirror.log"))
    );
}

#[test]
fn a_sync_conflict_can_be_handed_to_a_repair_worker() {
    if !confinement_or_skip("sync --repair") {
        return;
    }
    let h = Hosts::taught_and_cloned();
    let (a, b) = (h.a.path(), h.b.path());
    h.chat(a, "记住: 我喜欢绿茶");
    h.chat(b, "记住: 我喜欢咖啡");
    let b_commit = h.main_at(b);
    let o = on(
        b,
        h.root.path(),
        &["sync", "-a", "agent-demo", "--repair", "--json"],
    );
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    // The sync waited for the repair, checked that B's change is on the
    // new main, and pushed it: success, and only then.
    // (`clean` when the supervisor's own sync after the merge pushed it.)
    assert!(o.status.success(), "{v}");
    assert!(v["status"] == "pushed" || v["status"] == "clean", "{v}");
    assert_eq!(h.main_at(b), h.remote_main(), "{v}");
    assert!(
        v["message"].as_str().unwrap().starts_with("repaired:"),
        "{v}"
    );
    let branch = v["repair_branch"].as_str().unwrap().to_string();
    assert!(branch.starts_with("mini-letta/memory-worker/"), "{v}");
    let bare = h.bare();
    let o = git(
        Path::new("/"),
        &["--git-dir", bare.to_str().unwrap(), "show", "main:human.md"],
    );
    let t = stdout(&o);
    assert!(t.contains("我喜欢绿茶") && t.contains("我喜欢咖啡"), "{t}");
    let v = h.sync(a);
    assert_eq!(v["status"], "clean", "{v}");
    let human = h.human(a);
    assert_eq!(human.matches("我喜欢咖啡").count(), 1, "{human}");
    assert_eq!(human.matches("我喜欢绿茶").count(), 1, "{human}");
    // Nothing lost: B's original commit is still reachable (backup ref).
    let b_git = h.agent_dir(b).join("memory.git");
    let refs = git_ok(
        Path::new("/"),
        &[
            "--git-dir",
            b_git.to_str().unwrap(),
            "for-each-ref",
            "--contains",
            &b_commit,
            "--format=%(refname)",
        ],
    );
    assert!(refs.contains("refs/mini-letta/backup/"), "{refs}");
    h.fsck(b);
}
