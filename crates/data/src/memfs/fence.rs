//! The fence of a clustered agent's remote (issue 35): `refs/mini-letta/fence`,
//! a chain of empty commits, each stamped with the host that pushed and its
//! ownership *epoch* (the etcd revision at which it took the agent).
//!
//! Why a ref in the remote: etcd says who owns an agent, but a host paused
//! between its last etcd check and its push cannot know it lost ownership
//! meanwhile. So ownership is also written where the writes land. A new
//! owner's first push is a fence commit of its epoch (its *claim*); every
//! push after it moves `main` and the fence together (atomically), the
//! fence from the exact commit this host fetched and saw stamped with its
//! own epoch. A stale host then fails one way or the other: it fetched the
//! new owner's claim (not its own stamp: refused before pushing), or it
//! fetched before the claim landed (its push is no longer a fast-forward
//! of the fence, and the remote refuses it under its ref locks).

use git2::{Oid, Repository, Signature};

/// The fence in the remote.
pub const FENCE_REF: &str = "refs/mini-letta/fence";

/// Where the fetched fence is kept in `memory.git`.
pub const FENCE_TRACKING_REF: &str = "refs/remotes/origin/fence";

const TITLE: &str = "mini-letta fence";

/// The largest epoch mini-letta takes for one it issued: etcd revisions
/// plus the cluster's epoch base stay far below; a larger one in a fence
/// or in etcd was planted (and would overflow the sums).
pub const MAX_EPOCH: i64 = 1 << 53;

/// Who pushed a fence commit, in which ownership epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    pub host: String,
    /// The etcd revision at which `host` took the agent (the owner key's
    /// create revision): it grows with every change of owner.
    pub epoch: i64,
}

impl Stamp {
    /// The commit message carrying the stamp.
    pub fn message(&self) -> String {
        format!("{TITLE}\n\nhost: {}\nepoch: {}\n", self.host, self.epoch)
    }

    /// The stamp of a fence commit's message; `None` for anything else
    /// (the remote is not trusted: nothing here panics or trusts a field
    /// it did not parse).
    pub fn parse(message: &str) -> Option<Stamp> {
        let mut lines = message.lines();
        if lines.next()? != TITLE {
            return None;
        }
        let (mut host, mut epoch) = (None, None);
        for line in lines {
            if let Some(h) = line.strip_prefix("host: ") {
                host = Some(h.to_string());
            } else if let Some(e) = line.strip_prefix("epoch: ") {
                epoch = e.trim().parse::<i64>().ok();
            }
        }
        Some(Stamp {
            host: host?,
            epoch: epoch?,
        })
    }
}

/// The stamp of fence commit `id` in `repo`, if it is one.
pub fn stamp_of(repo: &Repository, id: Oid) -> Option<Stamp> {
    let commit = repo.find_commit(id).ok()?;
    Stamp::parse(&String::from_utf8_lossy(commit.message_bytes()))
}

/// A new fence commit over `parent` (the remote's fence as fetched), with
/// an empty tree, recording `main`, the remote `main` it is pushed with
/// (issue 43): as a `main: <oid>` line and as its last parent. So the
/// fence is a record of what the owner acknowledged — a remote whose
/// `main` no longer contains it was rolled back — and keeps that history
/// reachable (fetched with the fence, never collected) whatever happens to
/// the remote's `main`.
pub fn commit(
    repo: &Repository,
    parent: Option<Oid>,
    stamp: &Stamp,
    main: Oid,
) -> Result<Oid, git2::Error> {
    let tree = repo.find_tree(repo.treebuilder(None)?.write()?)?;
    let sig = Signature::now("mini-letta", "mini-letta@localhost")?;
    let mut parents = Vec::new();
    if let Some(p) = parent {
        parents.push(repo.find_commit(p)?);
    }
    parents.push(repo.find_commit(main)?);
    let parents: Vec<&git2::Commit> = parents.iter().collect();
    let message = format!("{}{MAIN_LINE}{main}\n", stamp.message());
    repo.commit(None, &sig, &sig, &message, &tree, &parents)
}

const MAIN_LINE: &str = "main: ";

/// The `main` fence commit `id` records: its `main:` line when that names
/// one of its parents (a fence written before issue 43, or one whose line
/// names nothing it keeps, records none).
pub fn fenced_main(repo: &Repository, id: Oid) -> Option<Oid> {
    let commit = repo.find_commit(id).ok()?;
    Stamp::parse(&String::from_utf8_lossy(commit.message_bytes()))?;
    let message = String::from_utf8_lossy(commit.message_bytes()).into_owned();
    let main = message
        .lines()
        .find_map(|l| l.strip_prefix(MAIN_LINE))
        .and_then(|o| Oid::from_str(o.trim()).ok())?;
    commit.parent_ids().any(|p| p == main).then_some(main)
}

/// What a clustered supervisor adds to a sync: whose fence to push, and
/// the etcd check right before each push.
pub trait Fence {
    /// This host's stamp for the agent.
    fn stamp(&self) -> Stamp;
    /// Right before a push: `Err(why)` unless this host still owns the
    /// agent (an etcd transaction comparing the owner key's revision and
    /// lease).
    fn confirm(&self) -> Result<(), String>;
    /// Whether this sync is the owner's first: the remote's fence may be
    /// an older epoch's, and is replaced by this host's claim.
    fn takeover(&self) -> bool;
}

/// The fence commit before fence commit `id` in its chain: its first
/// parent, unless that is the `main` it records (a first claim's only
/// parent).
pub fn previous(repo: &Repository, id: Oid) -> Option<Oid> {
    let commit = repo.find_commit(id).ok()?;
    let first = commit.parent_id(0).ok()?;
    (fenced_main(repo, id) != Some(first)).then_some(first)
}

/// Whether the remote `main` as fetched (`remote_main`) still contains
/// what the remote's fence (fetched as `remote_fence`) recorded: `Err`
/// names both when it does not (the remote was rolled back or rewritten
/// behind the owners' backs), with the recorded `main` to keep.
pub(crate) fn check_not_rolled_back(
    repo: &Repository,
    remote_main: Option<Oid>,
    remote_fence: Option<Oid>,
) -> Result<(), RolledBack> {
    let Some(recorded) = remote_fence.and_then(|f| fenced_main(repo, f)) else {
        return Ok(());
    };
    let contains = match remote_main {
        Some(m) => m == recorded || repo.graph_descendant_of(m, recorded).unwrap_or(false),
        None => false,
    };
    if contains {
        return Ok(());
    }
    let stamp = remote_fence.and_then(|f| stamp_of(repo, f));
    Err(RolledBack {
        remote_main,
        recorded,
        by: stamp,
    })
}

/// A remote `main` that lost what its fence recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolledBack {
    pub remote_main: Option<Oid>,
    pub recorded: Oid,
    pub by: Option<Stamp>,
}

impl std::fmt::Display for RolledBack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let main = self
            .remote_main
            .map_or_else(|| "no main".to_string(), |m| format!("main {m}"));
        let by = self
            .by
            .as_ref()
            .map(|s| format!(" by host {} (epoch {})", shown(&s.host), s.epoch))
            .unwrap_or_default();
        write!(
            f,
            "the remote's {main} does not contain {}, the main its fence records as pushed{by}: \
             the remote was rolled back or rewritten",
            self.recorded
        )
    }
}

/// Whether this host may push over the remote fence `remote` (fetched):
/// on a takeover, a fence of an older epoch (or none); otherwise exactly
/// this host's own stamp. `Err(why)` names who holds the remote.
pub(crate) fn may_push_over(
    repo: &Repository,
    remote: Option<Oid>,
    fence: &dyn Fence,
) -> Result<(), String> {
    let mine = fence.stamp();
    let Some(id) = remote else {
        return if fence.takeover() {
            Ok(())
        } else {
            Err("the remote has no fence: this host's claim is gone".into())
        };
    };
    let Some(theirs) = stamp_of(repo, id) else {
        return Err(format!("the remote's fence {id} is not a fence commit"));
    };
    let ok = if fence.takeover() {
        theirs.epoch < mine.epoch
    } else {
        theirs == mine
    };
    if ok {
        return Ok(());
    }
    let claimed = format!(
        "the remote was claimed by host {} (epoch {}; this host's is {})",
        shown(&theirs.host),
        theirs.epoch,
        mine.epoch
    );
    if theirs.epoch > MAX_EPOCH {
        return Err(format!(
            "{claimed}: no epoch mini-letta issues is that large, so the fence was planted; \
             point the remote's {FENCE_REF} back at a fence commit of a real owner"
        ));
    }
    // A take-over's epoch is etcd's newest revision plus the base: in a
    // healthy etcd no fence can be stamped at or above it.
    if fence.takeover() {
        return Err(format!(
            "{claimed}: etcd just gave this host the agent as its newest epoch, so etcd has \
             lost its data (or the fence was forged); once etcd is whole, `mini-letta cluster \
             recover` raises its epochs past every fence in the remote"
        ));
    }
    Err(claimed)
}

/// A host name from the remote as it may be shown: quoted and escaped
/// when it holds a character a name may not, and cut short when it is
/// longer than a host id may be (the remote is not trusted).
pub fn shown(host: &str) -> String {
    const MAX: usize = 64;
    match crate::names::check(host) {
        Ok(()) if !host.is_empty() && host.len() <= MAX => host.to_string(),
        _ => {
            let head: String = host.chars().take(MAX / 2).collect();
            if head.len() < host.len() {
                format!("{head:?}… ({} bytes)", host.len())
            } else {
                format!("{head:?}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn repo_with_commits(n: usize) -> (tempfile::TempDir, Repository, Vec<Oid>) {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(dir.path()).unwrap();
        let sig = Signature::now("t", "t@t").unwrap();
        let mut ids: Vec<Oid> = Vec::new();
        {
            let tree = repo
                .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
                .unwrap();
            for i in 0..n {
                let parent = ids.last().map(|p| repo.find_commit(*p).unwrap());
                let parents: Vec<&git2::Commit> = parent.iter().collect();
                ids.push(
                    repo.commit(None, &sig, &sig, &format!("c{i}"), &tree, &parents)
                        .unwrap(),
                );
            }
        }
        (dir, repo, ids)
    }

    #[test]
    fn a_fence_records_its_main_and_a_rollback_is_seen() {
        let (_d, repo, c) = repo_with_commits(3);
        let s = Stamp {
            host: "host-a".into(),
            epoch: 7,
        };
        let f1 = commit(&repo, None, &s, c[1]).unwrap();
        assert_eq!(fenced_main(&repo, f1), Some(c[1]));
        assert_eq!(stamp_of(&repo, f1), Some(s.clone()));
        let f2 = commit(&repo, Some(f1), &s, c[2]).unwrap();
        assert_eq!(fenced_main(&repo, f2), Some(c[2]));
        assert_eq!(previous(&repo, f2), Some(f1));
        assert_eq!(previous(&repo, f1), None, "a first claim's parent is main");
        assert!(repo.graph_descendant_of(f2, f1).unwrap());
        // main at or past the recorded one: fine; behind it or gone: not.
        assert_eq!(check_not_rolled_back(&repo, Some(c[2]), Some(f2)), Ok(()));
        assert_eq!(check_not_rolled_back(&repo, Some(c[2]), Some(f1)), Ok(()));
        let e = check_not_rolled_back(&repo, Some(c[0]), Some(f2)).unwrap_err();
        assert_eq!((e.remote_main, e.recorded), (Some(c[0]), c[2]));
        let text = e.to_string();
        assert!(text.contains(&c[0].to_string()) && text.contains(&c[2].to_string()));
        assert!(
            text.contains("host-a") && text.contains("rolled back"),
            "{text}"
        );
        assert!(check_not_rolled_back(&repo, None, Some(f2)).is_err());
        // An old-style fence, or a main line naming no parent, records none.
        let old = repo
            .commit(
                None,
                &Signature::now("t", "t@t").unwrap(),
                &Signature::now("t", "t@t").unwrap(),
                &format!("{}main: {}\n", s.message(), c[2]),
                &repo.find_commit(f1).unwrap().tree().unwrap(),
                &[&repo.find_commit(f1).unwrap()],
            )
            .unwrap();
        assert_eq!(fenced_main(&repo, old), None);
        assert_eq!(check_not_rolled_back(&repo, Some(c[0]), Some(old)), Ok(()));
    }

    struct Taking(i64, bool);
    impl Fence for Taking {
        fn stamp(&self) -> Stamp {
            Stamp {
                host: "host-b".into(),
                epoch: self.0,
            }
        }
        fn confirm(&self) -> Result<(), String> {
            Ok(())
        }
        fn takeover(&self) -> bool {
            self.1
        }
    }

    /// Issue 43: a take-over meeting a fence at or above its fresh epoch
    /// says etcd lost its data; one past any epoch mini-letta issues (a
    /// forged `i64::MAX`) says it was planted and how to undo it.
    #[test]
    fn an_impossible_fence_epoch_is_named_for_what_it_is() {
        let (_d, repo, c) = repo_with_commits(1);
        let at = |epoch: i64| {
            let s = Stamp {
                host: "host-a".into(),
                epoch,
            };
            commit(&repo, None, &s, c[0]).unwrap()
        };
        assert_eq!(may_push_over(&repo, Some(at(5)), &Taking(9, true)), Ok(()));
        let lost = may_push_over(&repo, Some(at(500)), &Taking(9, true)).unwrap_err();
        assert!(
            lost.contains("lost its data") && lost.contains("cluster recover"),
            "{lost}"
        );
        let forged = may_push_over(&repo, Some(at(i64::MAX)), &Taking(9, true)).unwrap_err();
        assert!(
            forged.contains("planted") && forged.contains(FENCE_REF),
            "{forged}"
        );
        // Not a take-over: another owner's stamp is just another owner's.
        let other = may_push_over(&repo, Some(at(5)), &Taking(9, false)).unwrap_err();
        assert!(other.contains("claimed by host host-a"), "{other}");
        assert!(!other.contains("lost its data"), "{other}");
    }

    #[test]
    fn a_stamp_survives_its_message_and_nothing_else_parses() {
        let s = Stamp {
            host: "host-a".into(),
            epoch: 42,
        };
        assert_eq!(Stamp::parse(&s.message()), Some(s));
        for bad in [
            "",
            "mini-letta fence",
            "mini-letta fence\n\nhost: a\n",
            "mini-letta fence\n\nepoch: 3\n",
            "mini-letta fence\n\nhost: a\nepoch: x\n",
            "other\n\nhost: a\nepoch: 3\n",
        ] {
            assert_eq!(Stamp::parse(bad), None, "{bad:?}");
        }
    }
}
