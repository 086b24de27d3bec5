//! The agent child's own stream, between the CLI that starts a turn and
//! the child that runs it: a [`TurnInput`] on the child's stdin, then
//! [`TurnEvent`]s as JSON lines on its stdout. The child also reports its
//! events (text deltas aside) to the supervisor with `turn.event`, which
//! re-broadcasts them to subscribers (`attach`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::messages::Usage;

/// What starts a turn (sent to the agent child on its stdin).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TurnInput {
    pub text: String,
    #[serde(default = "default_conversation")]
    pub conversation: String,
    /// Model handle overriding the agent's.
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub max_steps: Option<u32>,
    #[serde(default)]
    pub workspace: Option<String>,
    /// Recompile the system prompt before the first step.
    #[serde(default)]
    pub recompile: bool,
    /// First turn of a session: the agent-info reminder is sent once per
    /// session (an interactive chat is one session; each `chat -p` is one).
    #[serde(default = "yes")]
    pub new_session: bool,
    /// `chat --context-window N`: the conversation's context window from
    /// now on (the child stores it in the conversation's settings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    /// `MINI_LETTA_CONTEXT_WINDOW` as the CLI saw it: this turn's window,
    /// not stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window_override: Option<u64>,
    /// `MINI_LETTA_REFLECTION_CONTEXT_WINDOW` as the CLI saw it: the window
    /// reflection sub-agents get (parsed and resolved, not used yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reflection_context_window: Option<u64>,
    /// Not a turn: compact the conversation now (`mini-letta compact`),
    /// in this mode (`all` or `sliding_window`); `text` is ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compact: Option<String>,
    /// `chat --timings`: the agent reports its marks (and the stage's) in a
    /// `timings` event after `done`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timings: bool,
}

fn yes() -> bool {
    true
}

fn default_conversation() -> String {
    "default".into()
}

/// Events of a turn, streamed to whoever runs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TurnEvent {
    Reminders {
        items: Vec<String>,
    },
    Step {
        n: u32,
    },
    MemoryUpdate {
        revision: Option<String>,
    },
    TextDelta {
        text: String,
    },
    ToolCall {
        id: String,
        name: String,
        arguments: Value,
    },
    ToolResult {
        id: String,
        name: String,
        text: String,
        is_error: bool,
    },
    /// A transient failure; try `attempt` (1: the first retry) follows
    /// after `delay_ms`.
    Retry {
        attempt: u32,
        error: String,
        #[serde(default)]
        delay_ms: u64,
    },
    /// The conversation was compacted (spec agent-loop.md §5): `trigger` is
    /// `context_window_limit`, `context_window_overflow` or `manual`;
    /// `mode` the one applied (`sliding_window` or `all`); counts and
    /// token estimates are of the in-context messages.
    Compaction {
        trigger: String,
        mode: String,
        messages_before: u64,
        messages_after: u64,
        tokens_before: u64,
        tokens_after: u64,
    },
    /// The turn waits for another turn of its conversation to finish
    /// (written by the supervisor before the child starts).
    Waiting {
        reason: String,
    },
    /// The finished turn triggered a reflection, which runs on under the
    /// supervisor (`waits`: this command's own supervisor, which waits for
    /// it before exiting). Reported by the CLI from the supervisor's answer.
    Reflection {
        trigger: String,
        waits: bool,
    },
    /// Why the turn failed, with what to do about it when that is known;
    /// sent before its `done` (stop reason `error`).
    Error {
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hint: Option<String>,
    },
    Done {
        stop_reason: String,
        text: String,
        steps: u32,
        usage: Usage,
    },
    /// The marks the child stage and the agent program recorded (only when
    /// the turn input asked for them), after `done`.
    Timings {
        marks: Vec<super::timings::Mark>,
    },
}
