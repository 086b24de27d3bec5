//! Scripted mock (`mock/scripted`, its script named by
//! `MINI_LETTA_SCRIPTED_MODEL` in the supervisor's start-up environment):
//! canned answers read from a JSON file, one per request, so tests can drive exact sequences — tool calls,
//! transient failures, context overflows — through the real runtime.
//!
//! ```json
//! {"turns": [
//!   {"text": "hello"},
//!   {"tool_calls": [{"name": "Bash", "arguments": {"command": "echo hi"}}]},
//!   {"error": {"kind": "transient", "status": 500, "message": "boom"}},
//!   {"error": {"kind": "context_overflow", "message": "prompt is too long"}},
//!   {"error": {"kind": "fatal", "message": "bad request"}}
//! ]}
//! ```
//!
//! An entry may combine `text` and `tool_calls`, give a call an `id`, wait
//! `delay_ms` before answering (at most 10 minutes), and
//! override `usage` (`{"input_tokens":…, "output_tokens":…}`) and `stop`
//! (`end_turn`, `tool_use`, `max_tokens`); otherwise usage is computed as in
//! the rule mock and the stop is `tool_use` when calls are present.
//!
//! The cursor — the index of the next entry — lives in the sidecar file
//! `<path>.cursor`, not in memory: the supervisor may build a new model for
//! every step, and a multi-step turn must still walk through the script. It
//! is read and rewritten (temp file + rename) under an exclusive lock on the
//! script file, so concurrent callers never take the same entry. Delete the
//! sidecar to start over. When every entry is used, requests fail with a
//! fatal "script exhausted".

use std::fs::File;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::mock::{finish, next_call_id, request_chars, tokens};
use super::provider::{Model, ModelError, ModelEvent};
use crate::protocol::messages::{ModelRequest, ModelResponse, Part, StopKind, Usage};

/// One entry of a script.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptTurn {
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ScriptCall>,
    #[serde(default)]
    pub error: Option<ModelError>,
    #[serde(default)]
    pub usage: Option<Usage>,
    #[serde(default)]
    pub stop: Option<StopKind>,
    /// Answer only after this many milliseconds (a slow provider: lets a
    /// test act while a request is in flight).
    #[serde(default)]
    pub delay_ms: Option<u64>,
}

/// A tool call of a scripted entry.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptCall {
    #[serde(default)]
    pub id: Option<String>,
    pub name: String,
    #[serde(default)]
    pub arguments: Value,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Script {
    turns: Vec<ScriptTurn>,
}

/// A model answering from a script file.
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    path: PathBuf,
    turns: Vec<ScriptTurn>,
}

impl ScriptedModel {
    /// Reads and checks the script at `path`.
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ModelError::fatal(format!("cannot read model script {}: {e}", path.display()))
        })?;
        let script: Script = serde_json::from_str(&text).map_err(|e| {
            ModelError::fatal(format!("invalid model script {}: {e}", path.display()))
        })?;
        for (i, t) in script.turns.iter().enumerate() {
            if t.text.is_none() && t.tool_calls.is_empty() && t.error.is_none() {
                return Err(ModelError::fatal(format!(
                    "invalid model script {}: turn {i} has no text, tool_calls or error",
                    path.display()
                )));
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            turns: script.turns,
        })
    }

    /// The sidecar file holding the index of the next entry.
    pub fn cursor_path(&self) -> PathBuf {
        cursor_path(&self.path)
    }

    /// Takes the next entry, advancing the persisted cursor.
    fn take(&self) -> Result<ScriptTurn, ModelError> {
        let io = |what: &str, e: std::io::Error| {
            ModelError::fatal(format!("model script {}: {what}: {e}", self.path.display()))
        };
        let lock = File::open(&self.path).map_err(|e| io("cannot open", e))?;
        lock.lock().map_err(|e| io("cannot lock", e))?;
        let cursor_file = self.cursor_path();
        let cursor = match std::fs::read_to_string(&cursor_file) {
            Ok(s) => s.trim().parse::<usize>().map_err(|e| {
                ModelError::fatal(format!(
                    "model script cursor {} is corrupt ({e}); delete it to start over",
                    cursor_file.display()
                ))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(io("cannot read the cursor", e)),
        };
        let Some(turn) = self.turns.get(cursor).cloned() else {
            return Err(ModelError::fatal(format!(
                "script exhausted: {} has {} turns, all used (delete {} to start over)",
                self.path.display(),
                self.turns.len(),
                cursor_file.display()
            )));
        };
        crate::fsutil::atomic_write(&cursor_file, format!("{}\n", cursor + 1).as_bytes())
            .map_err(|e| io("cannot write the cursor", e))?;
        drop(lock);
        Ok(turn)
    }
}

/// `<path>.cursor`.
pub fn cursor_path(script: &Path) -> PathBuf {
    let mut s = script.as_os_str().to_os_string();
    s.push(".cursor");
    PathBuf::from(s)
}

impl Model for ScriptedModel {
    fn complete(
        &self,
        request: &ModelRequest,
        on_event: &mut dyn FnMut(ModelEvent),
    ) -> Result<ModelResponse, ModelError> {
        let turn = self.take()?;
        if let Some(ms) = turn.delay_ms {
            std::thread::sleep(std::time::Duration::from_millis(ms.min(600_000)));
        }
        if let Some(e) = turn.error {
            return Err(e);
        }
        let mut parts = Vec::new();
        if let Some(t) = turn.text {
            parts.push(Part::Text { text: t });
        }
        for c in turn.tool_calls {
            parts.push(Part::ToolCall {
                id: c.id.unwrap_or_else(next_call_id),
                name: c.name,
                arguments: match c.arguments {
                    Value::Null => Value::Object(Default::default()),
                    v => v,
                },
            });
        }
        let mut resp = finish(
            parts,
            tokens(request_chars(request)),
            turn.stop,
            "mock/scripted",
            on_event,
        );
        if let Some(u) = turn.usage {
            resp.usage = u;
        }
        Ok(resp)
    }
}
