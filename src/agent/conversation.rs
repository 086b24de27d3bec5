//! One conversation on disk (book names, spec agent-loop.md §1.2):
//!
//! * `messages.jsonl` — append-only, one JSON object a line; never rewritten.
//!   A torn last line (a crash or a full disk mid-append) is ignored when
//!   read, never fatal, and cut off by the next append (it was never an
//!   acknowledged message); appends are serialised by a lock on the file.
//! * `context.json` — `{"in_context_message_ids": [...]}`: which stored
//!   messages the model sees, in order (compaction rewrites this, not the log).
//! * `pending-reminders.json` — `{"items": [{"id", "text"}]}`: reminders
//!   queued after a turn and delivered with the next user message.
//! * `settings.json` — `{"context_window_limit": N}`: the conversation's own
//!   context window (`chat --context-window N`), over the agent's.
//! * `compaction-event.json` — the last compaction (`agent::context`).
//!
//! JSON files are replaced atomically (temp file, fsync, rename).
//!
//! The conversations directory belongs to the agent's uid: a confined child
//! writes it, while the operator's CLI (root) reads and writes it too. So
//! every file here is reached by name from the conversation directory's
//! descriptor ([`crate::agentfs`]), never by a path a swapped symlink could
//! redirect, and reads refuse FIFOs and stop at a size cap.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::agentfs::{Dir, FsError};
use crate::paths::{
    AgentPaths, COMPACTION_EVENT_FILE_NAME, CONTEXT_FILE_NAME, CONVERSATION_SETTINGS_FILE_NAME,
    CONVERSATIONS_DIR_NAME, ConversationPaths, LAST_REQUEST_FILE_NAME, MESSAGES_FILE_NAME,
    PENDING_REMINDERS_FILE_NAME, PathsError,
};
use crate::protocol::messages::{Message, Part, Role, Usage};

/// Largest message log read (a child can grow it without bound).
pub const MAX_LOG_BYTES: u64 = 256 << 20;
/// Largest JSON side file read (context, reminders, cached prompt).
pub const MAX_JSON_BYTES: u64 = 16 << 20;
/// Permission bits of the files written here.
const FILE_PERM: u32 = 0o644;

#[derive(Debug, thiserror::Error)]
pub enum ConversationError {
    #[error(transparent)]
    Paths(#[from] PathsError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error(transparent)]
    Fs(#[from] FsError),
}

fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> ConversationError + '_ {
    move |source| ConversationError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The directory of conversation `id` of `agent`, opened from the
/// conversations directory's descriptor; created (with `conversations/`)
/// when `create`, else `None` when missing. `conversations/` itself sits in
/// the agent directory, which no child can write, so it alone is opened by
/// path (and not followed if it were a symlink); a child's view may not
/// include the agent directory itself, only what its profile lists.
pub fn open_dir(
    agent: &AgentPaths,
    id: &str,
    create: bool,
) -> Result<Option<Dir>, ConversationError> {
    let paths = agent.conversation(id)?;
    let convs = match Dir::open(&agent.conversations_dir()) {
        Ok(d) => d,
        Err(e) if e.is_not_found() && create => {
            std::fs::create_dir_all(agent.dir()).map_err(io(agent.dir()))?;
            Dir::open(agent.dir())?.create_dir(CONVERSATIONS_DIR_NAME, 0o777)?
        }
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let opened = if create {
        convs.create_dir(paths.id(), 0o777)
    } else {
        convs.open_dir(paths.id())
    };
    match opened {
        Ok(d) => Ok(Some(d)),
        Err(e) if !create && e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The ids of `agent`'s conversations (its conversation directories),
/// sorted; none when it has no `conversations/` yet.
pub fn list_ids(agent: &AgentPaths) -> Result<Vec<String>, ConversationError> {
    let dir = agent.conversations_dir();
    let entries = match std::fs::read_dir(&dir) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(&dir)(e)),
    };
    let mut ids: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        // Not the recall index (`.recall`) or anything else not an id.
        .filter(|n| crate::paths::is_valid_agent_id(n))
        .collect();
    ids.sort();
    Ok(ids)
}

/// The bytes of `name` in `dir` (at most `max`), or `None` when missing.
pub(crate) fn read_optional(dir: &Dir, name: &str, max: u64) -> Result<Option<Vec<u8>>, FsError> {
    match dir.read_file_capped(name, max) {
        Ok((bytes, _)) => Ok(Some(bytes)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Pretty JSON with a final newline.
fn to_json<T: Serialize>(path: PathBuf, value: &T) -> Result<Vec<u8>, ConversationError> {
    let mut json = serde_json::to_vec_pretty(value).map_err(|e| ConversationError::Corrupt {
        path,
        message: e.to_string(),
    })?;
    json.push(b'\n');
    Ok(json)
}

/// One stored message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredMessage {
    pub id: String,
    pub role: Role,
    pub parts: Vec<Part>,
    /// `"summary"` for compaction summaries; absent for ordinary messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Stop reason of an assistant message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// RFC 3339 time of writing.
    pub ts: String,
}

impl StoredMessage {
    /// A message written now, with no usage, kind or stop reason.
    pub fn new(id: String, role: Role, parts: Vec<Part>) -> Self {
        Self {
            id,
            role,
            parts,
            kind: None,
            usage: None,
            stop: None,
            model: None,
            ts: time::OffsetDateTime::now_utc()
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
        }
    }

    pub fn to_message(&self) -> Message {
        Message {
            role: self.role,
            parts: self.parts.clone(),
        }
    }

    /// All text parts joined.
    pub fn text(&self) -> String {
        self.parts
            .iter()
            .filter_map(|p| match p {
                Part::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct ContextFile {
    in_context_message_ids: Vec<String>,
}

/// A queued reminder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reminder {
    pub id: String,
    pub text: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct RemindersFile {
    items: Vec<Reminder>,
}

/// A conversation's own settings (`settings.json`); unknown keys are kept
/// out of the way, not refused (a child writes this directory).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConversationSettings {
    /// The context window of this conversation's turns, in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window_limit: Option<u64>,
}

/// An open conversation.
pub struct Conversation {
    pub id: String,
    paths: ConversationPaths,
    /// The conversation directory; every file is reached from it.
    dir: Dir,
    messages: Vec<StoredMessage>,
    /// Whether the log's last line was torn (ignored on load).
    pub torn_tail: bool,
    next: u64,
}

impl Conversation {
    /// Open (creating if needed) conversation `id` of an agent.
    pub fn open(agent: &AgentPaths, id: &str) -> Result<Self, ConversationError> {
        let paths = agent.conversation(id)?;
        let dir = open_dir(agent, id, true)?.ok_or_else(|| ConversationError::Io {
            path: paths.dir().to_path_buf(),
            source: std::io::ErrorKind::NotFound.into(),
        })?;
        Self::load(id, paths, dir)
    }

    /// Open conversation `id` of an agent if it exists; `None` when it
    /// does not (nothing is created).
    pub fn open_existing(agent: &AgentPaths, id: &str) -> Result<Option<Self>, ConversationError> {
        let paths = agent.conversation(id)?;
        match open_dir(agent, id, false)? {
            Some(dir) => Self::load(id, paths, dir).map(Some),
            None => Ok(None),
        }
    }

    fn load(id: &str, paths: ConversationPaths, dir: Dir) -> Result<Self, ConversationError> {
        let log = paths.messages_jsonl();
        let text = read_optional(&dir, MESSAGES_FILE_NAME, MAX_LOG_BYTES)?
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        let mut messages = Vec::new();
        let mut torn_tail = false;
        let lines: Vec<&str> = text.split('\n').collect();
        for (i, line) in lines.iter().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<StoredMessage>(line) {
                Ok(m) => messages.push(m),
                Err(e) => {
                    // A bad line anywhere is skipped with a warning; only the
                    // last line is expected to be torn by a crash.
                    if i + 1 < lines.len() && !lines[i + 1..].iter().all(|l| l.trim().is_empty()) {
                        tracing::warn!(
                            "{}: line {} is not a message ({e}); skipped",
                            log.display(),
                            i + 1
                        );
                    } else {
                        torn_tail = true;
                        tracing::warn!("{}: torn last line ignored ({e})", log.display());
                    }
                }
            }
        }
        let next = messages
            .iter()
            .filter_map(|m| {
                m.id.strip_prefix("msg-")
                    .and_then(|n| n.parse::<u64>().ok())
            })
            .max()
            .unwrap_or(0)
            + 1;
        Ok(Self {
            id: id.to_string(),
            paths,
            dir,
            messages,
            torn_tail,
            next,
        })
    }

    pub fn paths(&self) -> &ConversationPaths {
        &self.paths
    }

    /// Every stored message, oldest first.
    pub fn messages(&self) -> &[StoredMessage] {
        &self.messages
    }

    /// A new message id.
    pub fn next_id(&mut self) -> String {
        let id = format!("msg-{:06}", self.next);
        self.next += 1;
        id
    }

    /// Append a message to the log (fsynced) and to the context.
    ///
    /// Writers take an exclusive lock on the log, so a line is never seen
    /// half-written by another writer. A torn last line (a crash, or a full
    /// disk, mid-append) was never an acknowledged message: it is cut off
    /// before writing. A write that fails (ENOSPC) is undone the same way,
    /// so the log never keeps a fragment.
    pub fn append(&mut self, msg: StoredMessage) -> Result<(), ConversationError> {
        self.append_to_log(&msg)?;
        let mut ids = self.context_ids()?;
        ids.push(msg.id.clone());
        self.set_context_ids(&ids)?;
        self.messages.push(msg);
        Ok(())
    }

    /// Append a message to the log only: kept for the record (a failed
    /// turn's error), never shown to the model.
    pub fn append_outside_context(&mut self, msg: StoredMessage) -> Result<(), ConversationError> {
        self.append_to_log(&msg)?;
        self.messages.push(msg);
        Ok(())
    }

    /// Take `id` out of the model's context (the log keeps it).
    pub fn remove_from_context(&self, id: &str) -> Result<(), ConversationError> {
        let mut ids = self.context_ids()?;
        let before = ids.len();
        ids.retain(|i| i != id);
        if ids.len() != before {
            self.set_context_ids(&ids)?;
        }
        Ok(())
    }

    fn append_to_log(&self, msg: &StoredMessage) -> Result<(), ConversationError> {
        let log = self.paths.messages_jsonl();
        let file = self.dir.open_append(MESSAGES_FILE_NAME, FILE_PERM)?;
        let mut file = lock_log(file).map_err(io(&log))?;
        let mut line = serde_json::to_vec(msg).map_err(|e| ConversationError::Corrupt {
            path: log.clone(),
            message: e.to_string(),
        })?;
        line.push(b'\n');
        let len = complete_length(&file).map_err(io(&log))?;
        if len < file.metadata().map_err(io(&log))?.len() {
            tracing::warn!("{}: torn last line removed", log.display());
            file.set_len(len).map_err(io(&log))?;
        }
        if let Err(e) = file.write_all(&line).and_then(|()| file.sync_data()) {
            // Nothing half-written stays behind.
            let _ = file.set_len(len);
            return Err(io(&log)(e));
        }
        Ok(())
    }

    /// Ids of the messages in the model's context. Without a context file,
    /// every stored message.
    pub fn context_ids(&self) -> Result<Vec<String>, ConversationError> {
        let path = self.paths.context_json();
        match read_optional(&self.dir, CONTEXT_FILE_NAME, MAX_JSON_BYTES)? {
            Some(b) => serde_json::from_slice::<ContextFile>(&b)
                .map(|c| c.in_context_message_ids)
                .map_err(|e| ConversationError::Corrupt {
                    path,
                    message: e.to_string(),
                }),
            None => Ok(self.messages.iter().map(|m| m.id.clone()).collect()),
        }
    }

    pub fn set_context_ids(&self, ids: &[String]) -> Result<(), ConversationError> {
        let json = to_json(
            self.paths.context_json(),
            &ContextFile {
                in_context_message_ids: ids.to_vec(),
            },
        )?;
        self.write_file(CONTEXT_FILE_NAME, &json)
    }

    /// Replace the file `name` of this conversation atomically.
    fn write_file(&self, name: &str, bytes: &[u8]) -> Result<(), ConversationError> {
        Ok(self.dir.replace_file(name, bytes, FILE_PERM)?)
    }

    /// Record the last model request sent (for operators).
    pub fn write_last_request(&self, json: &[u8]) -> Result<(), ConversationError> {
        self.write_file(LAST_REQUEST_FILE_NAME, json)
    }

    /// The in-context messages, in order (unknown ids are skipped; an id
    /// stored twice is its latest line).
    pub fn context(&self) -> Result<Vec<&StoredMessage>, ConversationError> {
        let ids = self.context_ids()?;
        let by_id: std::collections::HashMap<&str, &StoredMessage> =
            self.messages.iter().map(|m| (m.id.as_str(), m)).collect();
        Ok(ids
            .iter()
            .filter_map(|id| by_id.get(id.as_str()).copied())
            .collect())
    }

    /// Append `msg` to the log without putting it in the context, then make
    /// `ids` the context: what a compaction does (the summary joins, the
    /// evicted messages leave the context, and the log only grows).
    pub fn append_and_set_context(
        &mut self,
        msg: StoredMessage,
        ids: &[String],
    ) -> Result<(), ConversationError> {
        self.append_outside_context(msg)?;
        self.set_context_ids(ids)
    }

    /// The conversation's settings (defaults when it has none; an
    /// unreadable file is reported, not guessed at).
    pub fn settings(&self) -> Result<ConversationSettings, ConversationError> {
        match read_optional(&self.dir, CONVERSATION_SETTINGS_FILE_NAME, MAX_JSON_BYTES)? {
            Some(b) => serde_json::from_slice(&b).map_err(|e| ConversationError::Corrupt {
                path: self.paths.settings_json(),
                message: e.to_string(),
            }),
            None => Ok(ConversationSettings::default()),
        }
    }

    /// Replace the conversation's settings.
    pub fn set_settings(&self, settings: &ConversationSettings) -> Result<(), ConversationError> {
        let json = to_json(self.paths.settings_json(), settings)?;
        self.write_file(CONVERSATION_SETTINGS_FILE_NAME, &json)
    }

    /// The last compaction's record, as stored (`None` before the first).
    pub fn compaction_event_bytes(&self) -> Result<Option<Vec<u8>>, ConversationError> {
        Ok(read_optional(
            &self.dir,
            COMPACTION_EVENT_FILE_NAME,
            MAX_JSON_BYTES,
        )?)
    }

    /// Record a compaction (replacing the previous record).
    pub fn write_compaction_event<T: Serialize>(&self, event: &T) -> Result<(), ConversationError> {
        let json = to_json(self.paths.compaction_event_json(), event)?;
        self.write_file(COMPACTION_EVENT_FILE_NAME, &json)
    }

    /// Queued reminders.
    pub fn pending_reminders(&self) -> Result<Vec<Reminder>, ConversationError> {
        let path = self.paths.pending_reminders_json();
        match read_optional(&self.dir, PENDING_REMINDERS_FILE_NAME, MAX_JSON_BYTES)? {
            Some(b) => Ok(serde_json::from_slice::<RemindersFile>(&b)
                .map(|r| r.items)
                .unwrap_or_else(|e| {
                    tracing::warn!("{}: unreadable reminders dropped ({e})", path.display());
                    Vec::new()
                })),
            None => Ok(Vec::new()),
        }
    }

    /// Replace the reminder queue.
    pub fn set_pending_reminders(&self, items: &[Reminder]) -> Result<(), ConversationError> {
        let json = to_json(
            self.paths.pending_reminders_json(),
            &RemindersFile {
                items: items.to_vec(),
            },
        )?;
        self.write_file(PENDING_REMINDERS_FILE_NAME, &json)
    }

    /// Queue one reminder (replacing one with the same id).
    pub fn queue_reminder(&self, id: &str, text: &str) -> Result<(), ConversationError> {
        let mut items = self.pending_reminders()?;
        items.retain(|r| r.id != id);
        items.push(Reminder {
            id: id.to_string(),
            text: text.to_string(),
        });
        self.set_pending_reminders(&items)
    }
}

/// How long an append waits for another writer of the same log.
const LOG_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The log, locked for this writer; a holder that never lets go (any
/// process of the agent's uid can take the lock) costs a bounded wait.
fn lock_log(file: std::fs::File) -> std::io::Result<nix::fcntl::Flock<std::fs::File>> {
    crate::fsutil::flock_bounded(file, LOG_LOCK_WAIT, "the conversation log")
}

/// The length of `file` up to and including its last newline: what is
/// past it is a torn line. Reads the tail backwards in small blocks.
fn complete_length(file: &std::fs::File) -> std::io::Result<u64> {
    let len = file.metadata()?.len();
    let mut end = len;
    let mut block = [0u8; 4096];
    while end > 0 {
        let start = end.saturating_sub(block.len() as u64);
        let chunk = &mut block[..(end - start) as usize];
        file.read_exact_at(chunk, start)?;
        if let Some(i) = chunk.iter().rposition(|b| *b == b'\n') {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::Home;

    fn msg(c: &mut Conversation, text: &str) -> StoredMessage {
        StoredMessage {
            id: c.next_id(),
            role: Role::User,
            parts: vec![Part::Text { text: text.into() }],
            kind: None,
            usage: None,
            stop: None,
            model: None,
            ts: "2026-01-01T00:00:00Z".into(),
        }
    }

    #[test]
    fn torn_tail_is_ignored_and_appends_continue() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path());
        let agent = home.agent("agent-x").unwrap();
        let mut c = Conversation::open(&agent, "default").unwrap();
        let m = msg(&mut c, "one");
        c.append(m).unwrap();
        // A crash mid-append leaves half a line.
        let log = c.paths().messages_jsonl();
        let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        f.write_all(b"{\"id\":\"msg-000002\",\"ro").unwrap();
        drop(f);
        let mut c = Conversation::open(&agent, "default").unwrap();
        assert!(c.torn_tail);
        assert_eq!(c.messages().len(), 1);
        let m = msg(&mut c, "two");
        c.append(m).unwrap();
        let c = Conversation::open(&agent, "default").unwrap();
        assert!(!c.torn_tail);
        assert_eq!(
            c.messages().iter().map(|m| m.text()).collect::<Vec<_>>(),
            ["one", "two"]
        );
        assert_eq!(c.context().unwrap().len(), 2);
        // The fragment was cut off, not kept in the middle of the log.
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.ends_with('\n'));
        for line in text.lines() {
            serde_json::from_str::<StoredMessage>(line).unwrap();
        }
    }
}
