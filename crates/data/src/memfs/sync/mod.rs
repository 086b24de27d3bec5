//! Remote sync of an agent's memory (`mini-letta sync`): fetch the remote
//! `main`, fast-forward or rebase onto it, validate what would be pushed,
//! push without ever forcing.
//!
//! Network git goes through the `git` CLI (run by the supervisor), so the
//! operator's credential helpers and ssh configuration apply. Every command
//! names the git directory `memory.git/` explicitly: the child-writable
//! `memory/.git` pointer is never read. The URL is passed on each command
//! line (it comes from `MINI_LETTA_REMOTE_ROOT`, which may change between
//! runs); `origin` is configured to the same URL only for an operator's git
//! in the checkout, and the fetched tip is kept in `refs/remotes/origin/main`.
//!
//! The remote is not trusted (issue 36): whoever can write the remote root
//! is an attacker. A directory remote's repository is checked before any
//! git runs on it ([`crate::memfs::remote_repo`]), and everything that moves
//! `main` to what the remote has — a fast-forward, a rebase, the set-aside
//! before a repair — first validates the exact tree it would move to
//! against local `main`, with the rules of a local commit (a change to
//! `.memfs.config.json` needs the same approval, `MINI_LETTA_CONSTRAINTS_UPDATE=1`
//! in the syncing process's environment). A refusal is `invalid` and leaves
//! `main`, the checkout and its `.git` pointer as they were.

use std::path::{Path, PathBuf};

use git2::{Repository, Signature};

use crate::memfs::fence::Fence;
use crate::memfs::gitcli;
use crate::memfs::lock::RepoLock;
use crate::memfs::remote_repo;
pub use crate::memfs::remote_root::{RemoteRoot, RootRefused};
use crate::memfs::repo::{MAIN_BRANCH, open_agent};
use crate::memfs::status::worktree_status;
use crate::memfs::worktree::advance::{self, write_temp_target};
use crate::paths::{AgentPaths, PathsError, REMOTE_REPO_SUFFIX, remote_agent_repo};

mod aside;
mod error;
mod fenced;
mod judge;
mod rebase;
mod refs;
mod run;

pub use aside::{Aside, SetAside, not_carried_over, set_aside_for_repair};
pub use error::SyncError;
use error::git;
pub use fenced::ownership_lost;
pub use judge::accept_from_remote;
use refs::main_tip;
pub use refs::{BACKUP_REF_PREFIX, REMOTE_TRACKING_REF};
use run::Run;

/// Environment variable naming the remote root.
pub const REMOTE_ROOT_ENV: &str = "MINI_LETTA_REMOTE_ROOT";

pub use crate::protocol::replies::{SyncOutcome, SyncStatus};

/// The remote repository of agent `agent_id` under `remote_root`, unchecked
/// (for display and tests); a root [`RemoteRoot::parse`] refuses is joined
/// as written.
pub fn remote_url(remote_root: &str, agent_id: &str) -> String {
    match RemoteRoot::parse(remote_root) {
        Ok(root) => root.agent_location(agent_id),
        Err(_) => format!(
            "{}/{agent_id}{REMOTE_REPO_SUFFIX}",
            remote_root.trim_end_matches('/')
        ),
    }
}

/// Where agent `agent_id`'s memory lives under `remote_root`: a network
/// URL, or the absolute path of a repository in a directory root (a path
/// or a `file://` URL alike) that passed [`remote_repo::check`] for the
/// home at `home`. A root of no allowed form is [`SyncError::RootRefused`],
/// a repository that may not be touched [`SyncError::Refused`]. Every
/// fetch, push, clone and ls-remote gets its URL here.
pub fn agent_url(remote_root: &str, agent_id: &str, home: &Path) -> Result<String, SyncError> {
    if !crate::paths::is_valid_agent_id(agent_id) {
        return Err(PathsError::InvalidAgentId(agent_id.to_string()).into());
    }
    match RemoteRoot::parse(remote_root)? {
        RemoteRoot::Network(url) => Ok(RemoteRoot::Network(url).agent_location(agent_id)),
        RemoteRoot::Dir(root_dir) => {
            let repo = remote_agent_repo(&root_dir, agent_id)?;
            remote_repo::check(&root_dir, &repo, home)?;
            Ok(repo.to_string_lossy().into_owned())
        }
    }
}

/// The home an agent's remote must lie outside of.
fn home_of(agent: &AgentPaths) -> PathBuf {
    agent
        .home()
        .map(|h| h.root().to_path_buf())
        .unwrap_or_else(|| agent.dir().to_path_buf())
}

/// Make agent `agent_id`'s repository in a directory root on first use:
/// `mkdir` (which never follows a symlink planted there), `git init
/// --bare` inside it, and the check again. Returns its URL.
fn ensure_remote(root: &str, agent_id: &str, home: &Path) -> Result<String, SyncError> {
    let url = agent_url(root, agent_id, home)?;
    let RemoteRoot::Dir(root_dir) = RemoteRoot::parse(root)? else {
        return Ok(url);
    };
    if std::fs::symlink_metadata(&url).is_ok() {
        return Ok(url);
    }
    std::fs::create_dir_all(&root_dir).map_err(|source| SyncError::Io {
        path: root_dir.clone(),
        source,
    })?;
    std::fs::create_dir(&url).map_err(|source| SyncError::Io {
        path: PathBuf::from(&url),
        source,
    })?;
    gitcli::run(
        None,
        &[
            "init",
            "--quiet",
            "--bare",
            "--initial-branch",
            MAIN_BRANCH,
            "--",
            &url,
        ],
    )?
    .checked("init")?;
    agent_url(root, agent_id, home)
}

/// Name the remote `origin` in `memory.git`'s own configuration (kept in
/// step with the root each sync uses), so an operator's `git pull --rebase
/// origin main` in the checkout, the conflict recipe, reaches the same
/// remote. Children cannot write `memory.git`, so they cannot redirect it.
fn set_origin(repo: &Repository, url: &str) -> Result<(), SyncError> {
    match repo.find_remote("origin") {
        Ok(r) if r.url().ok() == Some(url) => Ok(()),
        Ok(_) => repo
            .remote_set_url("origin", url)
            .map_err(git("configure the origin remote")),
        Err(_) => repo
            .remote("origin", url)
            .map(|_| ())
            .map_err(git("configure the origin remote")),
    }
}

/// Agent ids with a `<id>.git` directory in a directory remote root
/// (sorted; empty for a network or refused root or an unreadable
/// directory). Symlinks are not listed; each repository is still checked
/// before it is read.
pub fn remote_agents(remote_root: &str) -> Vec<String> {
    let Ok(RemoteRoot::Dir(dir)) = RemoteRoot::parse(remote_root) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut ids: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let id = name.strip_suffix(REMOTE_REPO_SUFFIX)?;
            crate::paths::is_valid_agent_id(id).then(|| id.to_string())
        })
        .collect();
    ids.sort();
    ids
}

/// Remove lock files a sync killed mid-way left: `refs/mini-letta/backup/
/// *.lock` (only a sync writes there, always under the repository lock this
/// one now holds, so any such file is a dead one's), and those of a fetch
/// (`refs/remotes/**.lock`, `packed-refs.lock`) once no git of ours runs on
/// this repository — a fetch whose volume turned read-only under it cannot
/// remove its own, and it would stop every later sync.
fn drop_stale_locks(repo: &Repository) {
    let remove = |path: &Path| match std::fs::remove_file(path) {
        Ok(()) => tracing::info!("removed {}, left by a dead sync", path.display()),
        Err(e) => tracing::warn!("cannot remove {}: {e}", path.display()),
    };
    for lock in lock_files(&repo.path().join(BACKUP_REF_PREFIX), false) {
        remove(&lock);
    }
    let mut fetch_locks = lock_files(&repo.path().join("refs/remotes"), true);
    let packed = repo.path().join("packed-refs.lock");
    if packed.is_file() {
        fetch_locks.push(packed);
    }
    if !fetch_locks.is_empty() && !gitcli::running_on(repo.path()) {
        for lock in fetch_locks {
            remove(&lock);
        }
    }
}

/// The `*.lock` files in `dir` (and below it when `deep`).
fn lock_files(dir: &Path, deep: bool) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(kind) = e.file_type() else { continue };
            let path = e.path();
            if kind.is_dir() && deep {
                stack.push(path);
            } else if kind.is_file() && path.extension().is_some_and(|x| x == "lock") {
                found.push(path);
            }
        }
    }
    found
}

/// Remove the temporary files of writes a kill cut short (a child's memory
/// tool, a checkout update): untracked, of our writers' exact shape, and
/// never renamed into place. Called under the memory lease and the
/// repository lock, when no writer of ours is running, so they are dead
/// ones'; left alone they would keep the checkout dirty forever. `dirty`
/// is the checkout's status; whether anything was removed.
fn drop_dead_write_temps(
    repo: &Repository,
    agent: &AgentPaths,
    dirty: &[String],
) -> Result<bool, SyncError> {
    if !dirty.iter().any(|p| write_temp_target(p).is_some()) {
        return Ok(false);
    }
    let index = repo.index().map_err(git("read the index"))?;
    let dead: Vec<&String> = dirty
        .iter()
        .filter(|p| write_temp_target(p).is_some())
        .filter(|p| index.get_path(Path::new(p.as_str()), 0).is_none())
        .collect();
    if dead.is_empty() {
        return Ok(false);
    }
    let root = crate::agentfs::Dir::open(&agent.memory_dir())
        .map_err(|e| SyncError::Worktree(e.into()))?;
    for p in dead {
        if let Ok((dir, leaf)) = root.open_parent(std::ffi::OsStr::new(p.as_str())) {
            match dir.remove_file(leaf) {
                Ok(()) => tracing::info!("removed {p}, left by a write that was cut short"),
                Err(e) => tracing::warn!("cannot remove {p}: {e}"),
            }
        }
    }
    Ok(true)
}

/// Whether `main` has commits the remote was not last seen to have (or
/// the remote was never synced): what a sync after a turn would push. Reads
/// two refs of the git directory; nothing is fetched.
pub fn has_pending(agent: &AgentPaths) -> bool {
    let Ok(repo) = crate::memfs::repo::open_agent(agent) else {
        return false;
    };
    let main = repo
        .find_reference("refs/heads/main")
        .ok()
        .and_then(|r| r.target());
    let seen = repo
        .find_reference(REMOTE_TRACKING_REF)
        .ok()
        .and_then(|r| r.target());
    main.is_some() && main != seen
}

/// The outcome of a sync whose remote root or repository is refused.
fn refused(repo: &Repository, why: impl std::fmt::Display) -> SyncOutcome {
    tracing::warn!("{why}");
    let mut out = SyncOutcome::new(
        SyncStatus::Invalid,
        format!("{why}; nothing was fetched or pushed"),
    );
    out.local = main_tip(repo).ok().map(|o| o.to_string());
    out
}

/// Sync agent `agent_id`'s memory with `remote_root` (see the module docs);
/// commits replayed by a rebase are made as `committer` (the caller's:
/// memfs knows no agent).
pub fn sync(
    agent: &AgentPaths,
    agent_id: &str,
    remote_root: Option<&str>,
    committer: &Signature<'_>,
) -> Result<SyncOutcome, SyncError> {
    sync_with(agent, agent_id, remote_root, committer, None)
}

/// [`sync`] for an agent this host owns in a cluster (issue 35): the
/// remote's fence is fetched and judged, and every push moves it with
/// `main`, after `fence` confirmed ownership ([`crate::memfs::fence`]).
pub fn sync_fenced(
    agent: &AgentPaths,
    agent_id: &str,
    remote_root: Option<&str>,
    committer: &Signature<'_>,
    fence: &dyn Fence,
) -> Result<SyncOutcome, SyncError> {
    sync_with(agent, agent_id, remote_root, committer, Some(fence))
}

fn sync_with(
    agent: &AgentPaths,
    agent_id: &str,
    remote_root: Option<&str>,
    committer: &Signature<'_>,
    fence: Option<&dyn Fence>,
) -> Result<SyncOutcome, SyncError> {
    let Some(root) = remote_root.filter(|r| !r.is_empty()) else {
        return Ok(SyncOutcome::new(
            SyncStatus::Skipped,
            format!("no remote configured: set {REMOTE_ROOT_ENV}"),
        ));
    };
    if !crate::paths::is_valid_agent_id(agent_id) {
        return Err(PathsError::InvalidAgentId(agent_id.to_string()).into());
    }
    let git_dir = agent.memory_git_dir();
    let _lock = RepoLock::acquire(&git_dir)?;
    let repo = open_agent(agent)?;
    drop_stale_locks(&repo);
    advance::recover(&repo, &agent.memory_dir())?;

    if let Some(out) = dirty_outcome(&repo, agent)? {
        return Ok(out);
    }

    let url = match ensure_remote(root, agent_id, &home_of(agent)) {
        Ok(url) => url,
        Err(SyncError::Refused(why)) => return Ok(refused(&repo, why)),
        Err(SyncError::RootRefused(why)) => return Ok(refused(&repo, why)),
        Err(e) => return Err(e),
    };
    set_origin(&repo, &url)?;

    let mut run = Run {
        repo: &repo,
        agent,
        committer,
        git_dir: &git_dir,
        url: &url,
        backup_ref: None,
        fence,
    };
    let mut last_rejection = String::new();
    for attempt in 0..2 {
        match run.attempt(attempt == 1)? {
            Ok(out) => return Ok(out),
            Err(rejection) => last_rejection = rejection,
        }
    }
    let mut out = SyncOutcome::new(
        SyncStatus::PushFailed,
        format!("push to {url} was rejected again after a retry: {last_rejection}"),
    );
    out.local = main_tip(&repo).ok().map(|o| o.to_string());
    out.backup_ref = run.backup_ref;
    Ok(out)
}

/// The `dirty` outcome when the checkout has uncommitted changes (after
/// the temporary files of dead writes are removed), else `None`. One
/// status of the checkout in the common case: it is most of a no-op's cost.
fn dirty_outcome(repo: &Repository, agent: &AgentPaths) -> Result<Option<SyncOutcome>, SyncError> {
    let mut status = worktree_status(repo)?;
    if drop_dead_write_temps(repo, agent, &status.dirty)? {
        status = worktree_status(repo)?;
    }
    if status.dirty.is_empty() {
        return Ok(None);
    }
    let mut out = SyncOutcome::new(
        SyncStatus::Dirty,
        format!(
            "{} uncommitted memory change(s): commit them first ({})",
            status.dirty.len(),
            status.dirty.join(", ")
        ),
    );
    out.local = status.head;
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::judge::check;
    use super::refs::LOCAL_MAIN;
    use super::run::fetch;
    use super::*;
    use crate::memfs::commit::CommitOptions;
    use crate::memfs::transport::{self, Update};
    use git2::Oid;

    /// The committer a caller passes: the agent's.
    fn sig(agent: &AgentPaths) -> Signature<'static> {
        crate::store::commit_signature(agent).unwrap()
    }
    use crate::memfs::commit::commit_paths;
    use crate::paths::Home;
    use git2::Signature;
    use std::process::Command;

    fn journal_path(repo: &Repository) -> PathBuf {
        crate::paths::MemoryGitDir::new(repo.path()).main_move_journal()
    }

    struct Agent {
        _tmp: tempfile::TempDir,
        paths: AgentPaths,
        id: String,
    }

    fn agent() -> Agent {
        let tmp = tempfile::tempdir().unwrap();
        let home = Home::at(tmp.path());
        let record = crate::store::create(&home, "syncer", None).unwrap();
        let paths = home.agent(&record.id).unwrap();
        Agent {
            _tmp: tmp,
            paths,
            id: record.id,
        }
    }

    fn cli(args: &[&str]) {
        let out = Command::new("git").args(args).output().unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
    }

    /// A second home's agent whose memory is a copy of the remote's `main`
    /// (what a clone on another machine would hold), synced as `id`.
    fn second_home(remote: &str) -> Agent {
        let b = agent();
        let gd = b.paths.memory_git_dir();
        let gd = gd.to_str().unwrap();
        let wt = b.paths.memory_dir();
        let wt = wt.to_str().unwrap();
        cli(&[
            "--git-dir",
            gd,
            "fetch",
            "--update-head-ok",
            remote,
            "+refs/heads/main:refs/heads/main",
        ]);
        cli(&["--git-dir", gd, "--work-tree", wt, "reset", "--hard", "-q"]);
        cli(&["--git-dir", gd, "--work-tree", wt, "clean", "-fdq"]);
        b
    }

    fn md(name: &str, body: &str) -> String {
        format!("---\nname: {name}\ndescription: {name} notes\n---\n\n{body}\n")
    }

    fn commit_file(a: &Agent, rel: &str, contents: &str) -> Oid {
        let p = a.paths.memory_dir().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, contents).unwrap();
        let repo = open_agent(&a.paths).unwrap();
        let sig = Signature::now("t", "t@example.com").unwrap();
        commit_paths(
            &repo,
            &[rel.to_string()],
            &format!("add {rel}"),
            &sig,
            &CommitOptions::for_repo(&repo, false),
        )
        .unwrap()
        .commit
        .unwrap()
    }

    fn tip(a: &Agent) -> Oid {
        main_tip(&open_agent(&a.paths).unwrap()).unwrap()
    }

    fn remote_tip(url: &str) -> Oid {
        Repository::open_bare(url)
            .unwrap()
            .refname_to_id("refs/heads/main")
            .unwrap()
    }

    fn is_clean(a: &Agent) -> bool {
        worktree_status(&open_agent(&a.paths).unwrap())
            .unwrap()
            .dirty
            .is_empty()
    }

    /// Agent A synced to a fresh directory root, and B a copy of it.
    fn pair() -> (tempfile::TempDir, String, Agent, Agent, String) {
        let root = tempfile::tempdir().unwrap();
        let root_s = root.path().to_str().unwrap().to_string();
        let a = agent();
        let out = sync(&a.paths, &a.id, Some(&root_s), &sig(&a.paths)).unwrap();
        assert_eq!(out.status, SyncStatus::Pushed, "{out:?}");
        let url = remote_url(&root_s, &a.id);
        let b = second_home(&url);
        (root, root_s, a, b, url)
    }

    #[test]
    fn remote_urls() {
        assert_eq!(remote_url("/srv/mem", "ag-1"), "/srv/mem/ag-1.git");
        assert_eq!(remote_url("/srv/mem/", "ag-1"), "/srv/mem/ag-1.git");
        assert_eq!(
            remote_url("https://git.example.com/mem/", "ag-1"),
            "https://git.example.com/mem/ag-1.git"
        );
        assert_eq!(
            remote_url("git@example.com:mem", "ag-1"),
            "git@example.com:mem/ag-1.git"
        );
        assert!(!crate::memfs::transport::is_url("relative/dir"));
        assert!(!crate::memfs::transport::is_url("./a:b"));
    }

    #[test]
    fn no_root_is_skipped() {
        let a = agent();
        let out = sync(&a.paths, &a.id, None, &sig(&a.paths)).unwrap();
        assert_eq!(out.status, SyncStatus::Skipped);
        assert!(out.message.contains(REMOTE_ROOT_ENV));
        let json = serde_json::to_value(&out).unwrap();
        assert_eq!(json["status"], "skipped");
    }

    #[test]
    fn first_sync_creates_the_remote_and_pushes() {
        let root = tempfile::tempdir().unwrap();
        let root_s = root.path().join("remotes");
        let root_s = root_s.to_str().unwrap();
        let a = agent();
        let out = sync(&a.paths, &a.id, Some(root_s), &sig(&a.paths)).unwrap();
        assert_eq!(out.status, SyncStatus::Pushed, "{out:?}");
        assert!(out.pushed_commits >= 1);
        let url = remote_url(root_s, &a.id);
        assert_eq!(remote_tip(&url), tip(&a));
        assert_eq!(out.remote, Some(tip(&a).to_string()));
        assert_eq!(remote_agents(root_s), vec![a.id.clone()]);

        let again = sync(&a.paths, &a.id, Some(root_s), &sig(&a.paths)).unwrap();
        assert_eq!(again.status, SyncStatus::Clean, "{again:?}");
        assert_eq!(serde_json::to_value(&again).unwrap()["status"], "clean");

        commit_file(&a, "notes/MEMORY.md", "# notes\n");
        let pushed = sync(&a.paths, &a.id, Some(root_s), &sig(&a.paths)).unwrap();
        assert_eq!(pushed.status, SyncStatus::Pushed, "{pushed:?}");
        assert_eq!(pushed.pushed_commits, 1);
        assert_eq!(remote_tip(&url), tip(&a));
    }

    #[test]
    fn a_second_home_fast_forwards() {
        let (_root, root_s, a, b, url) = pair();
        commit_file(&a, "fact.md", &md("fact", "the sky is blue"));
        assert_eq!(
            sync(&a.paths, &a.id, Some(&root_s), &sig(&a.paths))
                .unwrap()
                .status,
            SyncStatus::Pushed
        );
        let out = sync(&b.paths, &a.id, Some(&root_s), &sig(&b.paths)).unwrap();
        assert_eq!(out.status, SyncStatus::Clean, "{out:?}");
        assert!(out.message.contains("fast-forwarded 1"), "{}", out.message);
        assert_eq!(tip(&b), remote_tip(&url));
        let text = std::fs::read_to_string(b.paths.memory_dir().join("fact.md")).unwrap();
        assert!(text.contains("the sky is blue"));
        assert!(is_clean(&b));
    }

    #[test]
    fn diverged_histories_are_rebased_and_pushed() {
        let (_root, root_s, a, b, url) = pair();
        commit_file(&a, "a.md", &md("a", "fact from A"));
        sync(&a.paths, &a.id, Some(&root_s), &sig(&a.paths)).unwrap();
        let old_remote = remote_tip(&url);
        let old_local = commit_file(&b, "b.md", &md("b", "fact from B"));

        let out = sync(&b.paths, &a.id, Some(&root_s), &sig(&b.paths)).unwrap();
        assert_eq!(out.status, SyncStatus::Pushed, "{out:?}");
        assert_eq!(out.pushed_commits, 1);
        assert!(out.message.contains("rebased"));
        let backup = out.backup_ref.clone().unwrap();
        assert!(backup.starts_with(BACKUP_REF_PREFIX));
        let repo = open_agent(&b.paths).unwrap();
        assert_eq!(repo.refname_to_id(&backup).unwrap(), old_local);

        let new_remote = remote_tip(&url);
        assert_eq!(new_remote, tip(&b));
        // Never forced: the remote's old tip is kept in its history.
        assert!(repo.graph_descendant_of(new_remote, old_remote).unwrap());
        let tree = repo.find_commit(new_remote).unwrap().tree().unwrap();
        assert!(tree.get_path(Path::new("a.md")).is_ok());
        assert!(tree.get_path(Path::new("b.md")).is_ok());
        assert!(check(&repo, new_remote, None).unwrap().is_none());
        assert!(b.paths.memory_dir().join("a.md").is_file());
        assert!(is_clean(&b));

        // A then picks up B's fact by fast-forward.
        let back = sync(&a.paths, &a.id, Some(&root_s), &sig(&a.paths)).unwrap();
        assert_eq!(back.status, SyncStatus::Clean, "{back:?}");
        assert!(a.paths.memory_dir().join("b.md").is_file());
        assert!(is_clean(&a));
    }

    #[test]
    fn conflicting_edits_are_a_conflict() {
        let (_root, root_s, a, b, _url) = pair();
        commit_file(&a, "same.md", &md("same", "A's version"));
        sync(&a.paths, &a.id, Some(&root_s), &sig(&a.paths)).unwrap();
        let before = commit_file(&b, "same.md", &md("same", "B's version"));

        let out = sync(&b.paths, &a.id, Some(&root_s), &sig(&b.paths)).unwrap();
        assert_eq!(out.status, SyncStatus::Conflict, "{out:?}");
        assert!(out.message.contains("same.md"), "{}", out.message);
        assert_eq!(tip(&b), before);
        let backup = out.backup_ref.unwrap();
        let repo = open_agent(&b.paths).unwrap();
        assert_eq!(repo.refname_to_id(&backup).unwrap(), before);
        let text = std::fs::read_to_string(b.paths.memory_dir().join("same.md")).unwrap();
        assert!(text.contains("B's version"));
        assert!(is_clean(&b));
    }

    /// B after a conflict on `same.md` with A's pushed version.
    fn conflicted() -> (tempfile::TempDir, String, Agent, Agent, Oid) {
        let (root, root_s, a, b, _url) = pair();
        commit_file(&a, "same.md", &md("same", "A's version"));
        sync(&a.paths, &a.id, Some(&root_s), &sig(&a.paths)).unwrap();
        let local = commit_file(&b, "same.md", &md("same", "B's version"));
        let out = sync(&b.paths, &a.id, Some(&root_s), &sig(&b.paths)).unwrap();
        assert_eq!(out.status, SyncStatus::Conflict, "{out:?}");
        (root, root_s, a, b, local)
    }

    #[test]
    fn a_repair_is_judged_by_what_reached_main() {
        let (_root, _root_s, _a, b, local) = conflicted();
        let Aside::Set(aside) = set_aside_for_repair(&b.paths).unwrap() else {
            panic!("nothing set aside");
        };
        assert_eq!(aside.local, local);
        assert_eq!(tip(&b), aside.remote);
        let repo = open_agent(&b.paths).unwrap();
        assert_eq!(repo.refname_to_id(&aside.backup_ref).unwrap(), local);
        // Main is the remote's: B's line is not there.
        assert_eq!(not_carried_over(&b.paths, &aside).unwrap(), vec!["same.md"]);
        // Another line somewhere else does not count...
        commit_file(&b, "same.md", &md("same", "A's version\nsomething else"));
        assert_eq!(not_carried_over(&b.paths, &aside).unwrap(), vec!["same.md"]);
        // ...B's own line, beside A's, does.
        commit_file(&b, "same.md", &md("same", "A's version\nB's version"));
        assert!(not_carried_over(&b.paths, &aside).unwrap().is_empty());
    }

    #[test]
    fn nothing_is_set_aside_for_a_refused_remote() {
        let (_root, _root_s, _a, b, local) = conflicted();
        // The remote as fetched gains a symlink out of the tree.
        let repo = open_agent(&b.paths).unwrap();
        let seen = repo.refname_to_id(REMOTE_TRACKING_REF).unwrap();
        let parent = repo.find_commit(seen).unwrap();
        let link = repo.blob(b"/etc/shadow").unwrap();
        let mut tb = repo.treebuilder(Some(&parent.tree().unwrap())).unwrap();
        tb.insert("leak", link, 0o120000).unwrap();
        let tree = repo.find_tree(tb.write().unwrap()).unwrap();
        let sig = Signature::now("m", "m@example.com").unwrap();
        let hostile = repo
            .commit(None, &sig, &sig, "hostile", &tree, &[&parent])
            .unwrap();
        repo.reference(REMOTE_TRACKING_REF, hostile, true, "test")
            .unwrap();
        let Aside::Refused(why) = set_aside_for_repair(&b.paths).unwrap() else {
            panic!("set aside onto a hostile remote");
        };
        assert!(why.contains("leak: symbolic link points outside"), "{why}");
        assert_eq!(tip(&b), local);
        assert!(!b.paths.memory_dir().join("leak").exists());
        assert!(is_clean(&b));
    }

    #[test]
    fn a_rebased_tree_failing_validation_is_invalid() {
        let (_root, root_s, a, b, url) = pair();
        // Each side stays within the core-memory budget; together they do not.
        let big = "x".repeat(12_000);
        for n in ["a1", "a2", "a3"] {
            commit_file(&a, &format!("{n}.md"), &md(n, &big));
        }
        sync(&a.paths, &a.id, Some(&root_s), &sig(&a.paths)).unwrap();
        let remote_before = remote_tip(&url);
        let mut before = tip(&b);
        for n in ["b1", "b2", "b3"] {
            before = commit_file(&b, &format!("{n}.md"), &md(n, &big));
        }
        let out = sync(&b.paths, &a.id, Some(&root_s), &sig(&b.paths)).unwrap();
        assert_eq!(out.status, SyncStatus::Invalid, "{out:?}");
        assert!(out.message.contains("fails validation"), "{}", out.message);
        assert!(
            out.message.contains("maxCoreMemoryCharacters"),
            "{}",
            out.message
        );
        assert_eq!(tip(&b), before);
        assert_eq!(remote_tip(&url), remote_before);
        assert!(!b.paths.memory_dir().join("a1.md").exists());
        assert!(is_clean(&b));
    }

    #[test]
    fn a_remote_that_moved_is_a_rejection_not_a_failure() {
        let (_root, root_s, a, b, url) = pair();
        commit_file(&a, "a.md", &md("a", "fact from A"));
        sync(&a.paths, &a.id, Some(&root_s), &sig(&a.paths)).unwrap();
        let before = remote_tip(&url);
        commit_file(&b, "b.md", &md("b", "fact from B"));
        // B's push without fetching is what a sync racing A would attempt:
        // from the remote main B last saw.
        let repo = open_agent(&b.paths).unwrap();
        let seen = repo.refname_to_id(REMOTE_TRACKING_REF).ok();
        let update = Update {
            name: LOCAL_MAIN,
            old: seen,
            new: tip(&b),
        };
        let pushed =
            transport::push(&repo, &b.paths.memory_git_dir(), &url, &[update], None).unwrap();
        assert!(
            matches!(pushed, transport::Pushed::Rejected(_)),
            "{pushed:?}"
        );
        assert_eq!(remote_tip(&url), before);
        let out = sync(&b.paths, &a.id, Some(&root_s), &sig(&b.paths)).unwrap();
        assert_eq!(out.status, SyncStatus::Pushed, "{out:?}");
    }

    #[test]
    fn a_dirty_checkout_is_left_alone() {
        let root = tempfile::tempdir().unwrap();
        let root_s = root.path().to_str().unwrap();
        let a = agent();
        std::fs::write(a.paths.memory_dir().join("loose.md"), "x").unwrap();
        let out = sync(&a.paths, &a.id, Some(root_s), &sig(&a.paths)).unwrap();
        assert_eq!(out.status, SyncStatus::Dirty, "{out:?}");
        assert!(out.message.contains("loose.md"));
        assert!(!Path::new(&remote_url(root_s, &a.id)).exists());
    }

    /// B's state after a sync that moved `main` to the remote's and was
    /// killed before the checkout followed (the journal left behind).
    fn killed_after_moving_main() -> (tempfile::TempDir, String, Agent, Agent) {
        let (root, root_s, a, b, url) = pair();
        commit_file(&a, "a.md", &md("a", "fact from A"));
        sync(&a.paths, &a.id, Some(&root_s), &sig(&a.paths)).unwrap();
        let repo = open_agent(&b.paths).unwrap();
        let old = tip(&b);
        let new = fetch(&repo, &b.paths.memory_git_dir(), &url, false)
            .unwrap()
            .0
            .unwrap();
        std::fs::write(journal_path(&repo), format!("{old} {new}\n")).unwrap();
        repo.reference(LOCAL_MAIN, new, true, "test: killed")
            .unwrap();
        assert!(!is_clean(&b));
        (root, root_s, a, b)
    }

    #[test]
    fn a_checkout_left_behind_by_a_killed_sync_is_brought_up_to_date() {
        let (_root, root_s, a, b) = killed_after_moving_main();
        let out = sync(&b.paths, &a.id, Some(&root_s), &sig(&b.paths)).unwrap();
        assert_eq!(out.status, SyncStatus::Clean, "{out:?}");
        assert!(is_clean(&b));
        assert!(b.paths.memory_dir().join("a.md").is_file());
        assert!(!journal_path(&open_agent(&b.paths).unwrap()).exists());
    }

    #[test]
    fn an_edit_made_after_the_kill_is_not_overwritten() {
        let (_root, root_s, a, b) = killed_after_moving_main();
        let edited = b.paths.memory_dir().join("a.md");
        std::fs::write(&edited, md("a", "B's own words")).unwrap();
        let out = sync(&b.paths, &a.id, Some(&root_s), &sig(&b.paths)).unwrap();
        assert_eq!(out.status, SyncStatus::Dirty, "{out:?}");
        let text = std::fs::read_to_string(&edited).unwrap();
        assert!(text.contains("B's own words"));
        assert!(!journal_path(&open_agent(&b.paths).unwrap()).exists());
    }

    #[test]
    fn a_dead_writers_temporary_file_does_not_keep_the_checkout_dirty() {
        let (_root, root_s, a, b, _url) = pair();
        let dead = b
            .paths
            .memory_dir()
            .join(".human.md.tmp-2-80dca957d336785f");
        std::fs::write(&dead, "half a write").unwrap();
        // Not of our shape: a person's file stays, and the sync says dirty.
        let theirs = b.paths.memory_dir().join(".human.md.tmp-notes");
        std::fs::write(&theirs, "mine").unwrap();
        let out = sync(&b.paths, &a.id, Some(&root_s), &sig(&b.paths)).unwrap();
        assert_eq!(out.status, SyncStatus::Dirty, "{out:?}");
        assert!(!dead.exists());
        assert!(theirs.exists());
        std::fs::remove_file(&theirs).unwrap();
        let out = sync(&b.paths, &a.id, Some(&root_s), &sig(&b.paths)).unwrap();
        assert_eq!(out.status, SyncStatus::Clean, "{out:?}");
    }

    #[test]
    fn a_dead_syncs_backup_lock_is_removed() {
        let (_root, root_s, a, b, _url) = pair();
        let dir = b.paths.memory_git_dir().join(BACKUP_REF_PREFIX);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("20000101000000.lock"), "").unwrap();
        let out = sync(&b.paths, &a.id, Some(&root_s), &sig(&b.paths)).unwrap();
        assert_eq!(out.status, SyncStatus::Clean, "{out:?}");
        assert!(!dir.join("20000101000000.lock").exists());
    }

    #[test]
    fn a_dead_fetchs_lock_is_removed_but_a_live_gits_is_not() {
        let (_root, root_s, a, b, _url) = pair();
        commit_file(&a, "a.md", &md("a", "fact from A"));
        sync(&a.paths, &a.id, Some(&root_s), &sig(&a.paths)).unwrap();
        // A fetch whose volume turned read-only could not remove its lock.
        let git_dir = b.paths.memory_git_dir();
        let lock = git_dir.join("refs/remotes/origin/main.lock");
        std::fs::create_dir_all(lock.parent().unwrap()).unwrap();
        std::fs::write(&lock, "").unwrap();
        // While a git of ours still runs on the repository, it is its.
        let mut live = gitcli::command(Some(&git_dir), &["cat-file", "--batch"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // (Seen once it has exec'd: until then /proc shows our own name.)
        let seen = (0..500).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            crate::memfs::gitcli::running_on(&git_dir)
        });
        assert!(seen, "the live git is not seen");
        let out = sync(&b.paths, &a.id, Some(&root_s), &sig(&b.paths));
        assert!(lock.exists(), "a live git's lock was removed: {out:?}");
        drop(live.stdin.take());
        live.wait().unwrap();
        assert!(!crate::memfs::gitcli::running_on(&git_dir));
        let out = sync(&b.paths, &a.id, Some(&root_s), &sig(&b.paths)).unwrap();
        assert_eq!(out.status, SyncStatus::Clean, "{out:?}");
        assert!(!lock.exists());
        assert!(b.paths.memory_dir().join("a.md").is_file());
    }

    #[test]
    fn a_lock_on_main_left_by_a_killed_sync_is_removed() {
        let (_root, root_s, a, b) = killed_after_moving_main();
        let lock = b.paths.memory_git_dir().join("refs/heads/main.lock");
        std::fs::write(&lock, "0000000000000000000000000000000000000000\n").unwrap();
        let out = sync(&b.paths, &a.id, Some(&root_s), &sig(&b.paths)).unwrap();
        assert_eq!(out.status, SyncStatus::Clean, "{out:?}");
        assert!(!lock.exists());
        assert!(is_clean(&b));
    }

    #[test]
    fn a_write_cut_short_leaves_a_temporary_file_that_is_cleared() {
        let (_root, root_s, a, b) = killed_after_moving_main();
        let tmp = b.paths.memory_dir().join(".a.md.tmp-123-0123456789abcdef");
        std::fs::write(&tmp, "half").unwrap();
        let out = sync(&b.paths, &a.id, Some(&root_s), &sig(&b.paths)).unwrap();
        assert_eq!(out.status, SyncStatus::Clean, "{out:?}");
        assert!(!tmp.exists());
        assert!(is_clean(&b));
    }
}
