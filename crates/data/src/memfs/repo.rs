//! Opening and creating memory repositories with git2.
//!
//! New repositories keep their git directory beside the working tree
//! (`memory.git/` next to `memory/`), linked both ways with *relative* paths
//! (`memory/.git` holds `gitdir: ../memory.git`, `core.worktree` is
//! `../memory`), so a home directory can be moved or bind-mounted elsewhere
//! (a sandbox view) and the repository still opens.
//!
//! Every open here is *sealed* ([`seal`]): a repository holding a file
//! through which git would read objects or history from elsewhere
//! (`objects/info/alternates`, `info/grafts`, `shallow`, …; mini-letta
//! never makes one) is refused, naming the file, and the handle reads
//! objects from its own `objects/` only — an alternates file that appears
//! after the check is still never followed. libgit2 ignores replace refs.

use std::fs;
use std::path::{Path, PathBuf};

use git2::{Odb, Repository, RepositoryInitOptions, RepositoryOpenFlags, Signature};

use crate::paths::MemoryGitDir;

/// Errors from opening, reading or creating a memory repository.
#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    #[error("{0}: no such directory")]
    MissingDir(PathBuf),
    #[error("{0}: not a git repository")]
    NotARepository(PathBuf),
    #[error("{path}: cannot read git object {what}: {source}")]
    UnreadableObject {
        path: PathBuf,
        what: String,
        source: git2::Error,
    },
    #[error("{path}: {source}")]
    Git { path: PathBuf, source: git2::Error },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}: already exists")]
    AlreadyExists(PathBuf),
    /// A file that makes git read beyond the repository's own objects.
    #[error(
        "{path}: refusing this repository: the file {what}, and mini-letta never makes one \
         (an archive, a remote or someone with root planted it); remove it"
    )]
    Planted { path: PathBuf, what: &'static str },
}

impl RepoError {
    pub(crate) fn git(path: &Path, source: git2::Error) -> Self {
        Self::Git {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The branch every memory repository works on.
pub const MAIN_BRANCH: &str = "main";

/// Open the repository whose working tree (or git directory) is exactly `dir`.
///
/// No upward search: a memory directory that is not itself a repository must
/// never silently resolve to an enclosing one.
///
/// An agent's memory, whose working tree belongs to the agent's own uid, is
/// opened as [`open_agent`] does — but only when it is exactly an agent's
/// `memory/` (or `memory.git/`) whose record and git directory belong to
/// us: the operator's commands work on the agents of their own homes,
/// while any other repository owned by someone else is still refused.
pub fn open(dir: &Path) -> Result<Repository, RepoError> {
    if !dir.is_dir() {
        return Err(RepoError::MissingDir(dir.to_path_buf()));
    }
    let opened = Repository::open_ext(
        dir,
        RepositoryOpenFlags::NO_SEARCH,
        std::iter::empty::<&Path>(),
    );
    match opened {
        Ok(repo) => seal(repo),
        Err(e) if e.code() == git2::ErrorCode::Owner => match own_agent_of(dir) {
            // A planted file is the reason worth telling; any other
            // failure of the agent open is reported as the owner check.
            Some(agent) => open_agent(&agent).map_err(|inner| match inner {
                RepoError::Planted { .. } => inner,
                _ => RepoError::git(dir, e),
            }),
            None => Err(RepoError::git(dir, e)),
        },
        Err(e) if e.code() == git2::ErrorCode::NotFound => {
            Err(RepoError::NotARepository(dir.to_path_buf()))
        }
        Err(e) => Err(RepoError::git(dir, e)),
    }
}

/// Open the bare repository (or a linked worktree's admin directory) at
/// exactly `git_dir`, sealed ([`seal`]).
pub fn open_bare(git_dir: &Path) -> Result<Repository, RepoError> {
    let repo = Repository::open_bare(git_dir).map_err(|e| match e.code() {
        git2::ErrorCode::NotFound => RepoError::NotARepository(git_dir.to_path_buf()),
        _ => RepoError::git(git_dir, e),
    })?;
    seal(repo)
}

/// Make a freshly opened `repo` read nothing but itself: refuse it when
/// its git directory or common directory holds a file of
/// [`MemoryGitDir::foreign_history_files`], then give it an object
/// database of its own `objects/` alone, so libgit2 never loads
/// `objects/info/alternates` (it would, lazily, at the first object read).
///
/// The check runs after the open because libgit2 reads `info/grafts` and
/// `shallow` while opening: a file present then is still present now
/// (only root can write a memory repository's git directory).
pub(crate) fn seal(repo: Repository) -> Result<Repository, RepoError> {
    let git_dir = repo.path().to_path_buf();
    let common = repo.commondir().to_path_buf();
    refuse_planted(&git_dir)?;
    if common != git_dir {
        refuse_planted(&common)?;
    }
    let odb = own_objects(&MemoryGitDir::new(&common).objects_dir())?;
    repo.set_odb(&odb).map_err(|e| RepoError::git(&common, e))?;
    Ok(repo)
}

/// The first file of [`MemoryGitDir::foreign_history_files`] present (in
/// any form: a directory or a symlink there is refused too) in `git_dir`.
pub(crate) fn planted_file(git_dir: &Path) -> Option<(PathBuf, &'static str)> {
    MemoryGitDir::new(git_dir)
        .foreign_history_files()
        .into_iter()
        .find(|(p, _)| fs::symlink_metadata(p).is_ok())
}

/// `Err(Planted)` when [`planted_file`] finds one in `git_dir`.
pub(crate) fn refuse_planted(git_dir: &Path) -> Result<(), RepoError> {
    match planted_file(git_dir) {
        Some((path, what)) => Err(RepoError::Planted { path, what }),
        None => Ok(()),
    }
}

/// An object database reading and writing `objects` (loose objects and
/// packs) and nothing else: no alternates, no commit-graph.
pub(crate) fn own_objects(objects: &Path) -> Result<Odb<'static>, RepoError> {
    let odb = Odb::new().map_err(|e| RepoError::git(objects, e))?;
    add_own_backends(&odb, objects, false).map_err(|e| RepoError::git(objects, e))?;
    Ok(odb)
}

/// Add the loose and pack backends of `objects` to `odb` (as alternates,
/// which are never written to, when `alternate`), without reading
/// `objects/info/alternates` — which `Odb::add_disk_alternate` would.
pub(crate) fn add_own_backends(
    odb: &Odb<'_>,
    objects: &Path,
    alternate: bool,
) -> Result<(), git2::Error> {
    use git2::Binding;
    use libgit2_sys as raw;
    use std::os::unix::ffi::OsStrExt;
    // libgit2's default priorities: packs are asked before loose objects.
    const LOOSE_PRIORITY: i32 = 1;
    const PACKED_PRIORITY: i32 = 2;
    let dir = std::ffi::CString::new(objects.as_os_str().as_bytes())
        .map_err(|_| git2::Error::from_str("the objects path holds a NUL byte"))?;
    for packed in [false, true] {
        let mut backend: *mut raw::git_odb_backend = std::ptr::null_mut();
        // SAFETY: `dir` is a NUL-terminated string that outlives the call,
        // `backend` a valid out-pointer; a compression level of -1, no
        // fsync flag and modes 0 are libgit2's defaults.
        let rc = unsafe {
            if packed {
                raw::git_odb_backend_pack(&mut backend, dir.as_ptr())
            } else {
                raw::git_odb_backend_loose(&mut backend, dir.as_ptr(), -1, 0, 0, 0)
            }
        };
        if rc < 0 {
            return Err(git2::Error::last_error(rc));
        }
        let priority = if packed {
            PACKED_PRIORITY
        } else {
            LOOSE_PRIORITY
        };
        // SAFETY: `odb.raw()` is a live database for the call; `backend` was
        // just made and belongs to no database. On success the database
        // owns it (and frees it with itself); on failure it is still ours.
        let rc = unsafe {
            if alternate {
                raw::git_odb_add_alternate(odb.raw(), backend, priority)
            } else {
                raw::git_odb_add_backend(odb.raw(), backend, priority)
            }
        };
        if rc < 0 {
            let e = git2::Error::last_error(rc);
            // SAFETY: not added, so nothing else holds `backend`; its own
            // `free` releases it exactly once.
            unsafe {
                if let Some(free) = (*backend).free {
                    free(backend);
                }
            }
            return Err(e);
        }
    }
    Ok(())
}

/// The agent whose memory working tree or git directory `dir` is, when its
/// record and git directory are ours (not followed through symlinks).
fn own_agent_of(dir: &Path) -> Option<crate::paths::AgentPaths> {
    use std::os::unix::fs::MetadataExt;
    let dir = dir.canonicalize().ok()?;
    let agent = crate::paths::AgentPaths::from_dir(dir.parent()?);
    if dir != agent.memory_dir() && dir != agent.memory_git_dir() {
        return None;
    }
    let me = nix::unistd::geteuid().as_raw();
    let ours = |p: &Path, want_dir: bool| {
        std::fs::symlink_metadata(p)
            .is_ok_and(|m| m.uid() == me && if want_dir { m.is_dir() } else { m.is_file() })
    };
    (ours(&agent.agent_json(), false) && ours(&agent.memory_git_dir(), true)).then_some(agent)
}

/// Open an agent's memory repository from the paths the supervisor knows:
/// the git directory `memory.git/` with `memory/` as its working tree.
///
/// The `memory/.git` pointer file lives in the agent-writable working tree,
/// so it is never followed here: a confined agent could otherwise point the
/// supervisor at a git directory of its own making (whose `core.worktree`
/// names another agent's files) and have the supervisor copy them for it.
pub fn open_agent(paths: &crate::paths::AgentPaths) -> Result<Repository, RepoError> {
    let git_dir = paths.memory_git_dir();
    let work_tree = paths.memory_dir();
    if !git_dir.is_dir() {
        return Err(RepoError::NotARepository(git_dir));
    }
    let repo = open_bare(&git_dir)?;
    repo.set_workdir(&work_tree, false)
        .map_err(|e| RepoError::git(&work_tree, e))?;
    Ok(repo)
}

/// Files to write into a fresh repository, as `(relative path, contents)`.
pub type SeedFiles<'a> = &'a [(&'a str, &'a str)];

/// Create a memory repository with its git directory at `git_dir` and working
/// tree at `work_tree`, write `files`, and make one commit on `main`.
pub fn create(
    work_tree: &Path,
    git_dir: &Path,
    files: SeedFiles<'_>,
    author: &Signature<'_>,
    message: &str,
) -> Result<Repository, RepoError> {
    let repo = init_linked(work_tree, git_dir)?;

    for (rel, contents) in files {
        let path = work_tree.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(|e| RepoError::io(parent, e))?;
        }
        fs::write(&path, contents).map_err(|e| RepoError::io(&path, e))?;
    }
    {
        let mut index = repo.index().map_err(|e| RepoError::git(git_dir, e))?;
        for (rel, _) in files {
            index
                .add_path(Path::new(rel))
                .map_err(|e| RepoError::git(git_dir, e))?;
        }
        index.write().map_err(|e| RepoError::git(git_dir, e))?;
        let tree_id = index.write_tree().map_err(|e| RepoError::git(git_dir, e))?;
        let tree = repo
            .find_tree(tree_id)
            .map_err(|e| RepoError::git(git_dir, e))?;
        repo.commit(Some("HEAD"), author, author, message, &tree, &[])
            .map_err(|e| RepoError::git(git_dir, e))?;
    }
    Ok(repo)
}

/// Create an empty repository (no commit, `HEAD` on `main`) with its git
/// directory at `git_dir` and working tree at `work_tree`, linked both ways
/// with relative paths; neither may exist yet.
pub fn init_linked(work_tree: &Path, git_dir: &Path) -> Result<Repository, RepoError> {
    for p in [work_tree, git_dir] {
        if p.exists() {
            return Err(RepoError::AlreadyExists(p.to_path_buf()));
        }
    }
    fs::create_dir_all(work_tree).map_err(|e| RepoError::io(work_tree, e))?;
    let mut opts = RepositoryInitOptions::new();
    opts.initial_head(MAIN_BRANCH)
        .no_reinit(true)
        // Without this libgit2 would put a `.git/` inside `git_dir`.
        .no_dotgit_dir(true)
        .external_template(false)
        .workdir_path(work_tree);
    let repo = Repository::init_opts(git_dir, &opts).map_err(|e| RepoError::git(git_dir, e))?;
    link_relative(work_tree, git_dir)?;
    // Reopen so the relative links are what the handle uses.
    drop(repo);
    open(work_tree)
}

/// Point `work_tree/.git` at `git_dir` and `core.worktree` back, relatively.
fn link_relative(work_tree: &Path, git_dir: &Path) -> Result<(), RepoError> {
    let to_git = relative_path(work_tree, git_dir);
    let to_tree = relative_path(git_dir, work_tree);
    let dotgit = work_tree.join(".git");
    fs::write(&dotgit, format!("gitdir: {}\n", to_git.display()))
        .map_err(|e| RepoError::io(&dotgit, e))?;
    let mut cfg =
        git2::Config::open(&git_dir.join("config")).map_err(|e| RepoError::git(git_dir, e))?;
    cfg.set_str("core.worktree", &to_tree.to_string_lossy())
        .map_err(|e| RepoError::git(git_dir, e))?;
    Ok(())
}

/// `to` relative to the directory `from` (both absolute or both relative to
/// the same base; we only ever link siblings).
fn relative_path(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<_> = from.components().collect();
    let to_c: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to_c).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..from.len() {
        out.push("..");
    }
    for c in &to_c[common..] {
        out.push(c.as_os_str());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_links_between_siblings() {
        assert_eq!(
            relative_path(Path::new("/a/x/memory"), Path::new("/a/x/memory.git")),
            PathBuf::from("../memory.git")
        );
        assert_eq!(
            relative_path(Path::new("/a/x/memory.git"), Path::new("/a/x/memory")),
            PathBuf::from("../memory")
        );
    }

    /// A bare repository holding one blob; the blob's id.
    fn donor(dir: &Path) -> git2::Oid {
        let repo = Repository::init_bare(dir).unwrap();
        repo.blob(b"the other tenant's secret").unwrap()
    }

    #[test]
    fn own_objects_never_follow_alternates() {
        let tmp = tempfile::tempdir().unwrap();
        let secret = donor(&tmp.path().join("donor.git"));
        let thief = tmp.path().join("thief.git");
        Repository::init_bare(&thief).unwrap();
        std::fs::write(
            thief.join("objects/info/alternates"),
            format!("{}\n", tmp.path().join("donor.git/objects").display()),
        )
        .unwrap();
        // The control: libgit2's own object database follows it.
        let plain = Repository::open_bare(&thief).unwrap();
        assert!(plain.find_blob(secret).is_ok());
        // The sealed one does not, as a backend nor as an alternate.
        let sealed = Repository::open_bare(&thief).unwrap();
        sealed
            .set_odb(&own_objects(&thief.join("objects")).unwrap())
            .unwrap();
        assert!(sealed.find_blob(secret).is_err());
        let view = Odb::new().unwrap();
        add_own_backends(&view, &thief.join("objects"), true).unwrap();
        assert!(!view.exists(secret));
        // Its own objects are read and written as before.
        let mine = sealed.blob(b"own").unwrap();
        assert!(
            Repository::open_bare(&thief)
                .unwrap()
                .find_blob(mine)
                .is_ok()
        );
        assert!(view.exists(mine));
    }

    #[test]
    fn every_open_refuses_a_planted_file_by_name() {
        for rel in [
            "objects/info/alternates",
            "objects/info/http-alternates",
            "info/grafts",
            "shallow",
        ] {
            let tmp = tempfile::tempdir().unwrap();
            let repo = create(
                &tmp.path().join("memory"),
                &tmp.path().join("memory.git"),
                &[("a.md", "a")],
                &Signature::now("t", "t@example.com").unwrap(),
                "init",
            )
            .unwrap();
            let head = repo.head().unwrap().target().unwrap();
            std::fs::create_dir_all(tmp.path().join("memory.git/info")).unwrap();
            std::fs::write(tmp.path().join("memory.git").join(rel), format!("{head}\n")).unwrap();
            for opened in [
                open(&tmp.path().join("memory")),
                open(&tmp.path().join("memory.git")),
                open_bare(&tmp.path().join("memory.git")),
            ] {
                match opened {
                    Err(RepoError::Planted { path, .. }) => assert!(path.ends_with(rel)),
                    other => panic!("{rel}: {:?}", other.map(|_| ())),
                }
            }
        }
    }

    #[test]
    fn open_refuses_non_repositories() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            open(dir.path()),
            Err(RepoError::NotARepository(_))
        ));
        assert!(matches!(
            open(&dir.path().join("nope")),
            Err(RepoError::MissingDir(_))
        ));
    }
}
