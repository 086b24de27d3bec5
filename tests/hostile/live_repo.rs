//! A live `memory.git` (or a remote, or a mirror) carrying what mini-letta
//! never makes — `objects/info/alternates` naming another tenant's
//! objects, `info/grafts`, `shallow`, hooks in a directory remote — and
//! every reader root runs on it: the CLI's readers, Palace, `doctor`,
//! worktree checkouts, sync, the mirror. A tool child cannot plant any of
//! it (last test); root can, and then nothing of the other tenant may be
//! read and nothing of the remote may run.

use std::path::{Path, PathBuf};

use crate::common::{self, confinement_or_skip, run, stderr, stdout, wait_until};
use crate::planted::{MARKER, Tenants, git, holds_object, run_env};

const ALTERNATES: &str = "objects/info/alternates";

/// `Tenants` plus agent `thief`; its git directory.
fn with_thief(t: &Tenants) -> (String, PathBuf) {
    let id = common::create_agent(t.path(), &["thief"]);
    let git_dir = t.agent_dir(&id).join("memory.git");
    (id, git_dir)
}

fn plant(git_dir: &Path, rel: &str, text: &str) {
    let p = git_dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// What the archive of the import attack leaves, planted by root in a
/// live repository: an alternate to the victim's objects and `main` on
/// the victim's commit.
fn plant_theft(t: &Tenants, git_dir: &Path) {
    plant(
        git_dir,
        ALTERNATES,
        &format!("{}\n", t.victim_objects().display()),
    );
    plant(
        git_dir,
        "refs/heads/main",
        &format!("{}\n", t.victim_commit),
    );
}

/// Before the fix `memory show`, `prompt`, `recompile` and Palace read the
/// victim's `secret.md` through the alternate. Now every open refuses the
/// repository, naming the planted file; `doctor` reports it; once root
/// removes it the agent works again.
#[test]
fn planted_alternates_in_a_live_repository_are_refused_loudly() {
    let t = Tenants::new();
    let (_, git_dir) = with_thief(&t);
    let own_main = git(&git_dir, &["rev-parse", "refs/heads/main"]);
    plant_theft(&t, &git_dir);
    t.assert_never_shown("thief");

    let o = run(t.path(), &["memory", "show", "-a", "thief", "persona.md"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains(ALTERNATES), "{}", stderr(&o));
    let o = run(t.path(), &["doctor", "-a", "thief"]);
    let said = format!("{}{}", stdout(&o), stderr(&o));
    assert!(!o.status.success(), "{said}");
    assert!(said.contains(ALTERNATES), "doctor does not name it: {said}");
    assert!(!said.contains(MARKER), "{said}");

    // Its own main back, the alternate still there: no commit either.
    plant(&git_dir, "refs/heads/main", &format!("{own_main}\n"));
    let create = [
        "memory",
        "create",
        "-a",
        "thief",
        "n.md",
        "--description",
        "N.",
    ];
    let o = run(t.path(), &create);
    assert!(!o.status.success(), "committed beside an alternate");
    assert!(stderr(&o).contains(ALTERNATES), "{}", stderr(&o));
    assert_eq!(git(&git_dir, &["rev-parse", "refs/heads/main"]), own_main);

    std::fs::remove_file(git_dir.join(ALTERNATES)).unwrap();
    let o = run(t.path(), &create);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// `info/grafts` and `shallow` rewrite the parents libgit2 and git report
/// (here: the first commit hidden). Before the fix `memory log` showed
/// the rewritten history; now the repository is refused, naming the file.
#[test]
fn planted_grafts_or_shallow_in_a_live_repository_are_refused() {
    let t = Tenants::new();
    let (_, git_dir) = with_thief(&t);
    let o = run(
        t.path(),
        &[
            "memory",
            "create",
            "-a",
            "thief",
            "n.md",
            "--description",
            "N.",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let head = git(&git_dir, &["rev-parse", "refs/heads/main"]);
    for rel in ["info/grafts", "shallow"] {
        plant(&git_dir, rel, &format!("{head}\n"));
        let o = run(t.path(), &["memory", "log", "-a", "thief"]);
        assert!(
            !o.status.success(),
            "{rel}: the grafted history was read: {}",
            stdout(&o)
        );
        assert!(stderr(&o).contains(rel), "{rel}: {}", stderr(&o));
        let o = run(t.path(), &["doctor", "-a", "thief"]);
        assert!(stdout(&o).contains(rel), "doctor: {}", stdout(&o));
        std::fs::remove_file(git_dir.join(rel)).unwrap();
    }
    let o = run(t.path(), &["memory", "log", "-a", "thief"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// A reflection's or memory worker's checkout is made by libgit2 from the
/// repository; before the fix it was checked out through the alternate,
/// putting the victim's `secret.md` in the thief's (child-readable)
/// worktree.
#[test]
fn a_worktree_checkout_never_reads_through_alternates() {
    use mini_letta::memfs::worktree::{Label, create};
    let t = Tenants::new();
    let (id, git_dir) = with_thief(&t);
    plant_theft(&t, &git_dir);
    let paths = mini_letta::paths::Home::at(t.path()).agent(&id).unwrap();
    for label in [Label::Reflection, Label::MemoryWorker] {
        let made = create(&paths, label);
        let worktrees = t.agent_dir(&id).join("memory-worktrees");
        crate::planted::assert_no_file_holds(&worktrees, MARKER);
        let e = match made {
            Ok(wt) => panic!("a worktree was checked out: {}", wt.dir.display()),
            Err(e) => e,
        };
        assert!(e.to_string().contains(ALTERNATES), "{e}");
    }
}

/// A bare repository the agent's remote root holds is as hostile as an
/// archive: its alternates named the victim's objects and `git fetch`
/// (upload-pack runs on the remote's directory) copied the victim's
/// secret into the thief's own object store. Now sync refuses it.
#[test]
fn sync_never_fetches_through_a_remotes_alternates() {
    let t = Tenants::new();
    let (id, git_dir) = with_thief(&t);
    let root = tempfile::tempdir().unwrap();
    let remote = root.path().join(format!("{id}.git"));
    let o = std::process::Command::new("git")
        .args(["init", "-q", "--bare"])
        .arg(&remote)
        .output()
        .unwrap();
    assert!(o.status.success());
    plant_theft(&t, &remote);

    let o = run_env(
        t.path(),
        &["sync", "-a", "thief"],
        &[("MINI_LETTA_REMOTE_ROOT", root.path())],
    );
    let said = format!("{}{}", stdout(&o), stderr(&o));
    assert!(!said.contains(MARKER), "{said}");
    assert!(
        !holds_object(&git_dir, &t.victim_blob),
        "the fetch copied the victim's secret into the thief's objects: {said}"
    );
    let refs = git(&git_dir, &["for-each-ref", "--format=%(objectname)"]);
    assert!(!refs.contains(&t.victim_commit), "{refs}");
    assert!(
        said.contains(ALTERNATES),
        "the refusal does not name it: {said}"
    );
}

/// Pushing to a directory remote runs `git receive-pack` there, as root:
/// before the fix the remote's own hooks ran (a marker file appeared).
#[test]
fn sync_runs_no_hook_of_a_directory_remote() {
    let t = Tenants::new();
    let (id, _) = with_thief(&t);
    let root = tempfile::tempdir().unwrap();
    let remote = root.path().join(format!("{id}.git"));
    let o = std::process::Command::new("git")
        .args(["init", "-q", "--bare"])
        .arg(&remote)
        .output()
        .unwrap();
    assert!(o.status.success());
    let ran = root.path().join("hook-ran");
    for hook in [
        "pre-receive",
        "update",
        "post-receive",
        "post-update",
        "reference-transaction",
        "push-to-checkout",
        "pre-auto-gc",
    ] {
        let p = remote.join("hooks").join(hook);
        std::fs::write(&p, format!("#!/bin/sh\necho {hook} >> {}\n", ran.display())).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let o = run_env(
        t.path(),
        &["sync", "-a", "thief"],
        &[("MINI_LETTA_REMOTE_ROOT", root.path())],
    );
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("pushed"), "{}", stdout(&o));
    assert!(
        !ran.exists(),
        "the remote's hooks ran as root: {}",
        std::fs::read_to_string(&ran).unwrap_or_default()
    );
}

/// Planted in the agent's own repository, the theft would be pushed out
/// by sync; it is refused before anything is sent.
#[test]
fn sync_never_pushes_through_planted_alternates() {
    let t = Tenants::new();
    let (id, git_dir) = with_thief(&t);
    let root = tempfile::tempdir().unwrap();
    plant_theft(&t, &git_dir);
    // The checkout too (root can), so sync finds nothing uncommitted and
    // goes on to push.
    let work_tree = t.agent_dir(&id).join("memory");
    let o = std::process::Command::new("git")
        .args(["-c", "core.hooksPath=/dev/null", "--git-dir"])
        .arg(&git_dir)
        .arg("--work-tree")
        .arg(&work_tree)
        .args(["reset", "-q", "--hard", "refs/heads/main"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run_env(
        t.path(),
        &["sync", "-a", "thief"],
        &[("MINI_LETTA_REMOTE_ROOT", root.path())],
    );
    let said = format!("{}{}", stdout(&o), stderr(&o));
    assert!(!o.status.success(), "{said}");
    let remote = root.path().join(format!("{id}.git"));
    if remote.is_dir() {
        assert!(!holds_object(&remote, &t.victim_blob), "{said}");
    }
}

/// The post-commit mirror pushes `main` with the git CLI, which cannot be
/// told to ignore alternates: before the fix it pushed the victim's
/// objects to the thief's mirror. Now the push is refused and logged.
#[test]
fn the_mirror_never_pushes_through_planted_alternates() {
    let t = Tenants::new();
    let (_, git_dir) = with_thief(&t);
    let mirror_dir = tempfile::tempdir().unwrap();
    let mirror = mirror_dir.path().join("mirror.git");
    let o = std::process::Command::new("git")
        .args(["init", "-q", "--bare"])
        .arg(&mirror)
        .output()
        .unwrap();
    assert!(o.status.success());
    let mut cfg = git2::Config::open(&git_dir.join("config")).unwrap();
    cfg.set_str(mini_letta::memfs::mirror::URL_KEY, mirror.to_str().unwrap())
        .unwrap();
    plant_theft(&t, &git_dir);

    mini_letta::memfs::mirror::main_moved(&git_dir);
    let log = git_dir.join("mirror.log");
    assert!(
        wait_until(60, || std::fs::read_to_string(&log)
            .is_ok_and(|l| l.contains("exit="))),
        "the mirror never finished"
    );
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        !holds_object(&mirror, &t.victim_blob),
        "the mirror received the victim's secret: {logged}"
    );
    assert!(logged.contains(ALTERNATES), "{logged}");
}

/// The premise of everything above: a confined tool child cannot plant
/// any of it in its own `memory.git`.
#[test]
fn a_tool_child_cannot_plant_in_its_memory_git() {
    if !confinement_or_skip("a_tool_child_cannot_plant_in_its_memory_git") {
        return;
    }
    let t = Tenants::new();
    let (_, git_dir) = with_thief(&t);
    let targets = [
        ALTERNATES,
        "objects/info/http-alternates",
        "info/grafts",
        "shallow",
        "refs/replace/0123456789012345678901234567890123456789",
        "packed-refs",
        "objects/ab/cdef",
        "config.worktree",
    ];
    let script: String = targets
        .iter()
        .map(|rel| {
            format!(
                "mkdir -p \"$(dirname memory.git/{rel})\" 2>/dev/null; \
                 if echo x > memory.git/{rel}; then echo WROTE {rel}; fi; "
            )
        })
        .collect();
    let o = run(
        t.path(),
        &["sandbox", "run", "-a", "thief", "--", "sh", "-c", &script],
    );
    assert!(!stdout(&o).contains("WROTE"), "{}", stdout(&o));
    for rel in targets {
        assert!(!git_dir.join(rel).exists(), "{rel} was created");
    }
}
