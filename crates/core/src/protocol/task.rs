//! What a sub-agent child is launched to do (`task.get`): recorded by the
//! supervisor at launch, keyed by the child's id, so a child learns its
//! task from the supervisor's table and never from its own arguments.

use serde::{Deserialize, Serialize};

/// Kinds of sub-agent.
pub const KIND_REFLECTION: &str = "reflection";
pub const KIND_MEMORY_WORKER: &str = "memory-worker";
pub const KIND_RECALL: &str = "recall";

/// Longest report a child may leave (`task.finish`); the rest is cut.
pub const MAX_REPORT_BYTES: usize = 64 * 1024;

/// A sub-agent's task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubagentTask {
    /// `reflection`, `memory-worker` or `recall`.
    pub kind: String,
    /// The system prompt.
    pub system: String,
    /// The first user message.
    pub prompt: String,
    /// The memory directory the child edits (its worktree); empty for a
    /// sub-agent that edits nothing (recall).
    pub memory_dir: String,
    /// A conversation whose context the sub-agent starts from (a recall
    /// sub-agent forks its parent's), read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork_conversation: Option<String>,
    /// The window its model requests declare.
    #[serde(default)]
    pub context_window: Option<u64>,
    /// Model responses at most.
    pub max_steps: u32,
    /// The tools it is offered, by name.
    pub tools: Vec<String>,
}

/// A report cut to at most [`MAX_REPORT_BYTES`], at a character boundary:
/// what a child may leave, whatever it sends.
pub fn clip_report(report: &str) -> String {
    if report.len() <= MAX_REPORT_BYTES {
        return report.to_string();
    }
    let mut end = MAX_REPORT_BYTES;
    while !report.is_char_boundary(end) {
        end -= 1;
    }
    report[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_cut_at_the_cap_and_a_character_boundary() {
        assert_eq!(clip_report("short"), "short");
        let long = "日".repeat(MAX_REPORT_BYTES);
        let cut = clip_report(&long);
        assert!(cut.len() <= MAX_REPORT_BYTES && cut.len() > MAX_REPORT_BYTES - 3);
        assert!(cut.chars().all(|c| c == '日'));
    }
}
