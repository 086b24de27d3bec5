//! A conversation's cached compiled system prompt (`system-prompt.json`).
//!
//! The turn loop writes it when it compiles; `mini-letta prompt` shows it
//! unless asked for a fresh compile.

use std::fs;

use serde::{Deserialize, Serialize};

use super::store::StoreError;
use crate::fsutil::atomic_write;
use crate::paths::AgentPaths;

/// What `system-prompt.json` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedPrompt {
    pub content: String,
    pub core_memory: String,
    pub compiled_at: String,
    pub raw_system_hash: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memfs_revision: Option<String>,
}

/// The cached prompt of `conversation`, if one was written.
pub fn load(agent: &AgentPaths, conversation: &str) -> Result<Option<CachedPrompt>, StoreError> {
    let path = agent.conversation(conversation)?.system_prompt_json();
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(StoreError::Io { path, source }),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| StoreError::BadRecord { path, source })
}

/// Write the cached prompt of `conversation` atomically.
pub fn store(
    agent: &AgentPaths,
    conversation: &str,
    prompt: &CachedPrompt,
) -> Result<(), StoreError> {
    let conv = agent.conversation(conversation)?;
    let io = |path: &std::path::Path| {
        let path = path.to_path_buf();
        move |source| StoreError::Io { path, source }
    };
    fs::create_dir_all(conv.dir()).map_err(io(conv.dir()))?;
    let path = conv.system_prompt_json();
    let mut json = serde_json::to_vec_pretty(prompt).map_err(|source| StoreError::BadRecord {
        path: path.clone(),
        source,
    })?;
    json.push(b'\n');
    atomic_write(&path, &json).map_err(io(&path))
}
