//! The validated-commit library called directly: refusals leave the on-disk
//! index byte for byte as it was, and threads of one process are serialized
//! by the in-process half of the writer lock.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use git2::{Repository, Signature};
use mini_letta::memfs::commit::{CommitError, CommitOptions, commit_paths};
use mini_letta::memfs::ops::Writer;
use mini_letta::memfs::repo;
use mini_letta::memfs::template::initial_files;

/// A memfs-v2 repository laid out like an agent's (git dir beside the tree).
fn new_repo() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let mem = dir.path().join("memory");
    let files = initial_files();
    let seed: Vec<(&str, &str)> = files.iter().map(|(p, c)| (*p, c.as_str())).collect();
    let sig = Signature::now("T", "t@example.com").unwrap();
    repo::create(&mem, &dir.path().join("memory.git"), &seed, &sig, "init").unwrap();
    (dir, mem)
}

fn sig() -> Signature<'static> {
    Signature::now("Agent", "agent@example.com").unwrap()
}

#[test]
fn refusal_leaves_the_index_file_byte_identical() {
    let (dir, mem) = new_repo();
    let repository = repo::open(&mem).unwrap();
    // Something else is staged, so the index differs from HEAD.
    std::fs::write(
        mem.join("human.md"),
        "---\nname: H\ndescription: d\n---\nx\n",
    )
    .unwrap();
    let mut index = repository.index().unwrap();
    index.add_path(Path::new("human.md")).unwrap();
    index.write().unwrap();
    let index_file = dir.path().join("memory.git/index");
    let before = std::fs::read(&index_file).unwrap();
    let head = repository.head().unwrap().target().unwrap();

    std::fs::write(mem.join("bad.md"), "no frontmatter\n").unwrap();
    let opts = CommitOptions::for_repo(&repository, false);
    let err = commit_paths(&repository, &["bad.md".into()], "bad", &sig(), &opts).unwrap_err();
    let report = err.report().expect("a validator refusal");
    assert_eq!(
        report.messages(),
        ["bad.md: missing frontmatter (must start with ---)"]
    );
    assert_eq!(
        err.to_string(),
        "Memory validation failed:\n\n  bad.md: missing frontmatter (must start with ---)"
    );
    assert_eq!(std::fs::read(&index_file).unwrap(), before);
    assert_eq!(repository.head().unwrap().target().unwrap(), head);

    // Path errors come before anything is read.
    for bad in ["../x.md", "/etc/passwd", "a/./b.md", ".git/config"] {
        let err = commit_paths(&repository, &[bad.into()], "x", &sig(), &opts).unwrap_err();
        assert!(err.report().is_none(), "{bad}");
        assert!(err.to_string().contains(bad), "{bad}: {err}");
    }
    assert!(matches!(
        commit_paths(&repository, &[], "x", &sig(), &opts),
        Err(CommitError::NoPaths)
    ));
    assert_eq!(std::fs::read(&index_file).unwrap(), before);
}

#[test]
fn threads_in_one_process_commit_without_losing_any() {
    let (_dir, mem) = new_repo();
    let handles: Vec<_> = ["t1.md", "t2.md", "t3.md"]
        .into_iter()
        .map(|path| {
            let mem = mem.clone();
            std::thread::spawn(move || {
                let repository = Repository::open(&mem).unwrap();
                let opts = CommitOptions::for_repo(&repository, false);
                let w = Writer::new(repository, sig(), opts).unwrap();
                for i in 0..30 {
                    std::fs::write(
                        mem.join(path),
                        format!("---\nname: T\ndescription: d\n---\n{i}\n"),
                    )
                    .unwrap();
                    let out = w
                        .commit(&[path.to_string()], &format!("{path} {i}"))
                        .unwrap();
                    assert!(out.commit.is_some());
                    assert_eq!(out.changed, [path]);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let repository = Repository::open(&mem).unwrap();
    let mut walk = repository.revwalk().unwrap();
    walk.push_head().unwrap();
    let ids: Vec<_> = walk.map(|i| i.unwrap()).collect();
    assert_eq!(ids.len(), 1 + 90);
    for id in &ids[..90] {
        assert_eq!(repository.find_commit(*id).unwrap().parent_count(), 1);
    }
    // The index holds exactly the committed entries.
    let statuses = repository.statuses(None).unwrap();
    assert_eq!(statuses.len(), 0);
}

/// Someone else's `git add` holding `index.lock` for a moment does not cost
/// the commit its index update: the update waits for the lock and the tree
/// reads clean after. Held past the wait, the commit still stands (the index
/// is only a mirror) and the wait stays bounded.
#[test]
fn a_briefly_held_index_lock_is_waited_for() {
    let (dir, mem) = new_repo();
    let repository = repo::open(&mem).unwrap();
    let lock = dir.path().join("memory.git/index.lock");
    let commit = |n: u32| {
        std::fs::write(
            mem.join("held.md"),
            format!("---\nname: H\ndescription: d\n---\n{n}\n"),
        )
        .unwrap();
        let opts = CommitOptions::for_repo(&repository, false);
        let began = std::time::Instant::now();
        let out = commit_paths(&repository, &["held.md".into()], "held", &sig(), &opts).unwrap();
        assert!(out.commit.is_some());
        began.elapsed()
    };
    let clean = || {
        Repository::open(&mem)
            .unwrap()
            .statuses(None)
            .unwrap()
            .is_empty()
    };

    std::fs::write(&lock, "").unwrap();
    let holder = {
        let lock = lock.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(60));
            std::fs::remove_file(lock).unwrap();
        })
    };
    commit(1);
    holder.join().unwrap();
    assert!(
        clean(),
        "the index was not updated after the lock was let go"
    );

    std::fs::write(&lock, "").unwrap();
    let took = commit(2);
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
    assert!(!clean(), "the index changed under someone else's lock");
    std::fs::remove_file(&lock).unwrap();
}
