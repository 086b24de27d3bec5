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
//! redirect, and reads refuse FIFOs and stop at a size cap. The log is
//! read a line at a time ([`lines`]): a line over the cap is skipped and
//! reported, never held, and readers that need no whole conversation
//! ([`summary`], [`last_messages`], [`read_messages`]) hold one line at a
//! time, whatever the agent wrote.

pub mod last_request;
pub mod lines;
pub mod said;

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Seek, Write};
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
pub use last_request::{LAST_REQUEST_MAX_BYTES, LAST_REQUEST_MAX_FILES};
use lines::{Line, LinePos, LogLines, MAX_LINE_BYTES};

/// Largest message log read (a child can grow it without bound).
pub const MAX_LOG_BYTES: u64 = 256 << 20;
/// Largest JSON side file read (context, reminders, cached prompt).
pub const MAX_JSON_BYTES: u64 = 16 << 20;
/// Permission bits of the files written here.
const FILE_PERM: u32 = 0o644;
/// Skipped lines one read lists; past that it only counts them (a log of
/// a million bad lines must not make a million reports).
const MAX_LISTED_SKIPS: usize = 16;
/// The read buffer of a log: a few system calls per megabyte.
const LOG_READ_BUFFER: usize = 64 << 10;

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
/// Of `messages` (a stretch of the log), the ids an append put in the
/// context: ordinary messages (no `kind`), but not a user's message
/// answered by an error record (a turn that failed at its first step takes
/// its user message out of the context).
fn appended_in_context(messages: &[StoredMessage]) -> impl Iterator<Item = String> + '_ {
    messages.iter().enumerate().filter_map(|(i, m)| {
        let failed = m.role == Role::User
            && messages
                .get(i + 1)
                .is_some_and(|n| n.kind.as_deref() == Some("error"));
        (m.kind.is_none() && !failed).then(|| m.id.clone())
    })
}

/// `context.json`'s bytes for `ids`.
fn context_json(path: PathBuf, ids: &[String]) -> Result<Vec<u8>, ConversationError> {
    to_json(
        path,
        &ContextFile {
            in_context_message_ids: ids.to_vec(),
        },
    )
}

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
            ts: crate::clock::now_rfc3339(),
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
        let mut messages = Vec::new();
        let report = match open_log(&dir)? {
            Some((_, size)) if size > MAX_LOG_BYTES => {
                return Err(FsError::TooLarge {
                    path: log,
                    size,
                    max: MAX_LOG_BYTES,
                }
                .into());
            }
            // Stops at the cap even if the log grows while it is read.
            Some((file, _)) => scan(
                buffered(file.take(MAX_LOG_BYTES)),
                LinePos::default(),
                |m, _| messages.push(m),
            )
            .map_err(io(&log))?,
            None => LogReport::default(),
        };
        report.warn(&log.display().to_string());
        let torn_tail = report.torn_tail;
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
    ///
    /// The log's line is the one flushed write of an append: the context
    /// list is replaced without flushes, so a crash can leave it behind the
    /// log (or, on a filesystem that does not order a file's data before
    /// its rename, unreadable), which [`Self::context_ids`] makes good
    /// from the log.
    pub fn append(&mut self, msg: StoredMessage) -> Result<(), ConversationError> {
        self.append_to_log(&msg)?;
        let mut ids = self.context_ids()?;
        ids.push(msg.id.clone());
        let json = context_json(self.paths.context_json(), &ids)?;
        self.dir
            .replace_file_unsynced(CONTEXT_FILE_NAME, &json, FILE_PERM)?;
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
            Some(b) => match serde_json::from_slice::<ContextFile>(&b) {
                Ok(c) => Ok(self.with_unflushed_appends(c.in_context_message_ids)),
                Err(e) => {
                    tracing::warn!(
                        "{}: {e}; rebuilt from the log (the last compaction's summary on)",
                        path.display()
                    );
                    Ok(self.rebuilt_context())
                }
            },
            None => Ok(self.messages.iter().map(|m| m.id.clone()).collect()),
        }
    }

    /// The context list after a crash that lost appends' (unflushed)
    /// replacements of it: the log's messages after the list's last one
    /// that an append put in the context. Every other way a message
    /// reaches the log outside the context marks it (`kind`: errors,
    /// summaries, memory updates) or, for the user message of a failed
    /// turn, follows it with an error record; and those rewrites of the
    /// list are flushed.
    fn with_unflushed_appends(&self, mut ids: Vec<String>) -> Vec<String> {
        let Some(last) = ids.last() else {
            return ids;
        };
        let Some(at) = self.messages.iter().rposition(|m| &m.id == last) else {
            return ids;
        };
        let later = &self.messages[at + 1..];
        let missing: Vec<String> = appended_in_context(later)
            .filter(|id| !ids.contains(id))
            .collect();
        ids.extend(missing);
        ids
    }

    /// A context list that cannot be read (torn by a crash): the last
    /// compaction's summary and what an append put in the context after it.
    fn rebuilt_context(&self) -> Vec<String> {
        let from = self
            .messages
            .iter()
            .rposition(|m| m.kind.as_deref() == Some("summary"));
        let (summary, later) = match from {
            Some(at) => (Some(self.messages[at].id.clone()), &self.messages[at + 1..]),
            None => (None, &self.messages[..]),
        };
        summary
            .into_iter()
            .chain(appended_in_context(later))
            .collect()
    }

    pub fn set_context_ids(&self, ids: &[String]) -> Result<(), ConversationError> {
        let json = context_json(self.paths.context_json(), ids)?;
        self.write_file(CONTEXT_FILE_NAME, &json)
    }

    /// Replace the file `name` of this conversation atomically.
    fn write_file(&self, name: &str, bytes: &[u8]) -> Result<(), ConversationError> {
        Ok(self.dir.replace_file(name, bytes, FILE_PERM)?)
    }

    /// Record the last model request sent (for operators), bounded in size
    /// and in number (see [`last_request`]).
    pub fn write_last_request(
        &self,
        agent: &AgentPaths,
        request: &crate::protocol::messages::ModelRequest,
    ) -> Result<(), ConversationError> {
        let record = last_request::record(request, LAST_REQUEST_MAX_BYTES);
        // For operators only: nothing reads it back after a crash.
        self.dir
            .replace_file_unsynced(LAST_REQUEST_FILE_NAME, &record, FILE_PERM)?;
        last_request::prune(agent, LAST_REQUEST_MAX_FILES)
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

    /// Empty the reminder queue once its reminders are delivered; when
    /// there is no queue, or it is already empty — the common turn —
    /// nothing is written (an atomic replace costs two disk flushes).
    pub fn clear_pending_reminders(&self) -> Result<(), ConversationError> {
        let queued = read_optional(&self.dir, PENDING_REMINDERS_FILE_NAME, MAX_JSON_BYTES)?;
        let empty = queued.as_deref().is_none_or(|b| {
            serde_json::from_slice::<RemindersFile>(b).is_ok_and(|r| r.items.is_empty())
        });
        if empty {
            return Ok(());
        }
        self.set_pending_reminders(&[])
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

/// A log line a read passed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedLine {
    /// 1-based.
    pub line: u64,
    /// Its length, without the newline.
    pub bytes: u64,
    pub why: SkipReason,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// Over [`MAX_LINE_BYTES`]: never held, never parsed.
    TooLong,
    /// Not a stored message; what the parser said.
    NotAMessage(String),
}

impl std::fmt::Display for SkippedLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.why {
            SkipReason::TooLong => write!(
                f,
                "line {} ({} bytes) is over the {MAX_LINE_BYTES}-byte line limit; skipped",
                self.line, self.bytes
            ),
            SkipReason::NotAMessage(e) => {
                write!(f, "line {} is not a message ({e}); skipped", self.line)
            }
        }
    }
}

/// What a read of a log met besides messages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogReport {
    /// The first lines skipped (at most 16).
    pub skipped: Vec<SkippedLine>,
    /// Every line skipped, listed or not.
    pub skipped_count: u64,
    /// The last line is not a message yet: torn by a crash, or being
    /// written. Ignored, never reported as skipped.
    pub torn_tail: bool,
    /// Where a later read of new lines resumes: after the last line that
    /// ended (a torn or half-written one is read again).
    pub end: LinePos,
}

impl LogReport {
    fn skip(&mut self, line: SkippedLine) {
        self.skipped_count += 1;
        if self.skipped.len() < MAX_LISTED_SKIPS {
            self.skipped.push(line);
        }
    }

    /// One sentence per skipped line, and one for those not listed.
    pub fn warnings(&self) -> Vec<String> {
        let mut out: Vec<String> = self.skipped.iter().map(ToString::to_string).collect();
        let unlisted = self.skipped_count - self.skipped.len() as u64;
        if unlisted > 0 {
            out.push(format!("{unlisted} more line(s) skipped"));
        }
        out
    }

    /// Log [`Self::warnings`] and a torn tail, each prefixed by `what`.
    fn warn(&self, what: &str) {
        for w in self.warnings() {
            tracing::warn!("{what}: {w}");
        }
        if self.torn_tail {
            tracing::warn!("{what}: torn last line ignored");
        }
    }
}

/// A stored message from one log line. Invalid UTF-8 is replaced, not
/// fatal (the log has always been read that way).
fn parse_message(bytes: &[u8]) -> Result<StoredMessage, serde_json::Error> {
    match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_str(&String::from_utf8_lossy(bytes)),
    }
}

/// Longest parser message kept for a skipped line (it can quote the line).
const MAX_REASON_CHARS: usize = 200;

/// What the parser said about a line, short and printable: it may quote
/// what the agent wrote (an unknown role, say), so it is cut, and any
/// character a terminal would act on is shown as its code point.
fn parse_failure(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let mut out = String::new();
    let mut shown = 0;
    for c in text.chars() {
        let piece = if crate::names::is_unsafe(c) {
            format!("<U+{:04X}>", u32::from(c))
        } else {
            c.to_string()
        };
        shown += piece.chars().count();
        if shown > MAX_REASON_CHARS {
            out.push('…');
            break;
        }
        out.push_str(&piece);
    }
    out
}

fn buffered<R: Read>(reader: R) -> BufReader<R> {
    BufReader::with_capacity(LOG_READ_BUFFER, reader)
}

/// The log of the conversation in `dir`, open, with its size; `None`
/// when there is no log.
fn open_log(dir: &Dir) -> Result<Option<(std::fs::File, u64)>, FsError> {
    match dir.open_file(MESSAGES_FILE_NAME) {
        Ok((file, stat)) => Ok(Some((file, stat.size))),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Read log lines from `reader` (positioned at `from`) to its end, giving
/// `each` every message with where its line starts. A line that is not a
/// message is skipped and reported, except the last (torn by a crash
/// mid-append: it was never an acknowledged message); a last line with no
/// newline is never a message yet.
fn scan<R: BufRead>(
    reader: R,
    from: LinePos,
    mut each: impl FnMut(StoredMessage, LinePos),
) -> std::io::Result<LogReport> {
    let mut report = LogReport {
        end: from,
        ..LogReport::default()
    };
    // A bad line is reported only once a later line shows it was not last.
    let mut pending: Option<SkippedLine> = None;
    let mut lines = LogLines::resuming(reader, from, MAX_LINE_BYTES);
    while let Some(line) = lines.next() {
        let line = line?;
        let blank =
            matches!(&line, Line::Text { bytes, .. } if bytes.iter().all(u8::is_ascii_whitespace));
        if !line.ended() {
            if !blank {
                report.torn_tail = true;
                report.skip_pending(&mut pending);
            }
            break;
        }
        report.end = lines.position();
        match line {
            _ if blank => {}
            Line::TooLong { at, len, .. } => {
                report.skip_pending(&mut pending);
                report.skip(SkippedLine {
                    line: at.line + 1,
                    bytes: len,
                    why: SkipReason::TooLong,
                });
            }
            Line::Text { at, bytes, .. } => {
                report.skip_pending(&mut pending);
                match parse_message(&bytes) {
                    Ok(m) => each(m, at),
                    Err(e) => {
                        pending = Some(SkippedLine {
                            line: at.line + 1,
                            bytes: bytes.len() as u64,
                            why: SkipReason::NotAMessage(parse_failure(&e)),
                        })
                    }
                }
            }
        }
    }
    if pending.is_some() {
        report.torn_tail = true;
    }
    Ok(report)
}

impl LogReport {
    fn skip_pending(&mut self, pending: &mut Option<SkippedLine>) {
        if let Some(p) = pending.take() {
            self.skip(p);
        }
    }
}

/// Stream the messages of conversation `id` of `agent` from `from` on
/// (the start, or a previous read's [`LogReport::end`]), giving `each`
/// every message with where its line starts; `None` when there is no
/// such conversation. Holds one line at a time, whatever the log holds.
/// A log shorter than `from` (replaced) is read again from its start.
pub fn read_messages(
    agent: &AgentPaths,
    id: &str,
    from: LinePos,
    each: impl FnMut(StoredMessage, LinePos),
) -> Result<Option<LogReport>, ConversationError> {
    let Some(dir) = open_dir(agent, id, false)? else {
        return Ok(None);
    };
    let log = agent.conversation(id)?.messages_jsonl();
    let Some((mut file, size)) = open_log(&dir)? else {
        return Ok(Some(LogReport::default()));
    };
    let from = if size < from.offset {
        tracing::warn!(
            "{}: the log shrank; read again from its start",
            log.display()
        );
        LinePos::default()
    } else {
        from
    };
    file.seek(std::io::SeekFrom::Start(from.offset))
        .map_err(io(&log))?;
    scan(buffered(file), from, each).map(Some).map_err(io(&log))
}

/// A conversation counted without being held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub messages: usize,
    /// The last message's time.
    pub last_ts: Option<String>,
    pub report: LogReport,
}

/// Count conversation `id`'s messages, streaming its log; `None` when
/// there is no such conversation.
pub fn summary(agent: &AgentPaths, id: &str) -> Result<Option<Summary>, ConversationError> {
    let mut messages = 0usize;
    let mut last_ts = None;
    let report = read_messages(agent, id, LinePos::default(), |m, _| {
        messages += 1;
        last_ts = Some(m.ts);
    })?;
    Ok(report.map(|report| Summary {
        messages,
        last_ts,
        report,
    }))
}

/// How many messages of conversation `id` are in the model's context:
/// the ids its context file lists, else `messages` (every message, as
/// [`Conversation::context_ids`] has it).
pub fn in_context_count(
    agent: &AgentPaths,
    id: &str,
    messages: usize,
) -> Result<usize, ConversationError> {
    let Some(dir) = open_dir(agent, id, false)? else {
        return Ok(messages);
    };
    let counted = count_context_ids(&dir, agent.conversation(id)?.context_json())?;
    Ok(counted.unwrap_or(messages))
}

/// How many ids `context.json` lists (`None` without one), counted as
/// they are parsed: a file of many tiny ids never becomes many strings.
fn count_context_ids(dir: &Dir, path: PathBuf) -> Result<Option<usize>, ConversationError> {
    struct Count(usize);
    impl<'de> Deserialize<'de> for Count {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_seq(Count(0))
        }
    }
    impl<'de> serde::de::Visitor<'de> for Count {
        type Value = Count;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of message ids")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Count, A::Error> {
            let mut n = 0;
            while seq.next_element::<IdStr>()?.is_some() {
                n += 1;
            }
            Ok(Count(n))
        }
    }
    /// A string, looked at and dropped.
    struct IdStr;
    impl<'de> Deserialize<'de> for IdStr {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_str(IdStr)
        }
    }
    impl serde::de::Visitor<'_> for IdStr {
        type Value = IdStr;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a message id")
        }
        fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<IdStr, E> {
            Ok(IdStr)
        }
    }
    #[derive(Deserialize)]
    struct Counted {
        in_context_message_ids: Count,
    }
    let Some(bytes) = read_optional(dir, CONTEXT_FILE_NAME, MAX_JSON_BYTES)? else {
        return Ok(None);
    };
    serde_json::from_slice::<Counted>(&bytes)
        .map(|c| Some(c.in_context_message_ids.0))
        .map_err(|e| ConversationError::Corrupt {
            path,
            message: parse_failure(&e),
        })
}

/// Give `each` the last `n` messages of conversation `id`, oldest first,
/// one at a time; `None` when there is no such conversation. The log is
/// read twice (where each message starts, then the last `n` again), so
/// what is held is one line and `n` offsets, however long the messages.
/// The report's `end` is where following the log resumes.
pub fn last_messages(
    agent: &AgentPaths,
    id: &str,
    n: usize,
    mut each: impl FnMut(StoredMessage),
) -> Result<Option<LogReport>, ConversationError> {
    let mut starts: VecDeque<LinePos> = VecDeque::new();
    let Some(report) = read_messages(agent, id, LinePos::default(), |_, at| {
        if n > 0 {
            if starts.len() == n {
                starts.pop_front();
            }
            starts.push_back(at);
        }
    })?
    else {
        return Ok(None);
    };
    let Some(dir) = open_dir(agent, id, false)? else {
        return Ok(Some(report));
    };
    let log = agent.conversation(id)?.messages_jsonl();
    let Some((file, _)) = open_log(&dir)? else {
        return Ok(Some(report));
    };
    for at in starts {
        (&file)
            .seek(std::io::SeekFrom::Start(at.offset))
            .map_err(io(&log))?;
        let mut one = LogLines::resuming(buffered(&file), at, MAX_LINE_BYTES);
        // The log only grows, so the line is where it was; if the log was
        // replaced meanwhile, what is there now is shown only if it is a
        // message.
        if let Some(Line::Text {
            bytes, ended: true, ..
        }) = one.next().transpose().map_err(io(&log))?
            && let Ok(m) = parse_message(&bytes)
        {
            each(m);
        }
    }
    Ok(Some(report))
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

    /// An append flushes the log but not the context list: a crash may
    /// leave the list appends behind, or torn, and the messages are back in
    /// the context on the next open — while a message the log holds
    /// outside the context on purpose (an error record after a failed
    /// turn, which also took the user message out) stays out.
    #[test]
    fn a_context_list_behind_the_log_or_torn_is_made_good() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path());
        let agent = home.agent("agent-x").unwrap();
        let mut c = Conversation::open(&agent, "default").unwrap();
        let one = msg(&mut c, "one");
        c.append(one.clone()).unwrap();
        let behind = std::fs::read(c.paths().context_json()).unwrap();
        let two = msg(&mut c, "two");
        c.append(two.clone()).unwrap();
        // The crash: the list as it was before the second append.
        std::fs::write(c.paths().context_json(), &behind).unwrap();
        let c = Conversation::open(&agent, "default").unwrap();
        assert_eq!(
            c.context_ids().unwrap(),
            vec![one.id.clone(), two.id.clone()]
        );

        // A failed turn: user message in, error record outside, user out.
        let mut c = Conversation::open(&agent, "default").unwrap();
        let asked = msg(&mut c, "three");
        c.append(asked.clone()).unwrap();
        let mut error = msg(&mut c, "[error] boom");
        error.kind = Some("error".into());
        c.append_outside_context(error).unwrap();
        c.remove_from_context(&asked.id).unwrap();
        let c = Conversation::open(&agent, "default").unwrap();
        assert_eq!(
            c.context_ids().unwrap(),
            vec![one.id.clone(), two.id.clone()]
        );

        // A list the compaction rewrote is taken as it is.
        let mut c = Conversation::open(&agent, "default").unwrap();
        let mut summary = msg(&mut c, "summary");
        summary.kind = Some("summary".into());
        c.append_and_set_context(summary.clone(), std::slice::from_ref(&summary.id))
            .unwrap();
        let c = Conversation::open(&agent, "default").unwrap();
        assert_eq!(c.context_ids().unwrap(), vec![summary.id.clone()]);

        // Two appends behind, then a torn list: both made good from the log.
        let mut c = Conversation::open(&agent, "default").unwrap();
        let behind = std::fs::read(c.paths().context_json()).unwrap();
        let (four, five) = (msg(&mut c, "four"), msg(&mut c, "five"));
        c.append(four.clone()).unwrap();
        c.append(five.clone()).unwrap();
        std::fs::write(c.paths().context_json(), &behind).unwrap();
        let want = vec![summary.id.clone(), four.id.clone(), five.id.clone()];
        let c = Conversation::open(&agent, "default").unwrap();
        assert_eq!(c.context_ids().unwrap(), want);
        std::fs::write(c.paths().context_json(), b"{\"in_context_mess").unwrap();
        let c = Conversation::open(&agent, "default").unwrap();
        assert_eq!(c.context_ids().unwrap(), want);
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

    /// Delivered reminders leave an empty queue behind; a turn with nothing
    /// queued writes nothing (the file is not replaced: same inode); an
    /// unreadable queue is emptied rather than warned about forever.
    #[test]
    fn clearing_the_reminder_queue_writes_only_when_there_is_one() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let agent = Home::at(dir.path()).agent("agent-x").unwrap();
        let c = Conversation::open(&agent, "default").unwrap();
        let file = c.paths().pending_reminders_json();
        c.clear_pending_reminders().unwrap();
        assert!(!file.exists(), "no queue, nothing written");
        c.queue_reminder("r1", "hello").unwrap();
        c.clear_pending_reminders().unwrap();
        assert!(c.pending_reminders().unwrap().is_empty());
        let inode = std::fs::metadata(&file).unwrap().ino();
        c.clear_pending_reminders().unwrap();
        assert_eq!(std::fs::metadata(&file).unwrap().ino(), inode);
        std::fs::write(&file, b"{not json").unwrap();
        c.clear_pending_reminders().unwrap();
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&std::fs::read(&file).unwrap()).unwrap(),
            serde_json::json!({"items": []})
        );
    }

    /// Append raw bytes to conversation `id`'s log.
    fn append_raw(agent: &AgentPaths, id: &str, bytes: &[u8]) {
        let log = agent.conversation(id).unwrap().messages_jsonl();
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        f.write_all(bytes).unwrap();
    }

    fn line_of(id: &str, text: &str, ts: &str) -> Vec<u8> {
        let mut m = StoredMessage::new(
            id.into(),
            Role::User,
            vec![Part::Text { text: text.into() }],
        );
        m.ts = ts.into();
        let mut l = serde_json::to_vec(&m).unwrap();
        l.push(b'\n');
        l
    }

    fn ids(agent: &AgentPaths, id: &str, n: usize) -> Vec<String> {
        let mut got = Vec::new();
        last_messages(agent, id, n, |m| got.push(m.id))
            .unwrap()
            .unwrap();
        got
    }

    #[test]
    fn an_over_cap_line_is_skipped_reported_and_never_a_message() {
        let dir = tempfile::tempdir().unwrap();
        let agent = Home::at(dir.path()).agent("agent-x").unwrap();
        open_dir(&agent, "c", true).unwrap();
        append_raw(&agent, "c", &line_of("msg-000001", "one", "t1"));
        // A well-formed message one byte over the cap.
        let big = line_of("msg-000002", "@", "t2");
        let at = big.iter().position(|b| *b == b'@').unwrap();
        let mut long = big[..at].to_vec();
        long.resize(MAX_LINE_BYTES + 1 - (big.len() - 1 - at - 1), b'a');
        long.extend_from_slice(&big[at + 1..]);
        assert_eq!(long.len(), MAX_LINE_BYTES + 2);
        append_raw(&agent, "c", &long);
        append_raw(&agent, "c", &line_of("msg-000003", "three", "t3"));

        let s = summary(&agent, "c").unwrap().unwrap();
        assert_eq!((s.messages, s.last_ts.as_deref()), (2, Some("t3")));
        assert_eq!(
            s.report.skipped,
            vec![SkippedLine {
                line: 2,
                bytes: MAX_LINE_BYTES as u64 + 1,
                why: SkipReason::TooLong
            }]
        );
        assert!(!s.report.torn_tail);
        assert_eq!(s.report.warnings().len(), 1);
        assert_eq!(ids(&agent, "c", 1), ["msg-000003"]);
        assert_eq!(ids(&agent, "c", 10), ["msg-000001", "msg-000003"]);
        assert!(ids(&agent, "c", 0).is_empty());
        let c = Conversation::open_existing(&agent, "c").unwrap().unwrap();
        assert_eq!(c.messages().len(), 2);
        assert!(!c.torn_tail);
    }

    #[test]
    fn a_bad_line_is_reported_unless_it_is_the_torn_last_one() {
        let dir = tempfile::tempdir().unwrap();
        let agent = Home::at(dir.path()).agent("agent-x").unwrap();
        open_dir(&agent, "c", true).unwrap();
        append_raw(&agent, "c", &line_of("msg-000001", "one", "t1"));
        append_raw(&agent, "c", b"not json\n\n");
        append_raw(&agent, "c", &line_of("msg-000002", "two", "t2"));
        append_raw(&agent, "c", b"{\"id\":\"msg-000003\"\n\n");
        let s = summary(&agent, "c").unwrap().unwrap();
        assert_eq!(s.messages, 2);
        assert_eq!(s.report.skipped.len(), 1);
        assert_eq!(s.report.skipped[0].line, 2);
        assert!(matches!(
            s.report.skipped[0].why,
            SkipReason::NotAMessage(_)
        ));
        // The last line, bad even with its newline: a crash mid-append.
        assert!(s.report.torn_tail);
        // Many bad lines: a few listed, every one counted.
        for _ in 0..40 {
            append_raw(&agent, "c", b"x\n");
        }
        append_raw(&agent, "c", &line_of("msg-000004", "four", "t4"));
        let s = summary(&agent, "c").unwrap().unwrap();
        assert_eq!(s.messages, 3);
        assert_eq!(s.report.skipped.len(), MAX_LISTED_SKIPS);
        assert_eq!(s.report.skipped_count, 42);
        assert!(!s.report.torn_tail);
        assert!(s.report.warnings().last().unwrap().starts_with("26 more"));
    }

    #[test]
    fn what_the_parser_says_of_a_bad_line_is_short_and_printable() {
        let dir = tempfile::tempdir().unwrap();
        let agent = Home::at(dir.path()).agent("agent-x").unwrap();
        open_dir(&agent, "c", true).unwrap();
        // An unknown role, quoted by the parser as it is: escape sequences
        // and a megabyte of it.
        let role = format!("\u{1b}]52;c;x\u{7}\u{202e}{}", "r".repeat(1 << 20));
        let line = serde_json::json!({"id": "m", "role": role, "parts": [], "ts": "t"});
        append_raw(&agent, "c", format!("{line}\n").as_bytes());
        append_raw(&agent, "c", &line_of("msg-000001", "one", "t1"));
        let s = summary(&agent, "c").unwrap().unwrap();
        let SkipReason::NotAMessage(why) = &s.report.skipped[0].why else {
            panic!("{:?}", s.report.skipped);
        };
        assert!(
            why.chars().count() <= MAX_REASON_CHARS + 1,
            "{} chars",
            why.len()
        );
        assert!(crate::names::first_unsafe(why).is_none(), "{why:?}");
        assert!(why.contains("<U+001B>"), "{why:?}");
    }

    #[test]
    fn a_read_resumes_where_the_last_ended_and_rereads_a_half_written_line() {
        let dir = tempfile::tempdir().unwrap();
        let agent = Home::at(dir.path()).agent("agent-x").unwrap();
        assert!(
            read_messages(&agent, "c", LinePos::default(), |_, _| {})
                .unwrap()
                .is_none()
        );
        open_dir(&agent, "c", true).unwrap();
        let read = |from| {
            let mut got = Vec::new();
            let r = read_messages(&agent, "c", from, |m, _| got.push(m.id))
                .unwrap()
                .unwrap();
            (got, r)
        };
        let (got, r) = read(LinePos::default());
        assert!(got.is_empty() && r.end == LinePos::default());
        append_raw(&agent, "c", &line_of("msg-000001", "one", "t1"));
        let (got, r) = read(r.end);
        assert_eq!(got, ["msg-000001"]);
        // Half a line: not a message yet, and read again next time.
        let two = line_of("msg-000002", "two", "t2");
        append_raw(&agent, "c", &two[..10]);
        let (got, r2) = read(r.end);
        assert!(got.is_empty() && r2.torn_tail && r2.end == r.end);
        append_raw(&agent, "c", &two[10..]);
        let (got, r3) = read(r2.end);
        assert_eq!(got, ["msg-000002"]);
        assert_eq!(r3.end.line, 2);
        // A log replaced by a shorter one is read from its start.
        let log = agent.conversation("c").unwrap().messages_jsonl();
        std::fs::write(&log, line_of("msg-000009", "nine", "t9")).unwrap();
        let (got, _) = read(r3.end);
        assert_eq!(got, ["msg-000009"]);
    }

    #[test]
    fn context_ids_are_counted_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let agent = Home::at(dir.path()).agent("agent-x").unwrap();
        let mut c = Conversation::open(&agent, "c").unwrap();
        for t in ["a", "b", "c"] {
            let m = msg(&mut c, t);
            c.append(m).unwrap();
        }
        assert_eq!(in_context_count(&agent, "c", 3).unwrap(), 3);
        c.remove_from_context("msg-000002").unwrap();
        assert_eq!(in_context_count(&agent, "c", 3).unwrap(), 2);
        c.write_file(CONTEXT_FILE_NAME, br#"{"in_context_message_ids": [1]}"#)
            .unwrap();
        assert!(in_context_count(&agent, "c", 3).is_err());
        let d = agent
            .conversation("c")
            .unwrap()
            .dir()
            .join(CONTEXT_FILE_NAME);
        std::fs::remove_file(d).unwrap();
        assert_eq!(in_context_count(&agent, "c", 3).unwrap(), 3);
    }
}
