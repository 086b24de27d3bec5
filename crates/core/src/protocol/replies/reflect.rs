//! The sub-agents' replies: a reflection's launch (`reflect.run`, and the
//! one a turn's answer carries), how a sub-agent's run ended (the result
//! records, in two parts: what merged and how the task ended), and
//! `reflect.status`. The reflection library words them; the supervisor
//! passes them on; the CLI and Palace read them.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::reply::Reply;
use crate::protocol::events::ChildEnd;

/// Why a reflection was not launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// The agent has no git-backed memory.
    MemfsDisabled,
    /// Another reflection of this agent holds `reflection.lock`.
    AlreadyActive,
    /// The parent memory checkout has uncommitted changes.
    ParentDirty,
    /// No conversation has unreflected content.
    NoPayload,
    /// An automatic launch during the backoff after a failed merge.
    Backoff,
    /// Anything else went wrong while preparing the launch.
    Error,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::MemfsDisabled => "memfs_disabled",
            Refusal::AlreadyActive => "already_active",
            Refusal::ParentDirty => "parent_dirty",
            Refusal::NoPayload => "no_payload",
            Refusal::Backoff => "backoff",
            Refusal::Error => "error",
        }
    }
}

/// What a launch attempt decided before anything ran: `{launched, reason?,
/// message, …}` (the texts are the reflection library's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchResult {
    pub launched: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Refusal>,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_id: Option<String>,
    /// The conversations the launched reflection reads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conversations: Vec<String>,
    /// When automatic launches resume (a `backoff` refusal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<String>,
}

/// A transcript a launched reflection reads, up to which message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TranscriptRef {
    pub conversation_id: String,
    pub end_message_id: String,
}

/// `reflect.run`, and a finished turn's `reflection`: the launched child,
/// or why none was launched; with `wait`, how it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReflectLaunch {
    pub launched: bool,
    /// Why not, when not launched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Refusal>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When automatic launches resume (a `backoff` refusal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<String>,
    /// The agent id, once launched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child: Option<u64>,
    /// `manual`, `step-count` or `compaction-event`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transcripts: Option<Vec<TranscriptRef>>,
    /// How it ended (`reflect.run` with `wait`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<SubagentResult>,
}
impl Reply for ReflectLaunch {}

impl From<LaunchResult> for ReflectLaunch {
    fn from(r: LaunchResult) -> Self {
        Self {
            launched: r.launched,
            reason: r.reason,
            message: Some(r.message),
            retry_at: r.retry_at,
            agent: None,
            child: None,
            trigger: None,
            worktree: None,
            branch: None,
            transcripts: None,
            result: None,
        }
    }
}

impl ReflectLaunch {
    /// Not launched: nothing new to reflect on (an answer, not a failure).
    pub fn nothing_new(&self) -> bool {
        self.reason == Some(Refusal::NoPayload)
    }
}

/// How a sub-agent's task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// The child exited 0: it says it did what it was asked.
    Finished,
    /// The child exited with an error (its model failed, a step limit…).
    Failed,
    /// The child was killed (a signal, a deadline, the OOM killer).
    Killed,
    /// Stopped with its supervisor: the next one runs it again, and the
    /// run is not counted against the instruction.
    Interrupted,
    /// No child ran (the worktree or the launch failed).
    NotStarted,
}

impl TaskStatus {
    /// From the child's end; `stopping`: its supervisor is stopping.
    pub fn of(end: &ChildEnd, stopping: bool) -> Self {
        match end {
            ChildEnd::Exited { code: 0 } => TaskStatus::Finished,
            _ if stopping => TaskStatus::Interrupted,
            ChildEnd::Exited { .. } => TaskStatus::Failed,
            ChildEnd::Killed { .. } => TaskStatus::Killed,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Finished => "finished",
            TaskStatus::Failed => "failed",
            TaskStatus::Killed => "killed",
            TaskStatus::Interrupted => "interrupted",
            TaskStatus::NotStarted => "not_started",
        }
    }
}

/// The task part of an outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskPart {
    pub status: TaskStatus,
    /// The child's end (`{"state": "exited", "code": 1}`), `null` when
    /// none ran.
    #[serde(default)]
    pub exit: Value,
    /// The sub-agent's report (its last text, or its error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<String>,
}

impl TaskPart {
    /// The task part of a child that ended with `end`.
    pub fn ended(end: &ChildEnd, stopping: bool, report: Option<String>) -> Self {
        TaskPart {
            status: TaskStatus::of(end, stopping),
            exit: serde_json::to_value(end).unwrap_or_default(),
            report,
        }
    }

    /// A run that never started, and why.
    pub fn not_started(why: impl Into<String>) -> Self {
        TaskPart {
            status: TaskStatus::NotStarted,
            exit: Value::Null,
            report: Some(why.into()),
        }
    }
}

/// The merge part of an outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergePart {
    /// The finalize status (`merged`, `no_changes`, `merge_conflict`,
    /// `failed`, `discarded`, `invalid`, `parent_dirty`, …).
    pub status: String,
    #[serde(default)]
    pub summary: String,
    /// Commits the branch had on top of `main`.
    #[serde(default)]
    pub commit_count: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_commit: Option<String>,
    /// Paths the merge changed in `main` (or, for a conflict, those that
    /// conflicted).
    #[serde(default)]
    pub changed_paths: Vec<String>,
}

impl MergePart {
    /// Whether anything reached `main`.
    pub fn landed(&self) -> bool {
        self.status == "merged"
    }
}

/// One run of a queued instruction, as its queue entry keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attempt {
    /// 1 for the first run.
    pub attempt: u32,
    pub finished_at: String,
    /// `None` when no child ran (nothing to merge).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge: Option<MergePart>,
    pub task: TaskPart,
}

/// How a sub-agent's run ended, as its result record keeps it
/// (`reflections/last-result.json`, `last-worker.json`) and `reflect.run`
/// with `wait` answers it. `status` is the merge status (the older shape's
/// one field); `merge` and `task` are the two parts. What else a record
/// holds (the branch, conflicts, the integration, the queue entry) is kept
/// as it came.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubagentResult {
    pub status: String,
    #[serde(default)]
    pub summary: String,
    /// The line the user is shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge: Option<MergePart>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskPart>,
    #[serde(
        rename = "finishedAt",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub finished_at: Option<String>,
    /// A worker's run: which run of its instruction this was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// A worker's run: what happens to its instruction now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl SubagentResult {
    /// A run that failed before it had a record of its own.
    pub fn failed(summary: impl Into<String>) -> Self {
        Self {
            status: "failed".into(),
            summary: summary.into(),
            message: None,
            merge: None,
            task: None,
            finished_at: None,
            attempt: None,
            next: None,
            rest: Map::new(),
        }
    }

    /// A record read from its JSON; one that is not a record at all is a
    /// failed run saying so (a reader never fails on a file it finds).
    pub fn from_record(v: Value) -> Self {
        serde_json::from_value(v)
            .unwrap_or_else(|e| Self::failed(format!("an unreadable result record: {e}")))
    }

    /// Whether its change reached `main`.
    pub fn merged(&self) -> bool {
        self.status == "merged"
    }

    /// The merge status: the `merge` part's, else the record's own.
    pub fn merge_status(&self) -> &str {
        self.merge.as_ref().map_or(&self.status, |m| &m.status)
    }
}
impl Reply for SubagentResult {}

/// A reflection or memory worker running for the agent: `child` is none
/// while one is being prepared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningSlot {
    pub child: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preparing: bool,
}

impl RunningSlot {
    /// The slot as the supervisor keeps it: 0 is "being prepared".
    pub fn of(child: Option<u64>) -> Option<Self> {
        child.map(|c| match c {
            0 => RunningSlot {
                child: None,
                preparing: true,
            },
            c => RunningSlot {
                child: Some(c),
                preparing: false,
            },
        })
    }
}

/// The agent's reflection settings, as `reflect status` shows them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SettingsView {
    pub trigger: String,
    #[serde(rename = "stepCount")]
    pub step_count: u64,
    pub merge: String,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `reflection.lock`, when held.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LockView {
    pub pid: u32,
    /// Whether its owner still runs.
    pub alive: bool,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// The backoff after a failed merge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackoffView {
    pub delay_ms: u64,
    pub retry_at: String,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// One conversation's reflection cursor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StateView {
    pub conversation: String,
    #[serde(default)]
    pub steps_since_last_reflection: u64,
    #[serde(default)]
    pub reflected_through_message_id: Option<String>,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// An instruction kept until applied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerRow {
    pub id: String,
    /// The instruction, cut.
    pub instruction: String,
    /// `pending` or `failed`.
    pub status: String,
    pub attempts: u32,
    #[serde(rename = "queuedAt")]
    pub queued_at: String,
    pub conversation: Option<String>,
    /// A repair worker's.
    pub repair: bool,
    /// Its last run.
    pub last: Option<Attempt>,
}

/// `reflect.status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReflectStatus {
    pub agent: String,
    pub settings: SettingsView,
    pub lock: Option<LockView>,
    pub backoff: Option<BackoffView>,
    pub last: Option<SubagentResult>,
    pub last_worker: Option<SubagentResult>,
    pub conversations: Vec<StateView>,
    pub workers_kept: usize,
    pub workers_failing: usize,
    pub workers_failed: usize,
    pub workers: Vec<WorkerRow>,
    /// The reflection running in this supervisor.
    #[serde(default)]
    pub running: Option<RunningSlot>,
    /// The memory worker running in this supervisor.
    #[serde(default)]
    pub worker: Option<RunningSlot>,
    /// Workers queued behind it.
    #[serde(default)]
    pub workers_waiting: usize,
}
impl Reply for ReflectStatus {}
