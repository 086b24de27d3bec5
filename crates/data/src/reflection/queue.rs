//! Memory-worker instructions the agent was told were taken
//! (`reflections/worker-queue.json`): an instruction stays here from its
//! acknowledgement until its worker is finalized, so a supervisor that
//! stops (or crashes) with workers running or waiting loses none — the
//! next one runs them at its start.
//!
//! A run that does not finish its instruction (the child failed or was
//! killed, or what it committed could not land) keeps the instruction
//! here with the run's record and one more attempt counted; past
//! [`MAX_ATTEMPTS`] the entry stays, marked `failed`, and is no longer run
//! by itself — delegating the same instruction again restarts it.

use serde::{Deserialize, Serialize};
use std::sync::Mutex;

use serde_json::{Value, json};

use super::outcome::{Attempt, Next};
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
    /// dropped: past [`FAILING_AFTER`] it is reported as failing, at
    /// [`MAX_ATTEMPTS`] it is marked failed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempts: u32,
    /// The conversation whose turn delegated it (told when it fails).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
    #[serde(default, skip_serializing_if = "ItemStatus::is_pending")]
    pub status: ItemStatus,
    /// Its earlier runs, oldest first (at most [`HISTORY_KEPT`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Attempt>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Whether a kept instruction is still run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemStatus {
    /// Queued, running, or waiting to be run again.
    #[default]
    Pending,
    /// Failed [`MAX_ATTEMPTS`] times: kept and shown, not run by itself.
    Failed,
}

impl ItemStatus {
    fn is_pending(&self) -> bool {
        *self == ItemStatus::Pending
    }
}

impl QueuedWorker {
    pub fn is_failed(&self) -> bool {
        self.status == ItemStatus::Failed
    }

    /// The number of its next run (1 for the first; runs its supervisor
    /// stopped are numbered too, though not counted).
    pub fn next_run(&self) -> u32 {
        let last = self.history.last().map_or(0, |a| a.attempt);
        last.max(self.attempts).saturating_add(1)
    }
}

/// Failed runs after which an instruction is reported as failing (by
/// `reflect status` and `doctor`); it is still tried again.
pub const FAILING_AFTER: u32 = 4;

/// Failed runs after which an instruction is no longer run by itself: it
/// stays kept, marked `failed`, and the agent is reminded of it. With the
/// pauses between runs (2 s doubling to 2 min) that is about four minutes
/// of failing.
pub const MAX_ATTEMPTS: u32 = 8;

/// Runs recorded per instruction (the latest).
pub const HISTORY_KEPT: usize = 16;

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
    push_for(agent, instruction, isolation, None, now)
}

/// [`push`], delegated from `conversation`. The same instruction as one
/// kept `failed` restarts that one (its count back to zero, its history
/// kept) rather than being kept twice.
pub fn push_for(
    agent: &AgentPaths,
    instruction: &str,
    isolation: Option<&str>,
    conversation: Option<&str>,
    now: time::OffsetDateTime,
) -> Result<QueuedWorker, ReflectionError> {
    {
        let _g = QUEUE_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let mut q = read(agent)?;
        let failed = q
            .items
            .iter_mut()
            .find(|i| i.is_failed() && i.repair.is_none() && i.instruction == instruction);
        if let Some(item) = failed {
            item.status = ItemStatus::Pending;
            item.attempts = 0;
            item.isolation = isolation.map(str::to_string);
            item.conversation = conversation.map(str::to_string);
            let revived = item.clone();
            write(agent, &q)?;
            return Ok(revived);
        }
    }
    let mut item = push_item(agent, instruction, isolation, None, now)?;
    if let Some(c) = conversation {
        item = set_conversation(agent, &item.id, c)?.unwrap_or(item);
    }
    Ok(item)
}

fn set_conversation(
    agent: &AgentPaths,
    id: &str,
    conversation: &str,
) -> Result<Option<QueuedWorker>, ReflectionError> {
    update(agent, id, |item| {
        item.conversation = Some(conversation.to_string())
    })
}

/// Apply `change` to instruction `id`; its new state (`None` when it is no
/// longer kept).
fn update(
    agent: &AgentPaths,
    id: &str,
    change: impl FnOnce(&mut QueuedWorker),
) -> Result<Option<QueuedWorker>, ReflectionError> {
    let _g = QUEUE_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let mut q = read(agent)?;
    let Some(item) = q.items.iter_mut().find(|i| i.id == id) else {
        return Ok(None);
    };
    change(item);
    let updated = item.clone();
    write(agent, &q)?;
    Ok(Some(updated))
}

/// [`push`], for a repair worker of `repair`.
pub(crate) fn push_repair(
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
        queued_at: crate::clock::rfc3339(now),
        repair,
        attempts: 0,
        conversation: None,
        status: ItemStatus::Pending,
        history: Vec::new(),
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
    Ok(update(agent, id, count_failure)?.map(|i| i.attempts))
}

fn count_failure(item: &mut QueuedWorker) {
    item.attempts = item.attempts.saturating_add(1);
    if item.attempts >= MAX_ATTEMPTS {
        item.status = ItemStatus::Failed;
    }
}

/// Keep the record of a run of instruction `id` that did not finish it;
/// `counted`: the run counts against [`MAX_ATTEMPTS`] (a run stopped with
/// its supervisor does not). Its new state (`failed` once the count
/// reaches the limit); `None` when it is no longer kept.
pub(crate) fn record_run(
    agent: &AgentPaths,
    id: &str,
    attempt: Attempt,
    counted: bool,
) -> Result<Option<QueuedWorker>, ReflectionError> {
    update(agent, id, |item| {
        item.history.push(attempt);
        let over = item.history.len().saturating_sub(HISTORY_KEPT);
        item.history.drain(..over);
        if counted {
            count_failure(item);
        }
    })
}

/// Every kept instruction, oldest first (those marked failed included).
pub fn list(agent: &AgentPaths) -> Result<Vec<QueuedWorker>, ReflectionError> {
    let _g = QUEUE_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    Ok(read(agent)?.items)
}

/// The kept instructions still to be run, oldest first.
pub fn pending(agent: &AgentPaths) -> Result<Vec<QueuedWorker>, ReflectionError> {
    Ok(list(agent)?
        .into_iter()
        .filter(|i| !i.is_failed())
        .collect())
}

// What a run's outcome does to the queue.

/// What became of an instruction after a run (see [`settle`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// No longer kept: done and forgotten, or forgotten meanwhile (an
    /// overlapping run finished it).
    Gone,
    /// Kept, as it is now (marked failed once past the limit).
    Kept(Box<QueuedWorker>),
    /// The queue could not be written (a full or read-only disk): the
    /// instruction stays as it was on disk; `attempts` is counted here only.
    Unrecorded { attempts: u32, error: String },
}

/// Settle instruction `item` after run `attempt`, as `next` says: forget
/// it when done, else keep the run's record — counted unless its
/// supervisor stopped. An instruction that reaches the limit is marked
/// failed and its conversation reminded.
pub fn settle(agent: &AgentPaths, item: &QueuedWorker, attempt: Attempt, next: Next) -> Settled {
    let result = match next {
        Next::Done => remove(agent, &item.id).map(|()| None),
        Next::Retry => record_run(agent, &item.id, attempt, true),
        Next::Interrupted => record_run(agent, &item.id, attempt, false),
    };
    match result {
        Ok(Some(kept)) => {
            if kept.is_failed() {
                remind_failed(agent, &kept);
            }
            Settled::Kept(Box::new(kept))
        }
        Ok(None) => Settled::Gone,
        Err(e) => Settled::Unrecorded {
            attempts: item.attempts.saturating_add(u32::from(next == Next::Retry)),
            error: e.to_string(),
        },
    }
}

/// Longest instruction quoted in a result record or a reminder.
const QUOTED_INSTRUCTION_CHARS: usize = 500;

/// Add to a worker's result record which instruction it ran, which run this
/// was, every run so far, and what happens next (`done`, `retry`,
/// `failed`, `left for the next supervisor`).
pub fn describe(
    record: &mut Value,
    item: &QueuedWorker,
    attempt: &Attempt,
    next: Next,
    settled: &Settled,
) {
    let (history, failed) = match settled {
        Settled::Kept(k) => (k.history.clone(), k.is_failed()),
        _ => {
            let mut h = item.history.clone();
            h.push(attempt.clone());
            (h, false)
        }
    };
    let said = if failed { "failed" } else { next.as_str() };
    if let Some(o) = record.as_object_mut() {
        o.insert("item".into(), json!(item.id));
        o.insert(
            "instruction".into(),
            json!(super::truncate_chars(
                &item.instruction,
                QUOTED_INSTRUCTION_CHARS
            )),
        );
        o.insert("attempt".into(), json!(attempt.attempt));
        o.insert("attempts".into(), json!(history));
        o.insert("done".into(), json!(next == Next::Done));
        o.insert("next".into(), json!(said));
    }
}

/// Id of the reminder left for a failed instruction (one per instruction).
pub(crate) fn failed_reminder_id(item: &QueuedWorker) -> String {
    format!("memory-worker-failed-{}", item.id)
}

/// What the agent is told when an instruction it delegated has failed
/// [`MAX_ATTEMPTS`] times.
pub fn failed_reminder_text(item: &QueuedWorker) -> String {
    let merged: Vec<&str> = item
        .history
        .iter()
        .filter_map(|a| a.merge.as_ref())
        .filter(|m| m.landed())
        .flat_map(|m| m.changed_paths.iter().map(String::as_str))
        .collect();
    let last = item.history.last().map_or_else(
        || "none recorded".to_string(),
        |a| {
            let report = a.task.report.as_deref().unwrap_or("no report");
            format!(
                "task {}: {}",
                a.task.status.as_str(),
                super::truncate_chars(report.trim(), 300)
            )
        },
    );
    format!(
        "MEMORY WORKER FAILED: A memory worker could not finish an instruction you delegated; \
it failed {} times and is no longer retried.\n\
Instruction: {}\n\
Last attempt: {last}\n\
Merged by its attempts: {}\n\
What was merged is in your memory. Make the rest of the change yourself with the memory \
tool, or delegate the same instruction again to restart it; tell the user if it matters.",
        item.attempts,
        super::truncate_chars(&item.instruction, QUOTED_INSTRUCTION_CHARS),
        if merged.is_empty() {
            "nothing".to_string()
        } else {
            merged.join(", ")
        }
    )
}

/// Leave the failed instruction's reminder for the next turn of the
/// conversation that delegated it (the default one when unknown).
/// Best effort: the instruction stays kept and shown whatever happens.
fn remind_failed(agent: &AgentPaths, item: &QueuedWorker) {
    let conv = item.conversation.as_deref().unwrap_or("default");
    let left =
        crate::store::conversation::Conversation::open_existing(agent, conv).and_then(
            |c| match c {
                Some(c) => c
                    .queue_reminder(&failed_reminder_id(item), &failed_reminder_text(item))
                    .map(|()| true),
                None => Ok(false),
            },
        );
    match left {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!(item = %item.id, conversation = conv, "no conversation to remind of a failed memory worker")
        }
        Err(e) => {
            tracing::warn!(item = %item.id, "cannot remind the agent of a failed memory worker: {e}")
        }
    }
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
    fn runs_are_recorded_and_the_limit_marks_an_instruction_failed_not_gone() {
        use crate::reflection::outcome::TaskPart;
        let (_t, agent) = testutil::agent();
        let now = time::OffsetDateTime::now_utc();
        let item = push_for(&agent, "记住: x", None, Some("default"), now).unwrap();
        assert_eq!(item.conversation.as_deref(), Some("default"));
        let run = |n| {
            crate::reflection::outcome::attempt(n, "t".into(), None, TaskPart::not_started("full"))
        };
        // A run stopped with the supervisor is kept, not counted.
        let after = record_run(&agent, &item.id, run(1), false)
            .unwrap()
            .unwrap();
        assert_eq!((after.attempts, after.history.len()), (0, 1));
        for n in 1..MAX_ATTEMPTS {
            let after = record_run(&agent, &item.id, run(n), true).unwrap().unwrap();
            assert!(!after.is_failed(), "failed after {n}");
        }
        let failed = record_run(&agent, &item.id, run(MAX_ATTEMPTS), true)
            .unwrap()
            .unwrap();
        assert!(failed.is_failed());
        assert_eq!(failed.attempts, MAX_ATTEMPTS);
        assert_eq!(failed.history.len(), (MAX_ATTEMPTS + 1) as usize);
        // Kept and listed, but not pending.
        assert_eq!(list(&agent).unwrap(), vec![failed.clone()]);
        assert!(pending(&agent).unwrap().is_empty());
        let text =
            std::fs::read_to_string(agent.reflections_dir().join(WORKER_QUEUE_FILE_NAME)).unwrap();
        assert!(text.contains("\"status\": \"failed\""), "{text}");
        // Delegated again: the same entry restarts.
        let again = push_for(&agent, "记住: x", None, Some("c2"), now).unwrap();
        assert_eq!(again.id, item.id);
        assert!(!again.is_failed());
        assert_eq!(again.attempts, 0);
        assert_eq!(again.conversation.as_deref(), Some("c2"));
        assert_eq!(pending(&agent).unwrap().len(), 1);
        // History is capped.
        for n in 0..(HISTORY_KEPT as u32 + 5) {
            record_run(&agent, &item.id, run(n), false).unwrap();
        }
        assert_eq!(list(&agent).unwrap()[0].history.len(), HISTORY_KEPT);
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
