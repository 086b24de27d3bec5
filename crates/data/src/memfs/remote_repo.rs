//! Whether a repository in a directory remote root may be touched at all.
//!
//! Why: several hosts, and possibly several tenants, share one remote root,
//! so anyone who can write there is an attacker for sync — and git, run by
//! the supervisor (root) on a local path, follows whatever it finds: a
//! symlink `<root>/<id>.git` into another tenant's `memory.git`, a
//! symlinked `objects/`, `objects/info/alternates`, a `commondir` file or a
//! gitfile `.git` inside all lead it into a repository the caller may not
//! read or write, and `info/grafts` or `shallow` rewrite the history it
//! sees. So before every fetch, push, clone, ls-remote and listing the
//! repository must be a real directory holding only real directories and
//! regular files, none of those redirections, outside the home.
//!
//! What this cannot close: someone who can write the root can still swap a
//! checked directory for a symlink between this check and git's open. The
//! window is the length of one git command.

use std::path::{Path, PathBuf};

/// Files that make git read another repository or another history.
const REDIRECTIONS: [&str; 6] = [
    "objects/info/alternates",
    "objects/info/http-alternates",
    "info/grafts",
    "shallow",
    "commondir",
    ".git",
];

/// Entries a remote repository may hold; a memory repository's are a few
/// thousand at most, and the walk must stay bounded.
pub const MAX_ENTRIES: usize = 200_000;

/// A remote repository refused, naming its path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("refusing the remote repository {}: {reason}", path.display())]
pub struct RemoteRefused {
    pub path: PathBuf,
    pub reason: String,
}

/// Check the repository `repo` (`<root_dir>/<id>.git`) for a caller whose
/// home is `home`. A repository that does not exist yet passes when the
/// root itself is outside the home (it is made on first use).
pub fn check(root_dir: &Path, repo: &Path, home: &Path) -> Result<(), RemoteRefused> {
    let refuse = |reason: String| RemoteRefused {
        path: repo.to_path_buf(),
        reason,
    };
    // No symlink at any component below the root: the repository's own
    // name is the only one.
    let meta = match std::fs::symlink_metadata(repo) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return outside_home(root_dir, home).map_err(refuse);
        }
        Err(e) => return Err(refuse(format!("cannot inspect it: {e}"))),
        Ok(m) => m,
    };
    if meta.file_type().is_symlink() {
        return Err(refuse("it is a symbolic link".into()));
    }
    if !meta.is_dir() {
        return Err(refuse("it is not a directory".into()));
    }
    outside_home(repo, home).map_err(refuse)?;
    for name in REDIRECTIONS {
        if std::fs::symlink_metadata(repo.join(name)).is_ok() {
            return Err(refuse(format!(
                "it has {name}, which would make git read another repository or history"
            )));
        }
    }
    only_real_entries(repo).map_err(refuse)
}

/// `Err(reason)` when `path`, resolved, lies inside `home`, resolved.
fn outside_home(path: &Path, home: &Path) -> Result<(), String> {
    let resolve = |p: &Path| {
        std::fs::canonicalize(p)
            .or_else(|_| std::path::absolute(p))
            .unwrap_or_else(|_| p.to_path_buf())
    };
    let (path, home) = (resolve(path), resolve(home));
    if path.starts_with(&home) {
        return Err(format!(
            "it is inside the home {} (a remote is shared storage, never an agent's own)",
            home.display()
        ));
    }
    Ok(())
}

/// `Err(reason)` for the first entry below `repo` that is a symlink or
/// neither a directory nor a regular file (a FIFO would hang git), or when
/// there are more than [`MAX_ENTRIES`].
fn only_real_entries(repo: &Path) -> Result<(), String> {
    let mut seen = 0usize;
    let mut stack = vec![repo.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| format!("cannot list {}: {e}", shown(repo, &dir)))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("cannot list {}: {e}", shown(repo, &dir)))?;
            seen += 1;
            if seen > MAX_ENTRIES {
                return Err(format!("it holds more than {MAX_ENTRIES} entries"));
            }
            let path = entry.path();
            let kind = entry
                .file_type()
                .map_err(|e| format!("cannot inspect {}: {e}", shown(repo, &path)))?;
            if kind.is_symlink() {
                return Err(format!("{} is a symbolic link", shown(repo, &path)));
            }
            if kind.is_dir() {
                stack.push(path);
            } else if !kind.is_file() {
                return Err(format!(
                    "{} is not a regular file or directory",
                    shown(repo, &path)
                ));
            }
        }
    }
    Ok(())
}

/// `path` relative to the repository, for a message.
fn shown(repo: &Path, path: &Path) -> String {
    path.strip_prefix(repo)
        .unwrap_or(path)
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn bare(dir: &Path) -> PathBuf {
        let repo = dir.join("agent-a.git");
        git2::Repository::init_bare(&repo).unwrap();
        repo
    }

    #[test]
    fn a_plain_bare_repository_or_none_yet_passes() {
        let root = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        let missing = root.path().join("agent-b.git");
        assert_eq!(check(root.path(), &missing, home.path()), Ok(()));
        let repo = bare(root.path());
        assert_eq!(check(root.path(), &repo, home.path()), Ok(()));
    }

    #[test]
    fn every_redirection_is_refused_by_name() {
        let root = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let repo = bare(root.path());
        for name in REDIRECTIONS {
            std::fs::write(repo.join(name), "x").unwrap();
            let e = check(root.path(), &repo, home.path()).unwrap_err();
            assert!(e.reason.contains(name), "{e}");
            assert!(e.to_string().contains(&repo.display().to_string()), "{e}");
            std::fs::remove_file(repo.join(name)).unwrap();
        }
        std::os::unix::fs::symlink(elsewhere.path(), repo.join("refs/heads/x")).unwrap();
        let e = check(root.path(), &repo, home.path()).unwrap_err();
        assert!(e.reason.contains("refs/heads/x is a symbolic link"), "{e}");
        std::fs::remove_file(repo.join("refs/heads/x")).unwrap();
        nix::unistd::mkfifo(&repo.join("packed-refs"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let e = check(root.path(), &repo, home.path()).unwrap_err();
        assert!(
            e.reason.contains("packed-refs is not a regular file"),
            "{e}"
        );
    }

    #[test]
    fn a_symlinked_or_non_directory_repository_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        let link = root.path().join("agent-l.git");
        std::os::unix::fs::symlink(target.path(), &link).unwrap();
        let e = check(root.path(), &link, home.path()).unwrap_err();
        assert_eq!(e.reason, "it is a symbolic link");
        // A dangling one too: git would create a repository at its target.
        let dangling = root.path().join("agent-d.git");
        std::os::unix::fs::symlink("/nonexistent/x", &dangling).unwrap();
        assert!(check(root.path(), &dangling, home.path()).is_err());
        let file = root.path().join("agent-f.git");
        std::fs::write(&file, "gitdir: /elsewhere\n").unwrap();
        assert_eq!(
            check(root.path(), &file, home.path()).unwrap_err().reason,
            "it is not a directory"
        );
    }

    #[test]
    fn a_repository_or_root_inside_the_home_is_refused() {
        let home = tempfile::tempdir().unwrap();
        let repo = bare(home.path());
        let e = check(home.path(), &repo, home.path()).unwrap_err();
        assert!(e.reason.contains("inside the home"), "{e}");
        let missing = home.path().join("agents/agent-x.git");
        let e = check(&home.path().join("agents"), &missing, home.path()).unwrap_err();
        assert!(e.reason.contains("inside the home"), "{e}");
    }
}
