//! Repair attempts (chapter 17, exercise 3): a memory worker whose merge
//! conflicted keeps its branch, and a repair worker re-applies what it
//! meant to the memory as it is now — once per conflict. The record
//! (`reflections/repair-attempts.json`) names each conflict by the kept
//! branch's tip and `main`'s head when it was seen, so the same conflict
//! is never repaired twice, and a new one (either side moved) is.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::launch_result::failed;
use super::queue::{self, QueuedWorker, RepairOf};
use super::{MAX_SMALL_JSON_BYTES, PUBLIC_FILE_MODE, ReflectionError, prompt};
use crate::clock::now;
use crate::memfs::worktree as wt;
use crate::paths::{AgentPaths, Home, REPAIR_ATTEMPTS_FILE_NAME};

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
            at: crate::clock::rfc3339(now),
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

/// Queue the repair worker for `branch` of agent `agent_id`, kept after its
/// merge conflicted (`previous`: the repair that conflicted in turn, if
/// one did). `None` when none is due: the chain of repairs is too long,
/// nothing was kept, or this conflict was repaired already. On a blocking
/// thread; a failure is the JSON it is logged as.
pub fn queue_for(
    home: &Home,
    agent_id: &str,
    branch: &str,
    isolation: Option<&str>,
    previous: Option<RepairOf>,
) -> Result<Option<QueuedWorker>, super::launch_result::LaunchResult> {
    // A repair that conflicted in turn is repaired again (the memory moved
    // on), a few times at most.
    let depth = previous.as_ref().map_or(0, |p| p.depth + 1);
    if depth >= queue::MAX_REPAIR_DEPTH {
        tracing::warn!(agent = %agent_id, branch, "repairs keep conflicting: the branch stays for an operator");
        return Ok(None);
    }
    let also = previous
        .map(|p| {
            let mut v = p.also;
            v.push((p.branch, p.tip));
            v
        })
        .unwrap_or_default();
    let paths = home.agent(agent_id).map_err(failed)?;
    let Some(change) = wt::kept_change(&paths, branch).map_err(failed)? else {
        return Ok(None);
    };
    let signature = format!("{}:{}", change.tip, change.main);
    match claim(&paths, &signature, branch, now()).map_err(failed)? {
        Claim::Attempted => return Ok(None),
        Claim::Claimed => {}
    }
    let instruction = prompt::repair(&change.branch, &change.patch, &change.added);
    let repair = RepairOf {
        branch: change.branch,
        tip: change.tip,
        signature,
        also,
        depth,
    };
    queue::push_repair(&paths, &instruction, isolation, repair, now())
        .map(Some)
        .map_err(failed)
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
