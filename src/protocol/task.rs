//! What a sub-agent child is launched to do (`task.get`): recorded by the
//! supervisor at launch, keyed by the child's id, so a child learns its
//! task from the supervisor's table and never from its own arguments.

use serde::{Deserialize, Serialize};

/// Kinds of sub-agent.
pub const KIND_REFLECTION: &str = "reflection";
pub const KIND_MEMORY_WORKER: &str = "memory-worker";

/// Longest report a child may leave (`task.finish`); the rest is cut.
pub const MAX_REPORT_BYTES: usize = 64 * 1024;

/// A sub-agent's task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubagentTask {
    /// `reflection` or `memory-worker`.
    pub kind: String,
    /// The system prompt.
    pub system: String,
    /// The first user message.
    pub prompt: String,
    /// The memory directory the child edits (its worktree).
    pub memory_dir: String,
    /// The window its model requests declare.
    #[serde(default)]
    pub context_window: Option<u64>,
    /// Model responses at most.
    pub max_steps: u32,
    /// The tools it is offered, by name.
    pub tools: Vec<String>,
}
