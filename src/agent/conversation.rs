//! One conversation on disk (book names, spec agent-loop.md §1.2):
//!
//! * `messages.jsonl` — append-only, one JSON object a line; never rewritten.
//!   A torn last line (a crash mid-append) is detected and ignored, never
//!   fatal, and the next append starts on a fresh line.
//! * `context.json` — `{"in_context_message_ids": [...]}`: which stored
//!   messages the model sees, in order (compaction rewrites this, not the log).
//! * `pending-reminders.json` — `{"items": [{"id", "text"}]}`: reminders
//!   queued after a turn and delivered with the next user message.
//!
//! JSON files are replaced atomically (temp file, fsync, rename).

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::fsutil::atomic_write;
use crate::model::{Message, Part, Role, Usage};
use crate::paths::{AgentPaths, ConversationPaths, PathsError};

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
}

fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> ConversationError + '_ {
    move |source| ConversationError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Replace `path` atomically with pretty JSON and a final newline.
fn write_json<T: Serialize>(path: &std::path::Path, value: &T) -> Result<(), ConversationError> {
    let mut json = serde_json::to_vec_pretty(value).map_err(|e| ConversationError::Corrupt {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    json.push(b'\n');
    atomic_write(path, &json).map_err(io(path))
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

/// An open conversation.
pub struct Conversation {
    pub id: String,
    paths: ConversationPaths,
    messages: Vec<StoredMessage>,
    /// Whether the log's last line was torn (ignored on load).
    pub torn_tail: bool,
    next: u64,
}

impl Conversation {
    /// Open (creating if needed) conversation `id` of an agent.
    pub fn open(agent: &AgentPaths, id: &str) -> Result<Self, ConversationError> {
        let paths = agent.conversation(id)?;
        fs::create_dir_all(paths.dir()).map_err(io(paths.dir()))?;
        let log = paths.messages_jsonl();
        let text = match fs::read(&log) {
            Ok(b) => String::from_utf8_lossy(&b).into_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(io(&log)(e)),
        };
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
    pub fn append(&mut self, msg: StoredMessage) -> Result<(), ConversationError> {
        let log = self.paths.messages_jsonl();
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(&log)
            .map_err(io(&log))?;
        let mut line = serde_json::to_vec(&msg).map_err(|e| ConversationError::Corrupt {
            path: log.clone(),
            message: e.to_string(),
        })?;
        line.push(b'\n');
        // After a torn line, start on a fresh line so ours stays parsable.
        let len = file.metadata().map_err(io(&log))?.len();
        if len > 0 {
            use std::io::{Read, Seek, SeekFrom};
            let mut last = [0u8; 1];
            let mut f = fs::File::open(&log).map_err(io(&log))?;
            f.seek(SeekFrom::End(-1)).map_err(io(&log))?;
            f.read_exact(&mut last).map_err(io(&log))?;
            if last[0] != b'\n' {
                line.insert(0, b'\n');
            }
        }
        file.write_all(&line).map_err(io(&log))?;
        file.sync_data().map_err(io(&log))?;
        let mut ids = self.context_ids()?;
        ids.push(msg.id.clone());
        self.set_context_ids(&ids)?;
        self.messages.push(msg);
        Ok(())
    }

    /// Ids of the messages in the model's context. Without a context file,
    /// every stored message.
    pub fn context_ids(&self) -> Result<Vec<String>, ConversationError> {
        let path = self.paths.context_json();
        match fs::read(&path) {
            Ok(b) => serde_json::from_slice::<ContextFile>(&b)
                .map(|c| c.in_context_message_ids)
                .map_err(|e| ConversationError::Corrupt {
                    path,
                    message: e.to_string(),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Ok(self.messages.iter().map(|m| m.id.clone()).collect())
            }
            Err(e) => Err(io(&path)(e)),
        }
    }

    pub fn set_context_ids(&self, ids: &[String]) -> Result<(), ConversationError> {
        write_json(
            &self.paths.context_json(),
            &ContextFile {
                in_context_message_ids: ids.to_vec(),
            },
        )
    }

    /// The in-context messages, in order (unknown ids are skipped).
    pub fn context(&self) -> Result<Vec<&StoredMessage>, ConversationError> {
        let ids = self.context_ids()?;
        Ok(ids
            .iter()
            .filter_map(|id| self.messages.iter().rev().find(|m| &m.id == id))
            .collect())
    }

    /// Queued reminders.
    pub fn pending_reminders(&self) -> Result<Vec<Reminder>, ConversationError> {
        let path = self.paths.pending_reminders_json();
        match fs::read(&path) {
            Ok(b) => Ok(serde_json::from_slice::<RemindersFile>(&b)
                .map(|r| r.items)
                .unwrap_or_else(|e| {
                    tracing::warn!("{}: unreadable reminders dropped ({e})", path.display());
                    Vec::new()
                })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(io(&path)(e)),
        }
    }

    /// Replace the reminder queue.
    pub fn set_pending_reminders(&self, items: &[Reminder]) -> Result<(), ConversationError> {
        write_json(
            &self.paths.pending_reminders_json(),
            &RemindersFile {
                items: items.to_vec(),
            },
        )
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
        let mut f = OpenOptions::new().append(true).open(&log).unwrap();
        f.write_all(b"{\"id\":\"msg-000002\",\"ro").unwrap();
        drop(f);
        let mut c = Conversation::open(&agent, "default").unwrap();
        assert!(c.torn_tail);
        assert_eq!(c.messages().len(), 1);
        let m = msg(&mut c, "two");
        c.append(m).unwrap();
        let c = Conversation::open(&agent, "default").unwrap();
        assert_eq!(
            c.messages().iter().map(|m| m.text()).collect::<Vec<_>>(),
            ["one", "two"]
        );
        assert_eq!(c.context().unwrap().len(), 2);
    }
}
