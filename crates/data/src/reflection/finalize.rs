//! How a sub-agent's run ends, on a blocking thread: a reflection's
//! finalize ladder (merge or not, the cursors and backoff, the completion
//! line, the lock and payload released) and a memory worker's merge and the
//! settling of its instruction on both parts of the outcome.

use serde_json::json;

use super::launch_result::CompletionStatus;
use super::outcome::{self, Next, TaskPart};
use super::prepare::Prepared;
use super::queue::{self, QueuedWorker};
use super::{backoff, lock, payload};
use crate::clock::now;
use crate::memfs::worktree::{self as wt, FinalizeOptions, FinalizeStatus, MemoryWorktree};
use crate::paths::AgentPaths;
use crate::protocol::events::ChildEnd;
use crate::protocol::replies::{Merged, SubagentResult};
use crate::store;

/// The agent's integration turn in the explicit mode, as it ended.
#[derive(Debug, Clone)]
pub struct Integrated {
    pub conversation: String,
    /// How the turn's child ended (none when it did not run).
    pub exit: Option<ChildEnd>,
    /// What its `memory.merge` answered, if it merged.
    pub merge: Option<Merged>,
    /// Why the integration did not complete (spec §5.5), when it did not.
    pub failure: Option<String>,
}

/// The summary of an integration that did not complete.
pub fn integration_failure(why: &str) -> String {
    format!(
        "Reflection integration did not complete ({why}); the worktree was cleaned up so the transcript can be retried."
    )
}

/// Finalize reflection `p`'s worktree (merged only when `should_merge`),
/// advance the cursors or back off, and word the result; the lock and the
/// payload are released before it is returned.
pub fn complete_reflection(
    p: Prepared,
    child: u64,
    should_merge: bool,
    (end, task): (ChildEnd, TaskPart),
    report: Option<String>,
    integration: Option<Integrated>,
) -> SubagentResult {
    let summary = format!(
        "reflection {} over {} conversation(s)",
        p.worktree.id,
        p.manifest.transcripts.len()
    );
    let opts = match &integration {
        // The integration turn ran: merged only if the branch is now an
        // ancestor of main (checked by finalize), whatever it reported.
        Some(i) => FinalizeOptions {
            should_merge,
            require_already_merged: true,
            failure_summary: i.failure.clone(),
            summary,
            ..FinalizeOptions::default()
        },
        None => FinalizeOptions {
            should_merge,
            summary,
            ..FinalizeOptions::default()
        },
    };
    let finalized = store::commit_signature(&p.agent)
        .map_err(wt::git("make a commit signature"))
        .and_then(|sig| wt::finalize_reflection_worktree(&p.agent, &p.worktree, &opts, &sig));
    let mut value = match finalized {
        Ok(f) => {
            let now = now();
            let outcome = match f.status {
                FinalizeStatus::Merged | FinalizeStatus::NoChanges => {
                    payload::finalize_success(&p.agent, &p.manifest, now)
                        .and_then(|()| backoff::clear(&p.agent))
                        .map_err(|e| e.to_string())
                }
                FinalizeStatus::ParentDirty | FinalizeStatus::MergeConflict => {
                    backoff::record_failure(&p.agent, now)
                        .map(drop)
                        .map_err(|e| e.to_string())
                }
                _ => Ok(()),
            };
            if let Err(e) = outcome {
                tracing::warn!(agent = %p.record.id, "reflection bookkeeping failed: {e}");
            }
            let mut v = serde_json::to_value(&f).unwrap_or_else(|_| json!({}));
            let status = v["status"].as_str().unwrap_or("failed").to_string();
            // A failed integration's line is its own summary.
            let integration_summary = integration
                .as_ref()
                .filter(|_| f.status == FinalizeStatus::Failed)
                .map(|_| f.summary.clone());
            let line = CompletionStatus::from_finalize(&status, integration_summary.as_deref())
                .map(|c| super::launch_result::completion_line(&c))
                .unwrap_or_else(|| format!("{} Will retry later.", f.summary));
            if let Some(o) = v.as_object_mut() {
                o.insert("message".into(), json!(line));
            }
            v
        }
        Err(e) => json!({
            "status": "failed",
            "summary": format!("the reflection could not be finalized: {e}"),
            "message": "Tried to reflect, but memory updates were not completed cleanly; will retry later.",
        }),
    };
    if let Some(o) = value.as_object_mut() {
        if let Some(i) = &integration {
            o.insert(
                "integration".into(),
                json!({ "conversation": i.conversation, "exit": i.exit, "merge": i.merge }),
            );
        }
        o.insert("child".into(), json!(child));
        o.insert("exit".into(), serde_json::to_value(end).unwrap_or_default());
        o.insert("report".into(), json!(report));
        o.insert("finishedAt".into(), json!(crate::clock::rfc3339(now())));
    }
    let merge = outcome::merge_part(&value);
    outcome::annotate(&mut value, &merge, &task);
    // Released before the result is published: whoever sees the result
    // may launch the next reflection at once.
    let _ = payload::remove_payload(&p.agent, &p.manifest.launch_id);
    let _ = lock::release(&p.agent, &p.token);
    SubagentResult::from_record(value)
}

/// When a run ended, as the records say it.
pub fn finished_at() -> String {
    crate::clock::rfc3339(now())
}

/// A launched worker, as its finalization needs it.
pub struct WorkerRun {
    pub agent: AgentPaths,
    pub worktree: MemoryWorktree,
    pub item: QueuedWorker,
    pub child: u64,
}

/// What [`integrate_and_settle`] did.
pub struct Settlement {
    /// `reflections/last-worker.json`.
    pub record: SubagentResult,
    pub next: Next,
    pub settled: queue::Settled,
    /// Its branch was kept after a conflict: a repair is due.
    pub conflicted: bool,
    pub branch: String,
}

/// Merge a worker's branch, decide from both parts of the outcome, settle
/// its instruction and record the result. On a blocking thread.
pub fn integrate_and_settle(
    run: &WorkerRun,
    end: ChildEnd,
    task: TaskPart,
    cancelled: bool,
) -> Settlement {
    let (a, w) = (&run.agent, &run.worktree);
    let integrated = store::commit_signature(a)
        .map_err(wt::git("make a commit signature"))
        .and_then(|sig| wt::integrate_worker(a, w, cancelled, &sig));
    let (mut record, status, checkout_dirty) = match integrated {
        Ok(f) => {
            if let Some(r) = &run.item.repair {
                // The repair's own commits carry the kept change now: the
                // kept branch goes (only if nobody moved it meanwhile).
                if f.status == wt::FinalizeStatus::Merged {
                    let _ = wt::drop_kept_branch(a, &r.branch, &r.tip);
                    for (branch, tip) in &r.also {
                        let _ = wt::drop_kept_branch(a, branch, tip);
                    }
                }
                let _ = super::repair::complete(a, &r.signature);
            }
            // Met only uncommitted edits in the checkout: the instruction
            // runs again and redoes the change, so this attempt's branch
            // goes rather than lingering unrepaired.
            let checkout_dirty = f.status == wt::FinalizeStatus::MergeConflict && f.checkout_dirty;
            if checkout_dirty && let Some(tip) = &f.kept_tip {
                let _ = wt::drop_kept_branch(a, &f.branch, tip);
            }
            let v = serde_json::to_value(&f).unwrap_or_else(|_| json!({}));
            (v, f.status, checkout_dirty)
        }
        Err(e) => (
            json!({
                "status": "failed",
                "summary": format!("the worker's worktree could not be finalized: {e}"),
                "branch": w.branch,
            }),
            wt::FinalizeStatus::Failed,
            false,
        ),
    };
    let at = finished_at();
    if let Some(o) = record.as_object_mut() {
        o.insert("child".into(), json!(run.child));
        o.insert("exit".into(), serde_json::to_value(end).unwrap_or_default());
        o.insert("report".into(), json!(task.report));
        o.insert("finishedAt".into(), json!(at));
    }
    let merge = outcome::merge_part(&record);
    let next = outcome::next(&merge.status, checkout_dirty, task.status);
    let attempt = outcome::attempt(run.item.next_run(), at, Some(merge.clone()), task.clone());
    let settled = queue::settle(a, &run.item, attempt.clone(), next);
    outcome::annotate(&mut record, &merge, &task);
    queue::describe(&mut record, &run.item, &attempt, next, &settled);
    let record = SubagentResult::from_record(record);
    if let Err(e) = super::launch_result::save_last_worker_result(a, &record) {
        tracing::warn!("cannot record the memory worker's result: {e}");
    }
    Settlement {
        record,
        next,
        settled,
        conflicted: status == wt::FinalizeStatus::MergeConflict && !checkout_dirty,
        branch: w.branch.clone(),
    }
}
