//! One sync's attempts: fetch, reconcile local `main` with the remote's
//! (nothing to do, push, fast-forward or rebase), validate, push.

use std::path::Path;

use git2::{Oid, Repository, Signature};

use super::error::{SyncError, git};
use super::judge::{accept_from_remote, check};
use super::rebase::{Rebased, rebase};
use super::refs::{
    LOCAL_MAIN, REMOTE_TRACKING_REF, count_between, existing_backup, main_tip, move_main,
    write_backup,
};
use crate::memfs::fence::{self, FENCE_REF, FENCE_TRACKING_REF, Fence};
use crate::memfs::transport::{self, Update, Wanted};
use crate::paths::AgentPaths;
use crate::protocol::replies::{SyncOutcome, SyncStatus};

/// Fetch the remote `main` into [`REMOTE_TRACKING_REF`] and, when
/// `fenced`, its fence into [`FENCE_TRACKING_REF`]: `(main, fence)`, each
/// `None` when the remote has none yet.
pub(super) fn fetch(
    repo: &Repository,
    git_dir: &Path,
    url: &str,
    fenced: bool,
) -> Result<(Option<Oid>, Option<Oid>), SyncError> {
    let main = Wanted {
        remote: LOCAL_MAIN,
        tracking: REMOTE_TRACKING_REF,
    };
    let fence = Wanted {
        remote: FENCE_REF,
        tracking: FENCE_TRACKING_REF,
    };
    let wanted: &[Wanted<'_>] = if fenced { &[main, fence] } else { &[main] };
    let tips = transport::fetch(repo, git_dir, url, wanted)?;
    Ok((
        tips.first().copied().flatten(),
        tips.get(1).copied().flatten(),
    ))
}

/// How a push of [`Run::push_with_fence`] ended.
pub(super) enum Pushing {
    Done,
    /// etcd no longer confirms this host's ownership (why).
    Lost(String),
    Rejected(String),
    Failed(String),
}

/// One sync's state across its attempts (a rejected push is retried once
/// after a new fetch).
pub(super) struct Run<'a> {
    pub(super) repo: &'a Repository,
    pub(super) agent: &'a AgentPaths,
    pub(super) committer: &'a Signature<'a>,
    pub(super) git_dir: &'a Path,
    pub(super) url: &'a str,
    pub(super) backup_ref: Option<String>,
    /// In a cluster: the fence every push carries.
    pub(super) fence: Option<&'a dyn Fence>,
}

/// What the local `main` becomes before the push.
enum Plan {
    /// Push this (local `main`, or a rebase of it onto the remote).
    Push { tip: Oid, rebased: bool },
    /// Nothing to push: the sync ends with this outcome.
    End(SyncOutcome),
}

impl Run<'_> {
    pub(super) fn finish(
        &self,
        status: SyncStatus,
        message: String,
        remote: Option<Oid>,
    ) -> SyncOutcome {
        let mut out = SyncOutcome::new(status, message);
        out.local = main_tip(self.repo).ok().map(|o| o.to_string());
        out.remote = remote.map(|o| o.to_string());
        out.backup_ref = self.backup_ref.clone();
        out
    }

    /// Fetch, reconcile, validate, push. `Err(rejection)` asks for another
    /// attempt; on the `last` one a rejection is a `push_failed` outcome.
    pub(super) fn attempt(&mut self, last: bool) -> Result<Result<SyncOutcome, String>, SyncError> {
        let (remote, remote_fence) =
            match fetch(self.repo, self.git_dir, self.url, self.fence.is_some()) {
                Ok(tips) => tips,
                // Refused before anything was stored: like a tree the
                // validator refuses, `main` stays and the sync says why.
                Err(SyncError::Fetch(why)) => {
                    return Ok(Ok(self.finish(
                        SyncStatus::Invalid,
                        format!("the remote's memory is refused; local main is unchanged:\n{why}"),
                        None,
                    )));
                }
                Err(e) => return Err(e),
            };
        if let Some(f) = self.fence {
            if let Err(why) = fence::may_push_over(self.repo, remote_fence, f) {
                return self.lost(&why, remote).map(Ok);
            }
            if let Err(rolled_back) = fence::check_not_rolled_back(self.repo, remote, remote_fence)
            {
                return self.rolled_back(&rolled_back, remote).map(Ok);
            }
            if f.takeover() {
                return self.take_over(remote, remote_fence, last);
            }
        }
        let local = main_tip(self.repo)?;
        let (to_push, rebased) = match self.plan(local, remote)? {
            Plan::End(out) => return Ok(Ok(out)),
            Plan::Push { tip, rebased } => (tip, rebased),
        };
        if !rebased && let Some(message) = check(self.repo, to_push, remote)? {
            return Ok(Ok(self.finish(
                SyncStatus::Invalid,
                format!("the memory to push fails validation:\n{message}"),
                remote,
            )));
        }
        if to_push != local {
            move_main(
                self.repo,
                self.agent,
                local,
                to_push,
                "mini-letta sync: rebase",
            )?;
        }
        let n = count_between(self.repo, to_push, remote)?;
        let main = Update {
            name: LOCAL_MAIN,
            old: remote,
            new: to_push,
        };
        match self.push_with_fence(main, remote_fence)? {
            Pushing::Done => {
                let what = if rebased {
                    "rebased and pushed"
                } else {
                    "pushed"
                };
                let mut out = self.finish(
                    SyncStatus::Pushed,
                    format!("{what} {n} memory commit(s) to {}", self.url),
                    Some(to_push),
                );
                out.pushed_commits = n;
                Ok(Ok(out))
            }
            Pushing::Lost(why) => self.lost(&why, remote).map(Ok),
            Pushing::Rejected(message) if !last => Ok(Err(message)),
            Pushing::Rejected(message) | Pushing::Failed(message) => Ok(Ok(self.finish(
                SyncStatus::PushFailed,
                format!("push to {} failed: {message}", self.url),
                remote,
            ))),
        }
    }

    /// The remote's `main` lost what its fence records (issue 43 §4):
    /// nothing is pushed or taken from it, local `main` stays, and the
    /// recorded history (fetched with the fence) is kept under a backup
    /// ref for the operator to restore.
    fn rolled_back(
        &mut self,
        why: &fence::RolledBack,
        remote: Option<Oid>,
    ) -> Result<SyncOutcome, SyncError> {
        // Every turn meets it again until an operator acts: one ref.
        let backup = match existing_backup(self.repo, why.recorded) {
            Some(b) => b,
            None => write_backup(self.repo, why.recorded)?,
        };
        tracing::warn!("{why}");
        let mut out = self.finish(
            SyncStatus::Invalid,
            format!(
                "{why}; nothing was pushed or taken from it, and the recorded history is kept \
                 under {backup} — restore it with `git --git-dir {} push {} {backup}:refs/heads/main` \
                 (with --force if the remote's main was rewritten rather than rolled back)",
                self.git_dir.display(),
                self.url,
            ),
            remote,
        );
        out.backup_ref = Some(backup);
        Ok(out)
    }

    pub(super) fn descends(&self, a: Oid, b: Oid) -> Result<bool, SyncError> {
        self.repo
            .graph_descendant_of(a, b)
            .map_err(git("compare histories"))
    }

    /// Local `main` against the fetched `remote`: nothing to do, push as
    /// is, fast-forward (validated), or rebase (validated both ways).
    fn plan(&mut self, local: Oid, remote: Option<Oid>) -> Result<Plan, SyncError> {
        let repo = self.repo;
        let Some(r) = remote else {
            return Ok(Plan::Push {
                tip: local,
                rebased: false,
            });
        };
        if r == local {
            let out = self.finish(
                SyncStatus::Clean,
                "memory is up to date with the remote".into(),
                remote,
            );
            return Ok(Plan::End(out));
        }
        if self.descends(local, r)? {
            return Ok(Plan::Push {
                tip: local,
                rebased: false,
            });
        }
        if self.descends(r, local)? {
            return self.fast_forward(local, r).map(Plan::End);
        }
        if repo.merge_base(local, r).is_err() {
            return Ok(Plan::End(self.finish(
                SyncStatus::Conflict,
                format!(
                    "local memory and the remote {} have unrelated histories",
                    self.url
                ),
                remote,
            )));
        }
        self.rebase_onto(local, r)
    }

    /// Move `main` to the remote's `r`, a descendant of `local`, once its
    /// tree is accepted.
    fn fast_forward(&self, local: Oid, r: Oid) -> Result<SyncOutcome, SyncError> {
        if let Some(why) = accept_from_remote(self.repo, r, Some(local))? {
            return Ok(self.finish(
                SyncStatus::Invalid,
                format!("the remote's memory is refused; local main is unchanged:\n{why}"),
                Some(r),
            ));
        }
        let n = count_between(self.repo, r, Some(local))?;
        move_main(
            self.repo,
            self.agent,
            local,
            r,
            "mini-letta sync: fast-forward",
        )?;
        Ok(self.finish(
            SyncStatus::Clean,
            format!("fast-forwarded {n} commit(s) from the remote; nothing to push"),
            Some(r),
        ))
    }

    /// Replay local commits onto the remote's `r` (after a backup ref);
    /// the result must be accepted as a move from `local` and pass as what
    /// is pushed onto `r`.
    fn rebase_onto(&mut self, local: Oid, r: Oid) -> Result<Plan, SyncError> {
        // Before anything is rewritten, keep the local history.
        self.backup_ref = Some(write_backup(self.repo, local)?);
        let tip = match rebase(self.repo, self.committer, local, r)? {
            Rebased::Tip(t) => t,
            Rebased::Conflict(paths) => {
                return Ok(Plan::End(self.finish(
                    SyncStatus::Conflict,
                    format!(
                        "local commits conflict with the remote in: {}; local main is unchanged",
                        paths.join(", ")
                    ),
                    Some(r),
                )));
            }
        };
        // What would be pushed first (a combined tree over a budget is no
        // one side's fault), then what `main` would move to.
        let refusal = match check(self.repo, tip, Some(r))? {
            Some(why) => Some(format!(
                "the rebased memory fails validation; local main is unchanged:\n{why}"
            )),
            None => accept_from_remote(self.repo, tip, Some(local))?.map(|why| {
                format!(
                    "the remote's memory is refused (judged as rebased onto it); local main is \
unchanged:\n{why}"
                )
            }),
        };
        if let Some(message) = refusal {
            return Ok(Plan::End(self.finish(
                SyncStatus::Invalid,
                message,
                Some(r),
            )));
        }
        Ok(Plan::Push { tip, rebased: true })
    }
}
