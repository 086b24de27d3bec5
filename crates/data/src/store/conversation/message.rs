//! One stored message: a line of `messages.jsonl`, as written and read
//! back.

use serde::{Deserialize, Serialize};

use crate::protocol::messages::{Message, Part, Role, Usage};

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
