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

mod context_count;
mod dir;
mod error;
pub mod last_request;
pub mod lines;
mod log_read;
mod log_write;
mod message;
pub mod said;

use std::io::{Read, Write};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::agentfs::{Dir, FsError};
use crate::paths::{
    AgentPaths, COMPACTION_EVENT_FILE_NAME, CONTEXT_FILE_NAME, CONVERSATION_SETTINGS_FILE_NAME,
    ConversationPaths, LAST_REQUEST_FILE_NAME, MESSAGES_FILE_NAME, PENDING_REMINDERS_FILE_NAME,
};
use crate::protocol::messages::Role;
pub use context_count::in_context_count;
pub(crate) use dir::read_optional;
pub use dir::{MAX_JSON_BYTES, list_ids, open_dir};
pub use error::ConversationError;
use error::io;
pub use last_request::{LAST_REQUEST_MAX_BYTES, LAST_REQUEST_MAX_FILES};
use lines::LinePos;
pub use log_read::{
    LogReport, SkipReason, SkippedLine, Summary, last_messages, read_messages, summary,
};
use log_read::{buffered, open_log, scan};
use log_write::{complete_length, lock_log};
pub use message::StoredMessage;

/// Largest message log read (a child can grow it without bound).
pub const MAX_LOG_BYTES: u64 = 256 << 20;
/// Permission bits of the files written here.
const FILE_PERM: u32 = 0o644;

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

/// Pretty JSON with a final newline.
fn to_json<T: Serialize>(path: PathBuf, value: &T) -> Result<Vec<u8>, ConversationError> {
    let mut json = serde_json::to_vec_pretty(value).map_err(|e| ConversationError::Corrupt {
        path,
        message: e.to_string(),
    })?;
    json.push(b'\n');
    Ok(json)
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
        self.append_flushing(msg, true)
    }

    /// [`Self::append`] without flushing the log: for a message nobody has
    /// been told is kept yet (a turn's user message, before the turn's
    /// answer). The line is written, so it survives the process being
    /// killed; the next flushed append of this log (the answer, or the
    /// error that ends the turn) flushes it too, since a flush covers the
    /// whole file. Only a crash of the machine before then can lose it,
    /// and then the turn was never acknowledged.
    pub fn append_unflushed(&mut self, msg: StoredMessage) -> Result<(), ConversationError> {
        self.append_flushing(msg, false)
    }

    fn append_flushing(
        &mut self,
        msg: StoredMessage,
        flush: bool,
    ) -> Result<(), ConversationError> {
        self.append_to_log(&msg, flush)?;
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
        self.append_to_log(&msg, true)?;
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

    fn append_to_log(&self, msg: &StoredMessage, flush: bool) -> Result<(), ConversationError> {
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
        let written = file
            .write_all(&line)
            .and_then(|()| if flush { file.sync_data() } else { Ok(()) });
        if let Err(e) = written {
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
        // Only a conversation's first such file adds to the agent's count:
        // replacing one leaves nothing to prune (and pruning reads every
        // conversation's directory, too much for every request).
        let first = self.dir.stat_at(LAST_REQUEST_FILE_NAME)?.is_none();
        // For operators only: nothing reads it back after a crash.
        self.dir
            .replace_file_unsynced(LAST_REQUEST_FILE_NAME, &record, FILE_PERM)?;
        if first {
            last_request::prune(agent, LAST_REQUEST_MAX_FILES)?;
        }
        Ok(())
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
    pub(crate) fn set_pending_reminders(
        &self,
        items: &[Reminder],
    ) -> Result<(), ConversationError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::Home;
    use crate::protocol::messages::Part;

    /// A user message with `text`, the next id of `c` (the children's
    /// tests make theirs with it too).
    pub(super) fn msg(c: &mut Conversation, text: &str) -> StoredMessage {
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

    /// A turn's user message is appended unflushed: it is in the file (a
    /// killed process loses nothing it wrote) and in the context at once,
    /// and the answer's flushed append follows it.
    #[test]
    fn an_unflushed_append_is_written_and_the_next_append_follows_it() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path());
        let agent = home.agent("agent-x").unwrap();
        let mut c = Conversation::open(&agent, "default").unwrap();
        let asked = msg(&mut c, "question");
        c.append_unflushed(asked.clone()).unwrap();
        let seen = Conversation::open(&agent, "default").unwrap();
        assert_eq!(seen.messages().len(), 1);
        assert_eq!(seen.context_ids().unwrap(), vec![asked.id.clone()]);
        let answer = msg(&mut c, "answer");
        c.append(answer.clone()).unwrap();
        let seen = Conversation::open(&agent, "default").unwrap();
        assert_eq!(seen.context_ids().unwrap(), vec![asked.id, answer.id]);
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
}
