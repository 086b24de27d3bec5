//! The agents' name index, `<home>/agents/index.json`: every agent's id
//! and name, so finding an agent by name reads one small file and one
//! record instead of every `agent.json`.
//!
//! It is a cache, never the truth. It is trusted only while its ids are
//! exactly the agent directories present (one `readdir` and a `stat` each,
//! no reads), and a record found through it must carry the name asked for;
//! anything else (an index missing, torn, or out of date after a concurrent
//! create or a hand edit) rebuilds it from the records.
//!
//! An agent whose record cannot be read keeps the name the index last knew
//! for it (an empty name when none was ever known), so that asking for it
//! by name says it cannot be read rather than that there is none.

use std::collections::BTreeSet;
use std::fs;

use serde::{Deserialize, Serialize};

use crate::fsutil::atomic_write_mode;
use crate::paths::Home;

/// One agent as the index knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub id: String,
    /// Empty for an agent whose record could never be read.
    #[serde(default)]
    pub name: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct IndexFile {
    version: u32,
    /// In listing order (oldest first).
    agents: Vec<Entry>,
}

const VERSION: u32 = 1;

/// The index's entries if it matches the agent directories present.
pub(crate) fn read_current(home: &Home) -> Option<Vec<Entry>> {
    let file = read_file(home)?;
    let indexed: BTreeSet<String> = file.agents.iter().map(|e| e.id.clone()).collect();
    if indexed.len() != file.agents.len() || indexed != agent_dirs(home)? {
        return None;
    }
    Some(file.agents)
}

/// Whatever the index says, current or not (for the names of agents whose
/// records cannot be read); empty when there is no readable index.
pub(crate) fn read_any(home: &Home) -> Vec<Entry> {
    read_file(home).map(|f| f.agents).unwrap_or_default()
}

fn read_file(home: &Home) -> Option<IndexFile> {
    let bytes = fs::read(home.agents_index()).ok()?;
    let file: IndexFile = serde_json::from_slice(&bytes).ok()?;
    (file.version == VERSION).then_some(file)
}

/// Write the index for `entries` (in their order). Failing to write it
/// costs speed only, so the error is logged, not returned.
pub fn write(home: &Home, entries: &[Entry]) {
    let file = IndexFile {
        version: VERSION,
        agents: entries.to_vec(),
    };
    let result = serde_json::to_vec(&file)
        .map_err(std::io::Error::other)
        // Root's alone: other users of the host learn no agent's name.
        .and_then(|json| atomic_write_mode(&home.agents_index(), &json, 0o600));
    if let Err(e) = result {
        tracing::debug!("cannot write the agents' index: {e}");
    }
}

/// Ids of the agent directories present (one `readdir`, a `stat` each).
fn agent_dirs(home: &Home) -> Option<BTreeSet<String>> {
    let entries = match fs::read_dir(home.agents_dir()) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(BTreeSet::new()),
        Err(_) => return None,
    };
    let mut out = BTreeSet::new();
    for entry in entries {
        let entry = entry.ok()?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        // As `store::list_all` counts them: a directory named by an id,
        // its record readable or not.
        if is_agent_dir(home, &name) {
            out.insert(name);
        }
    }
    Some(out)
}

/// Whether `agents/<name>` is an agent's directory: a directory whose name
/// is a valid id (staging directories, the index and lock files are not).
pub(crate) fn is_agent_dir(home: &Home, name: &str) -> bool {
    home.agent(name).is_ok_and(|p| p.dir().is_dir())
}
