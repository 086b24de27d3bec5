//! `agent.json`: what an agent is.

use serde::{Deserialize, Serialize};

/// The system prompt a new agent gets unless `--system-file` says otherwise.
/// Memory is appended after a blank line (no `{CORE_MEMORY}` placeholder).
pub const DEFAULT_SYSTEM_PROMPT: &str = "You are a helpful assistant with long-term memory.\n\
Your memory is a git repository of Markdown files. The files below are your core memory and are \
always in view; directories listed as deferred memory hold more, behind their MEMORY.md index. \
Keep memory accurate and concise: record what matters about the user and yourself, and never \
store secrets.";

/// The model used when nothing else is configured: offline and deterministic.
pub const DEFAULT_MODEL: &str = "mock";

/// The agent record, as stored in `agents/<id>/agent.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentRecord {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    /// Raw system prompt; may contain `{CORE_MEMORY}`.
    pub system: String,
    #[serde(default)]
    pub tags: Vec<String>,
    pub model: String,
    /// Free-form model settings; `context_window_limit` (tokens) is the
    /// context window of the agent's turns (`agent create --context-window`).
    #[serde(default)]
    pub model_settings: serde_json::Map<String, serde_json::Value>,
    pub created_at: String,
    /// The uid this agent's confined processes run as (assigned by the
    /// supervisor at first launch when it runs as root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_uid: Option<u32>,
    /// Disk and inode quota: the agent's directory is a volume this size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<crate::sandbox::volume::Quota>,
    /// How its conversations are compacted (`mode`, `prompt`, `clip_chars`,
    /// `sliding_window_percentage`); the defaults when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction_settings: Option<super::context::compact::CompactionSettings>,
}
