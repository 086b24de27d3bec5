//! A conversation's cached compiled system prompt (`system-prompt.json`).
//!
//! The turn loop writes it when it compiles; `mini-letta prompt` shows it
//! unless asked for a fresh compile.

use serde::{Deserialize, Serialize};

use super::StoreError;
use super::conversation::{self, ConversationError, MAX_JSON_BYTES};
use crate::paths::{AgentPaths, SYSTEM_PROMPT_FILE_NAME};

/// The conversation directory is the agent's: it is reached by descriptor
/// ([`conversation::open_dir`]), and its errors are reported as I/O errors
/// of the cached prompt's path.
fn dir_error(path: std::path::PathBuf) -> impl FnOnce(ConversationError) -> StoreError {
    move |e| match e {
        ConversationError::Paths(p) => StoreError::Paths(p),
        ConversationError::Io { path, source } => StoreError::Io { path, source },
        e => StoreError::Io {
            path,
            source: std::io::Error::other(e.to_string()),
        },
    }
}

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
    let Some(dir) =
        conversation::open_dir(agent, conversation, false).map_err(dir_error(path.clone()))?
    else {
        return Ok(None);
    };
    let bytes = match conversation::read_optional(&dir, SYSTEM_PROMPT_FILE_NAME, MAX_JSON_BYTES) {
        Ok(Some(b)) => b,
        Ok(None) => return Ok(None),
        Err(e) => return Err(dir_error(path)(e.into())),
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
    let path = agent.conversation(conversation)?.system_prompt_json();
    let dir = conversation::open_dir(agent, conversation, true)
        .map_err(dir_error(path.clone()))?
        .ok_or_else(|| StoreError::Io {
            path: path.clone(),
            source: std::io::ErrorKind::NotFound.into(),
        })?;
    let mut json = serde_json::to_vec_pretty(prompt).map_err(|source| StoreError::BadRecord {
        path: path.clone(),
        source,
    })?;
    json.push(b'\n');
    dir.replace_file(SYSTEM_PROMPT_FILE_NAME, &json, 0o644)
        .map_err(|e| dir_error(path)(e.into()))
}
