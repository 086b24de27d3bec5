//! An agent's directory ([`AgentPaths`]) and its conversations'
//! ([`ConversationPaths`]), with the [`Home`] methods that find an agent's
//! directory and the reflections' one beside it.

use std::path::{Path, PathBuf};

use super::error::{PathsError, is_plain_component, is_valid_agent_id};
use super::home::{CREATE_STAGING_PREFIX, Home, REFLECTION_SIBLING_SUFFIX};

impl Home {
    /// Paths of one agent. The id is checked so that it can never name a
    /// directory outside `agents/`.
    pub fn agent(&self, id: &str) -> Result<AgentPaths, PathsError> {
        if !is_valid_agent_id(id) {
            return Err(PathsError::InvalidAgentId(id.to_string()));
        }
        Ok(AgentPaths {
            dir: self.agents_dir().join(id),
        })
    }

    /// Where a new agent is assembled before it is renamed to its final
    /// directory. The leading `.` is outside the id alphabet, so listings
    /// never mistake it for an agent.
    pub fn agent_staging(&self, id: &str) -> Result<AgentPaths, PathsError> {
        self.agent(id)?; // validates the id
        Ok(AgentPaths {
            dir: self
                .agents_dir()
                .join(format!("{CREATE_STAGING_PREFIX}{id}")),
        })
    }

    /// The conversation directory of a reflection sub-agent (book lab 5):
    /// `agents/<id>~reflection/conversations/reflection-<launch>/`, where
    /// the supervisor keeps the system prompt the reflection was given.
    /// `~` is outside the id alphabet, so listings never take it for an
    /// agent; both ids are checked.
    pub fn reflection_conversation_dir(
        &self,
        agent_id: &str,
        launch_id: &str,
    ) -> Result<PathBuf, PathsError> {
        if !is_valid_agent_id(launch_id) {
            return Err(PathsError::InvalidConversationId(launch_id.to_string()));
        }
        Ok(self
            .reflection_agent_dir(agent_id)?
            .join(CONVERSATIONS_DIR_NAME)
            .join(format!("reflection-{launch_id}")))
    }

    /// `agents/<id>~reflection/`: the supervisor's directory for agent
    /// `id`'s reflections, beside the agent's own (root's, 0700; it goes
    /// with the agent).
    pub fn reflection_agent_dir(&self, agent_id: &str) -> Result<PathBuf, PathsError> {
        self.agent(agent_id)?;
        Ok(self
            .agents_dir()
            .join(format!("{agent_id}{REFLECTION_SIBLING_SUFFIX}")))
    }
}

/// Paths inside one agent's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentPaths {
    dir: PathBuf,
}

impl AgentPaths {
    /// The paths of the agent whose directory is `dir` (inside a child,
    /// which knows its own directory but not the home around it).
    pub fn from_dir(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
        }
    }
}

/// Name of the memory working tree inside the agent directory.
pub const MEMORY_DIR_NAME: &str = "memory";
/// Name of the memory git directory inside the agent directory.
pub const MEMORY_GIT_DIR_NAME: &str = "memory.git";
/// Name of the agent's temporary directory inside the agent directory.
pub const TMP_DIR_NAME: &str = "tmp";
/// Name of the conversations directory inside the agent directory.
pub const CONVERSATIONS_DIR_NAME: &str = "conversations";
/// The recall index of an agent, inside `conversations/` (the agent child
/// may write it); its name is not a valid conversation id.
pub const RECALL_DIR_NAME: &str = ".recall";
/// The recall index's lock file.
pub const RECALL_LOCK_FILE_NAME: &str = "lock";
/// The recall index's log of terms. (v2: messages are indexed by what
/// was said, without reminders or packaging; v3: the snapshot is read in
/// place, section by section. An index of an earlier version is rebuilt.)
pub const RECALL_TERMS_FILE_NAME: &str = "terms-v3.log";
/// The recall index's log of indexed messages.
pub const RECALL_DOCS_FILE_NAME: &str = "docs-v3.log";
/// The recall index's compacted state.
pub const RECALL_SNAPSHOT_FILE_NAME: &str = "snapshot-v3.bin";
/// The files of an index of an earlier format, removed when it is rebuilt.
pub const RECALL_OLD_FILE_NAMES: [&str; 6] = [
    "terms-v1.log",
    "docs-v1.log",
    "snapshot-v1.bin",
    "terms-v2.log",
    "docs-v2.log",
    "snapshot-v2.bin",
];
/// Name of the memory worktrees directory inside the agent directory.
pub const WORKTREES_DIR_NAME: &str = "memory-worktrees";
/// Name of the reflections directory inside the agent directory.
pub const REFLECTIONS_DIR_NAME: &str = "reflections";
/// The agent's reflection settings, inside `reflections/`.
pub const REFLECTION_SETTINGS_FILE_NAME: &str = "settings.json";
/// The agent's reflection backoff record, inside `reflections/`.
pub const REFLECTION_BACKOFF_FILE_NAME: &str = "backoff.json";
/// The last finished reflection's result, inside `reflections/`.
pub const REFLECTION_LAST_RESULT_FILE_NAME: &str = "last-result.json";
/// Memory-worker instructions acknowledged and not yet finished, inside
/// `reflections/` (a stopped supervisor's successor runs them).
pub const WORKER_QUEUE_FILE_NAME: &str = "worker-queue.json";
/// Repairs of conflicted memory-worker merges attempted, inside
/// `reflections/` (one per conflict).
pub const REPAIR_ATTEMPTS_FILE_NAME: &str = "repair-attempts.json";
/// The last finished memory worker's result, inside `reflections/`.
pub const WORKER_LAST_RESULT_FILE_NAME: &str = "last-worker.json";
/// The payload launches directory, inside `reflections/`.
pub const REFLECTION_PAYLOADS_DIR_NAME: &str = "payloads";
/// The manifest of one launch's payload, inside `payloads/<launch-id>/`.
pub const REFLECTION_MANIFEST_FILE_NAME: &str = "manifest.json";
/// The reflection lock, in the agent directory (the supervisor's alone).
pub const REFLECTION_LOCK_FILE_NAME: &str = "reflection.lock";
/// `flock`ed around reading, reclaiming and releasing the reflection lock.
pub const REFLECTION_LOCK_GUARD_FILE_NAME: &str = "reflection.lock.guard";

/// Name of the marker, in the agent directory (which only the supervisor
/// can write), recording the uid the agent's tree was last given to.
pub const OWNERSHIP_MARKER_NAME: &str = ".owned-by-uid";

/// The entries of an agent directory that belong to the agent's uid (a
/// confined child writes below them). Everything else there (`agent.json`,
/// `memory.git/`) stays the supervisor's. Names, one component each, so the
/// supervisor can reach them from the agent directory's descriptor.
pub const AGENT_OWNED_DIR_NAMES: [&str; 5] = [
    MEMORY_DIR_NAME,
    TMP_DIR_NAME,
    CONVERSATIONS_DIR_NAME,
    WORKTREES_DIR_NAME,
    REFLECTIONS_DIR_NAME,
];

impl AgentPaths {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The home this agent's directory lies in (`<home>/agents/<id>`, or a
    /// staging directory beside it); `None` for a directory without those
    /// parents (a child knows only its own directory).
    pub fn home(&self) -> Option<Home> {
        self.dir.parent()?.parent().map(Home::at)
    }

    pub fn agent_json(&self) -> PathBuf {
        self.dir.join("agent.json")
    }

    pub fn memory_dir(&self) -> PathBuf {
        self.dir.join(MEMORY_DIR_NAME)
    }

    pub fn memory_git_dir(&self) -> PathBuf {
        self.dir.join(MEMORY_GIT_DIR_NAME)
    }

    /// Records the uid the agent-owned tree was given to (see
    /// [`OWNERSHIP_MARKER_NAME`]).
    pub fn ownership_marker(&self) -> PathBuf {
        self.dir.join(OWNERSHIP_MARKER_NAME)
    }

    /// The agent's private temporary directory (`TMPDIR` of its children).
    pub fn tmp_dir(&self) -> PathBuf {
        self.dir.join(TMP_DIR_NAME)
    }

    pub fn worktrees_dir(&self) -> PathBuf {
        self.dir.join(WORKTREES_DIR_NAME)
    }

    /// One memory worktree's directory, `memory-worktrees/<name>/`; `None`
    /// unless `name` is a single plain component (the caller checks its
    /// exact shape).
    pub fn memory_worktree_dir(&self, name: &str) -> Option<PathBuf> {
        is_plain_component(name).then(|| self.worktrees_dir().join(name))
    }

    /// The `.git` pointer file of memory worktree `name` (child-writable:
    /// written for git's CLI, never read by the supervisor).
    pub fn memory_worktree_dotgit(&self, name: &str) -> Option<PathBuf> {
        Some(self.memory_worktree_dir(name)?.join(".git"))
    }

    pub fn recall_dir(&self) -> PathBuf {
        self.conversations_dir().join(RECALL_DIR_NAME)
    }

    pub fn conversations_dir(&self) -> PathBuf {
        self.dir.join(CONVERSATIONS_DIR_NAME)
    }

    /// Paths of one conversation of this agent.
    pub fn conversation(&self, id: &str) -> Result<ConversationPaths, PathsError> {
        if !is_valid_agent_id(id) {
            return Err(PathsError::InvalidConversationId(id.to_string()));
        }
        Ok(ConversationPaths {
            dir: self.conversations_dir().join(id),
            id: id.to_string(),
        })
    }

    /// `reflections/`: settings, backoff and payloads of reflection.
    pub fn reflections_dir(&self) -> PathBuf {
        self.dir.join(REFLECTIONS_DIR_NAME)
    }

    /// The agent's reflection settings.
    pub fn reflection_settings_json(&self) -> PathBuf {
        self.reflections_dir().join(REFLECTION_SETTINGS_FILE_NAME)
    }

    /// When automatic reflection may run again after a failed merge.
    pub fn reflection_backoff_json(&self) -> PathBuf {
        self.reflections_dir().join(REFLECTION_BACKOFF_FILE_NAME)
    }

    pub fn reflection_payloads_dir(&self) -> PathBuf {
        self.reflections_dir().join(REFLECTION_PAYLOADS_DIR_NAME)
    }

    /// The payload directory of one reflection launch (the id is checked,
    /// so it names one directory inside `payloads/`).
    pub fn reflection_payload_dir(&self, launch_id: &str) -> Result<PathBuf, PathsError> {
        if !is_valid_agent_id(launch_id) {
            return Err(PathsError::InvalidLaunchId(launch_id.to_string()));
        }
        Ok(self.reflection_payloads_dir().join(launch_id))
    }

    /// The manifest of one launch's payload.
    pub fn reflection_manifest_json(&self, launch_id: &str) -> Result<PathBuf, PathsError> {
        Ok(self
            .reflection_payload_dir(launch_id)?
            .join(REFLECTION_MANIFEST_FILE_NAME))
    }

    /// One conversation's transcript slice in a launch's payload.
    pub fn reflection_payload_file(
        &self,
        launch_id: &str,
        conversation_id: &str,
    ) -> Result<PathBuf, PathsError> {
        Ok(self
            .reflection_payload_dir(launch_id)?
            .join(reflection_payload_file_name(conversation_id)?))
    }

    pub fn reflection_lock(&self) -> PathBuf {
        self.dir.join(REFLECTION_LOCK_FILE_NAME)
    }

    /// The guard file `flock`ed around changes of the reflection lock.
    pub fn reflection_lock_guard(&self) -> PathBuf {
        self.dir.join(REFLECTION_LOCK_GUARD_FILE_NAME)
    }

    /// The temporary file a reflection lock is published from.
    pub fn reflection_lock_temp(&self, token: &str) -> PathBuf {
        self.dir.join(reflection_lock_temp_name(token))
    }
}

/// File name of a conversation's slice in a payload directory.
pub fn reflection_payload_file_name(conversation_id: &str) -> Result<String, PathsError> {
    if !is_valid_agent_id(conversation_id) {
        return Err(PathsError::InvalidConversationId(
            conversation_id.to_string(),
        ));
    }
    Ok(format!("{conversation_id}.json"))
}

/// File name of the temporary file a reflection lock is published from
/// (hard-linked to [`REFLECTION_LOCK_FILE_NAME`]); the token is the
/// caller's random hex.
pub fn reflection_lock_temp_name(token: &str) -> String {
    format!("{REFLECTION_LOCK_FILE_NAME}.{token}.tmp")
}

/// Paths inside one conversation's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConversationPaths {
    dir: PathBuf,
    id: String,
}

/// File names inside a conversation directory. The directory is the agent's
/// (a confined child writes it), so the supervisor and the operator's CLI
/// reach these by name from the directory's descriptor; the paths below are
/// for messages.
pub const MESSAGES_FILE_NAME: &str = "messages.jsonl";
pub const CONTEXT_FILE_NAME: &str = "context.json";
pub const SYSTEM_PROMPT_FILE_NAME: &str = "system-prompt.json";
pub const LAST_REQUEST_FILE_NAME: &str = "last-request.json";
pub const PENDING_REMINDERS_FILE_NAME: &str = "pending-reminders.json";
/// The last compaction of the conversation (`agent::context::compact`).
pub const COMPACTION_EVENT_FILE_NAME: &str = "compaction-event.json";
/// The conversation's own settings (its context window).
pub const CONVERSATION_SETTINGS_FILE_NAME: &str = "settings.json";
/// The conversation's reflection cursor and step count.
pub const REFLECTION_STATE_FILE_NAME: &str = "reflection-state.json";

impl ConversationPaths {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The conversation id (its directory's name in `conversations/`).
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn messages_jsonl(&self) -> PathBuf {
        self.dir.join(MESSAGES_FILE_NAME)
    }

    pub fn context_json(&self) -> PathBuf {
        self.dir.join(CONTEXT_FILE_NAME)
    }

    pub fn system_prompt_json(&self) -> PathBuf {
        self.dir.join(SYSTEM_PROMPT_FILE_NAME)
    }

    pub fn pending_reminders_json(&self) -> PathBuf {
        self.dir.join(PENDING_REMINDERS_FILE_NAME)
    }

    /// The record of the conversation's last compaction.
    pub fn compaction_event_json(&self) -> PathBuf {
        self.dir.join(COMPACTION_EVENT_FILE_NAME)
    }

    /// The conversation's settings (`{"context_window_limit": N}`).
    pub fn settings_json(&self) -> PathBuf {
        self.dir.join(CONVERSATION_SETTINGS_FILE_NAME)
    }

    /// The conversation's reflection state (cursor, steps since).
    pub fn reflection_state_json(&self) -> PathBuf {
        self.dir.join(REFLECTION_STATE_FILE_NAME)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_ids_cannot_escape() {
        let home = Home::at(Path::new("/h"));
        assert!(home.agent("../x").is_err());
        assert!(home.agent("a/b").is_err());
        assert!(home.agent("").is_err());
        assert!(home.agent(".").is_err());
        let a = home.agent("agent-1_x").ok();
        assert_eq!(
            a.map(|a| a.memory_git_dir()),
            Some(PathBuf::from("/h/agents/agent-1_x/memory.git"))
        );
    }

    #[test]
    fn reflection_paths() {
        let a = AgentPaths::from_dir(Path::new("/h/agents/a"));
        assert_eq!(
            a.reflection_settings_json(),
            PathBuf::from("/h/agents/a/reflections/settings.json")
        );
        assert_eq!(
            a.reflection_backoff_json(),
            PathBuf::from("/h/agents/a/reflections/backoff.json")
        );
        assert_eq!(
            a.reflection_payload_file("L1", "c1").ok(),
            Some(PathBuf::from("/h/agents/a/reflections/payloads/L1/c1.json"))
        );
        assert_eq!(
            a.reflection_manifest_json("L1").ok(),
            Some(PathBuf::from(
                "/h/agents/a/reflections/payloads/L1/manifest.json"
            ))
        );
        assert!(a.reflection_payload_dir("../x").is_err());
        assert!(a.reflection_payload_file("L1", "a/b").is_err());
        assert_eq!(
            a.reflection_lock_temp("ab"),
            PathBuf::from("/h/agents/a/reflection.lock.ab.tmp")
        );
        assert_eq!(
            a.conversation("c1").map(|c| c.reflection_state_json()).ok(),
            Some(PathBuf::from(
                "/h/agents/a/conversations/c1/reflection-state.json"
            ))
        );
    }
}
