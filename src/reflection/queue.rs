//! Memory-worker instructions the agent was told were taken
//! (`reflections/worker-queue.json`): an instruction stays here from its
//! acknowledgement until its worker is finalized, so a supervisor that
//! stops (or crashes) with workers running or waiting loses none — the
//! next one runs them at its start.

use serde::{Deserialize, Serialize};
use std::sync::Mutex;

use super::{MAX_SMALL_JSON_BYTES, PUBLIC_FILE_MODE, ReflectionError};
use crate::paths::{AgentPaths, WORKER_QUEUE_FILE_NAME};

/// Instructions kept at most per agent; more are refused, not dropped.
pub const MAX_QUEUED: usize = 64;

/// Serialises read-modify-write of queue files in this process.
static QUEUE_LOCK: Mutex<()> = Mutex::new(());

/// One acknowledged instruction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueuedWorker {
    pub id: String,
    pub instruction: String,
    #[serde(default)]
    pub isolation: Option<String>,
    pub queued_at: String,
    /// A repair worker: the kept branch whose change it re-applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repair: Option<RepairOf>,
    /// Runs that ended without applying it (a launch that failed, a worker
    /// killed or out of disk). It is run again, later each time, and never
    /// dropped: past [`FAILING_AFTER`] it is reported as failing.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempts: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Failed runs after which an instruction is reported as failing (by
/// `reflect status` and `doctor`); it is still tried again.
pub const FAILING_AFTER: u32 = 4;

/// What a repair worker repairs (see [`super::repair`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RepairOf {
    pub branch: String,
    pub tip: String,
    pub signature: String,
    /// Earlier kept branches (and their tips) this repair also stands for:
    /// a repair that conflicted in turn is repaired again, and the last one
    /// to merge removes them all.
    #[serde(default)]
    pub also: Vec<(String, String)>,
    /// How many repairs led here (a chain stops at [`MAX_REPAIR_DEPTH`]).
    #[serde(default)]
    pub depth: u8,
}

/// Repairs of repairs at most; past it the branches stay for an operator.
pub const MAX_REPAIR_DEPTH: u8 = 3;

#[derive(Debug, Default, Serialize, Deserialize)]
struct QueueFile {
    #[serde(default)]
    items: Vec<QueuedWorker>,
}

fn read(agent: &AgentPaths) -> Result<QueueFile, ReflectionError> {
    let Some(dir) = super::open_reflections_dir(agent, false)? else {
        return Ok(QueueFile::default());
    };
    // A queue file that does not parse would lose what it holds if it
    // were silently replaced: it is an error, and nothing is written.
    Ok(
        super::read_json(&dir, WORKER_QUEUE_FILE_NAME, MAX_SMALL_JSON_BYTES * 16)?
            .unwrap_or_default(),
    )
}

fn write(agent: &AgentPaths, q: &QueueFile) -> Result<(), ReflectionError> {
    let dir = super::open_reflections_dir(agent, true)?.ok_or_else(|| ReflectionError::Io {
        path: agent.reflections_dir(),
        source: std::io::ErrorKind::NotFound.into(),
    })?;
    if q.items.is_empty() {
        return match dir.remove_file(WORKER_QUEUE_FILE_NAME) {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e.into()),
        };
    }
    let bytes = super::to_pretty_json(q, dir.path().join(WORKER_QUEUE_FILE_NAME))?;
    dir.replace_file(WORKER_QUEUE_FILE_NAME, &bytes, PUBLIC_FILE_MODE)?;
    Ok(())
}

/// Keep `instruction` (durably, before it is acknowledged); its id.
pub fn push(
    agent: &AgentPaths,
    instruction: &str,
    isolation: Option<&str>,
    now: time::OffsetDateTime,
) -> Result<QueuedWorker, ReflectionError> {
    push_item(agent, instruction, isolation, None, now)
}

/// [`push`], for a repair worker of `repair`.
pub fn push_repair(
    agent: &AgentPaths,
    instruction: &str,
    isolation: Option<&str>,
    repair: RepairOf,
    now: time::OffsetDateTime,
) -> Result<QueuedWorker, ReflectionError> {
    push_item(agent, instruction, isolation, Some(repair), now)
}

fn push_item(
    agent: &AgentPaths,
    instruction: &str,
    isolation: Option<&str>,
    repair: Option<RepairOf>,
    now: time::OffsetDateTime,
) -> Result<QueuedWorker, ReflectionError> {
    let _g = QUEUE_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let mut q = read(agent)?;
    if q.items.len() >= MAX_QUEUED {
        return Err(ReflectionError::InvalidSettings(format!(
            "{MAX_QUEUED} memory workers are already waiting for this agent; try again later"
        )));
    }
    let item = QueuedWorker {
        id: format!("{:016x}", rand::random::<u64>()),
        instruction: instruction.to_string(),
        isolation: isolation.map(str::to_string),
        queued_at: super::format_time(now),
        repair,
        attempts: 0,
    };
    q.items.push(item.clone());
    write(agent, &q)?;
    Ok(item)
}

/// Forget instruction `id` (its worker was finalized).
pub fn remove(agent: &AgentPaths, id: &str) -> Result<(), ReflectionError> {
    let _g = QUEUE_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let mut q = read(agent)?;
    let before = q.items.len();
    q.items.retain(|i| i.id != id);
    if q.items.len() != before {
        write(agent, &q)?;
    }
    Ok(())
}

/// Count one more failed run of instruction `id`; its new count (`None`
/// when it is no longer kept).
pub fn note_attempt(agent: &AgentPaths, id: &str) -> Result<Option<u32>, ReflectionError> {
    let _g = QUEUE_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let mut q = read(agent)?;
    let Some(item) = q.items.iter_mut().find(|i| i.id == id) else {
        return Ok(None);
    };
    item.attempts += 1;
    let n = item.attempts;
    write(agent, &q)?;
    Ok(Some(n))
}

/// Every kept instruction, oldest first.
pub fn list(agent: &AgentPaths) -> Result<Vec<QueuedWorker>, ReflectionError> {
    let _g = QUEUE_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    Ok(read(agent)?.items)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reflection::testutil;

    #[test]
    fn instructions_stay_until_removed_in_order() {
        let (_t, agent) = testutil::agent();
        let now = time::OffsetDateTime::now_utc();
        assert!(list(&agent).unwrap().is_empty());
        let a = push(&agent, "记住: a", Some("strict"), now).unwrap();
        let b = push(&agent, "记住: b", None, now).unwrap();
        let got = list(&agent).unwrap();
        assert_eq!(got, vec![a.clone(), b.clone()]);
        remove(&agent, &a.id).unwrap();
        assert_eq!(list(&agent).unwrap(), vec![b.clone()]);
        remove(&agent, &b.id).unwrap();
        assert!(list(&agent).unwrap().is_empty());
        assert!(
            !agent
                .reflections_dir()
                .join(WORKER_QUEUE_FILE_NAME)
                .exists()
        );
    }

    #[test]
    fn a_full_queue_refuses_and_an_unreadable_one_is_an_error() {
        let (_t, agent) = testutil::agent();
        let now = time::OffsetDateTime::now_utc();
        for i in 0..MAX_QUEUED {
            push(&agent, &format!("x{i}"), None, now).unwrap();
        }
        assert!(push(&agent, "one more", None, now).is_err());
        assert_eq!(list(&agent).unwrap().len(), MAX_QUEUED);
        std::fs::write(
            agent.reflections_dir().join(WORKER_QUEUE_FILE_NAME),
            "{not json",
        )
        .unwrap();
        assert!(list(&agent).is_err());
        assert!(push(&agent, "y", None, now).is_err());
    }
}
