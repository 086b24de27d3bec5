//! Repair attempts (chapter 17, exercise 3): a memory worker whose merge
//! conflicted keeps its branch, and a repair worker re-applies what it
//! meant to the memory as it is now — once per conflict. The record
//! (`reflections/repair-attempts.json`) names each conflict by the kept
//! branch's tip and `main`'s head when it was seen, so the same conflict
//! is never repaired twice, and a new one (either side moved) is.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::{MAX_SMALL_JSON_BYTES, PUBLIC_FILE_MODE, ReflectionError};
use crate::paths::{AgentPaths, REPAIR_ATTEMPTS_FILE_NAME};

/// Attempts remembered at most (the oldest are forgotten first).
const MAX_ATTEMPTS: usize = 256;

static LOCK: Mutex<()> = Mutex::new(());

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attempt {
    pub branch: String,
    /// `launching` until the repair worker is finalized, then `done`.
    pub state: String,
    pub at: String,
}

/// The outcome of [`claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Ours to repair.
    Claimed,
    /// This conflict was (or is being) repaired already.
    Attempted,
}

fn read(agent: &AgentPaths) -> Result<BTreeMap<String, Attempt>, ReflectionError> {
    let Some(dir) = super::open_reflections_dir(agent, false)? else {
        return Ok(BTreeMap::new());
    };
    Ok(
        super::read_json(&dir, REPAIR_ATTEMPTS_FILE_NAME, MAX_SMALL_JSON_BYTES * 4)?
            .unwrap_or_default(),
    )
}

fn write(agent: &AgentPaths, map: &BTreeMap<String, Attempt>) -> Result<(), ReflectionError> {
    let dir = super::open_reflections_dir(agent, true)?.ok_or_else(|| ReflectionError::Io {
        path: agent.reflections_dir(),
        source: std::io::ErrorKind::NotFound.into(),
    })?;
    let bytes = super::to_pretty_json(map, dir.path().join(REPAIR_ATTEMPTS_FILE_NAME))?;
    dir.replace_file(REPAIR_ATTEMPTS_FILE_NAME, &bytes, PUBLIC_FILE_MODE)?;
    Ok(())
}

/// Claim the repair of conflict `signature` (kept branch `branch`).
pub fn claim(
    agent: &AgentPaths,
    signature: &str,
    branch: &str,
    now: time::OffsetDateTime,
) -> Result<Claim, ReflectionError> {
    let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let mut map = read(agent)?;
    if map.contains_key(signature) {
        return Ok(Claim::Attempted);
    }
    while map.len() >= MAX_ATTEMPTS {
        let oldest = map
            .iter()
            .min_by(|a, b| a.1.at.cmp(&b.1.at))
            .map(|(k, _)| k.clone());
        match oldest {
            Some(k) => map.remove(&k),
            None => break,
        };
    }
    map.insert(
        signature.to_string(),
        Attempt {
            branch: branch.to_string(),
            state: "launching".into(),
            at: super::format_time(now),
        },
    );
    write(agent, &map)?;
    Ok(Claim::Claimed)
}

/// Mark attempt `signature` done (its repair worker was finalized).
pub fn complete(agent: &AgentPaths, signature: &str) -> Result<(), ReflectionError> {
    let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let mut map = read(agent)?;
    if let Some(a) = map.get_mut(signature) {
        a.state = "done".into();
        write(agent, &map)?;
    }
    Ok(())
}

/// Every remembered attempt, by signature.
pub fn attempts(agent: &AgentPaths) -> Result<BTreeMap<String, Attempt>, ReflectionError> {
    let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    read(agent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reflection::testutil;

    #[test]
    fn a_conflict_is_repaired_once_and_a_new_one_again() {
        let (_t, agent) = testutil::agent();
        let now = time::OffsetDateTime::now_utc();
        assert_eq!(
            claim(&agent, "tip1:main1", "b", now).unwrap(),
            Claim::Claimed
        );
        assert_eq!(
            claim(&agent, "tip1:main1", "b", now).unwrap(),
            Claim::Attempted
        );
        complete(&agent, "tip1:main1").unwrap();
        assert_eq!(
            claim(&agent, "tip1:main1", "b", now).unwrap(),
            Claim::Attempted
        );
        assert_eq!(attempts(&agent).unwrap()["tip1:main1"].state, "done");
        // main moved: a new conflict.
        assert_eq!(
            claim(&agent, "tip1:main2", "b", now).unwrap(),
            Claim::Claimed
        );
    }
}
