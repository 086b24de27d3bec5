//! A sync in a cluster (issue 35): the push that carries the fence, the
//! outcome of a host that lost the agent (nothing pushed, its commits kept
//! under a backup ref), and a new owner's take-over.

use git2::{Oid, Repository};

use super::error::{SyncError, git};
use super::judge::accept_from_remote;
use super::refs::{
    LOCAL_MAIN, REMOTE_TRACKING_REF, count_between, main_tip, move_main, write_backup,
};
use super::run::{Pushing, Run};
use crate::memfs::fence::{self, FENCE_REF, FENCE_TRACKING_REF};
use crate::memfs::lock::RepoLock;
use crate::memfs::repo::open_agent;
use crate::memfs::transport::{self, Pushed, Update};
use crate::paths::AgentPaths;
use crate::protocol::replies::{SyncOutcome, SyncStatus};

/// A backup ref of local `main` when it has commits `remote` (the remote
/// `main` as last seen) lacks: commits a host that lost an agent made were
/// never acknowledged, and the next owner's history is not built on them
/// — but nothing is ever lost.
fn keep_unpushed(repo: &Repository, remote: Option<Oid>) -> Result<Option<String>, SyncError> {
    let local = main_tip(repo)?;
    let unpushed = match remote {
        Some(r) => {
            r != local
                && !repo
                    .graph_descendant_of(r, local)
                    .map_err(git("compare histories"))?
        }
        None => true,
    };
    Ok(if unpushed {
        Some(write_backup(repo, local)?)
    } else {
        None
    })
}

fn lost_outcome(why: &str, backup_ref: Option<&str>) -> SyncOutcome {
    let kept = match backup_ref {
        Some(b) => format!("; local commits are kept under {b}"),
        None => String::new(),
    };
    tracing::warn!("ownership lost: {why}");
    let mut out = SyncOutcome::new(
        SyncStatus::OwnershipLost,
        format!("ownership of this agent was lost: {why}; nothing was pushed{kept}"),
    );
    out.backup_ref = backup_ref.map(str::to_string);
    out
}

/// A sync refused before it starts because this host no longer owns the
/// agent (its lease is gone): nothing is fetched or pushed, and commits
/// the remote was not seen to have are kept under a backup ref.
pub fn ownership_lost(agent: &AgentPaths, why: &str) -> Result<SyncOutcome, SyncError> {
    let _lock = RepoLock::acquire(&agent.memory_git_dir())?;
    let repo = open_agent(agent)?;
    let seen = repo.refname_to_id(REMOTE_TRACKING_REF).ok();
    let backup = keep_unpushed(&repo, seen)?;
    let mut out = lost_outcome(why, backup.as_deref());
    out.local = main_tip(&repo).ok().map(|o| o.to_string());
    out.remote = seen.map(|o| o.to_string());
    Ok(out)
}

impl Run<'_> {
    /// Push `main` — with, in a cluster, a new fence commit over
    /// `remote_fence`, once etcd confirmed ownership — and record what the
    /// remote now has (a push by URL or in-process moves no tracking ref),
    /// so "pending" means new commits only.
    pub(super) fn push_with_fence(
        &self,
        main: Update<'_>,
        remote_fence: Option<Oid>,
    ) -> Result<Pushing, SyncError> {
        let mut updates = vec![main];
        let confirm = || self.fence.map_or(Ok(()), |f| f.confirm());
        if let Some(f) = self.fence {
            // Early, before anything is written: a host that lost the agent
            // copies no object. Again under the remote's locks (below).
            if let Err(why) = confirm() {
                return Ok(Pushing::Lost(why));
            }
            let stamped = fence::commit(self.repo, remote_fence, &f.stamp(), main.new)
                .map_err(git("write the fence commit"))?;
            // Last: `main` lands first, so a push cut short leaves `main`
            // ahead of what the fence records, never behind it.
            updates.push(Update {
                name: FENCE_REF,
                old: remote_fence,
                new: stamped,
            });
        }
        let last_check: Option<transport::LastCheck<'_>> = self
            .fence
            .is_some()
            .then_some(&confirm as transport::LastCheck<'_>);
        match transport::push(self.repo, self.git_dir, self.url, &updates, last_check)? {
            Pushed::Done => {}
            Pushed::Refused(why) => return Ok(Pushing::Lost(why)),
            Pushed::Rejected(m) => return Ok(Pushing::Rejected(m)),
            Pushed::Failed(m) => return Ok(Pushing::Failed(m)),
        }
        for (u, tracking) in updates
            .iter()
            .zip([REMOTE_TRACKING_REF, FENCE_TRACKING_REF])
        {
            if let Err(e) = self
                .repo
                .reference(tracking, u.new, true, "mini-letta sync: pushed")
            {
                tracing::warn!("pushed, but cannot record the remote's {}: {e}", u.name);
            }
        }
        Ok(Pushing::Done)
    }

    /// The outcome of a sync that found this host no longer owns the
    /// agent ([`lost_outcome`]).
    pub(super) fn lost(
        &mut self,
        why: &str,
        remote: Option<Oid>,
    ) -> Result<SyncOutcome, SyncError> {
        if self.backup_ref.is_none() {
            self.backup_ref = keep_unpushed(self.repo, remote)?;
        }
        let mut out = lost_outcome(why, self.backup_ref.as_deref());
        out.local = main_tip(self.repo).ok().map(|o| o.to_string());
        out.remote = remote.map(|o| o.to_string());
        Ok(out)
    }

    /// A new owner's first sync: `main` becomes the remote's (validated;
    /// local commits the remote lacks were never acknowledged by anyone and
    /// are set aside under a backup ref), then this host's claim — a fence
    /// commit of its epoch — is pushed. A remote without `main` gets this
    /// host's.
    pub(super) fn take_over(
        &mut self,
        remote: Option<Oid>,
        remote_fence: Option<Oid>,
        last: bool,
    ) -> Result<Result<SyncOutcome, String>, SyncError> {
        let local = main_tip(self.repo)?;
        let mut said = String::from("took the agent over");
        // etcd gave this host the agent only once every earlier owner's
        // lease had ended: a lock on the refs this push takes is a dead
        // (or paused, and fenced out) writer's, and would block every
        // host for good.
        let cleared = transport::clear_stale_locks(self.url, &[LOCAL_MAIN, FENCE_REF]);
        if !cleared.is_empty() {
            said.push_str(&format!(
                "; removed {} left in the remote by an earlier owner",
                cleared.join(" and ")
            ));
        }
        let main = match remote {
            None => Update {
                name: LOCAL_MAIN,
                old: None,
                new: local,
            },
            Some(r) => {
                if r != local {
                    if let Some(why) = accept_from_remote(self.repo, r, Some(local))? {
                        return Ok(Ok(self.finish(
                            SyncStatus::Invalid,
                            format!(
                                "the remote's memory is refused; local main is unchanged:\n{why}"
                            ),
                            Some(r),
                        )));
                    }
                    if !self.descends(r, local)? && self.backup_ref.is_none() {
                        let backup = write_backup(self.repo, local)?;
                        said.push_str(&format!(
                            "; local commits the remote lacks are kept under {backup}"
                        ));
                        self.backup_ref = Some(backup);
                    }
                    move_main(
                        self.repo,
                        self.agent,
                        local,
                        r,
                        "mini-letta sync: take over at the remote's main",
                    )?;
                }
                Update {
                    name: LOCAL_MAIN,
                    old: Some(r),
                    new: r,
                }
            }
        };
        let published = main.old.is_none();
        match self.push_with_fence(main, remote_fence)? {
            Pushing::Done => {
                let (status, what) = if published {
                    (SyncStatus::Pushed, "; published its memory")
                } else {
                    (SyncStatus::Clean, "; main is the remote's")
                };
                let mut out = self.finish(status, format!("{said}{what}"), Some(main.new));
                if published {
                    out.pushed_commits = count_between(self.repo, main.new, None)?;
                }
                Ok(Ok(out))
            }
            Pushing::Lost(why) => self.lost(&why, remote).map(Ok),
            Pushing::Rejected(message) if !last => Ok(Err(message)),
            Pushing::Rejected(message) | Pushing::Failed(message) => Ok(Ok(self.finish(
                SyncStatus::PushFailed,
                format!("the claim on {} failed: {message}", self.url),
                remote,
            ))),
        }
    }
}
