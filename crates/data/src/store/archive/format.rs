//! What an archive is: its manifest, the names and depth its entries are
//! held to, and the bounds both export and import check.

use serde::{Deserialize, Serialize};

/// Name of the manifest, the archive's first entry.
pub const MANIFEST_NAME: &str = "mini-letta-export.json";
/// The manifest's `format`.
pub const FORMAT: &str = "mini-letta-agent-export";
/// The manifest's `version`.
pub const FORMAT_VERSION: u32 = 1;

pub(super) const RECORD_NAME: &str = "agent.json";

/// Deepest path accepted (in components).
pub(super) const MAX_DEPTH: usize = 64;

/// Bounds on an archive, checked on the entries' headers before their
/// contents are read, on export and on import alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Entries (files and directories).
    pub max_entries: u64,
    /// Bytes of all files together, uncompressed.
    pub max_total_bytes: u64,
}

impl Default for Limits {
    /// 200 000 entries, 4 GiB.
    fn default() -> Self {
        Limits {
            max_entries: 200_000,
            max_total_bytes: 4 << 30,
        }
    }
}

/// What the first entry says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    pub agent_id: String,
    pub name: String,
    pub exported_at: String,
    /// The mini-letta version that wrote it.
    pub mini_letta: String,
}
