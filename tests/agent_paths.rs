//! Attacks on the supervisor through an agent-writable directory: a hostile
//! child swaps directories and files with symlinks and FIFOs while the
//! supervisor (root) chowns, commits or reports status. Every attack here
//! was demonstrated against a supervisor that resolved paths by string; each
//! test asserts the harm cannot happen (host files keep their owner, host
//! content never becomes a git object, nothing blocks).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use git2::{Repository, Signature};
use mini_letta::memfs::commit::{CommitOptions, commit_paths};
use mini_letta::memfs::repo;
use mini_letta::memfs::validate::MAX_FILE_BYTES;
use mini_letta::paths::AgentPaths;
use nix::fcntl::{RenameFlags, renameat2};

/// How long each race runs. Long enough to hit the window thousands of
/// times on the old code, short enough for a 2-core CI.
const RACE: Duration = Duration::from_secs(3);
/// A uid no account uses: the agent's.
const AGENT_UID: u32 = 3_999_123;

fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    nix::unistd::mkfifo(
        c.as_c_str(),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
}

/// A thread that exchanges `a` and `b` in `dir` (atomically, with
/// `RENAME_EXCHANGE`) until told to stop: what a hostile child does to race
/// a check against a use.
struct Swapper {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<u64>>,
}

impl Swapper {
    fn start(dir: &Path, a: &str, b: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let dirfd = std::fs::File::open(dir).unwrap();
        let (a, b, flag) = (a.to_string(), b.to_string(), stop.clone());
        let handle = std::thread::spawn(move || {
            let mut n = 0u64;
            while !flag.load(Ordering::Relaxed) {
                renameat2(
                    &dirfd,
                    a.as_str(),
                    &dirfd,
                    b.as_str(),
                    RenameFlags::RENAME_EXCHANGE,
                )
                .unwrap();
                n += 1;
            }
            // Leave the tree as it was set up (an even number of swaps).
            if n % 2 == 1 {
                renameat2(
                    &dirfd,
                    a.as_str(),
                    &dirfd,
                    b.as_str(),
                    RenameFlags::RENAME_EXCHANGE,
                )
                .unwrap();
            }
            n
        });
        Self {
            stop,
            handle: Some(handle),
        }
    }

    fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().unwrap().join().unwrap()
    }
}

impl Drop for Swapper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A home-like layout: `<tmp>/host/` (root's files, outside every agent)
/// and `<tmp>/agents/a1/` with a memory repository.
struct Layout {
    tmp: tempfile::TempDir,
    agent: AgentPaths,
}

impl Layout {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let host = tmp.path().join("host");
        std::fs::create_dir(&host).unwrap();
        std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir(host.join("etc")).unwrap();
        let agent = AgentPaths::from_dir(&tmp.path().join("agents").join("a1"));
        std::fs::create_dir_all(agent.dir()).unwrap();
        let files = mini_letta::memfs::template::initial_files();
        let seed: Vec<(&str, &str)> = files.iter().map(|(p, c)| (*p, c.as_str())).collect();
        let sig = Signature::now("T", "t@example.com").unwrap();
        repo::create(
            &agent.memory_dir(),
            &agent.memory_git_dir(),
            &seed,
            &sig,
            "init",
        )
        .unwrap();
        Self { tmp, agent }
    }

    fn host(&self) -> PathBuf {
        self.tmp.path().join("host")
    }

    fn memory(&self) -> PathBuf {
        self.agent.memory_dir()
    }

    /// A root-only host file holding `secret`.
    fn host_secret(&self, rel: &str, secret: &str) -> PathBuf {
        let p = self.host().join(rel);
        std::fs::write(&p, secret).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        p
    }

    fn repo(&self) -> Repository {
        repo::open_agent(&self.agent).unwrap()
    }
}

fn secret_marker() -> String {
    format!("HOST-SECRET-{:016x}", rand::random::<u64>())
}

/// Every object in the repository's object database, as bytes.
fn all_objects(repo: &Repository) -> Vec<(git2::Oid, Vec<u8>)> {
    let odb = repo.odb().unwrap();
    let mut ids = Vec::new();
    odb.foreach(|id| {
        ids.push(*id);
        true
    })
    .unwrap();
    ids.into_iter()
        .map(|id| (id, odb.read(id).unwrap().data().to_vec()))
        .collect()
}

fn assert_no_object_contains(repo: &Repository, needle: &str) {
    for (id, data) in all_objects(repo) {
        assert!(
            !data.windows(needle.len()).any(|w| w == needle.as_bytes()),
            "object {id} holds host file content ({needle})"
        );
    }
}

fn sig() -> Signature<'static> {
    Signature::now("Agent", "agent@example.com").unwrap()
}

/// Run `f` on a worker thread; each result must come back within
/// `per_call` or the test fails (a call blocked on a FIFO never returns).
fn commit_loop_with_deadline(
    layout: &Layout,
    paths: Vec<String>,
    per_call: Duration,
) -> (usize, usize) {
    let (tx, rx) = mpsc::channel();
    let agent = layout.agent.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        let repo = repo::open_agent(&agent).unwrap();
        let opts = CommitOptions::for_repo(&repo, false);
        while !flag.load(Ordering::Relaxed) {
            let r = commit_paths(&repo, &paths, "race", &sig(), &opts);
            if tx.send(r.map_err(|e| e.to_string())).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + RACE;
    let (mut ok, mut err) = (0, 0);
    while Instant::now() < deadline {
        match rx.recv_timeout(per_call) {
            Ok(Ok(_)) => ok += 1,
            Ok(Err(_)) => err += 1,
            Err(_) => {
                stop.store(true, Ordering::Relaxed);
                panic!("a commit did not answer within {per_call:?} (blocked reading a FIFO?)");
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    (ok, err)
}

// ------------------------------------------------------------- attack 1

/// `own_agent_dir` runs on every spawn as root. A child exchanging a
/// directory of its memory tree with a symlink to a host directory must
/// never get host files chowned to its uid.
#[test]
fn chown_never_follows_a_swapped_symlink_out_of_the_agent_dir() {
    if !common::require_root("chown_never_follows_a_swapped_symlink_out_of_the_agent_dir") {
        return;
    }
    let l = Layout::new();
    let secret = l.host_secret("etc/shadow-like", "root only\n");
    let mem = l.memory();
    std::fs::create_dir(mem.join("sub")).unwrap();
    for i in 0..8 {
        std::fs::write(mem.join(format!("sub/f{i}.md")), "x").unwrap();
    }
    std::os::unix::fs::symlink(l.host().join("etc"), mem.join("link")).unwrap();
    let swapper = Swapper::start(&mem, "sub", "link");
    let deadline = Instant::now() + RACE;
    let mut calls = 0;
    while Instant::now() < deadline {
        // Without the marker every call walks the whole tree (as the first
        // spawn of an agent does), so the race is run on every call.
        let _ = std::fs::remove_file(l.agent.ownership_marker());
        // Errors are fine (the tree changes under the walk); harm is not.
        let _ = mini_letta::sandbox::identity::own_agent_dir(&l.agent, AGENT_UID);
        calls += 1;
        if std::fs::metadata(&secret).unwrap().uid() != 0 {
            break;
        }
    }
    let swaps = swapper.stop();
    eprintln!("{calls} own_agent_dir calls against {swaps} swaps");
    for p in [l.host(), l.host().join("etc"), secret] {
        let m = std::fs::symlink_metadata(&p).unwrap();
        assert_eq!(
            (m.uid(), m.gid()),
            (0, 0),
            "{} changed hands to the agent",
            p.display()
        );
    }
    // The agent's own tree is still given to it.
    let m = std::fs::metadata(mem.join("MEMORY.md")).unwrap();
    assert_eq!(m.uid(), AGENT_UID);
}

/// Hard links and other uids' files are never adopted, and the agent
/// directory itself stays root's.
#[test]
fn chown_keeps_hard_links_and_foreign_files() {
    if !common::require_root("chown_keeps_hard_links_and_foreign_files") {
        return;
    }
    let l = Layout::new();
    let host_file = l.host_secret("etc/linked", "x");
    let mem = l.memory();
    std::fs::hard_link(&host_file, mem.join("hard.md")).unwrap();
    std::fs::write(mem.join("other.md"), "y").unwrap();
    std::os::unix::fs::lchown(mem.join("other.md"), Some(4242), Some(4242)).unwrap();
    mini_letta::sandbox::identity::own_agent_dir(&l.agent, AGENT_UID).unwrap();
    assert_eq!(std::fs::metadata(&host_file).unwrap().uid(), 0);
    assert_eq!(std::fs::metadata(mem.join("other.md")).unwrap().uid(), 4242);
    assert_eq!(
        std::fs::metadata(mem.join("persona.md")).unwrap().uid(),
        AGENT_UID
    );
    let dir = std::fs::metadata(l.agent.dir()).unwrap();
    assert_eq!(
        (dir.uid(), dir.gid(), dir.mode() & 0o7777),
        (0, AGENT_UID, 0o750)
    );
    // agent.json and memory.git stay the supervisor's.
    let git = std::fs::metadata(l.agent.memory_git_dir()).unwrap();
    assert_eq!(git.uid(), 0);
}

/// The tree is walked once per uid; afterwards a spawn checks only the
/// top-level directories, and what mini-letta writes as root in the
/// agent's directories is the agent's from the start.
#[test]
fn ownership_is_set_once_and_root_writes_are_born_the_agents() {
    use mini_letta::memfs::ops::Writer;
    if !common::require_root("ownership_is_set_once_and_root_writes_are_born_the_agents") {
        return;
    }
    let l = Layout::new();
    let own = || mini_letta::sandbox::identity::own_agent_dir(&l.agent, AGENT_UID).unwrap();
    own();
    let marker = std::fs::read_to_string(l.agent.ownership_marker()).unwrap();
    assert_eq!(marker.trim(), AGENT_UID.to_string());
    assert_eq!(
        std::fs::metadata(l.agent.ownership_marker()).unwrap().uid(),
        0
    );
    // Written by hand as root after preparation: not walked to again.
    std::fs::write(l.memory().join("by-hand.md"), "x").unwrap();
    // Written by the operator's CLI (memory create), and a conversation.
    let repo = l.repo();
    let opts = CommitOptions::for_repo(&repo, false);
    let w = Writer::new(repo, sig(), opts).unwrap();
    // (replaced by a new inode, as every edit is)
    w.insert("human.md", "- likes tea", None).unwrap();
    let mut c = mini_letta::store::conversation::Conversation::open(&l.agent, "c1").unwrap();
    let id = c.next_id();
    c.append(mini_letta::store::conversation::StoredMessage::new(
        id,
        mini_letta::model::Role::User,
        vec![mini_letta::model::Part::Text { text: "hi".into() }],
    ))
    .unwrap();
    own();
    let uid = |p: PathBuf| std::fs::metadata(p).unwrap().uid();
    assert_eq!(uid(l.memory().join("by-hand.md")), 0);
    assert_eq!(uid(l.memory().join("human.md")), AGENT_UID);
    let conv = l.agent.conversation("c1").unwrap();
    for p in [
        conv.dir().to_path_buf(),
        conv.messages_jsonl(),
        conv.context_json(),
    ] {
        assert_eq!(uid(p.clone()), AGENT_UID, "{}", p.display());
    }
    // A new uid (or a removed marker) walks the tree again.
    std::fs::remove_file(l.agent.ownership_marker()).unwrap();
    own();
    assert_eq!(uid(l.memory().join("by-hand.md")), AGENT_UID);
}

// ------------------------------------------------------------- attack 2

/// A file checked as regular and then swapped for a symlink to a root-only
/// host file: its content must never become an object in the repository.
#[test]
fn commit_never_reads_a_host_file_through_a_swapped_symlink() {
    let l = Layout::new();
    let marker = secret_marker();
    let secret = l.host_secret("etc/secret", &format!("{marker}\n"));
    let mem = l.memory();
    std::fs::write(mem.join("notes.md"), "---\ndescription: n\n---\nlegit\n").unwrap();
    std::os::unix::fs::symlink(&secret, mem.join("alias.md")).unwrap();
    let swapper = Swapper::start(&mem, "notes.md", "alias.md");
    let (ok, err) = commit_loop_with_deadline(&l, vec!["notes.md".into()], Duration::from_secs(5));
    let swaps = swapper.stop();
    eprintln!("{ok} commits, {err} refusals against {swaps} swaps");
    assert_no_object_contains(&l.repo(), &marker);
}

/// The same through a directory component: `dir/` exchanged with a symlink
/// to a host directory holding a file of the same name.
#[test]
fn commit_never_reads_through_a_swapped_directory_symlink() {
    let l = Layout::new();
    let marker = secret_marker();
    std::fs::create_dir(l.host().join("etc/dir")).unwrap();
    l.host_secret("etc/dir/notes.md", &format!("{marker}\n"));
    let mem = l.memory();
    std::fs::create_dir(mem.join("dir")).unwrap();
    std::fs::write(mem.join("dir/notes.md"), "legit\n").unwrap();
    std::os::unix::fs::symlink(l.host().join("etc/dir"), mem.join("dirlink")).unwrap();
    let swapper = Swapper::start(&mem, "dir", "dirlink");
    let (ok, err) =
        commit_loop_with_deadline(&l, vec!["dir/notes.md".into()], Duration::from_secs(5));
    let (ok2, err2) = commit_loop_with_deadline(&l, vec!["dir".into()], Duration::from_secs(5));
    let swaps = swapper.stop();
    eprintln!(
        "{} commits, {} refusals against {swaps} swaps",
        ok + ok2,
        err + err2
    );
    assert_no_object_contains(&l.repo(), &marker);
}

/// A file larger than the per-file limit is refused before it is read
/// whole, and no object is written for it.
#[test]
fn commit_refuses_an_oversized_file_without_writing_an_object() {
    let l = Layout::new();
    let big = l.memory().join("big.md");
    let f = std::fs::File::create(&big).unwrap();
    // Sparse: costs no disk, but reading it costs 64 MiB.
    f.set_len(64 << 20).unwrap();
    drop(f);
    let repo = l.repo();
    let opts = CommitOptions::for_repo(&repo, false);
    let err = commit_paths(&repo, &["big.md".into()], "big", &sig(), &opts).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("exceeds the {MAX_FILE_BYTES}-byte file limit")),
        "{msg}"
    );
    for (id, data) in all_objects(&repo) {
        assert!(
            data.len() as u64 <= MAX_FILE_BYTES,
            "object {id} of {} bytes was written for a refused file",
            data.len()
        );
    }
}

// ------------------------------------------------------------- attack 3

/// A FIFO raced in place of a regular file: every commit answers (with a
/// refusal or a result) within a second instead of blocking in `open` or
/// `read` while holding the repository lock.
#[test]
fn commit_with_a_fifo_raced_in_answers_quickly() {
    let l = Layout::new();
    let mem = l.memory();
    std::fs::write(mem.join("notes.md"), "---\ndescription: n\n---\nlegit\n").unwrap();
    mkfifo(&mem.join("pipe.md"));
    let swapper = Swapper::start(&mem, "notes.md", "pipe.md");
    let (ok, err) = commit_loop_with_deadline(&l, vec!["notes.md".into()], Duration::from_secs(1));
    let swaps = swapper.stop();
    eprintln!("{ok} commits, {err} refusals against {swaps} swaps");
    // A FIFO sitting still is refused with a clear error too.
    let repo = l.repo();
    let opts = CommitOptions::for_repo(&repo, false);
    let err = commit_paths(&repo, &["pipe.md".into()], "p", &sig(), &opts).unwrap_err();
    assert!(err.to_string().contains("not a regular file"), "{err}");
}

/// A FIFO at `memory/.gitignore` made libgit2's status block forever in the
/// supervisor; now `memory.status` answers within a second (listing it as
/// dirty) and another agent's requests are still served.
#[test]
fn memory_status_with_a_fifo_answers_and_other_agents_are_served() {
    use mini_letta::protocol::Call;
    let d = common::Daemon::start(&["a", "b"]);
    mkfifo(&d.memory_dir(0).join(".gitignore"));
    std::fs::write(d.memory_dir(0).join("new.md"), "n").unwrap();
    let mut c = d.client();
    c.set_timeout(Some(Duration::from_secs(5))).unwrap();
    let started = Instant::now();
    let v = c
        .call_json(Call::MemoryStatus {
            agent: Some(d.agents[0].clone()),
        })
        .expect("memory.status must answer, not hang on a FIFO");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "memory.status took {:?}",
        started.elapsed()
    );
    let dirty: Vec<&str> = v["dirty"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x.as_str())
        .collect();
    assert_eq!(dirty, [".gitignore", "new.md"], "{v}");
    assert!(v["head"].as_str().is_some_and(|h| h.len() == 40), "{v}");
    // Many requests at once do not exhaust anything either.
    for _ in 0..50 {
        c.call_json(Call::MemoryStatus {
            agent: Some(d.agents[0].clone()),
        })
        .unwrap();
    }
    let v = d
        .client()
        .call_json(Call::MemoryStatus {
            agent: Some(d.agents[1].clone()),
        })
        .unwrap();
    assert_eq!(v["dirty"], serde_json::json!([]), "{v}");
}

/// The status function itself: a FIFO (tracked path replaced, untracked,
/// and at `.gitignore`) answers at once and is listed dirty, never read.
#[test]
fn worktree_status_lists_fifos_without_opening_them() {
    use mini_letta::memfs::status::worktree_status;
    let l = Layout::new();
    let mem = l.memory();
    mkfifo(&mem.join(".gitignore"));
    std::fs::remove_file(mem.join("human.md")).unwrap();
    mkfifo(&mem.join("human.md"));
    std::fs::create_dir(mem.join("d")).unwrap();
    mkfifo(&mem.join("d/pipe"));
    let repo = l.repo();
    let (tx, rx) = mpsc::channel();
    let agent = l.agent.clone();
    std::thread::spawn(move || {
        let repo = repo::open_agent(&agent).unwrap();
        let _ = tx.send(worktree_status(&repo).map_err(|e| e.to_string()));
    });
    let status = rx
        .recv_timeout(Duration::from_secs(1))
        .expect("worktree_status blocked on a FIFO")
        .unwrap();
    assert_eq!(status.dirty, [".gitignore", "d/pipe", "human.md"]);
    let head = repo
        .head()
        .unwrap()
        .peel_to_commit()
        .unwrap()
        .id()
        .to_string();
    assert_eq!(status.head, Some(head));
}

/// On an ordinary tree the answer is libgit2's (`include_untracked`,
/// `recurse_untracked_dirs`): modified, staged, staged-then-reverted,
/// deleted, mode change, untracked in an untracked directory, symlink.
#[test]
fn worktree_status_agrees_with_libgit2_on_ordinary_trees() {
    use mini_letta::memfs::status::worktree_status;
    let l = Layout::new();
    let mem = l.memory();
    let repo = l.repo();
    let libgit2 = |repo: &Repository| -> Vec<String> {
        let mut opts = git2::StatusOptions::new();
        opts.include_untracked(true).recurse_untracked_dirs(true);
        let mut v: Vec<String> = repo
            .statuses(Some(&mut opts))
            .unwrap()
            .iter()
            .filter_map(|s| s.path().ok().map(str::to_string))
            .collect();
        v.sort();
        v
    };
    assert_eq!(worktree_status(&repo).unwrap().dirty, Vec::<String>::new());
    assert_eq!(libgit2(&repo), Vec::<String>::new());
    // Modified in the working tree.
    std::fs::write(mem.join("persona.md"), "changed\n").unwrap();
    // Staged new file, then changed again in the tree.
    std::fs::write(mem.join("staged.md"), "one\n").unwrap();
    let mut index = repo.index().unwrap();
    index.add_path(Path::new("staged.md")).unwrap();
    index.write().unwrap();
    std::fs::write(mem.join("staged.md"), "two\n").unwrap();
    // Deleted.
    std::fs::remove_file(mem.join("human.md")).unwrap();
    // Untracked, in an untracked directory, and a symlink.
    std::fs::create_dir_all(mem.join("new/deeper")).unwrap();
    std::fs::write(mem.join("new/deeper/x.md"), "x\n").unwrap();
    std::os::unix::fs::symlink("persona.md", mem.join("link.md")).unwrap();
    // Mode change.
    std::fs::set_permissions(
        mem.join("MEMORY.md"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let ours = worktree_status(&repo).unwrap().dirty;
    assert_eq!(ours, libgit2(&repo));
    assert_eq!(
        ours,
        [
            "MEMORY.md",
            "human.md",
            "link.md",
            "new/deeper/x.md",
            "persona.md",
            "staged.md"
        ]
    );
}

// ------------------------------------------------- operator edits (CLI)

/// `mini-letta memory insert/replace/...` run by the operator (root) edit
/// the agent's working tree: a file swapped for a symlink to a host file
/// must neither leak the host file into the tree or the repository nor
/// have the host file rewritten.
#[test]
fn memory_edits_never_read_or_write_through_a_swapped_symlink() {
    use mini_letta::memfs::ops::Writer;
    let l = Layout::new();
    let marker = secret_marker();
    let secret = l.host_secret("etc/secret.md", &format!("{marker}\n"));
    std::fs::create_dir(l.host().join("etc/d")).unwrap();
    let host_in_dir = l.host_secret("etc/d/n.md", &format!("{marker}\n"));
    let mem = l.memory();
    let legit = "---\ndescription: n\n---\nlegit\n";
    std::fs::write(mem.join("notes.md"), legit).unwrap();
    std::os::unix::fs::symlink(&secret, mem.join("alias.md")).unwrap();
    std::fs::create_dir(mem.join("d")).unwrap();
    std::fs::write(mem.join("d/n.md"), legit).unwrap();
    std::os::unix::fs::symlink(l.host().join("etc/d"), mem.join("dlink")).unwrap();
    let s1 = Swapper::start(&mem, "notes.md", "alias.md");
    let s2 = Swapper::start(&mem, "d", "dlink");
    let deadline = Instant::now() + RACE;
    let repo = l.repo();
    let opts = CommitOptions::for_repo(&repo, false);
    let w = Writer::new(repo, sig(), opts).unwrap();
    let mut n = 0;
    while Instant::now() < deadline {
        let _ = w.insert("notes.md", "more", None);
        let _ = w.insert("d/n.md", "more", None);
        let _ = w.create(&format!("d/new{n}.md"), "a new file", "body");
        n += 1;
    }
    s1.stop();
    s2.stop();
    for p in [&secret, &host_in_dir] {
        let m = std::fs::symlink_metadata(p).unwrap();
        assert!(m.is_file() && m.uid() == 0, "{} replaced", p.display());
        assert_eq!(
            std::fs::read_to_string(p).unwrap(),
            format!("{marker}\n"),
            "{} rewritten",
            p.display()
        );
    }
    let host_entries: Vec<_> = std::fs::read_dir(l.host().join("etc/d"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(host_entries, ["n.md"], "files created in a host directory");
    // No regular file of the working tree (walked without following
    // symlinks) holds the host content.
    let mut stack = vec![mem.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                let text = std::fs::read(e.path()).unwrap();
                assert!(
                    !String::from_utf8_lossy(&text).contains(&marker),
                    "{} holds host file content",
                    e.path().display()
                );
            }
        }
    }
    assert_no_object_contains(&l.repo(), &marker);
}

/// Status trusts the index's stat data only when ctime (which a child
/// cannot set) matches too: a same-size rewrite with the old mtime put
/// back is still seen.
#[test]
fn worktree_status_sees_a_same_size_rewrite_with_the_old_mtime() {
    use mini_letta::memfs::status::worktree_status;
    use nix::sys::stat::{UtimensatFlags, utimensat};
    use nix::sys::time::TimeSpec;
    let l = Layout::new();
    let p = l.memory().join("persona.md");
    let repo = l.repo();
    // Let the index be strictly newer than the file, so the stat shortcut
    // applies, and check that it does (nothing dirty).
    std::thread::sleep(Duration::from_millis(20));
    let mut index = repo.index().unwrap();
    index.write().unwrap();
    assert!(worktree_status(&repo).unwrap().dirty.is_empty());
    let before = std::fs::metadata(&p).unwrap();
    let old = std::fs::read(&p).unwrap();
    let mut new = old.clone();
    let last = new.len() - 2;
    new[last] = if new[last] == b'x' { b'y' } else { b'x' };
    std::fs::write(&p, &new).unwrap();
    let atime = TimeSpec::new(before.atime(), before.atime_nsec());
    let mtime = TimeSpec::new(before.mtime(), before.mtime_nsec());
    utimensat(
        nix::fcntl::AT_FDCWD,
        &p,
        &atime,
        &mtime,
        UtimensatFlags::NoFollowSymlink,
    )
    .unwrap();
    assert_eq!(worktree_status(&repo).unwrap().dirty, ["persona.md"]);
}

// ----------------------------------------------- conversations (CLI, root)

/// The operator's CLI (root) opens, appends to and caches prompts in the
/// agent's conversation directories: a conversation directory swapped for a
/// symlink to a host directory must not get host files created or
/// rewritten, and a FIFO for a log must not hang it.
#[test]
fn conversation_files_are_never_written_through_a_swapped_symlink() {
    use mini_letta::model::{Part, Role};
    use mini_letta::store::conversation::{Conversation, StoredMessage};
    use mini_letta::store::system_prompt_file::{CachedPrompt, store};
    let l = Layout::new();
    let host = l.host().join("etc");
    let secret = l.host_secret("etc/messages.jsonl", "root's\n");
    let convs = l.agent.conversations_dir();
    std::fs::create_dir_all(convs.join("c1")).unwrap();
    std::os::unix::fs::symlink(&host, convs.join("c2")).unwrap();
    let swapper = Swapper::start(&convs, "c1", "c2");
    let prompt = CachedPrompt {
        content: "p".into(),
        core_memory: String::new(),
        compiled_at: "2026-01-01T00:00:00Z".into(),
        raw_system_hash: "h".into(),
        memfs_revision: None,
    };
    let deadline = Instant::now() + RACE;
    while Instant::now() < deadline {
        if let Ok(mut c) = Conversation::open(&l.agent, "c1") {
            let id = c.next_id();
            let _ = c.append(StoredMessage::new(
                id,
                Role::User,
                vec![Part::Text { text: "hi".into() }],
            ));
            let _ = c.queue_reminder("r", "text");
        }
        let _ = store(&l.agent, "c1", &prompt);
    }
    swapper.stop();
    let mut names: Vec<_> = std::fs::read_dir(&host)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["messages.jsonl"],
        "files written into a host directory"
    );
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root's\n");

    // A FIFO for a log answers at once.
    std::fs::create_dir_all(convs.join("c3")).unwrap();
    mkfifo(&convs.join("c3/messages.jsonl"));
    let (tx, rx) = mpsc::channel();
    let agent = l.agent.clone();
    std::thread::spawn(move || {
        let _ = tx.send(
            Conversation::open(&agent, "c3")
                .map(|_| ())
                .map_err(|e| e.to_string()),
        );
    });
    let r = rx
        .recv_timeout(Duration::from_secs(1))
        .expect("opening a conversation blocked on a FIFO");
    assert!(r.is_err_and(|e| e.contains("FIFO")));
}

/// A directory spec over a tree of many maximal files is refused once the
/// commit has read its total byte budget, before anything is written.
#[test]
fn commit_reads_a_bounded_total_from_a_directory_spec() {
    use mini_letta::memfs::commit::MAX_COMMIT_BYTES;
    let l = Layout::new();
    let dir = l.memory().join("bulk");
    std::fs::create_dir(&dir).unwrap();
    let files = MAX_COMMIT_BYTES / MAX_FILE_BYTES + 1;
    for i in 0..files {
        // Sparse: no disk, but each is a full file to read.
        let f = std::fs::File::create(dir.join(format!("f{i:04}.bin"))).unwrap();
        f.set_len(MAX_FILE_BYTES).unwrap();
    }
    let repo = l.repo();
    let before = all_objects(&repo).len();
    let opts = CommitOptions::for_repo(&repo, false);
    let err = commit_paths(&repo, &["bulk".into()], "bulk", &sig(), &opts).unwrap_err();
    assert!(err.to_string().contains("commit fewer at a time"), "{err}");
    assert_eq!(all_objects(&repo).len(), before, "objects written");
}

/// A ref lock left by a process that died mid-update (or by a file system
/// remounted read-only under it, where the lock could not be removed)
/// blocked every later commit of the agent for good: the fault soak lost 21
/// acknowledged facts behind one `refs/heads/main.lock`. A lock older than
/// any live update is cleared (and said); a fresh one is still respected.
#[test]
fn a_stale_ref_lock_does_not_block_commits_for_good() {
    let l = Layout::new();
    let repo = l.repo();
    let opts = CommitOptions::for_repo(&repo, false);
    std::fs::write(
        l.memory().join("a.md"),
        "---\nname: A\ndescription: a\n---\none\n",
    )
    .unwrap();
    commit_paths(&repo, &["a.md".into()], "one", &sig(), &opts).unwrap();
    let lock = repo.path().join("refs/heads/main.lock");
    // Fresh: someone may be updating the ref right now.
    std::fs::write(&lock, "").unwrap();
    std::fs::write(
        l.memory().join("a.md"),
        "---\nname: A\ndescription: a\n---\ntwo\n",
    )
    .unwrap();
    let err = commit_paths(&repo, &["a.md".into()], "two", &sig(), &opts).unwrap_err();
    assert!(err.to_string().contains("lock"), "{err}");
    assert!(lock.exists());
    // Old: nobody holds a ref lock for minutes.
    let old = std::time::SystemTime::now() - Duration::from_secs(120);
    std::fs::File::options()
        .write(true)
        .open(&lock)
        .unwrap()
        .set_modified(old)
        .unwrap();
    commit_paths(&repo, &["a.md".into()], "two", &sig(), &opts).unwrap();
    assert!(!lock.exists());
    let head = repo.head().unwrap().peel_to_commit().unwrap();
    assert_eq!(head.message().ok(), Some("two\n"));
}
