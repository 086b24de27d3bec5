//! How a sub-agent run ended, in two parts kept apart everywhere (the
//! result files, `reflect status`, Palace, doctor): what was **merged**
//! (the finalize status: `merged`, `no_changes`, `merge_conflict`, …) and
//! whether the **task** finished (how the child ended: `finished`,
//! `failed`, `killed`, `interrupted`, `not_started`).
//!
//! A worker that commits half its instruction and then fails has its
//! commits merged — they are validated memory — but its instruction is not
//! done: it goes back to the queue. Only a clean exit *and* a merge that
//! landed (or had nothing to land) ends an instruction. Like the rest of
//! this module: no processes and no git; the caller brings the facts. What
//! a decision does to the worker queue is the queue's (`queue::settle`).

use serde_json::{Value, json};

#[cfg(test)]
use crate::protocol::events::ChildEnd;
pub use crate::protocol::replies::{Attempt, MergePart, TaskPart, TaskStatus};

/// Longest report kept in an attempt's record (the last run's whole report
/// stays in the result file).
pub const ATTEMPT_REPORT_CHARS: usize = 2_000;

/// The merge part of a finalize result serialized as JSON
/// (`wt::Finalized`).
pub(crate) fn merge_part(v: &Value) -> MergePart {
    let strings = |k: &str| -> Vec<String> {
        v[k].as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    MergePart {
        status: v["status"].as_str().unwrap_or("failed").to_string(),
        summary: v["summary"].as_str().unwrap_or_default().to_string(),
        commit_count: v["commit_count"].as_u64().unwrap_or(0) as usize,
        merge_commit: v["merge_commit"].as_str().map(str::to_string),
        changed_paths: strings("changed_paths"),
    }
}

/// An attempt's record, its report cut to [`ATTEMPT_REPORT_CHARS`].
pub fn attempt(number: u32, at: String, merge: Option<MergePart>, mut task: TaskPart) -> Attempt {
    task.report = task
        .report
        .map(|r| super::truncate_chars(&r, ATTEMPT_REPORT_CHARS));
    Attempt {
        attempt: number,
        finished_at: at,
        merge,
        task,
    }
}

/// What happens to an instruction after a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Done: the task finished and its change landed, had nothing to land,
    /// or was handed to a repair worker.
    Done,
    /// Queued again (counted, after a pause).
    Retry,
    /// Its supervisor stopped: left, uncounted, for the next one.
    Interrupted,
}

impl Next {
    pub fn as_str(self) -> &'static str {
        match self {
            Next::Done => "done",
            Next::Retry => "retry",
            Next::Interrupted => "left for the next supervisor",
        }
    }
}

/// The decision for a run whose merge ended `merge` and task `task`.
/// `checkout_dirty`: a conflict met only uncommitted checkout edits, which
/// a repair would meet again (the instruction runs again instead).
pub fn next(merge: &str, checkout_dirty: bool, task: TaskStatus) -> Next {
    match task {
        TaskStatus::Interrupted => Next::Interrupted,
        TaskStatus::Finished => match merge {
            "merged" | "no_changes" => Next::Done,
            "merge_conflict" if !checkout_dirty => Next::Done,
            _ => Next::Retry,
        },
        TaskStatus::Failed | TaskStatus::Killed | TaskStatus::NotStarted => Next::Retry,
    }
}

/// Add the two parts to a result record (the finalize result and the
/// child's fields), keeping its top-level `status` — the merge status —
/// for readers of the older shape.
pub(crate) fn annotate(record: &mut Value, merge: &MergePart, task: &TaskPart) {
    if let Some(o) = record.as_object_mut() {
        o.insert("merge".into(), json!(merge));
        o.insert("task".into(), json!(task));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_or_killed_run_is_not_done() {
        let exited = |code| ChildEnd::Exited { code };
        assert_eq!(TaskStatus::of(&exited(0), false), TaskStatus::Finished);
        assert_eq!(TaskStatus::of(&exited(0), true), TaskStatus::Finished);
        assert_eq!(TaskStatus::of(&exited(1), false), TaskStatus::Failed);
        assert_eq!(TaskStatus::of(&exited(1), true), TaskStatus::Interrupted);
        let killed = ChildEnd::Killed { signal: 9 };
        assert_eq!(TaskStatus::of(&killed, false), TaskStatus::Killed);
        assert_eq!(TaskStatus::of(&killed, true), TaskStatus::Interrupted);

        use TaskStatus::*;
        assert_eq!(next("merged", false, Finished), Next::Done);
        assert_eq!(next("no_changes", false, Finished), Next::Done);
        assert_eq!(next("merge_conflict", false, Finished), Next::Done);
        assert_eq!(next("merge_conflict", true, Finished), Next::Retry);
        // The bug: half an instruction merged, the other half dropped.
        assert_eq!(next("merged", false, Failed), Next::Retry);
        assert_eq!(next("merged", false, Killed), Next::Retry);
        assert_eq!(next("no_changes", false, Failed), Next::Retry);
        assert_eq!(next("failed", false, Finished), Next::Retry);
        assert_eq!(next("discarded", false, Finished), Next::Retry);
        assert_eq!(next("merged", false, Interrupted), Next::Interrupted);
        assert_eq!(next("failed", false, NotStarted), Next::Retry);
    }

    #[test]
    fn parts_serialise_apart_and_reports_are_cut() {
        let finalized = json!({"status": "merged", "summary": "Merged 1", "commit_count": 1,
            "merge_commit": "abc", "changed_paths": ["coffee.md"], "branch": "b"});
        let merge = merge_part(&finalized);
        assert!(merge.landed());
        let task = TaskPart::ended(
            &ChildEnd::Exited { code: 1 },
            false,
            Some("error: the model failed".into()),
        );
        let mut record = finalized.clone();
        annotate(&mut record, &merge, &task);
        assert_eq!(record["status"], "merged");
        assert_eq!(record["merge"]["changed_paths"], json!(["coffee.md"]));
        assert_eq!(record["task"]["status"], "failed");
        assert_eq!(
            record["task"]["exit"],
            json!({"state": "exited", "code": 1})
        );
        let long = TaskPart::ended(
            &ChildEnd::Killed { signal: 9 },
            false,
            Some("x".repeat(5000)),
        );
        let a = attempt(1, "t".into(), Some(merge), long);
        assert!(a.task.report.as_deref().is_some_and(|r| r.len() < 2100));
        let back: Attempt = serde_json::from_value(json!(a)).unwrap();
        assert_eq!(back, a);
        assert_eq!(json!(a)["task"]["status"], "killed");
        assert_eq!(
            json!(TaskPart::not_started("disk full"))["status"],
            "not_started"
        );
    }
}
