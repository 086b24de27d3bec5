//! Opening and creating memory repositories with git2.
//!
//! New repositories keep their git directory beside the working tree
//! (`memory.git/` next to `memory/`), linked both ways with *relative* paths
//! (`memory/.git` holds `gitdir: ../memory.git`, `core.worktree` is
//! `../memory`), so a home directory can be moved or bind-mounted elsewhere
//! (a sandbox view) and the repository still opens.

use std::fs;
use std::path::{Path, PathBuf};

use git2::{Repository, RepositoryInitOptions, RepositoryOpenFlags, Signature};

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
    Repository::open_ext(
        dir,
        RepositoryOpenFlags::NO_SEARCH,
        std::iter::empty::<&Path>(),
    )
    .or_else(|e| match (e.code(), own_agent_of(dir)) {
        (git2::ErrorCode::Owner, Some(agent)) => open_agent(&agent).map_err(|_| e),
        _ => Err(e),
    })
    .map_err(|e| match e.code() {
        git2::ErrorCode::NotFound => RepoError::NotARepository(dir.to_path_buf()),
        _ => RepoError::git(dir, e),
    })
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
    let repo = Repository::open_bare(&git_dir).map_err(|e| match e.code() {
        git2::ErrorCode::NotFound => RepoError::NotARepository(git_dir.clone()),
        _ => RepoError::git(&git_dir, e),
    })?;
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
