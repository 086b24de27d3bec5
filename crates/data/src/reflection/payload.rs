//! Choosing what a reflection reads, and writing it for the sub-agent
//! (spec §5.3).
//!
//! ## Which rows
//!
//! A conversation's unreflected part is everything in `messages.jsonl`
//! after its cursor (`reflectedThroughMessageId`; none or unknown: from
//! the start). Of those rows the payload keeps what was actually said:
//!
//! * user, assistant and tool rows with no `kind` (the user's words, the
//!   model's answers and tool calls, the tools' results);
//! * not harness rows, i.e. any row with a `kind`: compaction `summary`
//!   rows (they restate older messages), `memory_update` and `reminder`
//!   rows, `error` rows and `interrupted` notices;
//! * `<system-reminder>` blocks inside user text are cut out, and a user
//!   row left with nothing is dropped.
//!
//! *Canonical* rows are the kept user and assistant rows. A conversation
//! has a payload only if at least one canonical row follows its cursor; the
//! slice runs from the first kept row through the **last canonical** row,
//! so a tool round still in progress at the end waits for the next time.
//!
//! ## Sizes
//!
//! Text is cut at [`TEXT_MAX_CHARS`] a message, tool-call arguments at
//! [`TOOL_ARGS_MAX_CHARS`], tool results at [`TOOL_RESULT_MAX_CHARS`]. The
//! slices of one launch share a budget ([`DEFAULT_BUDGET_CHARS`]): the
//! first (most recently active) conversation is always admitted, a later one
//! only if it still fits. One conversation's slice never exceeds the budget
//! either: a long backlog is cut after the row that fills it (oldest rows
//! first), and the rest is left for the next reflection.
//!
//! ## Files
//!
//! `reflections/payloads/<launch-id>/<conversation-id>.json` holds one
//! slice, a pretty JSON array of [`PayloadRecord`]s;
//! `reflections/payloads/<launch-id>/manifest.json` the [`Manifest`]. The
//! supervisor writes them, mode 0644 in 0755 directories, so the confined
//! reflection child can read them.
//!
//! `*_line` fields count parsed rows of `messages.jsonl` (0-based;
//! `end_snapshot_line` is one past the last row covered). Finalizing uses
//! `end_message_id`, so rows appended while the reflection runs stay
//! unreflected.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::{PUBLIC_DIR_MODE, PUBLIC_FILE_MODE, ReflectionError, state};
use crate::agentfs::Dir;
use crate::paths::{
    AgentPaths, REFLECTION_MANIFEST_FILE_NAME, REFLECTION_PAYLOADS_DIR_NAME,
    reflection_payload_file_name,
};
use crate::protocol::messages::{Part, Role};
use crate::store::conversation::{self, Conversation, StoredMessage};

/// Budget of one launch's slices, in characters.
pub const DEFAULT_BUDGET_CHARS: usize = 150_000;
/// Conversations one launch looks at by default (the most recent ones).
pub const DEFAULT_LIMIT: usize = 10;
/// Longest tool-call arguments kept (characters of their JSON).
pub const TOOL_ARGS_MAX_CHARS: usize = 300;
/// Longest tool result kept.
pub const TOOL_RESULT_MAX_CHARS: usize = 2_000;
/// Longest text of one message kept.
pub const TEXT_MAX_CHARS: usize = 20_000;
/// Largest manifest or slice file read back.
const MAX_PAYLOAD_FILE_BYTES: u64 = 8 << 20;
/// Most entries removed from one launch's payload directory.
const MAX_PAYLOAD_ENTRIES: usize = 10_000;

/// The manifest's `type`.
pub const MANIFEST_TYPE: &str = "multi_transcript_reflection_payload";

/// One tool call, as the sub-agent reads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallRecord {
    pub name: String,
    /// The arguments' JSON, cut at [`TOOL_ARGS_MAX_CHARS`].
    pub arguments: String,
}

/// One tool result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResultRecord {
    pub name: String,
    /// Cut at [`TOOL_RESULT_MAX_CHARS`].
    pub text: String,
    #[serde(default)]
    pub is_error: bool,
}

/// One normalised message of a slice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayloadRecord {
    pub message_id: String,
    /// `user`, `assistant` or `tool`.
    pub role: String,
    pub ts: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub text: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallRecord>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_results: Vec<ToolResultRecord>,
}

impl PayloadRecord {
    /// A kept user or assistant row (see the module doc).
    pub(crate) fn is_canonical(&self) -> bool {
        self.role == "user" || self.role == "assistant"
    }
}

/// How the conversations of a launch were chosen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "kebab-case")]
pub enum SelectionPolicy {
    /// The `limit` most recently active conversations with unreflected rows.
    Recent { limit: usize },
    /// Exactly these conversations (those with unreflected rows).
    ExplicitConversations { conversation_ids: Vec<String> },
}

/// Whether a slice is new material (its cursor advances on success) or
/// context already reflected on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SliceMode {
    Unreflected,
    Replay,
}

/// One conversation's slice in the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TranscriptSlice {
    pub conversation_id: String,
    pub mode: SliceMode,
    /// Absolute path of the slice file.
    pub payload_path: String,
    pub start_message_id: String,
    pub end_message_id: String,
    pub start_line: usize,
    pub end_line: usize,
    pub end_snapshot_line: usize,
    /// User messages in the slice that an assistant answered in it.
    pub completed_turns: usize,
    /// Characters of the slice file.
    pub approx_chars: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_updated_at: Option<String>,
}

/// `manifest.json` of a launch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub schema_version: u32,
    #[serde(rename = "type")]
    pub kind: String,
    pub agent_id: String,
    /// The launch this payload belongs to (its directory's name).
    pub launch_id: String,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_instruction: Option<String>,
    pub selection_policy: SelectionPolicy,
    pub transcripts: Vec<TranscriptSlice>,
}

/// What [`select_and_write`] is asked for.
#[derive(Debug, Clone)]
pub struct SelectOptions {
    /// The launch id (a fresh one when `None`); letters, digits, `-`, `_`.
    pub launch_id: Option<String>,
    /// Most conversations considered (most recently active first).
    pub limit: usize,
    /// Only these conversations, when given.
    pub conversations: Option<Vec<String>>,
    pub budget_chars: usize,
    /// The user's extra instruction for this reflection (trimmed; empty is none).
    pub user_instruction: Option<String>,
}

impl Default for SelectOptions {
    fn default() -> Self {
        Self {
            launch_id: None,
            limit: DEFAULT_LIMIT,
            conversations: None,
            budget_chars: DEFAULT_BUDGET_CHARS,
            user_instruction: None,
        }
    }
}

/// `message` normalised for the payload, `None` when it is not kept (see
/// the module doc).
pub fn normalize(message: &StoredMessage) -> Option<PayloadRecord> {
    if message.kind.is_some() {
        return None;
    }
    let role = match message.role {
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let mut texts = Vec::new();
    let mut tool_calls = Vec::new();
    let mut tool_results = Vec::new();
    for part in &message.parts {
        match part {
            Part::Text { text } => {
                let text = if message.role == Role::User {
                    crate::protocol::messages::strip_reminders(text)
                } else {
                    text.clone()
                };
                let text = text.trim();
                if !text.is_empty() {
                    texts.push(text.to_string());
                }
            }
            Part::ToolCall {
                name, arguments, ..
            } => tool_calls.push(ToolCallRecord {
                name: name.clone(),
                arguments: super::truncate_chars(&arguments.to_string(), TOOL_ARGS_MAX_CHARS),
            }),
            Part::ToolResult {
                name,
                text,
                is_error,
                ..
            } => tool_results.push(ToolResultRecord {
                name: name.clone(),
                text: super::truncate_chars(text, TOOL_RESULT_MAX_CHARS),
                is_error: *is_error,
            }),
        }
    }
    if texts.is_empty() && tool_calls.is_empty() && tool_results.is_empty() {
        return None;
    }
    Some(PayloadRecord {
        message_id: message.id.clone(),
        role: role.to_string(),
        ts: message.ts.clone(),
        text: super::truncate_chars(&texts.join("\n"), TEXT_MAX_CHARS),
        tool_calls,
        tool_results,
    })
}

/// A conversation's unreflected slice, before it is written.
#[derive(Debug, Clone)]
pub struct Slice {
    pub conversation_id: String,
    pub records: Vec<PayloadRecord>,
    pub start_line: usize,
    pub end_line: usize,
    pub completed_turns: usize,
    pub last_updated_at: Option<String>,
}

impl Slice {
    pub(crate) fn start_message_id(&self) -> &str {
        self.records.first().map_or("", |r| r.message_id.as_str())
    }

    pub fn end_message_id(&self) -> &str {
        self.records.last().map_or("", |r| r.message_id.as_str())
    }
}

/// The unreflected slice of `messages` after `cursor`, at most about
/// `max_chars` (see the module doc); `None` when there is nothing new.
pub(crate) fn slice_messages(
    conversation_id: &str,
    messages: &[StoredMessage],
    cursor: Option<&str>,
    max_chars: usize,
) -> Option<Slice> {
    let from = state::cursor_index(messages, cursor).map_or(0, |i| i + 1);
    let mut kept: Vec<(usize, PayloadRecord)> = Vec::new();
    let mut chars = 0usize;
    let mut last_canonical: Option<usize> = None;
    for (line, message) in messages.iter().enumerate().skip(from) {
        let Some(record) = normalize(message) else {
            continue;
        };
        // Past the budget with something to show: the rest waits.
        if chars >= max_chars && last_canonical.is_some() {
            break;
        }
        chars += serde_json::to_string(&record).map_or(0, |s| s.chars().count());
        if record.is_canonical() {
            last_canonical = Some(kept.len());
        }
        kept.push((line, record));
    }
    kept.truncate(last_canonical? + 1);
    let start_line = kept.first().map(|(l, _)| *l)?;
    let end_line = kept.last().map(|(l, _)| *l)?;
    let records: Vec<PayloadRecord> = kept.into_iter().map(|(_, r)| r).collect();
    let completed_turns = records
        .iter()
        .enumerate()
        .filter(|(i, r)| {
            r.role == "user"
                && records[i + 1..]
                    .iter()
                    .any(|later| later.role == "assistant")
        })
        .count();
    Some(Slice {
        conversation_id: conversation_id.to_string(),
        records,
        start_line,
        end_line,
        completed_turns,
        last_updated_at: messages.last().map(|m| m.ts.clone()),
    })
}

/// Conversation `id`'s unreflected slice (its cursor from its state).
pub(crate) fn slice_conversation(
    agent: &AgentPaths,
    id: &str,
    max_chars: usize,
) -> Result<Option<Slice>, ReflectionError> {
    let Some(conv) = Conversation::open_existing(agent, id)? else {
        return Ok(None);
    };
    let st = state::load(agent, id)?;
    Ok(slice_messages(
        id,
        conv.messages(),
        st.reflected_through_message_id.as_deref(),
        max_chars,
    ))
}

/// Sort key of a slice: its last activity (RFC 3339 when it parses).
fn activity(slice: &Slice) -> Option<OffsetDateTime> {
    slice
        .last_updated_at
        .as_deref()
        .and_then(crate::clock::parse_rfc3339)
}

/// Select the conversations with unreflected content, write their slices
/// and the manifest under `reflections/payloads/<launch-id>/`, and stamp
/// `lastStartedAt` in each chosen conversation. `None` (`no_payload`) when
/// no conversation has anything new; nothing is written then.
pub fn select_and_write(
    agent: &AgentPaths,
    agent_id: &str,
    options: &SelectOptions,
    now: OffsetDateTime,
) -> Result<Option<Manifest>, ReflectionError> {
    let budget = options.budget_chars.max(1);
    let (slices, policy) = candidate_slices(agent, options, budget)?;
    let launch_id = match &options.launch_id {
        Some(id) => id.clone(),
        None => crate::names::stamped_id(now),
    };
    // Checks the id before anything is made.
    agent.reflection_payload_dir(&launch_id)?;
    let admitted = admit_within_budget(agent, &launch_id, slices, budget)?;
    if admitted.is_empty() {
        return Ok(None);
    }

    let dir = open_launch_dir(agent, &launch_id, true)?.ok_or_else(|| ReflectionError::Io {
        path: agent.reflection_payloads_dir().join(&launch_id),
        source: std::io::ErrorKind::NotFound.into(),
    })?;
    let transcripts = write_slices(agent, &dir, &launch_id, &admitted)?;
    let manifest = Manifest {
        schema_version: 1,
        kind: MANIFEST_TYPE.to_string(),
        agent_id: agent_id.to_string(),
        launch_id: launch_id.clone(),
        created_at: crate::clock::rfc3339(now),
        user_instruction: options
            .user_instruction
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string),
        selection_policy: policy,
        transcripts,
    };
    let bytes = super::to_pretty_json(&manifest, agent.reflection_manifest_json(&launch_id)?)?;
    dir.replace_file(REFLECTION_MANIFEST_FILE_NAME, &bytes, PUBLIC_FILE_MODE)?;
    stamp_started(agent, &manifest, now);
    Ok(Some(manifest))
}

/// The slices a launch may take, most recently active first (the `limit`
/// most recent unless conversations were named), and the policy that
/// chose them. A conversation asked for by name that cannot be read fails
/// the launch; otherwise an unreadable one is skipped with a warning.
fn candidate_slices(
    agent: &AgentPaths,
    options: &SelectOptions,
    budget: usize,
) -> Result<(Vec<Slice>, SelectionPolicy), ReflectionError> {
    let (ids, policy) = match &options.conversations {
        Some(ids) => (
            ids.clone(),
            SelectionPolicy::ExplicitConversations {
                conversation_ids: ids.clone(),
            },
        ),
        None => (
            conversation::list_ids(agent)?,
            SelectionPolicy::Recent {
                limit: options.limit,
            },
        ),
    };
    let mut slices = Vec::new();
    for id in &ids {
        match slice_conversation(agent, id, budget) {
            Ok(Some(s)) => slices.push(s),
            Ok(None) => {}
            // Asked for by name: say why it cannot be read.
            Err(e) if options.conversations.is_some() => return Err(e),
            // One unreadable conversation does not stop reflection on the
            // others.
            Err(e) => tracing::warn!("reflection skips conversation {id}: {e}"),
        }
    }
    // Most recently active first (ties and unparsable times: by id).
    slices.sort_by(|a, b| {
        activity(b)
            .cmp(&activity(a))
            .then_with(|| a.conversation_id.cmp(&b.conversation_id))
    });
    if options.conversations.is_none() {
        slices.truncate(options.limit.max(1));
    }
    Ok((slices, policy))
}

/// `slices` with their files' bytes, as many as the launch's budget
/// holds: the first always, a later one only if it still fits.
fn admit_within_budget(
    agent: &AgentPaths,
    launch_id: &str,
    slices: Vec<Slice>,
    budget: usize,
) -> Result<Vec<(Slice, Vec<u8>)>, ReflectionError> {
    let mut admitted: Vec<(Slice, Vec<u8>)> = Vec::new();
    let mut used = 0usize;
    for slice in slices {
        let path = agent.reflection_payload_file(launch_id, &slice.conversation_id)?;
        let bytes = super::to_pretty_json(&slice.records, path)?;
        let chars = String::from_utf8_lossy(&bytes).chars().count();
        if !admitted.is_empty() && used + chars > budget {
            continue;
        }
        used += chars;
        admitted.push((slice, bytes));
    }
    Ok(admitted)
}

/// Write each admitted slice's file in the launch directory `dir`; the
/// manifest's entries for them.
fn write_slices(
    agent: &AgentPaths,
    dir: &Dir,
    launch_id: &str,
    admitted: &[(Slice, Vec<u8>)],
) -> Result<Vec<TranscriptSlice>, ReflectionError> {
    let mut transcripts = Vec::new();
    for (slice, bytes) in admitted {
        let name = reflection_payload_file_name(&slice.conversation_id)?;
        dir.replace_file(&name, bytes, PUBLIC_FILE_MODE)?;
        let path = agent.reflection_payload_file(launch_id, &slice.conversation_id)?;
        transcripts.push(TranscriptSlice {
            conversation_id: slice.conversation_id.clone(),
            mode: SliceMode::Unreflected,
            payload_path: path.to_string_lossy().into_owned(),
            start_message_id: slice.start_message_id().to_string(),
            end_message_id: slice.end_message_id().to_string(),
            start_line: slice.start_line,
            end_line: slice.end_line,
            end_snapshot_line: slice.end_line + 1,
            completed_turns: slice.completed_turns,
            approx_chars: String::from_utf8_lossy(bytes).chars().count(),
            last_updated_at: slice.last_updated_at.clone(),
        });
    }
    Ok(transcripts)
}

/// Stamp `lastStartedAt` in each conversation of `manifest`; a stamp that
/// fails is only warned about (the payload is written already).
fn stamp_started(agent: &AgentPaths, manifest: &Manifest, now: OffsetDateTime) {
    for slice in &manifest.transcripts {
        if let Err(e) = state::mark_started(agent, &slice.conversation_id, now) {
            tracing::warn!(
                "conversation {}: cannot stamp the reflection start: {e}",
                slice.conversation_id
            );
        }
    }
}

/// `reflections/payloads/<launch-id>/`, made (0755) when `create`.
fn open_launch_dir(
    agent: &AgentPaths,
    launch_id: &str,
    create: bool,
) -> Result<Option<Dir>, ReflectionError> {
    agent.reflection_payload_dir(launch_id)?;
    let Some(top) = super::open_reflections_dir(agent, create)? else {
        return Ok(None);
    };
    let open = |parent: &Dir, name: &str| -> Result<Option<Dir>, ReflectionError> {
        if create {
            let d = parent.create_dir(name, PUBLIC_DIR_MODE)?;
            // The umask must not hide the payload from the child.
            d.chmod(PUBLIC_DIR_MODE)?;
            return Ok(Some(d));
        }
        match parent.open_dir(name) {
            Ok(d) => Ok(Some(d)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e.into()),
        }
    };
    if create {
        top.chmod(PUBLIC_DIR_MODE)?;
    }
    let Some(payloads) = open(&top, REFLECTION_PAYLOADS_DIR_NAME)? else {
        return Ok(None);
    };
    open(&payloads, launch_id)
}

/// The manifest of launch `launch_id`, read back (bounded, unfollowed).
#[cfg(test)]
pub(crate) fn load_manifest(
    agent: &AgentPaths,
    launch_id: &str,
) -> Result<Manifest, ReflectionError> {
    let dir = open_launch_dir(agent, launch_id, false)?.ok_or_else(|| ReflectionError::Io {
        path: agent.reflection_payload_dir(launch_id).unwrap_or_default(),
        source: std::io::ErrorKind::NotFound.into(),
    })?;
    super::read_json(&dir, REFLECTION_MANIFEST_FILE_NAME, MAX_PAYLOAD_FILE_BYTES)?.ok_or_else(
        || ReflectionError::Io {
            path: dir.path().join(REFLECTION_MANIFEST_FILE_NAME),
            source: std::io::ErrorKind::NotFound.into(),
        },
    )
}

/// The records of each slice of `manifest`, read back from its launch
/// directory by conversation id (not by the manifest's path text).
pub(crate) fn read_slices(
    agent: &AgentPaths,
    manifest: &Manifest,
) -> Result<Vec<(String, Vec<PayloadRecord>)>, ReflectionError> {
    let dir =
        open_launch_dir(agent, &manifest.launch_id, false)?.ok_or_else(|| ReflectionError::Io {
            path: agent.reflection_payloads_dir().join(&manifest.launch_id),
            source: std::io::ErrorKind::NotFound.into(),
        })?;
    let mut out = Vec::new();
    for slice in &manifest.transcripts {
        let name = reflection_payload_file_name(&slice.conversation_id)?;
        let records: Vec<PayloadRecord> = super::read_json(&dir, &name, MAX_PAYLOAD_FILE_BYTES)?
            .ok_or_else(|| ReflectionError::Io {
                path: dir.path().join(&name),
                source: std::io::ErrorKind::NotFound.into(),
            })?;
        out.push((slice.conversation_id.clone(), records));
    }
    Ok(out)
}

/// A reflection over `manifest` succeeded (its worktree merged or needed
/// no change): each `unreflected` slice's cursor moves to its
/// `end_message_id` and `lastSucceededAt` is stamped. Every slice is tried;
/// the first error is returned. (On failure the caller simply does not call
/// this: the cursors stay where they were.)
pub(crate) fn finalize_success(
    agent: &AgentPaths,
    manifest: &Manifest,
    now: OffsetDateTime,
) -> Result<(), ReflectionError> {
    let mut first_error = None;
    for slice in &manifest.transcripts {
        if slice.mode != SliceMode::Unreflected {
            continue;
        }
        if let Err(e) =
            state::mark_succeeded(agent, &slice.conversation_id, &slice.end_message_id, now)
        {
            tracing::warn!(
                "conversation {}: cannot advance the reflection cursor: {e}",
                slice.conversation_id
            );
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Remove launch `launch_id`'s payload directory (missing is fine).
pub(crate) fn remove_payload(agent: &AgentPaths, launch_id: &str) -> Result<(), ReflectionError> {
    let Some(payloads) = open_launch_dir(agent, launch_id, false)? else {
        return Ok(());
    };
    for name in payloads.list(MAX_PAYLOAD_ENTRIES)? {
        match payloads.remove_file(&name) {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    drop(payloads);
    let Some(top) = super::open_reflections_dir(agent, false)? else {
        return Ok(());
    };
    let parent = top.open_dir(REFLECTION_PAYLOADS_DIR_NAME)?;
    match parent.remove_dir(launch_id) {
        Ok(()) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Remove every launch's payload (after a crash, no reflection runs).
pub(crate) fn remove_all(agent: &AgentPaths) -> Result<(), ReflectionError> {
    let Some(top) = super::open_reflections_dir(agent, false)? else {
        return Ok(());
    };
    let payloads = match top.open_dir(REFLECTION_PAYLOADS_DIR_NAME) {
        Ok(d) => d,
        Err(e) if e.is_not_found() => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    for name in payloads.list(MAX_PAYLOAD_ENTRIES)? {
        // Only names a launch id could have; anything else is left alone.
        if let Some(id) = name.to_str().filter(|n| crate::paths::is_valid_agent_id(n)) {
            remove_payload(agent, id)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reflection::testutil::{self, say, say_kind, say_parts};
    use serde_json::json;
    use std::os::unix::fs::PermissionsExt;

    fn now() -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }

    fn tool_round(conv: &mut Conversation, result: &str) -> (String, String) {
        let call = say_parts(
            conv,
            Role::Assistant,
            vec![Part::ToolCall {
                id: "t1".into(),
                name: "bash".into(),
                arguments: json!({"command": "x".repeat(1000)}),
            }],
        );
        let res = say_parts(
            conv,
            Role::Tool,
            vec![Part::ToolResult {
                call_id: "t1".into(),
                name: "bash".into(),
                text: result.into(),
                is_error: false,
            }],
        );
        (call, res)
    }

    #[test]
    fn normalisation_keeps_words_and_drops_harness_rows() {
        let (_t, agent) = testutil::agent();
        let mut conv = Conversation::open(&agent, "c1").expect("open");
        say_kind(&mut conv, Role::User, "Summary of 3 messages", "summary");
        let first = say(
            &mut conv,
            Role::User,
            "<system-reminder>\nMEMORY COMMIT NEEDED\n</system-reminder>\nI prefer tea",
        );
        say_kind(
            &mut conv,
            Role::User,
            "<system-reminder>x</system-reminder>",
            "memory_update",
        );
        tool_round(&mut conv, &"r".repeat(5000));
        say_kind(&mut conv, Role::Assistant, "[error] boom", "error");
        let last = say(&mut conv, Role::Assistant, "Noted.");
        say_kind(
            &mut conv,
            Role::Assistant,
            "[Interrupted by user]",
            "interrupted",
        );

        let s = slice_messages("c1", conv.messages(), None, DEFAULT_BUDGET_CHARS).expect("slice");
        let roles: Vec<&str> = s.records.iter().map(|r| r.role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "tool", "assistant"]);
        assert_eq!(s.records[0].text, "I prefer tea", "reminder cut out");
        assert_eq!(s.start_message_id(), first);
        assert_eq!(s.end_message_id(), last);
        assert_eq!(s.start_line, 1);
        assert_eq!(s.end_line, 6);
        assert_eq!(s.completed_turns, 1);
        let call = &s.records[1].tool_calls[0];
        assert_eq!(call.name, "bash");
        assert!(call.arguments.starts_with("{\"command\":\"xxx"));
        assert!(call.arguments.chars().count() < TOOL_ARGS_MAX_CHARS + 50);
        assert!(call.arguments.contains("[truncated"));
        let result = &s.records[2].tool_results[0];
        assert!(result.text.chars().count() < TOOL_RESULT_MAX_CHARS + 50);
    }

    #[test]
    fn nothing_after_the_cursor_or_only_harness_rows_is_no_payload() {
        let (_t, agent) = testutil::agent();
        let mut conv = Conversation::open(&agent, "c1").expect("open");
        say(&mut conv, Role::User, "hi");
        let end = say(&mut conv, Role::Assistant, "hello");
        say_kind(
            &mut conv,
            Role::User,
            "<system-reminder>r</system-reminder>",
            "reminder",
        );
        assert!(slice_messages("c1", conv.messages(), Some(&end), 1000).is_none());
        // A tool round without its closing answer waits too.
        say(&mut conv, Role::User, "run it");
        tool_round(&mut conv, "ok");
        let s = slice_messages("c1", conv.messages(), Some(&end), 100_000).expect("slice");
        assert_eq!(s.records.len(), 2, "through the last user/assistant row");
        assert_eq!(s.records[1].tool_calls.len(), 1);
    }

    #[test]
    fn a_long_backlog_is_cut_oldest_first() {
        let mut msgs = Vec::new();
        for i in 0..50 {
            let role = if i % 2 == 0 {
                Role::User
            } else {
                Role::Assistant
            };
            msgs.push(StoredMessage::new(
                format!("msg-{i:06}"),
                role,
                vec![Part::text("y".repeat(100))],
            ));
        }
        let s = slice_messages("c1", &msgs, None, 1000).expect("slice");
        assert!(s.records.len() < 50 && !s.records.is_empty());
        assert_eq!(s.start_message_id(), "msg-000000");
        // Even a budget smaller than one message admits one row.
        let one = slice_messages("c1", &msgs, None, 1).expect("slice");
        assert_eq!(one.records.len(), 1);
    }

    fn two_conversations(agent: &AgentPaths) -> (String, String) {
        let mut a = Conversation::open(agent, "conv-a").expect("a");
        say(&mut a, Role::User, "- I live in Lisbon");
        let a_end = say(&mut a, Role::Assistant, "Got it.");
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut b = Conversation::open(agent, "conv-b").expect("b");
        say(&mut b, Role::User, "- I prefer tea");
        let b_end = say(&mut b, Role::Assistant, "Tea it is.");
        (a_end, b_end)
    }

    #[test]
    fn select_writes_slices_and_a_manifest_then_finalize_advances() {
        let (_t, agent) = testutil::agent();
        let (a_end, b_end) = two_conversations(&agent);
        let opts = SelectOptions {
            user_instruction: Some("  only tea  ".into()),
            ..Default::default()
        };
        let m = select_and_write(&agent, "a1", &opts, now())
            .expect("select")
            .expect("some");
        assert_eq!(m.kind, MANIFEST_TYPE);
        assert_eq!(m.schema_version, 1);
        assert_eq!(m.user_instruction.as_deref(), Some("only tea"));
        assert_eq!(
            m.selection_policy,
            SelectionPolicy::Recent {
                limit: DEFAULT_LIMIT
            }
        );
        let ids: Vec<&str> = m
            .transcripts
            .iter()
            .map(|t| t.conversation_id.as_str())
            .collect();
        assert_eq!(ids, ["conv-b", "conv-a"], "most recent first");
        assert_eq!(m.transcripts[0].end_message_id, b_end);
        assert_eq!(m.transcripts[0].end_snapshot_line, 2);
        assert_eq!(m.transcripts[0].completed_turns, 1);

        // On disk: pretty manifest with the documented keys, readable modes.
        let manifest_path = agent.reflection_manifest_json(&m.launch_id).expect("path");
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&manifest_path).expect("read")).expect("json");
        assert_eq!(v["type"], MANIFEST_TYPE);
        assert_eq!(v["selection_policy"]["mode"], "recent");
        assert_eq!(v["transcripts"][0]["mode"], "unreflected");
        let slice_path = std::path::PathBuf::from(&m.transcripts[1].payload_path);
        let records: Vec<PayloadRecord> =
            serde_json::from_slice(&std::fs::read(&slice_path).expect("slice")).expect("records");
        assert_eq!(records[0].text, "- I live in Lisbon");
        let mode =
            |p: &std::path::Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&slice_path), 0o644);
        assert_eq!(mode(&manifest_path), 0o644);
        assert_eq!(mode(slice_path.parent().expect("dir")), 0o755);
        assert_eq!(load_manifest(&agent, &m.launch_id).expect("load"), m);
        assert_eq!(read_slices(&agent, &m).expect("slices")[1].1, records);
        assert!(
            state::load(&agent, "conv-a")
                .expect("st")
                .last_started_at
                .is_some()
        );

        // A row appended during the reflection stays unreflected.
        let mut a = Conversation::open(&agent, "conv-a").expect("a");
        say(&mut a, Role::User, "- and I cycle");
        finalize_success(&agent, &m, now()).expect("finalize");
        let st = state::load(&agent, "conv-a").expect("st");
        assert_eq!(
            st.reflected_through_message_id.as_deref(),
            Some(a_end.as_str())
        );
        assert!(st.last_succeeded_at.is_some());
        let again = select_and_write(&agent, "a1", &SelectOptions::default(), now())
            .expect("select")
            .expect("some");
        assert_eq!(again.transcripts.len(), 1);
        assert_eq!(again.transcripts[0].conversation_id, "conv-a");
        let recs = read_slices(&agent, &again).expect("slices");
        assert_eq!(recs[0].1.len(), 1);
        assert_eq!(recs[0].1[0].text, "- and I cycle");

        remove_payload(&agent, &m.launch_id).expect("remove");
        assert!(
            !agent
                .reflection_payload_dir(&m.launch_id)
                .expect("p")
                .exists()
        );
        remove_payload(&agent, &m.launch_id).expect("removing twice is fine");
    }

    #[test]
    fn failure_leaves_cursors_and_nothing_new_is_no_payload() {
        let (_t, agent) = testutil::agent();
        two_conversations(&agent);
        let m = select_and_write(&agent, "a1", &SelectOptions::default(), now())
            .expect("select")
            .expect("some");
        // Failure path: no finalize; the same content is offered again.
        let again = select_and_write(&agent, "a1", &SelectOptions::default(), now())
            .expect("select")
            .expect("some");
        assert_eq!(again.transcripts.len(), 2);
        finalize_success(&agent, &again, now()).expect("finalize");
        assert!(
            select_and_write(&agent, "a1", &SelectOptions::default(), now())
                .expect("select")
                .is_none()
        );
        // Finalizing the older manifest again moves nothing back.
        finalize_success(&agent, &m, now()).expect("finalize old");
        assert!(
            select_and_write(&agent, "a1", &SelectOptions::default(), now())
                .expect("select")
                .is_none()
        );
    }

    #[test]
    fn the_budget_admits_the_first_and_what_fits() {
        let (_t, agent) = testutil::agent();
        two_conversations(&agent);
        let opts = SelectOptions {
            budget_chars: 50,
            ..Default::default()
        };
        let m = select_and_write(&agent, "a1", &opts, now())
            .expect("select")
            .expect("some");
        assert_eq!(m.transcripts.len(), 1);
        assert_eq!(m.transcripts[0].conversation_id, "conv-b");
        let limited = SelectOptions {
            limit: 1,
            ..Default::default()
        };
        let m = select_and_write(&agent, "a1", &limited, now())
            .expect("select")
            .expect("some");
        assert_eq!(m.transcripts.len(), 1);
        let explicit = SelectOptions {
            conversations: Some(vec!["conv-a".into()]),
            ..Default::default()
        };
        let m = select_and_write(&agent, "a1", &explicit, now())
            .expect("select")
            .expect("some");
        assert_eq!(m.transcripts[0].conversation_id, "conv-a");
        assert!(matches!(
            m.selection_policy,
            SelectionPolicy::ExplicitConversations { .. }
        ));
    }

    #[test]
    fn a_bad_launch_id_is_refused() {
        let (_t, agent) = testutil::agent();
        two_conversations(&agent);
        let opts = SelectOptions {
            launch_id: Some("../x".into()),
            ..Default::default()
        };
        assert!(matches!(
            select_and_write(&agent, "a1", &opts, now()),
            Err(ReflectionError::Paths(_))
        ));
    }

    #[test]
    fn launch_ids_are_timestamped() {
        let t = time::macros::datetime!(2026-12-02 10:05:09 UTC);
        let id = crate::names::stamped_id(t);
        assert!(id.starts_with("20261202100509-"), "{id}");
        assert_eq!(id.len(), 14 + 1 + 8);
        assert!(crate::paths::is_valid_agent_id(&id));
    }
}
