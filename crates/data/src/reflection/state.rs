//! `conversations/<id>/reflection-state.json`: how far reflection has read
//! a conversation, and how many steps it has fallen behind.
//!
//! ```json
//! {"stepsSinceLastReflection": 3, "reflectedThroughMessageId": "msg-000012",
//!  "lastStartedAt": "…", "lastSucceededAt": "…", "compactionSeenAt": "…"}
//! ```
//!
//! A *step* is one model response: an assistant message of `messages.jsonl`
//! with no `kind` (so a plain turn adds 1, a turn with one tool round adds
//! 2). Harness-written assistant rows (`kind` `error` or `interrupted`) are
//! not steps: no model answered.
//!
//! The cursor (`reflectedThroughMessageId`) names the last message a
//! successful reflection covered; everything after it is unreflected. It
//! only ever moves forward. The file sits in a directory the agent's child
//! can write, so it is read capped and unfollowed, and a file that does not
//! parse is rebuilt (cursor unknown: everything counts as unreflected)
//! rather than trusted or fatal. `stepsSinceLastReflection` is a cache:
//! [`refresh`] recomputes it from the log.

use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::{MAX_SMALL_JSON_BYTES, ReflectionError};
use crate::agentfs::Dir;
use crate::paths::{AgentPaths, REFLECTION_STATE_FILE_NAME};
use crate::protocol::messages::Role;
use crate::store::conversation::{self, Conversation, StoredMessage};

/// Permission bits of the state file (the agent's tools may read it).
const STATE_FILE_MODE: u32 = 0o644;

/// Serialises read-modify-write of state files within this process (the
/// supervisor finishes a reflection on one thread while a turn ends on
/// another).
static STATE_LOCK: Mutex<()> = Mutex::new(());

/// One conversation's reflection state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReflectionState {
    /// Steps after the cursor (see the module doc).
    #[serde(default)]
    pub steps_since_last_reflection: u64,
    /// The last message covered by a successful reflection.
    #[serde(default)]
    pub reflected_through_message_id: Option<String>,
    /// When a reflection covering this conversation last started (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_started_at: Option<String>,
    /// When one last succeeded (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_succeeded_at: Option<String>,
    /// The `at` of the last `compaction-event.json` the trigger has
    /// considered, so one compaction launches at most one reflection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction_seen_at: Option<String>,
}

/// Whether `m` is a step: a model response, not a harness row.
pub(crate) fn is_step(m: &StoredMessage) -> bool {
    m.role == Role::Assistant && m.kind.is_none()
}

/// The index of the message `cursor` names, if there is one.
pub(crate) fn cursor_index(messages: &[StoredMessage], cursor: Option<&str>) -> Option<usize> {
    let cursor = cursor?;
    messages.iter().position(|m| m.id == cursor)
}

/// Steps after the message whose id is `cursor` (all of them when there is
/// no cursor or it names no message).
pub fn steps_since(messages: &[StoredMessage], cursor: Option<&str>) -> u64 {
    let start = cursor_index(messages, cursor).map_or(0, |i| i + 1);
    messages[start..].iter().filter(|m| is_step(m)).count() as u64
}

/// The conversation's directory, or `UnknownConversation`-style not-found.
fn open_conversation_dir(agent: &AgentPaths, id: &str) -> Result<Dir, ReflectionError> {
    conversation::open_dir(agent, id, false)?.ok_or_else(|| ReflectionError::Io {
        path: agent.conversations_dir().join(id),
        source: std::io::ErrorKind::NotFound.into(),
    })
}

/// The stored state in `dir`; missing is the default, unparsable is the
/// default with a warning (see the module doc).
fn read_in(dir: &Dir) -> Result<ReflectionState, ReflectionError> {
    match super::read_json::<ReflectionState>(dir, REFLECTION_STATE_FILE_NAME, MAX_SMALL_JSON_BYTES)
    {
        Ok(s) => Ok(s.unwrap_or_default()),
        Err(ReflectionError::Corrupt { path, message }) => {
            tracing::warn!("{}: {message}; rebuilding it", path.display());
            Ok(ReflectionState::default())
        }
        Err(e) => Err(e),
    }
}

fn write_in(dir: &Dir, state: &ReflectionState) -> Result<(), ReflectionError> {
    let bytes = super::to_pretty_json(state, dir.path().join(REFLECTION_STATE_FILE_NAME))?;
    dir.replace_file(REFLECTION_STATE_FILE_NAME, &bytes, STATE_FILE_MODE)?;
    Ok(())
}

/// Store a state that differs from `before` only in its step count: that
/// count is always recomputed from the log, so losing it in a crash loses
/// nothing, and it is written without disk flushes (after every turn).
fn write_count_in(dir: &Dir, state: &ReflectionState) -> Result<(), ReflectionError> {
    let bytes = super::to_pretty_json(state, dir.path().join(REFLECTION_STATE_FILE_NAME))?;
    dir.replace_file_unsynced(REFLECTION_STATE_FILE_NAME, &bytes, STATE_FILE_MODE)?;
    Ok(())
}

/// The stored state of conversation `id` as it is on disk (the default
/// when it has none). Its step count may be stale; see [`refresh`].
pub fn load(agent: &AgentPaths, id: &str) -> Result<ReflectionState, ReflectionError> {
    read_in(&open_conversation_dir(agent, id)?)
}

/// Replace the stored state of conversation `id`.
pub fn save(agent: &AgentPaths, id: &str, state: &ReflectionState) -> Result<(), ReflectionError> {
    let _guard = STATE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    write_in(&open_conversation_dir(agent, id)?, state)
}

/// Load, change with `f` (given the conversation's messages), save.
fn update<T>(
    agent: &AgentPaths,
    id: &str,
    f: impl FnOnce(&mut ReflectionState, &[StoredMessage]) -> Result<T, ReflectionError>,
) -> Result<(ReflectionState, T), ReflectionError> {
    let _guard = STATE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let conv = Conversation::open_existing(agent, id)?.ok_or_else(|| ReflectionError::Io {
        path: agent.conversations_dir().join(id),
        source: std::io::ErrorKind::NotFound.into(),
    })?;
    let dir = open_conversation_dir(agent, id)?;
    let mut state = read_in(&dir)?;
    let before = state.clone();
    let out = f(&mut state, conv.messages())?;
    let changed = state != before;
    // The count always follows the log, whatever else changed.
    state.steps_since_last_reflection = steps_since(
        conv.messages(),
        state.reflected_through_message_id.as_deref(),
    );
    if changed {
        write_in(&dir, &state)?;
    } else if state != before || dir.stat_at(REFLECTION_STATE_FILE_NAME)?.is_none() {
        write_count_in(&dir, &state)?;
    }
    Ok((state, out))
}

/// Recompute `stepsSinceLastReflection` from the log and save it (after
/// each turn, before the trigger is evaluated).
pub(crate) fn refresh(agent: &AgentPaths, id: &str) -> Result<ReflectionState, ReflectionError> {
    update(agent, id, |_, _| Ok(())).map(|(s, ())| s)
}

/// Stamp `lastStartedAt` (a reflection covering the conversation began).
pub(crate) fn mark_started(
    agent: &AgentPaths,
    id: &str,
    now: OffsetDateTime,
) -> Result<ReflectionState, ReflectionError> {
    update(agent, id, |s, _| {
        s.last_started_at = Some(crate::clock::rfc3339(now));
        Ok(())
    })
    .map(|(s, ())| s)
}

/// A reflection covering the conversation through `end_message_id`
/// succeeded: the cursor moves there unless it is already later in the
/// log (a cursor never moves back), and `lastSucceededAt` is stamped.
pub(crate) fn mark_succeeded(
    agent: &AgentPaths,
    id: &str,
    end_message_id: &str,
    now: OffsetDateTime,
) -> Result<ReflectionState, ReflectionError> {
    update(agent, id, |s, messages| {
        let new = cursor_index(messages, Some(end_message_id)).ok_or_else(|| {
            ReflectionError::UnknownMessage {
                conversation: id.to_string(),
                message_id: end_message_id.to_string(),
            }
        })?;
        let old = cursor_index(messages, s.reflected_through_message_id.as_deref());
        if old.is_none_or(|old| new > old) {
            s.reflected_through_message_id = Some(end_message_id.to_string());
        }
        s.last_succeeded_at = Some(crate::clock::rfc3339(now));
        Ok(())
    })
    .map(|(s, ())| s)
}

/// Remember that the compaction stamped `at` has been considered.
pub(crate) fn note_compaction_seen(
    agent: &AgentPaths,
    id: &str,
    at: &str,
) -> Result<ReflectionState, ReflectionError> {
    update(agent, id, |s, _| {
        s.compaction_seen_at = Some(at.to_string());
        Ok(())
    })
    .map(|(s, ())| s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::messages::Part;
    use crate::reflection::testutil::{self, say, say_kind, say_parts};
    use serde_json::json;

    fn tool_turn(conv: &mut Conversation) {
        say(conv, Role::User, "look it up");
        say_parts(
            conv,
            Role::Assistant,
            vec![Part::ToolCall {
                id: "c1".into(),
                name: "memory_read".into(),
                arguments: json!({"path": "human.md"}),
            }],
        );
        say_parts(
            conv,
            Role::Tool,
            vec![Part::ToolResult {
                call_id: "c1".into(),
                name: "memory_read".into(),
                text: "…".into(),
                is_error: false,
            }],
        );
        say(conv, Role::Assistant, "found it");
    }

    #[test]
    fn steps_count_model_responses_only() {
        let (_t, agent) = testutil::agent();
        let mut conv = Conversation::open(&agent, "c1").expect("open");
        say(&mut conv, Role::User, "hi");
        let first = say(&mut conv, Role::Assistant, "hello");
        tool_turn(&mut conv);
        say_kind(&mut conv, Role::Assistant, "[error] boom", "error");
        say_kind(&mut conv, Role::User, "<system-reminder>", "reminder");
        let msgs = conv.messages();
        assert_eq!(
            steps_since(msgs, None),
            3,
            "1 plain turn + 2 for the tool turn"
        );
        assert_eq!(steps_since(msgs, Some(&first)), 2);
        assert_eq!(
            steps_since(msgs, Some("msg-999999")),
            3,
            "unknown cursor: all"
        );
    }

    #[test]
    fn refresh_counts_and_saves() {
        let (_t, agent) = testutil::agent();
        let mut conv = Conversation::open(&agent, "c1").expect("open");
        say(&mut conv, Role::User, "hi");
        say(&mut conv, Role::Assistant, "hello");
        tool_turn(&mut conv);
        let s = refresh(&agent, "c1").expect("refresh");
        assert_eq!(s.steps_since_last_reflection, 3);
        let path = agent
            .conversation("c1")
            .expect("paths")
            .reflection_state_json();
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
        assert_eq!(v["stepsSinceLastReflection"], 3);
        assert!(v["reflectedThroughMessageId"].is_null());
        assert_eq!(load(&agent, "c1").expect("load"), s);
    }

    #[test]
    fn cursor_advances_but_never_moves_back() {
        let (_t, agent) = testutil::agent();
        let mut conv = Conversation::open(&agent, "c1").expect("open");
        say(&mut conv, Role::User, "one");
        let early = say(&mut conv, Role::Assistant, "one back");
        say(&mut conv, Role::User, "two");
        let late = say(&mut conv, Role::Assistant, "two back");
        say(&mut conv, Role::User, "three");
        say(&mut conv, Role::Assistant, "three back");
        let now = OffsetDateTime::now_utc();

        let s = mark_succeeded(&agent, "c1", &late, now).expect("late");
        assert_eq!(
            s.reflected_through_message_id.as_deref(),
            Some(late.as_str())
        );
        assert_eq!(s.steps_since_last_reflection, 1);
        assert!(s.last_succeeded_at.is_some());

        let s = mark_succeeded(&agent, "c1", &early, now).expect("early");
        assert_eq!(
            s.reflected_through_message_id.as_deref(),
            Some(late.as_str()),
            "an older end keeps the later cursor"
        );
        assert_eq!(s.steps_since_last_reflection, 1);

        assert!(matches!(
            mark_succeeded(&agent, "c1", "msg-777777", now),
            Err(ReflectionError::UnknownMessage { .. })
        ));
    }

    #[test]
    fn mark_started_and_compaction_seen_are_stamped() {
        let (_t, agent) = testutil::agent();
        let mut conv = Conversation::open(&agent, "c1").expect("open");
        say(&mut conv, Role::User, "hi");
        let now = OffsetDateTime::now_utc();
        let s = mark_started(&agent, "c1", now).expect("start");
        assert_eq!(s.last_started_at, Some(crate::clock::rfc3339(now)));
        let s = note_compaction_seen(&agent, "c1", "2026-01-01T00:00:00Z").expect("seen");
        assert_eq!(
            s.compaction_seen_at.as_deref(),
            Some("2026-01-01T00:00:00Z")
        );
        assert!(s.last_started_at.is_some(), "other fields kept");
    }

    #[test]
    fn garbage_state_is_rebuilt_not_fatal() {
        let (_t, agent) = testutil::agent();
        let mut conv = Conversation::open(&agent, "c1").expect("open");
        say(&mut conv, Role::User, "hi");
        say(&mut conv, Role::Assistant, "hello");
        let path = agent
            .conversation("c1")
            .expect("paths")
            .reflection_state_json();
        std::fs::write(&path, b"\x00\xff not json").expect("write");
        assert_eq!(
            load(&agent, "c1").expect("load"),
            ReflectionState::default()
        );
        let s = refresh(&agent, "c1").expect("refresh");
        assert_eq!(s.steps_since_last_reflection, 1);
        assert_eq!(s.reflected_through_message_id, None);
    }

    #[test]
    fn a_symlinked_or_huge_state_file_is_refused() {
        let (t, agent) = testutil::agent();
        let mut conv = Conversation::open(&agent, "c1").expect("open");
        say(&mut conv, Role::User, "hi");
        let path = agent
            .conversation("c1")
            .expect("paths")
            .reflection_state_json();
        let target = t.path().join("secret");
        std::fs::write(&target, b"{}").expect("write");
        std::os::unix::fs::symlink(&target, &path).expect("symlink");
        assert!(matches!(
            load(&agent, "c1"),
            Err(ReflectionError::Fs(crate::agentfs::FsError::Symlink { .. }))
        ));
        std::fs::remove_file(&path).expect("rm");
        std::fs::write(&path, vec![b' '; (MAX_SMALL_JSON_BYTES + 1) as usize]).expect("big");
        assert!(matches!(
            load(&agent, "c1"),
            Err(ReflectionError::Fs(
                crate::agentfs::FsError::TooLarge { .. }
            ))
        ));
    }

    #[test]
    fn missing_conversation_is_an_error() {
        let (_t, agent) = testutil::agent();
        assert!(load(&agent, "nope").is_err());
        assert!(refresh(&agent, "nope").is_err());
    }
}
