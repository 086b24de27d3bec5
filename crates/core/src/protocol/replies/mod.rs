//! What the supervisor answers: one type per method's result. The
//! supervisor builds these and nothing else
//! ([`Outcome::reply`](super::Outcome::reply)); the CLI, Palace and the
//! children read them ([`super::client::Client::call_as`]).
//!
//! Readers are lenient where a newer supervisor may say more: unknown
//! fields are ignored, or kept whole in a `rest` map where a reply is also
//! printed as JSON (`--json` shows everything that came). On the wire a
//! reply is a JSON object with its keys in sorted order, as before these
//! types existed, so the bytes do not depend on field order here.

mod reflect;
mod reply;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::events::ChildEnd;
use super::timings::Mark;

pub use reply::{Reply, decode};

pub use reflect::{
    Attempt, BackoffView, LaunchResult, LockView, MergePart, ReflectLaunch, ReflectStatus, Refusal,
    RunningSlot, SettingsView, StateView, SubagentResult, TaskPart, TaskStatus, TranscriptRef,
    WorkerRow,
};

/// `ping`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pong {
    pub pong: bool,
}
impl Reply for Pong {}

/// An answer that says nothing but that the request was taken (`log`,
/// `turn.event`): `{}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {}
impl Reply for Ack {}

/// `supervisor.status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SupervisorStatus {
    pub running: bool,
    pub pid: u32,
    pub uptime_ms: u64,
    pub home: PathBuf,
    pub socket: PathBuf,
    pub version: String,
    pub protocol: u32,
    /// Live children.
    pub children: usize,
    /// Children in the table, ended ones too.
    pub children_known: usize,
    /// Requests taken from CLI peers since the start.
    pub cli_requests: u64,
}
impl Reply for SupervisorStatus {}

/// `supervisor.stop`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stopping {
    pub stopping: bool,
}
impl Reply for Stopping {}

/// `events.subscribe`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscribed {
    pub subscribed: bool,
}
impl Reply for Subscribed {}

/// Lifecycle of a child (`state` in a `ps` row).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum ChildState {
    /// Confined and waiting for a turn to be handed over; its channel is
    /// not served yet.
    Warm,
    /// Launched, no frame received yet.
    Starting,
    /// Said hello on its channel.
    Running,
    Exited {
        code: i32,
    },
    Killed {
        signal: i32,
    },
}

impl ChildState {
    /// Whether the child still runs (or waits, warm).
    pub fn is_live(&self) -> bool {
        matches!(
            self,
            ChildState::Warm | ChildState::Starting | ChildState::Running
        )
    }
}

/// A live child's current figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveFigures {
    pub cpu_ms: u64,
    pub memory_bytes: u64,
    pub peak_memory_bytes: Option<u64>,
}

/// A child as `ps` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildRow {
    pub id: u64,
    pub agent: String,
    pub agent_name: String,
    pub role: String,
    pub pid: u32,
    pub uptime_ms: u64,
    #[serde(flatten)]
    pub state: ChildState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_frame_us: Option<u64>,
    /// A live child's figures (none for an ended one).
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub figures: Option<LiveFigures>,
}

/// `ps`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Children {
    pub children: Vec<ChildRow>,
}
impl Reply for Children {}

/// `child.spawn`: the launched child; a turn's answer starts with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Started {
    pub child: u64,
    pub pid: u32,
    /// The agent id.
    pub agent: String,
    pub role: String,
    /// The child was started ahead of its turn and handed it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warm: bool,
    /// The launch's marks, when the caller asked for them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<Vec<Mark>>,
}
impl Reply for Started {}

/// `child.kill`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signalled {
    pub signalled: u64,
}
impl Reply for Signalled {}

/// `child.timings`: a child's launch marks in time order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildMarks {
    pub child: u64,
    pub marks: Vec<Mark>,
}
impl Reply for ChildMarks {}

impl Reply for super::frames::Committed {}

/// The `data` of a `validation_failed` error: the validator's messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violations {
    pub violations: Vec<String>,
}

/// `memory.status`: the caller's checkout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryStatus {
    pub head: Option<String>,
    pub dirty: Vec<String>,
    /// The sub-agent's worktree the status is of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<String>,
}
impl Reply for MemoryStatus {}

/// `memory.lease`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leased {
    pub leased: bool,
    pub agent: String,
}
impl Reply for Leased {}

/// `memory.release`: whether a lease was held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Released {
    pub released: bool,
}
impl Reply for Released {}

/// `model.info`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub model: String,
    pub context_window: Option<u64>,
}
impl Reply for ModelInfo {}

impl Reply for super::messages::ModelResponse {}

/// How a sync ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncStatus {
    /// No remote configured.
    Skipped,
    /// Nothing to push (possibly after fast-forwarding to the remote).
    Clean,
    /// Local commits were pushed.
    Pushed,
    /// The checkout has uncommitted changes; nothing was touched.
    Dirty,
    /// Local commits do not apply on the remote; `main` is unchanged.
    Conflict,
    /// The tree that would be pushed fails validation; `main` is unchanged.
    Invalid,
    /// The remote refused the push (also after one fetch + rebase retry).
    PushFailed,
    /// In a cluster: this host no longer owns the agent (etcd says so, or
    /// the remote's fence is another owner's); nothing was pushed.
    OwnershipLost,
}

impl SyncStatus {
    /// Whether the memory and the remote agree afterwards.
    pub fn is_settled(self) -> bool {
        matches!(
            self,
            SyncStatus::Skipped | SyncStatus::Clean | SyncStatus::Pushed
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SyncStatus::Skipped => "skipped",
            SyncStatus::Clean => "clean",
            SyncStatus::Pushed => "pushed",
            SyncStatus::Dirty => "dirty",
            SyncStatus::Conflict => "conflict",
            SyncStatus::Invalid => "invalid",
            SyncStatus::PushFailed => "push_failed",
            SyncStatus::OwnershipLost => "ownership_lost",
        }
    }
}

/// The result of a sync (memfs's `sync`), as a turn's answer and
/// `memory.sync` carry it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncOutcome {
    pub status: SyncStatus,
    pub message: String,
    /// Local `main` afterwards.
    #[serde(default)]
    pub local: Option<String>,
    /// The remote `main` as last seen (after a successful push: what was
    /// pushed).
    #[serde(default)]
    pub remote: Option<String>,
    /// The backup ref written before local history was rewritten.
    #[serde(default)]
    pub backup_ref: Option<String>,
    #[serde(default)]
    pub pushed_commits: usize,
    /// After `--repair`: the paths whose local change is not on `main`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_carried_over: Vec<String>,
}

impl SyncOutcome {
    /// A sync that did not get as far as an outcome of its own (the
    /// memory lease, the sync's thread).
    pub fn push_failed(message: impl Into<String>) -> Self {
        Self::new(SyncStatus::PushFailed, message)
    }

    pub fn new(status: SyncStatus, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            local: None,
            remote: None,
            backup_ref: None,
            pushed_commits: 0,
            not_carried_over: Vec::new(),
        }
    }
}

/// `memory.sync` (and `memory.repair`): the outcome, for which agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemorySynced {
    #[serde(flatten)]
    pub outcome: SyncOutcome,
    /// The agent id.
    pub agent: String,
    pub name: String,
    /// The agent was cloned from the remote first.
    #[serde(default)]
    pub cloned: bool,
    /// Where local commits were set aside for a repair, if they were.
    #[serde(default)]
    pub repair_branch: Option<String>,
}
impl Reply for MemorySynced {}

/// `turn.run`: the launched child and how the turn ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnEnded {
    #[serde(flatten)]
    pub started: Started,
    pub exit: ChildEnd,
    pub conversation: String,
    /// The turn was cancelled (its caller went, or `turn.cancel`).
    pub cancelled: bool,
    /// The reflection the finished turn launched, or why not (absent when
    /// the trigger did not fire).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reflection: Option<ReflectLaunch>,
    /// The sync after the turn's commits, when a remote is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<SyncOutcome>,
}
impl Reply for TurnEnded {}

/// `turn.cancel`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnCancelled {
    pub agent: String,
    pub conversation: String,
    /// A turn was running and was told to stop.
    pub cancelled: bool,
}
impl Reply for TurnCancelled {}

impl Reply for super::task::SubagentTask {}

/// `task.finish`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kept {
    pub kept: bool,
}
impl Reply for Kept {}

/// `recall.delegate`: what the recall sub-agent found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Findings {
    pub child: u64,
    pub findings: String,
}
impl Reply for Findings {}

/// `memory.merge`: the integration's merge as memfs finalized it. The
/// fields a reader decides on are typed; the rest (conflicts, errors) is
/// kept as it came.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Merged {
    pub status: String,
    #[serde(default)]
    pub summary: String,
    #[serde(default)]
    pub commit_count: usize,
    #[serde(default)]
    pub merge_commit: Option<String>,
    #[serde(default)]
    pub changed_paths: Vec<String>,
    /// The branch merged (or refused).
    #[serde(default)]
    pub branch: String,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}
impl Reply for Merged {}

/// `agent.release`: this host gave up the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentReleased {
    pub agent: String,
    pub name: String,
    pub released: bool,
    /// This host.
    pub host: String,
}
impl Reply for AgentReleased {}

/// `worker.start`: the worker launched, queued behind the running one, or
/// why it could not start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerStarted {
    pub launched: bool,
    /// Waiting behind the running worker, at `position`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub queued: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// Why it did not launch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Refusal>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
impl Reply for WorkerStarted {}

impl WorkerStarted {
    /// Waiting behind the running worker.
    pub fn queued(position: usize) -> Self {
        Self {
            launched: false,
            queued: true,
            position: Some(position),
            agent: None,
            child: None,
            worktree: None,
            branch: None,
            reason: None,
            message: None,
        }
    }

    /// Not launched, and why.
    pub fn refused(r: LaunchResult) -> Self {
        Self {
            launched: false,
            reason: r.reason,
            message: Some(r.message),
            ..Self::queued(0)
        }
        .not_queued()
    }

    /// Running as `child` on `branch` in `worktree`.
    pub fn launched(agent: String, child: u64, worktree: PathBuf, branch: String) -> Self {
        Self {
            launched: true,
            agent: Some(agent),
            child: Some(child),
            worktree: Some(worktree),
            branch: Some(branch),
            ..Self::queued(0)
        }
        .not_queued()
    }

    fn not_queued(self) -> Self {
        Self {
            queued: false,
            position: None,
            ..self
        }
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
