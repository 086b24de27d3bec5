//! The home's own paths (`run/`, `agents/` and what sits beside an agent
//! there, `audit/`, `network/`, `volumes/`) and the few outside it: a
//! remote's repositories, the supervisor's control key, the user's state.

use std::path::{Path, PathBuf};

use super::error::{HOME_ENV, PathsError, is_valid_agent_id};

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

    /// The usage summary (per UTC day, per agent) the supervisor keeps as
    /// it appends, so usage is read without walking the whole log.
    pub fn audit_usage_summary(&self) -> PathBuf {
        self.audit_dir().join("usage-summary.json")
    }

    /// Where the next usage summary is written before it is renamed over
    /// the last (one writer at a time: the supervisor's).
    pub fn audit_usage_summary_tmp(&self) -> PathBuf {
        self.audit_dir().join(".usage-summary.json.tmp")
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

/// The number of a rolled-over audit log's file name (`audit-<n>.jsonl`).
pub fn audit_rotated_number(name: &str) -> Option<u64> {
    let n = name.strip_prefix("audit-")?.strip_suffix(".jsonl")?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
