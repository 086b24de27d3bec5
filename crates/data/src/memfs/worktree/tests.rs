#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

use git2::{Oid, Repository, Signature};

use super::finalize::{
    DIRTY_UNCOMMITTED, FAILED, MERGE_CONFLICT, NO_COMMITS, NOT_MERGED_BY_AGENT, PARENT_DIRTY,
};
use super::naming::admin_dir;
use super::*;
use crate::memfs::commit::{CommitOptions, commit_paths};
use crate::memfs::repo;
use crate::memfs::status::worktree_status;
use crate::paths::{AgentPaths, Home, MemoryGitDir};

/// The committer a caller passes: the agent's.
fn sig(agent: &AgentPaths) -> Signature<'static> {
    crate::store::commit_signature(agent).unwrap()
}

fn agent() -> (tempfile::TempDir, AgentPaths) {
    let tmp = tempfile::tempdir().unwrap();
    let home = Home::at(tmp.path());
    let record = crate::store::create(&home, "wt", None).unwrap();
    let paths = home.agent(&record.id).unwrap();
    (tmp, paths)
}

fn md(name: &str, body: &str) -> String {
    format!("---\nname: {name}\ndescription: {name} notes\n---\n\n{body}\n")
}

fn write(dir: &Path, rel: &str, contents: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, contents).unwrap();
}

fn commit(repo: &Repository, paths: &[&str], msg: &str) -> Oid {
    let sig = Signature::now("t", "t@example.com").unwrap();
    let paths: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
    commit_paths(
        repo,
        &paths,
        msg,
        &sig,
        &CommitOptions::for_repo(repo, false),
    )
    .unwrap()
    .commit
    .unwrap()
}

/// Write files into `dir` and commit them through `repo`.
fn commit_files(repo: &Repository, dir: &Path, files: &[(&str, &str)], msg: &str) -> Oid {
    for (rel, contents) in files {
        write(dir, rel, contents);
    }
    let paths: Vec<&str> = files.iter().map(|(p, _)| *p).collect();
    commit(repo, &paths, msg)
}

fn git_cli(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn head(agent: &AgentPaths) -> Oid {
    let repo = repo::open_agent(agent).unwrap();
    repo.head().unwrap().peel_to_commit().unwrap().id()
}

fn branch_exists(agent: &AgentPaths, wt: &MemoryWorktree) -> bool {
    let repo = repo::open_agent(agent).unwrap();
    repo.find_reference(&wt.branch_ref()).is_ok()
}

fn main_dirty(agent: &AgentPaths) -> Vec<String> {
    worktree_status(&repo::open_agent(agent).unwrap())
        .unwrap()
        .dirty
}

fn assert_gone(agent: &AgentPaths, wt: &MemoryWorktree) {
    assert!(!wt.dir.exists(), "{} still there", wt.dir.display());
    assert!(!admin_dir(agent, &wt.name).unwrap().exists());
    let (_, list) = git_cli(&agent.memory_git_dir(), &["worktree", "list"]);
    assert!(!list.contains(&wt.name), "{list}");
}

fn opts(should_merge: bool) -> FinalizeOptions {
    FinalizeOptions {
        should_merge,
        summary: "tidy memory".into(),
        ..Default::default()
    }
}

/// A reflection worktree with one commit adding `notes.md`.
fn committed_reflection(agent: &AgentPaths) -> MemoryWorktree {
    let wt = create(agent, Label::Reflection).unwrap();
    let (_, wrepo) = open(agent, &wt.name).unwrap();
    commit_files(
        &wrepo,
        &wt.dir,
        &[("notes.md", &md("Notes", "learned things"))],
        "add notes",
    );
    wt
}

#[test]
fn names_are_checked() {
    assert_eq!(
        parse_name("reflection-20260101120000-0a1b2c3d"),
        Some((Label::Reflection, "20260101120000-0a1b2c3d"))
    );
    assert_eq!(
        parse_name("memory-worker-20260101120000-0a1b2c3d").map(|p| p.0),
        Some(Label::MemoryWorker)
    );
    for bad in [
        "",
        "..",
        "reflection-..",
        "reflection-20260101120000-0a1b2c3",
        "reflection-20260101120000-0A1B2C3D",
        "reflection-20260101120000-0a1b2c3d/..",
        "../reflection-20260101120000-0a1b2c3d",
        "other-20260101120000-0a1b2c3d",
    ] {
        assert!(parse_name(bad).is_none(), "{bad}");
    }
    let (_t, agent) = agent();
    assert!(matches!(
        open(&agent, "../memory"),
        Err(WorktreeError::BadName(_))
    ));
    assert!(matches!(
        open(&agent, "reflection-20260101120000-0a1b2c3d"),
        Err(WorktreeError::NotFound(_))
    ));
}

#[test]
fn create_makes_a_real_worktree_on_a_new_branch() {
    let (_t, agent) = agent();
    let main = head(&agent);
    let wt = create(&agent, Label::Reflection).unwrap();
    assert!(parse_name(&wt.name).is_some());
    assert_eq!(wt.name, format!("reflection-{}", wt.id));
    assert_eq!(wt.branch, format!("mini-letta/reflection/{}", wt.id));
    assert_eq!(wt.dir, agent.worktrees_dir().join(&wt.name));
    assert_eq!(wt.base, main);
    assert!(wt.dir.join("persona.md").is_file());

    let (ok, list) = git_cli(&agent.memory_git_dir(), &["worktree", "list"]);
    assert!(ok, "{list}");
    assert!(list.contains(&wt.dir.display().to_string()), "{list}");
    assert!(list.contains(&wt.branch), "{list}");
    let (ok, status) = git_cli(&wt.dir, &["status", "--porcelain"]);
    assert!(ok && status.is_empty(), "{status}");
    assert!(
        !MemoryGitDir::new(&agent.memory_git_dir())
            .worktree_staging_dir()
            .join(&wt.name)
            .exists()
    );

    let (opened, wrepo) = open(&agent, &wt.name).unwrap();
    assert_eq!(opened, wt);
    assert_eq!(wrepo.head().unwrap().name().unwrap(), wt.branch_ref());
    assert!(worktree_status(&wrepo).unwrap().dirty.is_empty());
    assert_eq!(list_names(&agent), vec![wt.name.clone()]);

    let worker = create(&agent, Label::MemoryWorker).unwrap();
    assert!(worker.name.starts_with("memory-worker-"));
    assert_eq!(list_names(&agent).len(), 2);
}

fn list_names(agent: &AgentPaths) -> Vec<String> {
    list(agent).unwrap().into_iter().map(|w| w.name).collect()
}

#[test]
fn create_without_head_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let agent = AgentPaths::from_dir(tmp.path());
    repo::init_linked(&agent.memory_dir(), &agent.memory_git_dir()).unwrap();
    let err = create(&agent, Label::Reflection).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "Unable to create reflection memory worktree: {} has no HEAD",
            agent.memory_dir().display()
        )
    );
}

#[test]
fn merged_reflection_is_a_real_merge_into_the_checkout() {
    let (_t, agent) = agent();
    let wt = create(&agent, Label::Reflection).unwrap();
    let (_, wrepo) = open(&agent, &wt.name).unwrap();
    let tip = commit_files(
        &wrepo,
        &wt.dir,
        &[
            ("notes.md", &md("Notes", "learned things")),
            ("persona.md", &md("Persona", "I am careful.")),
        ],
        "reflect",
    );
    // The parent advances meanwhile (another file).
    let main = repo::open_agent(&agent).unwrap();
    let parent = commit_files(
        &main,
        &agent.memory_dir(),
        &[("human.md", &md("Human", "likes tea"))],
        "human",
    );
    drop(main);

    let done = finalize_reflection_worktree(&agent, &wt, &opts(true), &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::Merged, "{done:?}");
    assert_eq!(
        done.summary,
        "Merged 1 reflection memory commit(s) into parent memory main."
    );
    assert_eq!(done.commit_count, 1);
    assert!(!done.branch_kept);
    assert_eq!(done.changed_paths, vec!["notes.md", "persona.md"]);

    let main = repo::open_agent(&agent).unwrap();
    let merge = main.head().unwrap().peel_to_commit().unwrap();
    assert_eq!(done.merge_commit, Some(merge.id().to_string()));
    assert_eq!(merge.message().unwrap(), "merge(reflection): tidy memory\n");
    assert_eq!(merge.parent_ids().collect::<Vec<_>>(), vec![parent, tip]);
    let read = |p: &str| std::fs::read_to_string(agent.memory_dir().join(p)).unwrap();
    assert_eq!(read("notes.md"), md("Notes", "learned things"));
    assert_eq!(read("persona.md"), md("Persona", "I am careful."));
    assert_eq!(read("human.md"), md("Human", "likes tea"));
    assert!(main_dirty(&agent).is_empty(), "{:?}", main_dirty(&agent));
    let (ok, st) = git_cli(&agent.memory_dir(), &["status", "--porcelain"]);
    assert!(ok && st.is_empty(), "{st}");
    assert!(!branch_exists(&agent, &wt));
    assert_gone(&agent, &wt);
    let (ok, fsck) = git_cli(&agent.memory_git_dir(), &["fsck", "--no-dangling"]);
    assert!(ok, "{fsck}");
    let json = serde_json::to_value(&done).unwrap();
    assert_eq!(json["status"], "merged");
}

#[test]
fn merge_removes_deleted_files_from_the_checkout() {
    let (_t, agent) = agent();
    let main = repo::open_agent(&agent).unwrap();
    commit_files(
        &main,
        &agent.memory_dir(),
        &[
            ("topics/MEMORY.md", "# Topics\n"),
            ("topics/a.md", &md("A", "a")),
        ],
        "topics",
    );
    let wt = create(&agent, Label::Reflection).unwrap();
    let (_, wrepo) = open(&agent, &wt.name).unwrap();
    std::fs::remove_dir_all(wt.dir.join("topics")).unwrap();
    commit(&wrepo, &["topics"], "drop topics");
    let done = finalize_reflection_worktree(&agent, &wt, &opts(true), &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::Merged, "{done:?}");
    assert!(!agent.memory_dir().join("topics").exists());
    assert!(main_dirty(&agent).is_empty(), "{:?}", main_dirty(&agent));
}

#[test]
fn dirty_worktree_is_discarded() {
    let (_t, agent) = agent();
    let wt = committed_reflection(&agent);
    write(&wt.dir, "scratch.md", "uncommitted");
    let before = head(&agent);
    let done = finalize_reflection_worktree(&agent, &wt, &opts(true), &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::DirtyUncommitted);
    assert_eq!(done.summary, DIRTY_UNCOMMITTED);
    assert_eq!(head(&agent), before);
    assert!(!branch_exists(&agent, &wt));
    assert_gone(&agent, &wt);
}

#[test]
fn failed_child_is_discarded() {
    let (_t, agent) = agent();
    let wt = committed_reflection(&agent);
    let before = head(&agent);
    let done = finalize_reflection_worktree(&agent, &wt, &opts(false), &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::Failed);
    assert_eq!(done.summary, FAILED);
    assert_eq!(done.commit_count, 1);
    assert_eq!(head(&agent), before);
    assert!(!branch_exists(&agent, &wt));
    assert_gone(&agent, &wt);
    // A clean no-op worktree of a failed child is still `failed`.
    let wt = create(&agent, Label::Reflection).unwrap();
    let o = FinalizeOptions {
        failure_summary: Some("custom".into()),
        ..opts(false)
    };
    let done = finalize_reflection_worktree(&agent, &wt, &o, &sig(&agent)).unwrap();
    assert_eq!(
        (done.status, done.summary.as_str()),
        (FinalizeStatus::Failed, "custom")
    );
}

#[test]
fn no_commits_is_no_changes() {
    let (_t, agent) = agent();
    let wt = create(&agent, Label::Reflection).unwrap();
    let done = finalize_reflection_worktree(&agent, &wt, &opts(true), &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::NoChanges);
    assert_eq!(done.summary, NO_COMMITS);
    assert_eq!(done.commit_count, 0);
    assert!(!branch_exists(&agent, &wt));
    assert_gone(&agent, &wt);
}

#[test]
fn dirty_parent_is_not_merged_into() {
    let (_t, agent) = agent();
    let wt = committed_reflection(&agent);
    write(&agent.memory_dir(), "human.md", "edited by hand");
    let before = head(&agent);
    let done = finalize_reflection_worktree(&agent, &wt, &opts(true), &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::ParentDirty);
    assert_eq!(done.summary, PARENT_DIRTY);
    assert_eq!(head(&agent), before);
    assert!(!agent.memory_dir().join("notes.md").exists());
    assert_eq!(main_dirty(&agent), vec!["human.md"]);
    assert!(!branch_exists(&agent, &wt));
    assert_gone(&agent, &wt);
}

#[test]
fn conflicting_reflection_changes_nothing() {
    let (_t, agent) = agent();
    let wt = create(&agent, Label::Reflection).unwrap();
    let (_, wrepo) = open(&agent, &wt.name).unwrap();
    commit_files(
        &wrepo,
        &wt.dir,
        &[("persona.md", &md("Persona", "from reflection"))],
        "r",
    );
    let main = repo::open_agent(&agent).unwrap();
    let before = commit_files(
        &main,
        &agent.memory_dir(),
        &[("persona.md", &md("Persona", "from main"))],
        "m",
    );
    let done = finalize_reflection_worktree(&agent, &wt, &opts(true), &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::MergeConflict);
    assert_eq!(done.summary, MERGE_CONFLICT);
    assert_eq!(head(&agent), before);
    assert_eq!(
        std::fs::read_to_string(agent.memory_dir().join("persona.md")).unwrap(),
        md("Persona", "from main")
    );
    assert!(main_dirty(&agent).is_empty());
    assert!(!branch_exists(&agent, &wt));
    assert_gone(&agent, &wt);
}

#[test]
fn require_already_merged_checks_ancestry() {
    let (_t, agent) = agent();
    let o = FinalizeOptions {
        require_already_merged: true,
        ..opts(true)
    };
    // Not merged: failed, whatever the agent said.
    let wt = committed_reflection(&agent);
    let before = head(&agent);
    let done = finalize_reflection_worktree(&agent, &wt, &o, &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::Failed);
    assert_eq!(done.summary, NOT_MERGED_BY_AGENT);
    assert_eq!(head(&agent), before);
    assert!(!branch_exists(&agent, &wt));
    assert_gone(&agent, &wt);

    // Merged by the integration agent (git in the checkout): merged.
    let wt = committed_reflection(&agent);
    let (ok, out) = git_cli(
        &agent.memory_dir(),
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "-c",
            "core.hooksPath=/dev/null",
            "merge",
            "--no-ff",
            "--no-edit",
            &wt.branch,
        ],
    );
    assert!(ok, "{out}");
    let merged = head(&agent);
    let done = finalize_reflection_worktree(&agent, &wt, &o, &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::Merged, "{done:?}");
    assert_eq!(
        done.summary,
        "Primary agent integrated 1 reflection memory commit(s)."
    );
    assert_eq!(head(&agent), merged);
    assert!(!branch_exists(&agent, &wt));
    assert_gone(&agent, &wt);
}

#[test]
fn missing_worktree_as_no_op() {
    let (_t, agent) = agent();
    let o = FinalizeOptions {
        known_no_changes: true,
        ..opts(true)
    };
    let wt = create(&agent, Label::Reflection).unwrap();
    std::fs::remove_dir_all(&wt.dir).unwrap();
    let done = finalize_reflection_worktree(&agent, &wt, &o, &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::NoChanges);
    assert_eq!(done.summary, NO_COMMITS);
    assert!(!branch_exists(&agent, &wt));
    assert_gone(&agent, &wt);

    // A missing worktree whose branch advanced is not a no-op.
    let wt = committed_reflection(&agent);
    let (_, wrepo) = open(&agent, &wt.name).unwrap();
    let tip = wrepo.head().unwrap().target().unwrap();
    std::fs::remove_dir_all(&wt.dir).unwrap();
    let err = finalize_reflection_worktree(&agent, &wt, &o, &sig(&agent)).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "Cannot finalize missing reflection worktree {} as no-op: {} advanced from {} to {}",
            wt.dir.display(),
            wt.branch,
            wt.base,
            tip
        )
    );
    assert!(branch_exists(&agent, &wt));
}

#[test]
fn invalid_merged_tree_is_refused() {
    let (_t, agent) = agent();
    let main = repo::open_agent(&agent).unwrap();
    commit_files(
        &main,
        &agent.memory_dir(),
        &[
            ("topics/MEMORY.md", "# Topics\n"),
            ("topics/a.md", &md("A", "a")),
        ],
        "topics",
    );
    // The branch adds a file under topics/ (valid: its index exists) ...
    let wt = create(&agent, Label::Reflection).unwrap();
    let (_, wrepo) = open(&agent, &wt.name).unwrap();
    commit_files(&wrepo, &wt.dir, &[("topics/b.md", &md("B", "b"))], "b");
    // ... while main drops the directory with its index (valid too).
    std::fs::remove_dir_all(agent.memory_dir().join("topics")).unwrap();
    let before = commit(&main, &["topics"], "drop topics");
    // Together: topics/b.md without topics/MEMORY.md.
    let done = finalize_reflection_worktree(&agent, &wt, &opts(true), &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::Invalid, "{done:?}");
    let error = done.error.clone().unwrap();
    assert!(error.contains("topics/MEMORY.md"), "{error}");
    assert_eq!(head(&agent), before);
    assert!(!agent.memory_dir().join("topics").exists());
    assert!(main_dirty(&agent).is_empty());
    assert!(!branch_exists(&agent, &wt));
    assert_gone(&agent, &wt);
}

#[test]
fn hostile_dot_git_file_does_not_redirect() {
    let (_t, agent) = agent();
    let wt = create(&agent, Label::Reflection).unwrap();
    // Another repository the child would like the supervisor to write.
    let other = tempfile::tempdir().unwrap();
    let decoy = Repository::init(other.path()).unwrap();
    std::fs::write(
        wt.dir.join(".git"),
        format!("gitdir: {}\n", decoy.path().display()),
    )
    .unwrap();

    let (_, wrepo) = open(&agent, &wt.name).unwrap();
    assert_eq!(
        std::fs::canonicalize(wrepo.path()).unwrap(),
        std::fs::canonicalize(admin_dir(&agent, &wt.name).unwrap()).unwrap()
    );
    let id = commit_files(&wrepo, &wt.dir, &[("notes.md", &md("Notes", "n"))], "notes");
    let main = repo::open_agent(&agent).unwrap();
    assert_eq!(
        main.find_reference(&wt.branch_ref()).unwrap().target(),
        Some(id)
    );
    assert!(decoy.head().is_err(), "the decoy got a commit");
    assert!(decoy.find_commit(id).is_err());
    // Finalizing still works on the real branch (the planted `.git` is an
    // untracked-looking entry it skips, like every `.git`).
    let done = finalize_reflection_worktree(&agent, &wt, &opts(true), &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::Merged, "{done:?}");
}

#[test]
fn removal_does_not_follow_symlinks() {
    let (_t, agent) = agent();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("keep.txt"), "precious").unwrap();

    let wt = create(&agent, Label::MemoryWorker).unwrap();
    std::os::unix::fs::symlink(outside.path(), wt.dir.join("link")).unwrap();
    discard(&agent, &wt).unwrap();
    assert_gone(&agent, &wt);
    assert!(!branch_exists(&agent, &wt));
    assert_eq!(
        std::fs::read_to_string(outside.path().join("keep.txt")).unwrap(),
        "precious"
    );

    // The whole worktree directory swapped for a symlink.
    let wt = create(&agent, Label::Reflection).unwrap();
    std::fs::remove_dir_all(&wt.dir).unwrap();
    std::os::unix::fs::symlink(outside.path(), &wt.dir).unwrap();
    let done = finalize_reflection_worktree(&agent, &wt, &opts(true), &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::DirtyUncommitted);
    assert!(std::fs::symlink_metadata(&wt.dir).is_err());
    assert!(outside.path().join("keep.txt").is_file());
}

#[test]
fn worker_conflict_keeps_the_branch() {
    let (_t, agent) = agent();
    let wt = create(&agent, Label::MemoryWorker).unwrap();
    let (_, wrepo) = open(&agent, &wt.name).unwrap();
    commit_files(
        &wrepo,
        &wt.dir,
        &[("persona.md", &md("Persona", "from worker"))],
        "w",
    );
    // Overlapping: the same file is dirty in the checkout.
    write(&agent.memory_dir(), "persona.md", "hand edit in progress");
    let before = head(&agent);
    let done = integrate_worker(&agent, &wt, false, &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::MergeConflict, "{done:?}");
    assert_eq!(
        done.summary,
        format!(
            "Memory changes conflict with the checkout; 1 commit(s) kept on {}",
            wt.branch
        )
    );
    assert!(done.branch_kept);
    assert_eq!(done.branch, wt.branch);
    assert!(branch_exists(&agent, &wt));
    // Only the checkout's uncommitted edits stood in the way (the caller
    // runs the instruction again instead of a repair), and the kept tip is
    // named so that the caller can drop exactly that branch.
    assert!(done.checkout_dirty, "{done:?}");
    assert_eq!(
        done.kept_tip.as_deref(),
        Some(main_repo_tip(&agent, &wt).as_str())
    );
    assert_eq!(serde_json::to_value(&done).unwrap()["checkout_dirty"], true);
    assert!(!wt.dir.exists());
    assert_eq!(head(&agent), before);
    assert_eq!(
        std::fs::read_to_string(agent.memory_dir().join("persona.md")).unwrap(),
        "hand edit in progress"
    );

    // A content conflict with a commit on main keeps the branch too.
    let wt = create(&agent, Label::MemoryWorker).unwrap();
    let (_, wrepo) = open(&agent, &wt.name).unwrap();
    commit_files(
        &wrepo,
        &wt.dir,
        &[("human.md", &md("Human", "worker"))],
        "w",
    );
    let main = repo::open_agent(&agent).unwrap();
    let before = commit_files(
        &main,
        &agent.memory_dir(),
        &[("human.md", &md("Human", "main"))],
        "m",
    );
    let done = integrate_worker(&agent, &wt, false, &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::MergeConflict);
    assert!(done.branch_kept && branch_exists(&agent, &wt));
    // A real conflict with main's history: a repair's business.
    assert!(!done.checkout_dirty, "{done:?}");
    assert!(
        serde_json::to_value(&done)
            .unwrap()
            .get("checkout_dirty")
            .is_none()
    );
    assert_eq!(head(&agent), before);
}

/// The tip of `wt`'s branch, read from `memory.git`.
fn main_repo_tip(agent: &AgentPaths, wt: &MemoryWorktree) -> String {
    let repo = repo::open_agent(agent).unwrap();
    repo.find_reference(&wt.branch_ref())
        .unwrap()
        .peel_to_commit()
        .unwrap()
        .id()
        .to_string()
}

#[test]
fn worker_merges_around_dirty_files() {
    let (_t, agent) = agent();
    let wt = create(&agent, Label::MemoryWorker).unwrap();
    let (_, wrepo) = open(&agent, &wt.name).unwrap();
    let tip = commit_files(&wrepo, &wt.dir, &[("notes.md", &md("Notes", "n"))], "w");
    // Uncommitted worker edits are dropped.
    write(&wt.dir, "scratch.md", "never merged");
    write(&agent.memory_dir(), "human.md", "hand edit in progress");
    let before = head(&agent);
    let done = integrate_worker(&agent, &wt, false, &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::Merged, "{done:?}");
    assert_eq!(done.changed_paths, vec!["notes.md"]);
    assert!(!done.branch_kept && !branch_exists(&agent, &wt));
    assert_gone(&agent, &wt);
    let main = repo::open_agent(&agent).unwrap();
    let merge = main.head().unwrap().peel_to_commit().unwrap();
    assert!(
        merge
            .message()
            .unwrap()
            .starts_with("merge(memory-worker): ")
    );
    assert_eq!(merge.parent_ids().collect::<Vec<_>>(), vec![before, tip]);
    assert_eq!(
        std::fs::read_to_string(agent.memory_dir().join("human.md")).unwrap(),
        "hand edit in progress"
    );
    assert!(agent.memory_dir().join("notes.md").is_file());
    assert!(!agent.memory_dir().join("scratch.md").exists());
    assert_eq!(main_dirty(&agent), vec!["human.md"]);
}

#[test]
fn worker_without_commits_or_cancelled() {
    let (_t, agent) = agent();
    let wt = create(&agent, Label::MemoryWorker).unwrap();
    let done = integrate_worker(&agent, &wt, false, &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::NoChanges);
    assert!(!branch_exists(&agent, &wt));
    assert_gone(&agent, &wt);

    let wt = create(&agent, Label::MemoryWorker).unwrap();
    let (_, wrepo) = open(&agent, &wt.name).unwrap();
    commit_files(&wrepo, &wt.dir, &[("notes.md", &md("Notes", "n"))], "w");
    let before = head(&agent);
    let done = integrate_worker(&agent, &wt, true, &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::Discarded);
    assert_eq!(serde_json::to_value(&done).unwrap()["status"], "discarded");
    assert_eq!(head(&agent), before);
    assert!(!branch_exists(&agent, &wt));
    assert_gone(&agent, &wt);
    assert!(!agent.memory_dir().join("notes.md").exists());
}

#[test]
fn orphans_are_cleaned_but_unmerged_worker_work_is_kept() {
    let (_t, agent) = agent();
    let reflection = committed_reflection(&agent);
    let worker = create(&agent, Label::MemoryWorker).unwrap();
    let (_, wrepo) = open(&agent, &worker.name).unwrap();
    commit_files(&wrepo, &worker.dir, &[("w.md", &md("W", "w"))], "w");
    let idle = create(&agent, Label::MemoryWorker).unwrap();
    let live = create(&agent, Label::Reflection).unwrap();
    assert_eq!(list(&agent).unwrap().len(), 4);

    let mut cleaned = cleanup_orphans(&agent, std::slice::from_ref(&live.name)).unwrap();
    cleaned.sort();
    let mut want = vec![
        reflection.name.clone(),
        worker.name.clone(),
        idle.name.clone(),
    ];
    want.sort();
    assert_eq!(cleaned, want);
    for wt in [&reflection, &worker, &idle] {
        assert_gone(&agent, wt);
    }
    assert!(!branch_exists(&agent, &reflection));
    assert!(!branch_exists(&agent, &idle));
    assert!(branch_exists(&agent, &worker), "unmerged worker work kept");
    assert!(live.dir.is_dir() && branch_exists(&agent, &live));
    // The kept branch is still listed (for doctor), without a directory.
    let names = list_names(&agent);
    assert!(names.contains(&worker.name) && names.contains(&live.name));
    let (ok, out) = git_cli(&agent.memory_git_dir(), &["worktree", "list"]);
    assert!(ok && out.lines().count() == 2, "{out}");
}

/// A bare `origin` cloned from the agent's repository, given one more
/// commit writing `rel`; registered as the memory repository's `origin`.
fn origin_with_commit(agent: &AgentPaths, tmp: &Path, rel: &str, contents: &str) -> Oid {
    let origin = tmp.join("origin.git");
    let work = tmp.join("origin-work");
    let run = |dir: &Path, args: &[&str]| {
        let (ok, out) = git_cli(dir, args);
        assert!(ok, "{args:?}: {out}");
    };
    let git_dir = agent.memory_git_dir();
    run(
        tmp,
        &[
            "clone",
            "-q",
            "--bare",
            git_dir.to_str().unwrap(),
            "origin.git",
        ],
    );
    run(
        tmp,
        &["clone", "-q", origin.to_str().unwrap(), "origin-work"],
    );
    write(&work, rel, contents);
    run(&work, &["add", rel]);
    run(
        &work,
        &[
            "-c",
            "user.name=o",
            "-c",
            "user.email=o@example.com",
            "commit",
            "-q",
            "-m",
            "from origin",
        ],
    );
    run(&work, &["push", "-q", "origin", "main"]);
    run(
        &git_dir,
        &["remote", "add", "origin", origin.to_str().unwrap()],
    );
    Repository::open_bare(&origin)
        .unwrap()
        .refname_to_id("refs/heads/main")
        .unwrap()
}

#[test]
fn refresh_from_origin_fast_forwards_or_rebases_before_merging() {
    let (t, agent) = agent();
    let remote = origin_with_commit(&agent, t.path(), "origin.md", &md("Origin", "o"));
    // A local commit too: main has diverged from origin and is rebased.
    let main = repo::open_agent(&agent).unwrap();
    commit_files(
        &main,
        &agent.memory_dir(),
        &[("human.md", &md("Human", "local"))],
        "local",
    );
    let wt = committed_reflection(&agent);
    let done = finalize_reflection_worktree(&agent, &wt, &opts(true), &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::Merged, "{done:?}");
    let merge = main.head().unwrap().peel_to_commit().unwrap();
    let first = merge.parent(0).unwrap();
    assert_eq!(first.summary().unwrap(), Some("local"));
    assert_eq!(first.parent_id(0).unwrap(), remote);
    for f in ["origin.md", "notes.md", "human.md"] {
        assert!(agent.memory_dir().join(f).is_file(), "{f}");
    }
    assert!(main_dirty(&agent).is_empty(), "{:?}", main_dirty(&agent));
    let (ok, fsck) = git_cli(&agent.memory_git_dir(), &["fsck", "--no-dangling"]);
    assert!(ok, "{fsck}");
}

#[test]
fn refresh_from_origin_fast_forward_and_failure() {
    let (t, agent) = agent();
    let remote = origin_with_commit(&agent, t.path(), "persona.md", &md("Persona", "origin"));
    let wt = committed_reflection(&agent);
    let done = finalize_reflection_worktree(&agent, &wt, &opts(true), &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::Merged, "{done:?}");
    let main = repo::open_agent(&agent).unwrap();
    let merge = main.head().unwrap().peel_to_commit().unwrap();
    assert_eq!(merge.parent_id(0).unwrap(), remote);
    assert_eq!(
        std::fs::read_to_string(agent.memory_dir().join("persona.md")).unwrap(),
        md("Persona", "origin")
    );
    assert!(main_dirty(&agent).is_empty());

    // A local edit conflicting with origin's: the refresh fails, nothing
    // changes, the reflection is thrown away for a retry.
    let (t2, agent2) = self::agent();
    origin_with_commit(&agent2, t2.path(), "persona.md", &md("Persona", "origin"));
    let main2 = repo::open_agent(&agent2).unwrap();
    let before = commit_files(
        &main2,
        &agent2.memory_dir(),
        &[("persona.md", &md("Persona", "local"))],
        "local",
    );
    let wt = committed_reflection(&agent2);
    let done = finalize_reflection_worktree(&agent2, &wt, &opts(true), &sig(&agent2)).unwrap();
    assert_eq!(done.status, FinalizeStatus::Failed);
    assert_eq!(done.summary, super::finalize::REFRESH_FAILED);
    assert!(done.error.is_some());
    assert_eq!(head(&agent2), before);
    assert!(main_dirty(&agent2).is_empty());
    assert!(!branch_exists(&agent2, &wt));
    assert_gone(&agent2, &wt);
}

#[test]
fn merged_symlinks_and_new_directories_reach_the_checkout() {
    let (_t, agent) = agent();
    let wt = create(&agent, Label::Reflection).unwrap();
    let (_, wrepo) = open(&agent, &wt.name).unwrap();
    write(&wt.dir, "projects/MEMORY.md", "# Projects\n");
    write(&wt.dir, "projects/x.md", &md("X", "x"));
    std::os::unix::fs::symlink("../persona.md", wt.dir.join("projects/alias.txt")).unwrap();
    commit(&wrepo, &["projects"], "projects");
    let done = finalize_reflection_worktree(&agent, &wt, &opts(true), &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::Merged, "{done:?}");
    let link = agent.memory_dir().join("projects/alias.txt");
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        Path::new("../persona.md")
    );
    assert!(agent.memory_dir().join("projects/x.md").is_file());
    assert!(main_dirty(&agent).is_empty(), "{:?}", main_dirty(&agent));
    let (ok, st) = git_cli(&agent.memory_dir(), &["status", "--porcelain"]);
    assert!(ok && st.is_empty(), "{st}");
}

/// A worker branch changing `human.md` and adding `notes.md`, and what
/// `human.md` holds on `main` before it.
fn worker_with_two_files(agent: &AgentPaths) -> (MemoryWorktree, String) {
    let wt = create(agent, Label::MemoryWorker).unwrap();
    let (_, wrepo) = open(agent, &wt.name).unwrap();
    let before = std::fs::read_to_string(agent.memory_dir().join("human.md")).unwrap();
    commit_files(
        &wrepo,
        &wt.dir,
        &[
            ("human.md", &format!("{before}- from the worker\n")),
            ("notes.md", &md("Notes", "n")),
        ],
        "w",
    );
    (wt, before)
}

#[test]
fn a_checkout_that_cannot_follow_a_merge_leaves_main_unmoved() {
    // The lost update this prevents: `main` moving while `memory/` kept
    // the old `human.md`, so the agent's next edit of it committed the old
    // text back and the worker's line was gone.
    for fault in ["second file", "ref move"] {
        let (_t, agent) = agent();
        let (wt, before) = worker_with_two_files(&agent);
        let head_before = head(&agent);
        match fault {
            "second file" => merge::FAIL_CHECKOUT_AFTER.with(|f| f.set(Some(1))),
            _ => advance::FAIL_NEXT_REF_MOVE.with(|f| f.set(true)),
        }
        let done = integrate_worker(&agent, &wt, false, &sig(&agent)).unwrap();
        assert_eq!(done.status, FinalizeStatus::Failed, "{fault}: {done:?}");
        assert!(done.branch_kept && branch_exists(&agent, &wt), "{fault}");
        assert_eq!(head(&agent), head_before, "{fault}: main moved");
        assert_eq!(
            std::fs::read_to_string(agent.memory_dir().join("human.md")).unwrap(),
            before,
            "{fault}: the checkout was left changed"
        );
        assert!(!agent.memory_dir().join("notes.md").exists(), "{fault}");
        assert!(
            main_dirty(&agent).is_empty(),
            "{fault}: {:?}",
            main_dirty(&agent)
        );
        assert!(!advance::interrupted(&agent.memory_git_dir()), "{fault}");

        // Space is back: the next worker's merge lands, checkout and all.
        let (wt, _) = worker_with_two_files(&agent);
        let done = integrate_worker(&agent, &wt, false, &sig(&agent)).unwrap();
        assert_eq!(done.status, FinalizeStatus::Merged, "{fault}: {done:?}");
        let human = std::fs::read_to_string(agent.memory_dir().join("human.md")).unwrap();
        assert!(human.ends_with("- from the worker\n"), "{fault}: {human}");
        assert!(main_dirty(&agent).is_empty(), "{fault}");
    }
}

/// The state a kill between the checkout update and the move of `main`
/// leaves: the journal, `memory/` at the merge, `main` before it.
fn killed_before_the_ref_moved(agent: &AgentPaths) -> (Oid, Oid) {
    let main = repo::open_agent(agent).unwrap();
    let old = head(agent);
    let human = std::fs::read_to_string(agent.memory_dir().join("human.md")).unwrap();
    // Made on a side branch: only its objects matter.
    let side = create(agent, Label::MemoryWorker).unwrap();
    let (_, wrepo) = open(agent, &side.name).unwrap();
    let new = commit_files(
        &wrepo,
        &side.dir,
        &[("human.md", &format!("{human}- merged fact\n"))],
        "w",
    );
    std::fs::write(
        crate::paths::MemoryGitDir::new(main.path()).main_move_journal(),
        format!("{old} {new}\n"),
    )
    .unwrap();
    write(
        &agent.memory_dir(),
        "human.md",
        &format!("{human}- merged fact\n"),
    );
    (old, new)
}

#[test]
fn a_move_of_main_cut_short_is_finished_or_left_to_its_owner() {
    let (_t, agent) = agent();
    let (_, new) = killed_before_the_ref_moved(&agent);
    let repo = repo::open_agent(&agent).unwrap();
    advance::recover(&repo, &agent.memory_dir()).unwrap();
    assert_eq!(head(&agent), new, "the interrupted merge is finished");
    assert!(main_dirty(&agent).is_empty(), "{:?}", main_dirty(&agent));
    assert!(!advance::interrupted(&agent.memory_git_dir()));

    // An edit made since the kill is never overwritten: the journal goes,
    // `main` stays, the edit stays (it shows as uncommitted).
    let (_t2, agent) = self::agent();
    let (old, _) = killed_before_the_ref_moved(&agent);
    write(&agent.memory_dir(), "human.md", "a person's own words");
    let repo = repo::open_agent(&agent).unwrap();
    advance::recover(&repo, &agent.memory_dir()).unwrap();
    assert_eq!(head(&agent), old);
    assert_eq!(
        std::fs::read_to_string(agent.memory_dir().join("human.md")).unwrap(),
        "a person's own words"
    );
    assert!(!advance::interrupted(&agent.memory_git_dir()));
}

/// `human.md` as a new agent has it.
fn human_base() -> String {
    crate::memfs::template::initial_files()
        .into_iter()
        .find(|(p, _)| *p == "human.md")
        .unwrap()
        .1
}

#[test]
fn append_only_sides_of_a_reflection_merge_line_wise() {
    let (_t, agent) = agent();
    let base = human_base();
    let wt = create(&agent, Label::Reflection).unwrap();
    let (_, wrepo) = open(&agent, &wt.name).unwrap();
    let tip = commit_files(
        &wrepo,
        &wt.dir,
        &[("human.md", &format!("{base}- likes tea\n"))],
        "r",
    );
    let main = repo::open_agent(&agent).unwrap();
    let parent = commit_files(
        &main,
        &agent.memory_dir(),
        &[("human.md", &format!("{base}- lives in Oslo\n"))],
        "m",
    );
    drop(main);
    let done = finalize_reflection_worktree(&agent, &wt, &opts(true), &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::Merged, "{done:?}");
    assert!(done.conflicts.is_empty());
    assert_eq!(done.changed_paths, vec!["human.md"]);
    // Both, in order: main's line first, then the branch's.
    let want = format!("{base}- lives in Oslo\n- likes tea\n");
    let read = || std::fs::read_to_string(agent.memory_dir().join("human.md")).unwrap();
    assert_eq!(read(), want);
    let main = repo::open_agent(&agent).unwrap();
    let merge = main.head().unwrap().peel_to_commit().unwrap();
    assert_eq!(merge.parent_ids().collect::<Vec<_>>(), vec![parent, tip]);
    let (ok, st) = git_cli(&agent.memory_dir(), &["status", "--porcelain"]);
    assert!(ok && st.is_empty(), "{st}");
    assert!(!branch_exists(&agent, &wt));
    assert_gone(&agent, &wt);
}

#[test]
fn append_only_sides_of_a_worker_merge_line_wise() {
    let (_t, agent) = agent();
    let base = human_base();
    let wt = create(&agent, Label::MemoryWorker).unwrap();
    let (_, wrepo) = open(&agent, &wt.name).unwrap();
    commit_files(
        &wrepo,
        &wt.dir,
        &[("human.md", &format!("{base}- w1\n"))],
        "w1",
    );
    commit_files(
        &wrepo,
        &wt.dir,
        &[("human.md", &format!("{base}- w1\n- w2\n"))],
        "w2",
    );
    // Main appends twice meanwhile, the last line left unterminated.
    let main = repo::open_agent(&agent).unwrap();
    commit_files(
        &main,
        &agent.memory_dir(),
        &[("human.md", &format!("{base}- m1\n"))],
        "m1",
    );
    commit_files(
        &main,
        &agent.memory_dir(),
        &[("human.md", &format!("{base}- m1\n- m2"))],
        "m2",
    );
    drop(main);
    let done = integrate_worker(&agent, &wt, false, &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::Merged, "{done:?}");
    assert!(!done.branch_kept && !branch_exists(&agent, &wt));
    let got = std::fs::read_to_string(agent.memory_dir().join("human.md")).unwrap();
    assert_eq!(got, format!("{base}- m1\n- m2\n- w1\n- w2\n"));
}

#[test]
fn an_edit_beside_an_append_is_still_a_true_conflict() {
    let (_t, agent) = agent();
    let base = format!("{}- one\n- two\n", human_base());
    let main = repo::open_agent(&agent).unwrap();
    commit_files(&main, &agent.memory_dir(), &[("human.md", &base)], "base");
    let wt = create(&agent, Label::MemoryWorker).unwrap();
    let (_, wrepo) = open(&agent, &wt.name).unwrap();
    commit_files(
        &wrepo,
        &wt.dir,
        &[("human.md", &format!("{base}- three\n"))],
        "w",
    );
    // Main rewrites the last line and appends: not an append.
    let edited = base.replace("- two\n", "- TWO\n- four\n");
    let before = commit_files(&main, &agent.memory_dir(), &[("human.md", &edited)], "m");
    let done = integrate_worker(&agent, &wt, false, &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::MergeConflict, "{done:?}");
    assert!(!done.checkout_dirty && done.branch_kept);
    assert_eq!(done.changed_paths, vec!["human.md"]);
    assert_eq!(done.conflicts.len(), 1);
    assert_eq!(done.conflicts[0].path, "human.md");
    assert!(done.conflicts[0].base.is_some() && done.conflicts[0].theirs.is_some());
    assert_eq!(head(&agent), before);
    let got = std::fs::read_to_string(agent.memory_dir().join("human.md")).unwrap();
    assert_eq!(got, edited);
}

#[test]
fn one_true_conflict_keeps_the_whole_merge_out() {
    let (_t, agent) = agent();
    let base = human_base();
    let wt = create(&agent, Label::Reflection).unwrap();
    let (_, wrepo) = open(&agent, &wt.name).unwrap();
    commit_files(
        &wrepo,
        &wt.dir,
        &[
            ("human.md", &format!("{base}- r\n")),
            ("persona.md", &md("Persona", "from reflection")),
        ],
        "r",
    );
    let main = repo::open_agent(&agent).unwrap();
    let before = commit_files(
        &main,
        &agent.memory_dir(),
        &[
            ("human.md", &format!("{base}- m\n")),
            ("persona.md", &md("Persona", "from main")),
        ],
        "m",
    );
    let done = finalize_reflection_worktree(&agent, &wt, &opts(true), &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::MergeConflict, "{done:?}");
    // Only the file a repair must look at is named.
    let named: Vec<&str> = done.conflicts.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(named, vec!["persona.md"]);
    assert_eq!(head(&agent), before);
    let got = std::fs::read_to_string(agent.memory_dir().join("human.md")).unwrap();
    assert_eq!(got, format!("{base}- m\n"));
}

#[test]
fn a_line_wise_merge_is_validated() {
    let (_t, agent) = agent();
    let base = human_base();
    // Each side alone stays under the per-file character limit; together
    // they do not.
    let limit = crate::memfs::validate::DEFAULT_MAX_FILE_CHARACTERS as usize;
    let line = |c: char| format!("- {}\n", c.to_string().repeat(limit * 6 / 10));
    let wt = create(&agent, Label::Reflection).unwrap();
    let (_, wrepo) = open(&agent, &wt.name).unwrap();
    commit_files(
        &wrepo,
        &wt.dir,
        &[("human.md", &format!("{base}{}", line('r')))],
        "r",
    );
    let main = repo::open_agent(&agent).unwrap();
    let before = commit_files(
        &main,
        &agent.memory_dir(),
        &[("human.md", &format!("{base}{}", line('m')))],
        "m",
    );
    let done = finalize_reflection_worktree(&agent, &wt, &opts(true), &sig(&agent)).unwrap();
    assert_eq!(done.status, FinalizeStatus::Invalid, "{done:?}");
    assert!(
        done.error.as_deref().unwrap_or("").contains("human.md"),
        "{done:?}"
    );
    assert_eq!(head(&agent), before);
}
