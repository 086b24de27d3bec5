//! The launch decision's vocabulary: why a launch is refused, the result
//! shape callers print (`{launched, reason?, message, …}`), and the line a
//! finished reflection leaves for the user (spec §5.4, §5.6). No processes
//! and no git here: the caller gathers the facts and this module words them.

use time::OffsetDateTime;

pub use crate::protocol::replies::{LaunchResult, Refusal, SubagentResult};

/// Exact texts (spec §5.4).
pub const MEMFS_DISABLED_TEXT: &str = "Memory filesystem is not enabled. Use /remember instead.";
pub const ALREADY_ACTIVE_TEXT: &str = "A reflection agent is already running in the background.";
pub const PARENT_DIRTY_TEXT: &str =
    "Parent memory has uncommitted changes; commit or discard them before reflecting.";
pub const NO_PAYLOAD_TEXT: &str = "No new transcript content to reflect on.";

/// A refusal with its fixed text (`backoff` and `error` have their own
/// constructors, which say when and what).
pub fn refused(reason: Refusal) -> LaunchResult {
    let message = match reason {
        Refusal::MemfsDisabled => MEMFS_DISABLED_TEXT.to_string(),
        Refusal::AlreadyActive => ALREADY_ACTIVE_TEXT.to_string(),
        Refusal::ParentDirty => PARENT_DIRTY_TEXT.to_string(),
        Refusal::NoPayload => NO_PAYLOAD_TEXT.to_string(),
        Refusal::Backoff => {
            "Automatic reflection is paused after a failed merge; it will retry later.".to_string()
        }
        Refusal::Error => "Reflection could not be started.".to_string(),
    };
    LaunchResult {
        launched: false,
        reason: Some(reason),
        message,
        launch_id: None,
        conversations: Vec::new(),
        retry_at: None,
    }
}

/// An automatic launch skipped until `retry_at`.
pub fn backoff(retry_at: OffsetDateTime) -> LaunchResult {
    let at = crate::clock::rfc3339(retry_at);
    LaunchResult {
        message: format!(
            "Automatic reflection is paused after a failed merge until {at}; a manual reflection can run now."
        ),
        retry_at: Some(at),
        ..refused(Refusal::Backoff)
    }
}

/// Preparing the launch failed (an `error` refusal carrying what went
/// wrong).
pub fn failed(detail: impl std::fmt::Display) -> LaunchResult {
    LaunchResult {
        message: format!("Reflection could not be started: {detail}"),
        ..refused(Refusal::Error)
    }
}

/// A reflection now runs in the background.
pub fn launched(launch_id: &str, conversations: Vec<String>) -> LaunchResult {
    let n = conversations.len();
    LaunchResult {
        launched: true,
        reason: None,
        message: format!(
            "Reflecting in the background on {n} conversation{}.",
            if n == 1 { "" } else { "s" }
        ),
        launch_id: Some(launch_id.to_string()),
        conversations,
        retry_at: None,
    }
}

/// The facts checked before any payload or worktree is made.
#[derive(Debug, Clone, Default)]
pub struct Precheck {
    pub memfs_enabled: bool,
    /// `reflection.lock` is held by a live launcher.
    pub already_active: bool,
    /// Asked for by the user (ignores the backoff).
    pub manual: bool,
    /// From [`super::backoff::check`].
    pub backoff_until: Option<OffsetDateTime>,
    pub parent_dirty: bool,
}

/// The first refusal that applies, in the spec's order (memfs, already
/// active, backoff for automatic launches, parent dirty); `None` = go on
/// to build the payload (whose absence is `no_payload`).
pub fn precheck(facts: &Precheck) -> Option<LaunchResult> {
    if !facts.memfs_enabled {
        return Some(refused(Refusal::MemfsDisabled));
    }
    if facts.already_active {
        return Some(refused(Refusal::AlreadyActive));
    }
    if let Some(until) = facts.backoff_until.filter(|_| !facts.manual) {
        return Some(backoff(until));
    }
    if facts.parent_dirty {
        return Some(refused(Refusal::ParentDirty));
    }
    None
}

/// How a reflection ended (the worktree finalize status, spec §4.2, and
/// whether the sub-agent itself succeeded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompletionStatus {
    Merged,
    NoChanges,
    ParentDirty,
    MergeConflict,
    /// The reflection worktree was left with uncommitted edits.
    DirtyUncommitted,
    /// Explicit integration failed; `summary` says how.
    FailedIntegration {
        summary: String,
    },
    /// The sub-agent failed.
    Failed,
}

impl CompletionStatus {
    /// From a finalize status name (`merged`, `no_changes`, `parent_dirty`,
    /// `merge_conflict`, `dirty_uncommitted`, `failed`); a failure in the
    /// integration phase carries its summary.
    pub(crate) fn from_finalize(status: &str, integration_summary: Option<&str>) -> Option<Self> {
        Some(match status {
            "merged" => Self::Merged,
            "no_changes" => Self::NoChanges,
            "parent_dirty" => Self::ParentDirty,
            "merge_conflict" => Self::MergeConflict,
            "dirty_uncommitted" => Self::DirtyUncommitted,
            "failed" => match integration_summary {
                Some(s) => Self::FailedIntegration {
                    summary: s.to_string(),
                },
                None => Self::Failed,
            },
            _ => return None,
        })
    }

    /// Whether the transcript counts as reflected (cursors advance).
    #[cfg(test)]
    pub(crate) fn consumes_transcript(&self) -> bool {
        matches!(self, Self::Merged | Self::NoChanges)
    }

    /// Whether automatic launches back off afterwards.
    #[cfg(test)]
    pub(crate) fn backs_off(&self) -> bool {
        matches!(self, Self::ParentDirty | Self::MergeConflict)
    }

    /// Whether the system prompt must be recompiled (memory changed).
    pub fn recompiles(&self) -> bool {
        matches!(self, Self::Merged)
    }
}

/// The user-facing line for a finished reflection (spec §5.6, exact).
pub(crate) fn completion_line(status: &CompletionStatus) -> String {
    match status {
        CompletionStatus::Merged => "Dreamed and made some memories.".into(),
        CompletionStatus::NoChanges => "Dreamed; no memory changes were needed.".into(),
        CompletionStatus::ParentDirty => {
            "Tried to reflect, but parent memory had uncommitted changes; will retry later.".into()
        }
        CompletionStatus::MergeConflict => {
            "Tried to reflect, but memory updates conflicted with newer changes; will retry later."
                .into()
        }
        CompletionStatus::DirtyUncommitted => {
            "Tried to reflect, but memory changes were not committed cleanly; will retry later."
                .into()
        }
        CompletionStatus::FailedIntegration { summary } => {
            format!("{} Will retry later.", summary.trim_end())
        }
        CompletionStatus::Failed => {
            "Tried to reflect, but memory updates were not completed cleanly; will retry later."
                .into()
        }
    }
}

/// Keep a finished reflection's result (`reflections/last-result.json`)
/// for `reflect status`, Palace and doctor.
pub fn save_last_result(
    agent: &crate::paths::AgentPaths,
    result: &SubagentResult,
) -> Result<(), super::ReflectionError> {
    save_result(
        agent,
        crate::paths::REFLECTION_LAST_RESULT_FILE_NAME,
        result,
    )
}

/// The last finished reflection's result, if one was kept.
pub fn load_last_result(
    agent: &crate::paths::AgentPaths,
) -> Result<Option<SubagentResult>, super::ReflectionError> {
    load_result(agent, crate::paths::REFLECTION_LAST_RESULT_FILE_NAME)
}

/// Keep a finished memory worker's result (`reflections/last-worker.json`).
pub(crate) fn save_last_worker_result(
    agent: &crate::paths::AgentPaths,
    result: &SubagentResult,
) -> Result<(), super::ReflectionError> {
    save_result(agent, crate::paths::WORKER_LAST_RESULT_FILE_NAME, result)
}

/// The last finished memory worker's result, if one was kept.
pub fn load_last_worker_result(
    agent: &crate::paths::AgentPaths,
) -> Result<Option<SubagentResult>, super::ReflectionError> {
    load_result(agent, crate::paths::WORKER_LAST_RESULT_FILE_NAME)
}

fn save_result(
    agent: &crate::paths::AgentPaths,
    name: &str,
    result: &SubagentResult,
) -> Result<(), super::ReflectionError> {
    let dir =
        super::open_reflections_dir(agent, true)?.ok_or_else(|| super::ReflectionError::Io {
            path: agent.reflections_dir(),
            source: std::io::ErrorKind::NotFound.into(),
        })?;
    let json = super::to_pretty_json(result, dir.path().join(name))?;
    dir.replace_file(name, &json, super::PUBLIC_FILE_MODE)?;
    Ok(())
}

fn load_result(
    agent: &crate::paths::AgentPaths,
    name: &str,
) -> Result<Option<SubagentResult>, super::ReflectionError> {
    // Read as JSON first: a record this build cannot type is still shown
    // (as a failed run saying so), never an error.
    let found: Option<serde_json::Value> = match super::open_reflections_dir(agent, false)? {
        Some(dir) => super::read_json(&dir, name, super::MAX_SMALL_JSON_BYTES)?,
        None => None,
    };
    Ok(found.map(SubagentResult::from_record))
}

/// `line` with the note that recompiling the system prompt failed.
#[cfg(test)]
pub(crate) fn with_recompile_failure(line: &str, error: impl std::fmt::Display) -> String {
    format!("{line} System prompt recompilation failed: {error}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use time::macros::datetime;

    #[test]
    fn refusals_serialise_with_their_texts() {
        let r = serde_json::to_value(refused(Refusal::AlreadyActive)).expect("json");
        assert_eq!(
            r,
            json!({"launched": false, "reason": "already_active",
                   "message": "A reflection agent is already running in the background."})
        );
        let r = serde_json::to_value(refused(Refusal::ParentDirty)).expect("json");
        assert_eq!(r["reason"], "parent_dirty");
        assert_eq!(
            r["message"],
            "Parent memory has uncommitted changes; commit or discard them before reflecting."
        );
        let r = serde_json::to_value(refused(Refusal::NoPayload)).expect("json");
        assert_eq!(r["reason"], "no_payload");
        assert_eq!(r["message"], "No new transcript content to reflect on.");
        let r = serde_json::to_value(refused(Refusal::MemfsDisabled)).expect("json");
        assert_eq!(r["reason"], "memfs_disabled");
        let r = serde_json::to_value(failed("disk full")).expect("json");
        assert_eq!(r["reason"], "error");
        assert!(
            r["message"]
                .as_str()
                .is_some_and(|m| m.contains("disk full"))
        );
        for reason in [
            Refusal::MemfsDisabled,
            Refusal::AlreadyActive,
            Refusal::ParentDirty,
            Refusal::NoPayload,
            Refusal::Backoff,
            Refusal::Error,
        ] {
            assert_eq!(
                serde_json::to_value(reason).expect("json"),
                json!(reason.as_str())
            );
        }
    }

    #[test]
    fn backoff_and_launched_shapes() {
        let r = serde_json::to_value(backoff(datetime!(2026-12-02 10:01 UTC))).expect("json");
        assert_eq!(r["launched"], false);
        assert_eq!(r["reason"], "backoff");
        assert_eq!(r["retry_at"], "2026-12-02T10:01:00Z");
        assert!(
            r["message"]
                .as_str()
                .is_some_and(|m| m.contains("2026-12-02T10:01:00Z"))
        );
        let r = serde_json::to_value(launched("L1", vec!["c1".into()])).expect("json");
        assert_eq!(r["launched"], true);
        assert_eq!(r["launch_id"], "L1");
        assert_eq!(r["conversations"], json!(["c1"]));
        assert!(r.get("reason").is_none());
        let back: LaunchResult = serde_json::from_value(r).expect("parse");
        assert!(back.launched);
    }

    #[test]
    fn precheck_order_and_manual_bypass() {
        let until = datetime!(2026-12-02 10:01 UTC);
        let all_bad = Precheck {
            memfs_enabled: false,
            already_active: true,
            manual: false,
            backoff_until: Some(until),
            parent_dirty: true,
        };
        let reason = |p: &Precheck| precheck(p).and_then(|r| r.reason);
        assert_eq!(reason(&all_bad), Some(Refusal::MemfsDisabled));
        let p = Precheck {
            memfs_enabled: true,
            ..all_bad.clone()
        };
        assert_eq!(reason(&p), Some(Refusal::AlreadyActive));
        let p = Precheck {
            already_active: false,
            ..p
        };
        assert_eq!(reason(&p), Some(Refusal::Backoff));
        let manual = Precheck {
            manual: true,
            ..p.clone()
        };
        assert_eq!(
            reason(&manual),
            Some(Refusal::ParentDirty),
            "manual ignores backoff"
        );
        let clean = Precheck {
            parent_dirty: false,
            ..manual
        };
        assert!(precheck(&clean).is_none());
    }

    #[test]
    fn completion_lines_are_exact() {
        let line = |s: &str, sum: Option<&str>| {
            completion_line(&CompletionStatus::from_finalize(s, sum).expect("status"))
        };
        assert_eq!(line("merged", None), "Dreamed and made some memories.");
        assert_eq!(
            line("no_changes", None),
            "Dreamed; no memory changes were needed."
        );
        assert_eq!(
            line("parent_dirty", None),
            "Tried to reflect, but parent memory had uncommitted changes; will retry later."
        );
        assert_eq!(
            line("merge_conflict", None),
            "Tried to reflect, but memory updates conflicted with newer changes; will retry later."
        );
        assert_eq!(
            line("dirty_uncommitted", None),
            "Tried to reflect, but memory changes were not committed cleanly; will retry later."
        );
        assert_eq!(
            line("failed", None),
            "Tried to reflect, but memory updates were not completed cleanly; will retry later."
        );
        assert_eq!(
            line(
                "failed",
                Some(
                    "Reflection integration did not complete (boom); the worktree was cleaned up so the transcript can be retried."
                )
            ),
            "Reflection integration did not complete (boom); the worktree was cleaned up so the transcript can be retried. Will retry later."
        );
        assert_eq!(CompletionStatus::from_finalize("weird", None), None);
        assert_eq!(
            with_recompile_failure("Dreamed and made some memories.", "bad frontmatter"),
            "Dreamed and made some memories. System prompt recompilation failed: bad frontmatter"
        );
    }

    #[test]
    fn status_consequences() {
        assert!(CompletionStatus::Merged.consumes_transcript());
        assert!(CompletionStatus::NoChanges.consumes_transcript());
        assert!(!CompletionStatus::ParentDirty.consumes_transcript());
        assert!(!CompletionStatus::Failed.consumes_transcript());
        assert!(CompletionStatus::ParentDirty.backs_off());
        assert!(CompletionStatus::MergeConflict.backs_off());
        assert!(!CompletionStatus::Failed.backs_off());
        assert!(CompletionStatus::Merged.recompiles());
        assert!(!CompletionStatus::NoChanges.recompiles());
    }
}
