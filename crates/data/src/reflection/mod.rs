//! Reflection: background sub-agents that read what was said in an agent's
//! conversations and fold what is worth keeping into its memory (spec
//! memfs-git.md §5).
//!
//! This module is the library side only — no processes:
//!
//! * [`settings`] — when reflection runs (`reflections/settings.json`);
//! * [`state`] — each conversation's cursor and step count
//!   (`conversations/<id>/reflection-state.json`);
//! * [`payload`] — choosing the unreflected transcript slices and writing
//!   them for the sub-agent (`reflections/payloads/<launch-id>/`);
//! * [`lock`] — one reflection per agent at a time (`reflection.lock`);
//! * [`backoff`] — automatic launches pause after failed merges
//!   (`reflections/backoff.json`);
//! * [`trigger`] — whether a finished turn should launch one;
//! * [`launch_result`] — the refusal reasons, result shape and completion lines;
//! * [`outcome`] — a run's two parts, what merged and whether the task
//!   finished, and what that means for its instruction;
//! * [`queue`] — memory-worker instructions kept until they are done;
//! * [`rerun`] — when an instruction whose run failed runs again;
//! * [`repair`] — repairs of a worker's conflicted merge, once each;
//! * [`prepare`] / [`finalize`] — a run's start and end on a blocking
//!   thread (checks, worktree and task; the finalize ladder, the settling);
//! * [`recover`] — what a stopped supervisor left, put right at start;
//! * [`status`] — what `reflect status` shows;
//! * [`prompt`] — what the sub-agent is told.
//!
//! The supervisor runs the children; this library holds what they are
//! given and what their runs mean (memory repositories only through
//! `memfs`).
//!
//! The supervisor (root) reads and writes all of this, but conversation
//! directories and `reflections/` belong to the agent's uid. So every file
//! is reached through [`crate::agentfs::Dir`] (no symlink followed, reads
//! capped), and content that does not parse is an error or a default,
//! never a panic.

pub mod backoff;
pub mod finalize;
pub mod launch_result;
pub mod lock;
pub mod outcome;
pub mod payload;
pub mod prepare;
pub mod prompt;
pub mod queue;
pub mod recover;
pub mod repair;
pub mod rerun;
pub mod settings;
pub mod state;
pub mod status;
pub mod trigger;

use std::path::PathBuf;

use serde::de::DeserializeOwned;

use crate::agentfs::{Dir, FsError};
use crate::paths::{AgentPaths, PathsError, REFLECTIONS_DIR_NAME};
use crate::store::conversation::ConversationError;

/// Largest small JSON file read here (settings, state, backoff, lock).
pub(crate) const MAX_SMALL_JSON_BYTES: u64 = 64 << 10;

/// Mode of `reflections/` and the payload directories: the confined
/// reflection child (the agent's uid, or another) must be able to read them.
pub(crate) const PUBLIC_DIR_MODE: u32 = 0o755;
/// Mode of files written for the sub-agent to read.
pub(crate) const PUBLIC_FILE_MODE: u32 = 0o644;

/// Modes of the supervisor's own files beside an agent's directory.
pub(crate) const PRIVATE_DIR_MODE: u32 = 0o700;
pub(crate) const PRIVATE_FILE_MODE: u32 = 0o600;

#[derive(Debug, thiserror::Error)]
pub enum ReflectionError {
    #[error(transparent)]
    Paths(#[from] PathsError),
    #[error(transparent)]
    Fs(#[from] FsError),
    #[error(transparent)]
    Conversation(#[from] ConversationError),
    /// The agent's memory repository could not be read.
    #[error("memory: {0}")]
    Memory(#[from] crate::memfs::repo::RepoError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file's content is not what it should be.
    #[error("{path}: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error("invalid reflection settings: {0}")]
    InvalidSettings(String),
    /// A cursor named a message the conversation does not have.
    #[error("conversation {conversation}: no message {message_id}")]
    UnknownMessage {
        conversation: String,
        message_id: String,
    },
}

/// The agent directory (the supervisor's: opened by path).
pub(crate) fn open_agent_dir(agent: &AgentPaths) -> Result<Dir, ReflectionError> {
    Ok(Dir::open(agent.dir())?)
}

/// `reflections/` of `agent`, made (mode 0755) when `create`; `None` when
/// missing and not `create`.
pub(crate) fn open_reflections_dir(
    agent: &AgentPaths,
    create: bool,
) -> Result<Option<Dir>, ReflectionError> {
    let top = open_agent_dir(agent)?;
    if create {
        let made = top.create_dir(REFLECTIONS_DIR_NAME, PUBLIC_DIR_MODE)?;
        return Ok(Some(made));
    }
    match top.open_dir(REFLECTIONS_DIR_NAME) {
        Ok(d) => Ok(Some(d)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The bytes of `name` in `dir` (at most `max`), `None` when missing.
pub(crate) fn read_optional(
    dir: &Dir,
    name: &str,
    max: u64,
) -> Result<Option<Vec<u8>>, ReflectionError> {
    match dir.read_file_capped(name, max) {
        Ok((bytes, _)) => Ok(Some(bytes)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// `name` in `dir` parsed as `T`; `Ok(None)` when missing, `Corrupt` when
/// it does not parse.
pub(crate) fn read_json<T: DeserializeOwned>(
    dir: &Dir,
    name: &str,
    max: u64,
) -> Result<Option<T>, ReflectionError> {
    let Some(bytes) = read_optional(dir, name, max)? else {
        return Ok(None);
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| ReflectionError::Corrupt {
            path: dir.path().join(name),
            message: format!("not valid JSON for this file: {e}"),
        })
}

/// Pretty JSON with a final newline.
pub(crate) fn to_pretty_json<T: serde::Serialize>(
    value: &T,
    path: PathBuf,
) -> Result<Vec<u8>, ReflectionError> {
    let mut json = serde_json::to_vec_pretty(value).map_err(|e| ReflectionError::Corrupt {
        path,
        message: e.to_string(),
    })?;
    json.push(b'\n');
    Ok(json)
}

/// The first `max` characters of `text`, with a note of how many more
/// there were (char-safe: never splits a code point).
pub fn truncate_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_string(),
        Some((cut, _)) => {
            let rest = text[cut..].chars().count();
            format!("{}… [truncated {rest} more characters]", &text[..cut])
        }
    }
}

#[cfg(test)]
pub(crate) mod testutil {
    use crate::paths::AgentPaths;
    use crate::protocol::messages::{Part, Role};
    use crate::store::conversation::{Conversation, StoredMessage};

    /// A bare agent directory in a temporary directory (enough for the
    /// conversation and reflection files; no record or memory repo).
    pub fn agent() -> (tempfile::TempDir, AgentPaths) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("agents").join("a1");
        std::fs::create_dir_all(&dir).expect("agent dir");
        (tmp, AgentPaths::from_dir(&dir))
    }

    /// Append a plain message; returns its id.
    pub fn say(conv: &mut Conversation, role: Role, text: &str) -> String {
        let id = conv.next_id();
        let m = StoredMessage::new(id.clone(), role, vec![Part::text(text)]);
        conv.append(m).expect("append");
        id
    }

    /// Append a message with a `kind`; returns its id.
    pub(crate) fn say_kind(conv: &mut Conversation, role: Role, text: &str, kind: &str) -> String {
        let id = conv.next_id();
        let mut m = StoredMessage::new(id.clone(), role, vec![Part::text(text)]);
        m.kind = Some(kind.into());
        conv.append(m).expect("append");
        id
    }

    /// Append a message with these parts; returns its id.
    pub(crate) fn say_parts(conv: &mut Conversation, role: Role, parts: Vec<Part>) -> String {
        let id = conv.next_id();
        conv.append(StoredMessage::new(id.clone(), role, parts))
            .expect("append");
        id
    }
}
