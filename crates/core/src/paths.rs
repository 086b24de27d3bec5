//! The on-disk layout. This module alone knows where things live under the
//! home directory; everything else asks it for paths.
//!
//! ```text
//! <home>/config.toml
//! <home>/run/supervisor.sock, supervisor.pid
//! <home>/agents.lock                flock'ed while agents' names change
//! <home>/agents/index.json          the name index (a cache)
//! <home>/agents/<agent-id>/agent.json
//!                          memory/          working tree (its `.git` is a gitdir pointer)
//!                          memory.git/      the git directory, beside the working tree
//!                          memory-worktrees/
//!                          conversations/<conv-id>/
//!                          reflections/settings.json, backoff.json
//!                          reflections/payloads/<launch-id>/manifest.json, <conv-id>.json
//!                          reflection.lock, reflection.lock.guard
//! <home>/agents/<agent-id>~reflection/conversations/reflection-<launch>/system-prompt.json
//!                                   the supervisor's (0700): what each reflection was told
//! <home>/volumes/<agent-id>.ext4   the agent's quota volume, mounted on its directory
//! <home>/network/<agent-id>/allow.json, log.jsonl, log.1.jsonl
//!                                   the agent's egress allow-list and network log (the
//!                                   supervisor's, 0700: outside every child's view)
//! <home>/remote/
//! ```
//!
//! The git directory sits beside the working tree, not inside it, so a sandbox
//! can mount it read-only while the working tree stays writable (landlock cannot
//! take write access away from a subdirectory of a writable directory).

use std::path::{Path, PathBuf};

/// Environment variable naming the home directory.
pub const HOME_ENV: &str = "MINI_LETTA_HOME";

#[derive(Debug, thiserror::Error)]
pub enum PathsError {
    #[error("cannot find a home directory: set {HOME_ENV} or pass --home")]
    NoHome,
    #[error("invalid agent id {0:?}: ids are letters, digits, '-' and '_' only")]
    InvalidAgentId(String),
    #[error("invalid conversation id {0:?}: ids are letters, digits, '-' and '_' only")]
    InvalidConversationId(String),
    #[error("invalid reflection launch id {0:?}: ids are letters, digits, '-' and '_' only")]
    InvalidLaunchId(String),
}

/// The mini-letta home directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Home {
    root: PathBuf,
}

impl Home {
    /// `--home` wins, then `$MINI_LETTA_HOME`, then `~/.mini-letta`.
    pub fn resolve(explicit: Option<&Path>) -> Result<Self, PathsError> {
        if let Some(p) = explicit {
            return Ok(Self::at(p));
        }
        if let Some(p) = std::env::var_os(HOME_ENV).filter(|v| !v.is_empty()) {
            return Ok(Self::at(Path::new(&p)));
        }
        let user_home = std::env::var_os("HOME")
            .filter(|v| !v.is_empty())
            .ok_or(PathsError::NoHome)?;
        Ok(Self::at(&Path::new(&user_home).join(".mini-letta")))
    }

    /// A home rooted at `root` (made absolute against the current directory).
    pub fn at(root: &Path) -> Self {
        let root = std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf());
        Self { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn config_file(&self) -> PathBuf {
        self.root.join("config.toml")
    }

    pub fn run_dir(&self) -> PathBuf {
        self.root.join("run")
    }

    /// The last sandbox probe of this host, for a supervisor started for
    /// one command (`sandbox::report_cache`).
    pub fn sandbox_report_cache(&self) -> PathBuf {
        self.run_dir().join("sandbox-report.json")
    }

    pub fn supervisor_socket(&self) -> PathBuf {
        self.run_dir().join("supervisor.sock")
    }

    /// The key a control connection presents where children could reach
    /// the socket (see [`control_key_beside`]).
    pub fn control_key_file(&self) -> PathBuf {
        control_key_beside(&self.supervisor_socket())
    }

    /// The supervisor's log: the daemon's stdout and stderr, and the
    /// records of an embedded one at default verbosity.
    pub fn supervisor_log(&self) -> PathBuf {
        self.run_dir().join("supervisor.log")
    }

    pub fn supervisor_pid_file(&self) -> PathBuf {
        self.run_dir().join("supervisor.pid")
    }

    /// Line-editing history of interactive chats with one agent (the
    /// operator's, beside the agents rather than in a directory the agent's
    /// children can write).
    pub fn chat_history_file(&self, agent_id: &str) -> Result<PathBuf, PathsError> {
        if !is_valid_agent_id(agent_id) {
            return Err(PathsError::InvalidAgentId(agent_id.to_string()));
        }
        Ok(self.root.join("history").join(agent_id))
    }

    pub fn agents_dir(&self) -> PathBuf {
        self.root.join("agents")
    }

    /// The agents' name index (a cache of every record's id and name; its
    /// `.` keeps it out of the id alphabet, so listings skip it).
    pub fn agents_index(&self) -> PathBuf {
        self.agents_dir().join("index.json")
    }

    /// `flock`ed around every change to the agents' names (create, rename,
    /// import), so two of them cannot both take one name. Beside `agents/`,
    /// not in it: nothing there but agents and their index.
    pub fn agents_names_lock(&self) -> PathBuf {
        self.root.join("agents.lock")
    }

    /// Operator overrides of the built-in sandbox role profiles.
    pub fn sandbox_profiles_dir(&self) -> PathBuf {
        self.root.join("sandbox-profiles")
    }

    /// The operator's override of one role's profile (`<role>.toml`).
    pub fn sandbox_profile_file(&self, role: &str) -> PathBuf {
        self.sandbox_profiles_dir().join(format!("{role}.toml"))
    }

    /// Per-agent quota volumes (filesystem images), root's only.
    pub fn volumes_dir(&self) -> PathBuf {
        self.root.join("volumes")
    }

    /// The image holding agent `id`'s directory when it has a quota.
    pub fn volume_image(&self, id: &str) -> Result<PathBuf, PathsError> {
        self.agent(id)?; // validates the id
        Ok(self.volumes_dir().join(format!("{id}.ext4")))
    }

    pub fn remote_dir(&self) -> PathBuf {
        self.root.join("remote")
    }

    /// The audit log's directory: root's only (0700), so no agent uid
    /// can open anything in it.
    pub fn audit_dir(&self) -> PathBuf {
        self.root.join("audit")
    }

    /// The hash-chained audit log being appended to.
    pub fn audit_log(&self) -> PathBuf {
        self.audit_dir().join("audit.jsonl")
    }

    /// Rolled-over audit log number `n` (1 is the oldest).
    pub fn audit_rotated(&self, n: u64) -> PathBuf {
        self.audit_dir().join(format!("audit-{n}.jsonl"))
    }

    /// `flock`ed by every appender around an append (and a rotation).
    pub fn audit_lock(&self) -> PathBuf {
        self.audit_dir().join("audit.lock")
    }

    /// Token budgets per agent: beside the log, where no agent writes.
    pub fn budgets_file(&self) -> PathBuf {
        self.audit_dir().join("budgets.json")
    }

    /// Every agent's egress policy and network log, outside `agents/`: no
    /// child's view or landlock grant reaches it, and an imported archive
    /// cannot bring a list of its own.
    pub fn network_dir(&self) -> PathBuf {
        self.root.join("network")
    }

    /// Agent `id`'s directory in [`Home::network_dir`].
    pub fn agent_network_dir(&self, id: &str) -> Result<PathBuf, PathsError> {
        self.agent(id)?; // validates the id
        Ok(self.network_dir().join(id))
    }

    /// Agent `id`'s egress allow-list (`{"allow": [...]}`).
    pub fn network_allow_file(&self, id: &str) -> Result<PathBuf, PathsError> {
        Ok(self.agent_network_dir(id)?.join(NETWORK_ALLOW_FILE_NAME))
    }

    /// Agent `id`'s network log (one JSON record per line), and the one
    /// before it once it was rotated.
    pub fn network_log_files(&self, id: &str) -> Result<NetworkLogFiles, PathsError> {
        let dir = self.agent_network_dir(id)?;
        Ok(NetworkLogFiles {
            current: dir.join(NETWORK_LOG_FILE_NAME),
            previous: dir.join(NETWORK_LOG_PREVIOUS_FILE_NAME),
            dir,
        })
    }

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
}

impl Home {
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

/// The egress allow-list's file name in an agent's network directory.
pub const NETWORK_ALLOW_FILE_NAME: &str = "allow.json";
/// The network log's file name in an agent's network directory.
pub const NETWORK_LOG_FILE_NAME: &str = "log.jsonl";
/// The rotated network log's file name.
pub const NETWORK_LOG_PREVIOUS_FILE_NAME: &str = "log.1.jsonl";

/// An agent's network log: its directory, the file written now and the
/// one rotated out before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkLogFiles {
    pub dir: PathBuf,
    pub current: PathBuf,
    pub previous: PathBuf,
}

/// Suffix of an agent's reflections' directory in `agents/`
/// ([`Home::reflection_agent_dir`]).
pub const REFLECTION_SIBLING_SUFFIX: &str = "~reflection";

/// Whether `name`, an entry of `agents/`, belongs to agent `id` without
/// being its directory: its reflections' directory, and what a create,
/// import or clone of it that stopped half-way left (`.creating-<id>`,
/// `.importing-<id>-XXXXXX`, `.cloning-<id>-XXXXXX`, the suffix six
/// letters or digits — so another agent whose id starts with this one's
/// is never taken for it).
pub fn is_agent_sibling(name: &str, id: &str) -> bool {
    if !is_valid_agent_id(id) {
        return false;
    }
    let staged = |prefix: &str| {
        name.strip_prefix(prefix)
            .and_then(|r| r.strip_prefix(id))
            .and_then(|r| r.strip_prefix('-'))
            .is_some_and(|r| r.len() == 6 && r.bytes().all(|b| b.is_ascii_alphanumeric()))
    };
    name.strip_prefix(id) == Some(REFLECTION_SIBLING_SUFFIX)
        || name.strip_prefix(CREATE_STAGING_PREFIX) == Some(id)
        || staged(IMPORT_STAGING_PREFIX)
        || staged(CLONE_STAGING_PREFIX)
}

/// Prefix of the directory a new agent is assembled in
/// ([`Home::agent_staging`]).
pub const CREATE_STAGING_PREFIX: &str = ".creating-";

/// Prefix of the directories (in `agents/`) an imported agent is unpacked
/// into before it is renamed into place; the leading `.` keeps listings
/// from mistaking one for an agent.
pub const IMPORT_STAGING_PREFIX: &str = ".importing-";

/// Prefix of the directory an agent cloned from a remote is built in.
pub const CLONE_STAGING_PREFIX: &str = ".cloning-";

/// Agent ids name directories, so they are restricted to a safe alphabet.
pub fn is_valid_agent_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The bare repository holding agent `id`'s memory in a directory of
/// remote repositories (`MINI_LETTA_REMOTE_ROOT` naming a local directory).
pub fn remote_agent_repo(remote_root: &Path, id: &str) -> Result<PathBuf, PathsError> {
    if !is_valid_agent_id(id) {
        return Err(PathsError::InvalidAgentId(id.to_string()));
    }
    Ok(remote_root.join(format!("{id}{REMOTE_REPO_SUFFIX}")))
}

/// Suffix of the bare repositories in a directory of remote repositories.
pub const REMOTE_REPO_SUFFIX: &str = ".git";

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
/// was said, without reminders or packaging; a v1 index is rebuilt.)
pub const RECALL_TERMS_FILE_NAME: &str = "terms-v2.log";
/// The recall index's log of indexed messages.
pub const RECALL_DOCS_FILE_NAME: &str = "docs-v2.log";
/// The files of an index of an earlier format, removed when it is rebuilt.
pub const RECALL_OLD_FILE_NAMES: [&str; 3] = ["terms-v1.log", "docs-v1.log", "snapshot-v1.bin"];
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

    /// The last model request sent for this conversation (for operators).
    pub fn last_request_json(&self) -> PathBuf {
        self.dir.join(LAST_REQUEST_FILE_NAME)
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

/// Files mini-letta keeps inside a memory repository's (common) git
/// directory. The git directory may belong to an agent or be any repository
/// given with `--memory-dir`, so these hang off the git directory itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryGitDir {
    dir: PathBuf,
}

/// Name of the layout-policy file in the git directory.
pub const LAYOUT_POLICY_FILE_NAME: &str = "mini-letta-memory-layout-policy";
/// Name of the writers' lock file in the git directory.
pub const WRITE_LOCK_FILE_NAME: &str = "mini-letta-memory.lock";
/// Git's directory of linked-worktree admin directories.
pub const WORKTREE_ADMIN_DIR_NAME: &str = "worktrees";
/// Where new memory worktrees are checked out before being moved into the
/// child-writable `memory-worktrees/` (inside the git directory, which
/// children cannot change while it is being filled).
pub const WORKTREE_STAGING_DIR_NAME: &str = "mini-letta-worktree-staging";
/// File in a worktree's admin directory recording the commit it started at.
pub const WORKTREE_BASE_FILE_NAME: &str = "mini-letta-base";

/// A single path component that is not `.`/`..` and has no `/` or NUL.
fn is_plain_component(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

impl MemoryGitDir {
    /// The (common) git directory of a memory repository.
    pub fn new(git_dir: &Path) -> Self {
        Self {
            dir: git_dir.to_path_buf(),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn hooks_dir(&self) -> PathBuf {
        self.dir.join("hooks")
    }

    pub fn pre_commit_hook(&self) -> PathBuf {
        self.hooks_dir().join("pre-commit")
    }

    pub fn post_commit_hook(&self) -> PathBuf {
        self.hooks_dir().join("post-commit")
    }

    /// The repository's own (local) git configuration.
    pub fn config_file(&self) -> PathBuf {
        self.dir.join("config")
    }

    /// `objects/`: the repository's own object store.
    pub fn objects_dir(&self) -> PathBuf {
        self.dir.join("objects")
    }

    /// Files through which git reads objects or history from outside the
    /// repository's own store, each with what it does. mini-letta never
    /// makes one; every root open refuses a repository holding any
    /// (`memfs::repo`), and an import never takes them.
    pub fn foreign_history_files(&self) -> [(PathBuf, &'static str); 4] {
        let objects = self.objects_dir();
        [
            (
                objects.join("info").join("alternates"),
                "reads objects from other repositories",
            ),
            (
                objects.join("info").join("http-alternates"),
                "reads objects from other repositories",
            ),
            (
                self.dir.join("info").join("grafts"),
                "rewrites the parents of commits",
            ),
            (self.dir.join("shallow"), "cuts history off"),
        ]
    }

    /// The note left while `main` and the checkout move together
    /// (`memfs::worktree::advance`), so a kill in between can be finished.
    pub fn main_move_journal(&self) -> PathBuf {
        self.dir.join("mini-letta-main-move")
    }

    /// The post-commit mirror's log (`mini-letta.memoryRepository.url`).
    pub fn mirror_log(&self) -> PathBuf {
        self.dir.join("mirror.log")
    }

    /// One line: `root-marker`, `legacy-only` or `shared-memory`.
    pub fn layout_policy_file(&self) -> PathBuf {
        self.dir.join(LAYOUT_POLICY_FILE_NAME)
    }

    /// `flock`ed by every writer around index and commit updates.
    pub fn write_lock_file(&self) -> PathBuf {
        self.dir.join(WRITE_LOCK_FILE_NAME)
    }

    /// `worktrees/`: git's admin directories of linked worktrees.
    pub fn worktree_admin_root(&self) -> PathBuf {
        self.dir.join(WORKTREE_ADMIN_DIR_NAME)
    }

    /// The admin directory of linked worktree `name` (`None` unless `name`
    /// is a single plain component).
    pub fn worktree_admin_dir(&self, name: &str) -> Option<PathBuf> {
        is_plain_component(name).then(|| self.worktree_admin_root().join(name))
    }

    /// Where memory worktrees are filled before being moved into place.
    pub fn worktree_staging_dir(&self) -> PathBuf {
        self.dir.join(WORKTREE_STAGING_DIR_NAME)
    }

    /// Worktree `name` while it is being filled (see
    /// [`Self::worktree_staging_dir`]).
    pub fn worktree_staging(&self, name: &str) -> Option<PathBuf> {
        is_plain_component(name).then(|| self.worktree_staging_dir().join(name))
    }

    /// The commit memory worktree `name` started at (in its admin directory).
    pub fn worktree_base_file(&self, name: &str) -> Option<PathBuf> {
        Some(self.worktree_admin_dir(name)?.join(WORKTREE_BASE_FILE_NAME))
    }

    /// Git's record of where worktree `name`'s `.git` file is.
    pub fn worktree_gitdir_file(&self, name: &str) -> Option<PathBuf> {
        Some(self.worktree_admin_dir(name)?.join("gitdir"))
    }
}

/// The number of a rolled-over audit log's file name (`audit-<n>.jsonl`).
pub fn audit_rotated_number(name: &str) -> Option<u64> {
    let n = name.strip_prefix("audit-")?.strip_suffix(".jsonl")?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
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
    fn an_agents_siblings_are_its_own_only() {
        let id = "agent-1";
        for name in [
            "agent-1~reflection",
            ".creating-agent-1",
            ".importing-agent-1-Ab3x9Z",
            ".cloning-agent-1-000000",
        ] {
            assert!(is_agent_sibling(name, id), "{name}");
        }
        for name in [
            "agent-1",
            "agent-12~reflection",
            "agent-1~reflectionx",
            ".creating-agent-12",
            // Agent `agent-1-b`'s import, not `agent-1`'s.
            ".importing-agent-1-b-Ab3x9Z",
            ".cloning-agent-1-00000",
            "index.json",
        ] {
            assert!(!is_agent_sibling(name, id), "{name}");
        }
        assert!(!is_agent_sibling("~reflection", ""));
        let home = Home::at(Path::new("/h"));
        assert_eq!(
            home.reflection_agent_dir(id).ok(),
            Some(PathBuf::from("/h/agents/agent-1~reflection"))
        );
        assert!(home.reflection_agent_dir("../x").is_err());
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

/// mini-letta's programs, installed side by side: the user's CLI, the
/// child stage every confined child starts with, and the agent-side
/// program (the agent's turn, the escape probes). Only the CLI takes user
/// commands; the others are started by the supervisor and the CLI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Programs {
    pub cli: PathBuf,
    pub stage: PathBuf,
    pub agent: PathBuf,
}

/// File name of the child-stage program.
pub const STAGE_PROGRAM_NAME: &str = "mini-letta-stage2";
/// File name of the agent-side program.
pub const AGENT_PROGRAM_NAME: &str = "mini-letta-agent";

impl Programs {
    /// The programs beside `cli` (this process's executable, normally).
    pub fn beside(cli: &Path) -> Self {
        Programs {
            cli: cli.to_path_buf(),
            stage: cli.with_file_name(STAGE_PROGRAM_NAME),
            agent: cli.with_file_name(AGENT_PROGRAM_NAME),
        }
    }

    /// The programs beside the running executable, each checked to exist:
    /// a partial install fails here, by name, not later inside a sandbox.
    pub fn installed() -> std::io::Result<Self> {
        let exe = std::env::current_exe()?;
        let found = Self::beside(&exe);
        for p in [&found.stage, &found.agent] {
            if !p.is_file() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!(
                        "{} is missing: mini-letta's programs ({}, {}, {}) must be installed together",
                        p.display(),
                        exe.file_name()
                            .and_then(|n| n.to_str())
                            .unwrap_or("mini-letta"),
                        STAGE_PROGRAM_NAME,
                        AGENT_PROGRAM_NAME
                    ),
                ));
            }
        }
        Ok(found)
    }
}

/// The control key file of the supervisor listening at `socket` (in the
/// same private directory).
pub fn control_key_beside(socket: &Path) -> PathBuf {
    socket.with_file_name(CONTROL_KEY_NAME)
}

/// File name of the supervisor's control key.
pub const CONTROL_KEY_NAME: &str = "control.key";

/// The agent uids handed out from a user's subordinate range, in its state
/// directory `state` (shared by all of the user's homes).
pub fn user_agent_uid_registry(state: &Path) -> PathBuf {
    state.join("mini-letta").join("agent-uids")
}

/// Where a passed trial of mapping the user's subordinate ids is recorded,
/// in its state directory `state`.
pub fn user_subids_proven(state: &Path) -> PathBuf {
    state.join("mini-letta").join("subids-proven")
}
