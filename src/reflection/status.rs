//! What `reflect status` shows of an agent: settings, lock, backoff, the
//! last results, each conversation's cursor, and the kept instructions.

use serde_json::{Value, json};

use super::queue::{self, QueuedWorker};
use super::{backoff, lock, settings, state as rstate};
use crate::paths::AgentPaths;

/// A kept instruction as `reflect status` shows it: its state, count and
/// last run (what merged and how the task ended), the instruction cut.
fn worker_row(item: &QueuedWorker) -> Value {
    json!({
        "id": item.id,
        "instruction": super::truncate_chars(&item.instruction, 300),
        "status": if item.is_failed() { "failed" } else { "pending" },
        "attempts": item.attempts,
        "queuedAt": item.queued_at,
        "conversation": item.conversation,
        "repair": item.repair.is_some(),
        "last": item.history.last(),
    })
}

/// The status of agent `id` (`agent`): everything `reflect status` shows
/// but what runs in this supervisor, which the caller adds. On a blocking
/// thread; what cannot be read shows as missing.
pub fn report(agent: &AgentPaths, id: String) -> Value {
    let settings = settings::load(agent).unwrap_or_default();
    let lock = lock::inspect(agent).ok().flatten();
    let backoff = backoff::load(agent).ok().flatten();
    let last = super::launch_result::load_last_result(agent).ok().flatten();
    let mut conversations = Vec::new();
    for conv in crate::store::conversation::list_ids(agent).unwrap_or_default() {
        let st = rstate::load(agent, &conv).unwrap_or_default();
        let mut v = serde_json::to_value(&st).unwrap_or_else(|_| json!({}));
        if let Some(o) = v.as_object_mut() {
            o.insert("conversation".into(), json!(conv));
        }
        conversations.push(v);
    }
    // Instructions kept until applied: queued, running, waiting to be
    // tried again after a failed run, or failed too often.
    let items = queue::list(agent).unwrap_or_default();
    let kept = items.len();
    let failed = items.iter().filter(|i| i.is_failed()).count();
    let failing = items
        .iter()
        .filter(|i| !i.is_failed() && i.attempts >= queue::FAILING_AFTER)
        .count();
    let last_worker = super::launch_result::load_last_worker_result(agent)
        .ok()
        .flatten();
    json!({
        "agent": id,
        "settings": settings,
        "lock": lock,
        "backoff": backoff,
        "last": last,
        "last_worker": last_worker,
        "conversations": conversations,
        "workers_kept": kept,
        "workers_failing": failing,
        "workers_failed": failed,
        "workers": items.iter().map(worker_row).collect::<Vec<_>>(),
    })
}
