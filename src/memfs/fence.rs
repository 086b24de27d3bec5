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
/// an empty tree: it carries the stamp and nothing else.
pub fn commit(repo: &Repository, parent: Option<Oid>, stamp: &Stamp) -> Result<Oid, git2::Error> {
    let tree = repo.find_tree(repo.treebuilder(None)?.write()?)?;
    let sig = Signature::now("mini-letta", "mini-letta@localhost")?;
    let parent = parent.map(|p| repo.find_commit(p)).transpose()?;
    let parents: Vec<&git2::Commit> = parent.iter().collect();
    repo.commit(None, &sig, &sig, &stamp.message(), &tree, &parents)
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

/// Whether this host may push over the remote fence `remote` (fetched):
/// on a takeover, a fence of an older epoch (or none); otherwise exactly
/// this host's own stamp. `Err(why)` names who holds the remote.
pub fn may_push_over(
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
        Ok(())
    } else {
        Err(format!(
            "the remote was claimed by host {} (epoch {}; this host's is {})",
            shown(&theirs.host),
            theirs.epoch,
            mine.epoch
        ))
    }
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
