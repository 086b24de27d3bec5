//! The validator's inputs besides the trees: the layout [`Policy`], the
//! [`ValidateOptions`] switches and the constants they default from.

use std::str::FromStr;

use super::snapshot::TreeSnapshot;

/// Environment variable a human sets to `1` to approve a config change.
pub const CONSTRAINTS_UPDATE_ENV: &str = "MINI_LETTA_CONSTRAINTS_UPDATE";
/// Default [B] hard per-file byte limit (1 MiB).
pub const MAX_FILE_BYTES: u64 = 1_048_576;
/// The root index / v2 marker.
pub const ROOT_INDEX: &str = "MEMORY.md";

/// Layout policy of the repository (sticky; stored beside the hooks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// MemFS v2 when a root `MEMORY.md` is staged or committed.
    RootMarker,
    /// Legacy `system/` + `reference/` only.
    LegacyOnly,
    /// Attached shared memory: v2 frontmatter rules without a root marker.
    SharedMemory,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::RootMarker => "root-marker",
            Policy::LegacyOnly => "legacy-only",
            Policy::SharedMemory => "shared-memory",
        }
    }

    /// Policy-file contents → policy; unreadable or unknown means legacy,
    /// as in the hook.
    pub(crate) fn from_policy_file(contents: Option<&str>) -> Policy {
        contents
            .and_then(|c| c.parse().ok())
            .unwrap_or(Policy::LegacyOnly)
    }

    /// The policy an audit uses for a revision: root-marker iff it has a
    /// root `MEMORY.md`.
    pub(crate) fn for_audit(tree: &TreeSnapshot) -> Policy {
        if tree.contains(ROOT_INDEX) {
            Policy::RootMarker
        } else {
            Policy::LegacyOnly
        }
    }
}

impl FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "root-marker" => Ok(Policy::RootMarker),
            "legacy-only" => Ok(Policy::LegacyOnly),
            "shared-memory" => Ok(Policy::SharedMemory),
            other => Err(format!("unknown memory layout policy '{other}'")),
        }
    }
}

/// Inputs besides the trees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidateOptions {
    pub policy: Policy,
    /// A human approved changing `.memfs.config.json` for this commit.
    pub constraints_update_approved: bool,
    /// [B] hard per-file byte limit; `None` disables it.
    pub max_file_bytes: Option<u64>,
    /// [B] secret scan on/off.
    pub secret_scan: bool,
    /// [B] the tree-shape rules of `tree_safety` on/off.
    pub tree_safety: bool,
}

impl ValidateOptions {
    /// mini-letta defaults: no approval, 1 MiB limit, secret scan on.
    pub fn new(policy: Policy) -> Self {
        ValidateOptions {
            policy,
            constraints_update_approved: false,
            max_file_bytes: Some(MAX_FILE_BYTES),
            secret_scan: true,
            tree_safety: true,
        }
    }

    /// letta-code behaviour only: the [B] rules switched off.
    pub fn letta_parity(policy: Policy) -> Self {
        ValidateOptions {
            max_file_bytes: None,
            secret_scan: false,
            tree_safety: false,
            ..Self::new(policy)
        }
    }

    pub fn with_approval(mut self, approved: bool) -> Self {
        self.constraints_update_approved = approved;
        self
    }
}

impl Default for ValidateOptions {
    fn default() -> Self {
        Self::new(Policy::RootMarker)
    }
}

/// `MINI_LETTA_CONSTRAINTS_UPDATE` is exactly `1`. For callers; the
/// validator itself never reads the environment.
pub fn constraints_update_approved_from_env() -> bool {
    std::env::var_os(CONSTRAINTS_UPDATE_ENV).is_some_and(|v| v == "1")
}
