//! Role profiles (`sandbox-profiles/<role>.toml`): what a child of each role
//! may read and write, its network and its limits. The files in the
//! repository are compiled in; `<home>/sandbox-profiles/<role>.toml`
//! overrides one. Every profile is validated when loaded: a profile that
//! would expose a masked tree (anything outside the agent's own directory,
//! workspace or worktree) or make the memory git directory or the agent
//! record writable is refused.

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::paths::{AgentPaths, Home};

/// The built-in profiles.
const BUILT_IN: &[(&str, &str)] = &[
    (
        "agent",
        include_str!("../../../sandbox-profiles/agent.toml"),
    ),
    ("tool", include_str!("../../../sandbox-profiles/tool.toml")),
    (
        "memory-worker",
        include_str!("../../../sandbox-profiles/memory-worker.toml"),
    ),
    (
        "reflection",
        include_str!("../../../sandbox-profiles/reflection.toml"),
    ),
    (
        "recall",
        include_str!("../../../sandbox-profiles/recall.toml"),
    ),
];

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("no sandbox profile for role {0:?}")]
    UnknownRole(String),
    #[error("sandbox profile {file}: {message}")]
    Invalid { file: String, message: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Network access of a role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Network {
    /// No sockets but Unix ones (model calls use the child's channel).
    None,
    /// TCP only to the supervisor's egress proxy inside the child's own
    /// network namespace, which lets through only what the agent's
    /// allow-list names (nothing by default). See `crate::egress`.
    Proxy,
}

/// Resource limits of a role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub pids: u64,
    pub memory_mb: u64,
    pub file_size_mb: u64,
    pub open_files: u64,
    /// CPU time per wall-clock time, in percent of one core (100 = one
    /// core): a tenant that spins (a fork bomb between failed forks) cannot
    /// take every core from the others.
    #[serde(default = "default_cpu_percent")]
    pub cpu_percent: u64,
}

fn default_cpu_percent() -> u64 {
    100
}

/// A profile as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub role: String,
    pub read_only: Vec<String>,
    pub writable: Vec<String>,
    pub network: Network,
    pub limits: Limits,
}

/// A profile resolved against one agent: concrete paths.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resolved {
    pub role: String,
    pub read_only: Vec<PathBuf>,
    pub writable: Vec<PathBuf>,
    pub network: Network,
    pub limits: Limits,
}

/// Roots a profile path may start with.
const ROOTS: &[&str] = &["$AGENT", "$WORKSPACE", "$WORKTREE"];

/// Parse and validate profile text.
pub fn parse(file: &str, text: &str) -> Result<Profile, ProfileError> {
    let invalid = |message: String| ProfileError::Invalid {
        file: file.to_string(),
        message,
    };
    let profile: Profile =
        toml::from_str(text).map_err(|e| invalid(e.to_string().trim().to_string()))?;
    for p in profile.read_only.iter().chain(&profile.writable) {
        let (root, rest) = p.split_once('/').unwrap_or((p.as_str(), ""));
        if !ROOTS.contains(&root) {
            return Err(invalid(format!(
                "path {p:?} must start with $AGENT, $WORKSPACE or $WORKTREE: anything else would expose a masked tree"
            )));
        }
        if Path::new(rest).components().any(|c| {
            matches!(
                c,
                Component::ParentDir | Component::CurDir | Component::RootDir
            )
        }) {
            return Err(invalid(format!(
                "path {p:?} must not contain '.', '..' or '//' segments"
            )));
        }
    }
    for p in &profile.writable {
        if p == "$AGENT" {
            return Err(invalid(
                "writable \"$AGENT\" would make the memory git directory and agent.json writable"
                    .into(),
            ));
        }
        for protected in ["$AGENT/memory.git", "$AGENT/agent.json"] {
            if p == protected
                || protected.starts_with(&format!("{p}/"))
                || p.starts_with(&format!("{protected}/"))
            {
                return Err(invalid(format!(
                    "writable {p:?} would expose {protected}, which must stay read-only"
                )));
            }
        }
    }
    if profile.limits.pids == 0 || profile.limits.open_files < 16 {
        return Err(invalid(
            "limits.pids must be > 0 and limits.open_files >= 16".into(),
        ));
    }
    Ok(profile)
}

/// Load the profile of `role` (an override in the home wins).
pub fn load(home: &Home, role: &str) -> Result<Profile, ProfileError> {
    let builtin = BUILT_IN
        .iter()
        .find(|(r, _)| *r == role)
        .ok_or_else(|| ProfileError::UnknownRole(role.to_string()))?;
    let override_path = home.sandbox_profile_file(role);
    let profile = match std::fs::read_to_string(&override_path) {
        Ok(text) => parse(&override_path.display().to_string(), &text)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            parse(&format!("sandbox-profiles/{role}.toml"), builtin.1)?
        }
        Err(source) => {
            return Err(ProfileError::Io {
                path: override_path,
                source,
            });
        }
    };
    if profile.role != role {
        return Err(ProfileError::Invalid {
            file: format!("{role}.toml"),
            message: format!("declares role {:?}", profile.role),
        });
    }
    Ok(profile)
}

/// Validate every built-in profile and any overrides (supervisor start).
pub fn load_all(home: &Home) -> Result<Vec<Profile>, ProfileError> {
    BUILT_IN.iter().map(|(r, _)| load(home, r)).collect()
}

impl Profile {
    /// Concrete paths for one agent; entries under an absent workspace or
    /// worktree are dropped.
    pub fn resolve(
        &self,
        agent: &AgentPaths,
        workspace: Option<&Path>,
        worktree: Option<&Path>,
    ) -> Resolved {
        let map = |p: &String| -> Option<PathBuf> {
            let (root, rest) = p.split_once('/').unwrap_or((p.as_str(), ""));
            let base = match root {
                "$AGENT" => agent.dir().to_path_buf(),
                "$WORKSPACE" => workspace?.to_path_buf(),
                "$WORKTREE" => worktree?.to_path_buf(),
                _ => return None,
            };
            Some(if rest.is_empty() {
                base
            } else {
                base.join(rest)
            })
        };
        Resolved {
            role: self.role.clone(),
            read_only: self.read_only.iter().filter_map(map).collect(),
            writable: self.writable.iter().filter_map(map).collect(),
            network: self.network,
            limits: self.limits.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_ins_are_valid() {
        for (role, text) in BUILT_IN {
            let p = parse(role, text).unwrap();
            assert_eq!(&p.role, role);
        }
    }

    #[test]
    fn exposing_profiles_are_refused() {
        let base = "role = \"tool\"\nnetwork = \"none\"\n[limits]\npids = 10\nmemory_mb = 10\nfile_size_mb = 1\nopen_files = 64\n";
        let with = |ro: &str, rw: &str| {
            parse(
                "t",
                &format!("read_only = [{ro}]\nwritable = [{rw}]\n{base}"),
            )
        };
        assert!(with("", "\"$AGENT/tmp\"").is_ok());
        for (ro, rw) in [
            ("\"/etc\"", ""),
            ("\"$AGENT/..\"", ""),
            ("\"$AGENT/../other\"", ""),
            ("", "\"$AGENT\""),
            ("", "\"$AGENT/memory.git\""),
            ("", "\"$AGENT/memory.git/hooks\""),
            ("", "\"$AGENT/agent.json\""),
            ("\"$HOME/x\"", ""),
        ] {
            let e = with(ro, rw).unwrap_err().to_string();
            assert!(e.contains("sandbox profile t:"), "{e}");
        }
        assert!(parse("t", "role = \"tool\"\nbogus = 1\n").is_err());
    }
}
