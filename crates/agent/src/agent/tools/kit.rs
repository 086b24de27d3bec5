//! What every tool is made of: its row ([`Tool`]), the call's arguments,
//! where it acts ([`ToolContext`]), what it answers ([`ToolOutput`]), and
//! the small argument and text helpers all tools share.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::paths::AgentPaths;
use crate::protocol::client::Client;
use crate::protocol::messages::ToolSpec;

/// What a tool run produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    pub text: String,
    pub is_error: bool,
}

impl ToolOutput {
    pub(super) fn ok(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            is_error: false,
        }
    }
    pub(super) fn err(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            is_error: true,
        }
    }
}

/// Where tools act.
pub struct ToolContext {
    pub agent: AgentPaths,
    pub agent_id: String,
    pub conversation_id: String,
    pub workspace: Option<PathBuf>,
    /// The channel to the supervisor (memory commits).
    pub channel: Arc<Mutex<Client>>,
    /// A sub-agent's memory worktree: the memory tool and `$MEMORY_DIR`
    /// point there instead of the agent's checkout, its commits land on
    /// the worktree's branch (the supervisor routes them), and no lease is
    /// taken (nobody else edits a worktree).
    pub worktree: Option<PathBuf>,
    /// A sub-agent whose view of the agent is read-only (recall): tools
    /// read what is on disk and write nothing.
    pub read_only: bool,
    /// Directories `Read` may read besides the memory directory and the
    /// workspace (a reflection's payloads, which its prompt tells it to
    /// read); never written by any tool.
    pub read_roots: Vec<PathBuf>,
}

impl ToolContext {
    /// The memory directory the tools edit: the worktree of a sub-agent,
    /// else the agent's checkout.
    pub fn memory_dir(&self) -> PathBuf {
        self.worktree
            .clone()
            .unwrap_or_else(|| self.agent.memory_dir())
    }
}

/// A call's arguments: always a JSON object by the time a tool sees them.
pub(super) type Args = serde_json::Map<String, Value>;

/// One tool.
pub(super) struct Tool {
    /// The name the model calls it by.
    pub(super) name: &'static str,
    /// The schema the model is shown.
    pub(super) spec: fn() -> ToolSpec,
    /// Run one call. Malformed arguments are a tool error, never a crash.
    pub(super) run: fn(&ToolContext, &Args) -> ToolOutput,
}

/// A string argument.
pub(super) fn string<'a>(args: &'a Args, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}

/// `s` cut to `max` characters, marked when cut.
pub(super) fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let cut: String = s.chars().take(max).collect();
    format!("{cut}… [truncated]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_marks_what_it_cuts() {
        assert_eq!(truncate("abc", 3), "abc");
        assert_eq!(truncate("abcd", 3), "abc… [truncated]");
        assert_eq!(truncate("ééé", 2), "éé… [truncated]");
    }
}
