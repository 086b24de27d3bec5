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
//!
//! The parts: `home.rs` (the home's own paths and the entries of
//! `agents/`), `agent.rs` (an agent's directory and its conversations'),
//! `git_dir.rs` (what mini-letta keeps in a memory repository's git
//! directory), `programs.rs` (the installed programs) and `error.rs`
//! ([`PathsError`] and the names a path may be built from).

mod agent;
mod error;
mod git_dir;
mod home;
mod programs;

pub use agent::{
    AGENT_OWNED_DIR_NAMES, AgentPaths, COMPACTION_EVENT_FILE_NAME, CONTEXT_FILE_NAME,
    CONVERSATION_SETTINGS_FILE_NAME, CONVERSATIONS_DIR_NAME, ConversationPaths,
    LAST_REQUEST_FILE_NAME, MEMORY_DIR_NAME, MEMORY_GIT_DIR_NAME, MESSAGES_FILE_NAME,
    OWNERSHIP_MARKER_NAME, PENDING_REMINDERS_FILE_NAME, RECALL_DIR_NAME, RECALL_DOCS_FILE_NAME,
    RECALL_LOCK_FILE_NAME, RECALL_OLD_FILE_NAMES, RECALL_SNAPSHOT_FILE_NAME,
    RECALL_TERMS_FILE_NAME, REFLECTION_BACKOFF_FILE_NAME, REFLECTION_LAST_RESULT_FILE_NAME,
    REFLECTION_LOCK_FILE_NAME, REFLECTION_LOCK_GUARD_FILE_NAME, REFLECTION_MANIFEST_FILE_NAME,
    REFLECTION_PAYLOADS_DIR_NAME, REFLECTION_SETTINGS_FILE_NAME, REFLECTION_STATE_FILE_NAME,
    REFLECTIONS_DIR_NAME, REPAIR_ATTEMPTS_FILE_NAME, SYSTEM_PROMPT_FILE_NAME, TMP_DIR_NAME,
    WORKER_LAST_RESULT_FILE_NAME, WORKER_QUEUE_FILE_NAME, WORKTREES_DIR_NAME,
    reflection_lock_temp_name, reflection_payload_file_name,
};
pub use error::{HOME_ENV, PathsError, is_valid_agent_id};
pub use git_dir::{
    LAYOUT_POLICY_FILE_NAME, MemoryGitDir, WORKTREE_ADMIN_DIR_NAME, WORKTREE_BASE_FILE_NAME,
    WORKTREE_STAGING_DIR_NAME, WRITE_LOCK_FILE_NAME,
};
pub use home::{
    CLONE_STAGING_PREFIX, CONTROL_KEY_NAME, CREATE_STAGING_PREFIX, Home, IMPORT_STAGING_PREFIX,
    NETWORK_ALLOW_FILE_NAME, NETWORK_LOG_FILE_NAME, NETWORK_LOG_PREVIOUS_FILE_NAME,
    NetworkLogFiles, REFLECTION_SIBLING_SUFFIX, REMOTE_REPO_SUFFIX, audit_rotated_number,
    control_key_beside, is_agent_sibling, remote_agent_repo, user_agent_uid_registry,
    user_subids_proven,
};
pub use programs::{AGENT_PROGRAM_NAME, Programs, STAGE_PROGRAM_NAME};
