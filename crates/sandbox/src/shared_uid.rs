//! What keeps agents apart when their children share one host uid (an
//! ordinary user's supervisor, or root where agent uids cannot be had):
//! plain file permissions no longer separate them, so a file in an agent's
//! tree that is also another file (a hard link planted from outside any
//! sandbox) or that someone else owns could hand a child what another
//! agent, or the host, holds. Such a tree is refused before a child of
//! the agent starts; nothing is moved or deleted (the operator decides).

use std::path::{Path, PathBuf};

use crate::agentfs::{Dir, FsError, Kind};
use crate::paths::AgentPaths;

use super::identity::{ADOPT_MAX_DEPTH, ADOPT_MAX_ENTRIES};

/// Why an agent's tree may not be given to a child sharing the user's uid.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error(
        "{path} has {links} hard links (its contents may be another agent's or the host's file); \
         an agent without a uid of its own is not started beside it: remove it \
         (or copy it to a new file) if it is the agent's own"
    )]
    Linked { path: PathBuf, links: u64 },
    #[error(
        "{path} belongs to uid {owner}, not to {expected} who runs this agent's children; \
         an agent without a uid of its own is not started beside it: remove it or give it to \
         uid {expected} if it is the agent's own"
    )]
    Foreign {
        path: PathBuf,
        owner: u32,
        expected: u32,
    },
    #[error(
        "{path}: more than {max} entries or {depth} levels to check; an agent without a uid of \
         its own is started only once its tree has been checked: remove what it does not need",
        max = ADOPT_MAX_ENTRIES,
        depth = ADOPT_MAX_DEPTH
    )]
    TooLarge { path: PathBuf },
    #[error(transparent)]
    Fs(#[from] FsError),
}

/// Check every directory of the agent a child may be given (its
/// agent-owned directories and, for a sub-agent, its worktree): each entry
/// owned by `owner`, each file with one link. The checkout's files are
/// made by git with one link each; a second one never comes from
/// mini-letta or a confined child (landlock lets a child link only what it
/// already sees).
pub fn check_tree(agent: &AgentPaths, worktree: Option<&Path>, owner: u32) -> Result<(), Refusal> {
    let mut budget = ADOPT_MAX_ENTRIES;
    // Worktrees are the supervisor's until one is handed over.
    let worktrees = agent.worktrees_dir();
    let mut tops: Vec<PathBuf> = super::identity::agent_owned_dirs(agent)
        .into_iter()
        .filter(|d| *d != worktrees)
        .collect();
    tops.extend(worktree.map(Path::to_path_buf));
    for top in tops {
        let dir = match Dir::open(&top) {
            Ok(d) => d,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e.into()),
        };
        check_owner(&top, dir.stat()?.uid, owner)?;
        check_below(&dir, owner, 1, &mut budget)?;
    }
    Ok(())
}

fn check_owner(path: &Path, found: u32, expected: u32) -> Result<(), Refusal> {
    if found == expected {
        Ok(())
    } else {
        Err(Refusal::Foreign {
            path: path.to_path_buf(),
            owner: found,
            expected,
        })
    }
}

fn check_below(dir: &Dir, owner: u32, depth: usize, budget: &mut usize) -> Result<(), Refusal> {
    let names = match dir.list(*budget) {
        Ok(n) => n,
        Err(FsError::TooManyEntries { .. }) => {
            return Err(Refusal::TooLarge {
                path: dir.path().to_path_buf(),
            });
        }
        Err(e) => return Err(e.into()),
    };
    for name in names {
        *budget = budget.checked_sub(1).ok_or_else(|| Refusal::TooLarge {
            path: dir.path().to_path_buf(),
        })?;
        // Gone since the listing: nothing to give.
        let Some(entry) = dir.entry(&name)? else {
            continue;
        };
        let st = *entry.stat();
        check_owner(entry.path(), st.uid, owner)?;
        match st.kind {
            Kind::Dir => {
                if depth >= ADOPT_MAX_DEPTH {
                    return Err(Refusal::TooLarge {
                        path: entry.path().to_path_buf(),
                    });
                }
                check_below(&entry.open_dir()?, owner, depth + 1, budget)?;
            }
            _ if st.nlink > 1 => {
                return Err(Refusal::Linked {
                    path: entry.path().to_path_buf(),
                    links: st.nlink,
                });
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::Home;

    fn agent() -> (tempfile::TempDir, AgentPaths) {
        let t = tempfile::tempdir().unwrap();
        let home = Home::at(t.path());
        let a = home.agent("agent-7").unwrap();
        std::fs::create_dir_all(a.memory_dir().join("notes")).unwrap();
        std::fs::write(a.memory_dir().join("notes/x.md"), "x").unwrap();
        (t, a)
    }

    fn me() -> u32 {
        nix::unistd::geteuid().as_raw()
    }

    #[test]
    fn an_ordinary_tree_passes() {
        let (_t, a) = agent();
        check_tree(&a, None, me()).unwrap();
    }

    #[test]
    fn a_second_link_anywhere_below_is_refused_naming_it() {
        let (t, a) = agent();
        let outside = t.path().join("secret");
        std::fs::write(&outside, "s").unwrap();
        let planted = a.memory_dir().join("notes/planted.md");
        std::fs::hard_link(&outside, &planted).unwrap();
        match check_tree(&a, None, me()) {
            Err(Refusal::Linked { path, links: 2 }) => assert_eq!(path, planted),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_foreign_owner_is_refused() {
        let (_t, a) = agent();
        match check_tree(&a, None, me() + 1) {
            Err(Refusal::Foreign {
                owner, expected, ..
            }) => {
                assert_eq!((owner, expected), (me(), me() + 1))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_given_worktree_is_checked_and_others_are_not() {
        let (t, a) = agent();
        let outside = t.path().join("secret");
        std::fs::write(&outside, "s").unwrap();
        let wt = a.worktrees_dir().join("w1");
        std::fs::create_dir_all(&wt).unwrap();
        std::fs::hard_link(&outside, wt.join("f.md")).unwrap();
        check_tree(&a, None, me()).unwrap();
        assert!(matches!(
            check_tree(&a, Some(&wt), me()),
            Err(Refusal::Linked { .. })
        ));
    }
}
