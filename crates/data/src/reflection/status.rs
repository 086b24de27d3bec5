//! What `reflect status` shows of an agent: settings, lock, backoff, the
//! last results, each conversation's cursor, and the kept instructions.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::queue::{self, QueuedWorker};
use super::{backoff, lock, settings, state as rstate};
use crate::paths::AgentPaths;
use crate::protocol::replies::{ReflectStatus, SettingsView, StateView, WorkerRow};

/// A kept instruction as `reflect status` shows it: its state, count and
/// last run (what merged and how the task ended), the instruction cut.
fn worker_row(item: &QueuedWorker) -> WorkerRow {
    WorkerRow {
        id: item.id.clone(),
        instruction: super::truncate_chars(&item.instruction, 300),
        status: if item.is_failed() {
            "failed"
        } else {
            "pending"
        }
        .into(),
        attempts: item.attempts,
        queued_at: item.queued_at.clone(),
        conversation: item.conversation.clone(),
        repair: item.repair.is_some(),
        last: item.history.last().cloned(),
    }
}

/// A record as the reply's view of it: the same JSON, read by the fields
/// a reader decides on (the rest kept whole).
fn view<T: Serialize, V: DeserializeOwned>(record: &T) -> Option<V> {
    serde_json::to_value(record)
        .ok()
        .and_then(|v| serde_json::from_value(v).ok())
}

/// The status of agent `id` (`agent`): everything `reflect status` shows
/// but what runs in this supervisor, which the caller adds. On a blocking
/// thread; what cannot be read shows as missing.
pub fn report(agent: &AgentPaths, id: String) -> ReflectStatus {
    let settings = settings::load(agent).unwrap_or_default();
    let lock = lock::inspect(agent).ok().flatten();
    let backoff = backoff::load(agent).ok().flatten();
    let last = super::launch_result::load_last_result(agent).ok().flatten();
    let mut conversations = Vec::new();
    for conv in crate::store::conversation::list_ids(agent).unwrap_or_default() {
        let st = rstate::load(agent, &conv).unwrap_or_default();
        let mut v = serde_json::to_value(&st).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.insert("conversation".into(), conv.into());
        }
        if let Ok(row) = serde_json::from_value::<StateView>(v) {
            conversations.push(row);
        }
    }
    // Instructions kept until applied: queued, running, waiting to be
    // tried again after a failed run, or failed too often.
    let items = queue::list(agent).unwrap_or_default();
    let failing = items
        .iter()
        .filter(|i| !i.is_failed() && i.attempts >= queue::FAILING_AFTER)
        .count();
    let last_worker = super::launch_result::load_last_worker_result(agent)
        .ok()
        .flatten();
    ReflectStatus {
        agent: id,
        settings: view(&settings).unwrap_or_else(|| SettingsView {
            trigger: settings.trigger.as_str().into(),
            step_count: settings.step_count.into(),
            merge: settings.merge.as_str().into(),
            rest: Default::default(),
        }),
        lock: lock.as_ref().and_then(view),
        backoff: backoff.as_ref().and_then(view),
        last,
        last_worker,
        conversations,
        workers_kept: items.len(),
        workers_failing: failing,
        workers_failed: items.iter().filter(|i| i.is_failed()).count(),
        workers: items.iter().map(worker_row).collect(),
        running: None,
        worker: None,
        workers_waiting: 0,
    }
}
