//! The agents' name index, `<home>/agents/index.json`: every agent's id
//! and name, so finding an agent by name reads one small file and one
//! record instead of every `agent.json`.
//!
//! It is a cache, never the truth. It is trusted only while its ids are
//! exactly the agents present (one `readdir` and a `stat` each, no reads),
//! and a record found through it must carry the name asked for; anything
//! else (an index missing, torn, or out of date after a concurrent create
//! or a hand edit) rebuilds it from the records.

use std::collections::BTreeSet;
use std::fs;

use serde::{Deserialize, Serialize};

use super::record::AgentRecord;
use crate::fsutil::atomic_write;
use crate::paths::Home;

/// One agent as the index knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub id: String,
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
pub fn read_current(home: &Home) -> Option<Vec<Entry>> {
    let bytes = fs::read(home.agents_index()).ok()?;
    let file: IndexFile = serde_json::from_slice(&bytes).ok()?;
    if file.version != VERSION {
        return None;
    }
    let indexed: BTreeSet<String> = file.agents.iter().map(|e| e.id.clone()).collect();
    if indexed.len() != file.agents.len() || indexed != agent_dirs(home)? {
        return None;
    }
    Some(file.agents)
}

/// Write the index for `records` (in their order). Failing to write it
/// costs speed only, so the error is logged, not returned.
pub fn write(home: &Home, records: &[AgentRecord]) {
    let file = IndexFile {
        version: VERSION,
        agents: records
            .iter()
            .map(|r| Entry {
                id: r.id.clone(),
                name: r.name.clone(),
            })
            .collect(),
    };
    let result = serde_json::to_vec(&file)
        .map_err(std::io::Error::other)
        .and_then(|json| atomic_write(&home.agents_index(), &json));
    if let Err(e) = result {
        tracing::debug!("cannot write the agents' index: {e}");
    }
}

/// Ids of the agents present (one `readdir`, a `stat` each).
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
        // As `store::list` counts them: a directory with a record.
        if let Ok(paths) = home.agent(&name)
            && paths.agent_json().is_file()
        {
            out.insert(name);
        }
    }
    Some(out)
}
