//! How many egress events of an agent (refused attempts, finished
//! connections) become audit records one by one: each is a durable append,
//! and a command can make tens of thousands a second, so past a per-agent
//! rate they are counted instead (with the bytes they carried), and the
//! count goes into one aggregated record. A flood then costs its own agent
//! nothing more than a counter, never the disk or the log writer the other
//! tenants need, and no event or byte goes unaccounted.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Refusals an agent may have recorded one by one, per second, on average.
pub const RATE_PER_SEC: f64 = 5.0;
/// And at once, after a quiet spell.
pub const BURST: f64 = 20.0;
/// How long after the first refusal left unrecorded its count is written
/// (in one record), if no recorded refusal carried it before.
pub const FLUSH_AFTER: Duration = Duration::from_secs(10);

/// Events counted and not yet carried by a record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pending {
    pub events: u64,
    pub bytes: u64,
}

/// Whether one event is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Record it, with the events left unrecorded before it.
    Record { before: Pending },
    /// Count it only; `schedule_flush`: the first of a run, whose count a
    /// record must carry within [`FLUSH_AFTER`].
    Count { schedule_flush: bool },
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
    pending: Pending,
}

/// Per-agent token buckets.
#[derive(Debug, Default)]
pub struct Denials {
    agents: Mutex<HashMap<String, Bucket>>,
}

impl Denials {
    /// Decide for one event of `agent` at `now` that carried `bytes`.
    pub(crate) fn admit(&self, agent: &str, now: Instant, bytes: u64) -> Admit {
        let mut agents = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded: agents idle for a minute (full buckets, nothing
        // counted) are forgotten.
        if agents.len() > 1024 {
            agents.retain(|_, b| {
                b.pending.events > 0 || now.duration_since(b.last) < Duration::from_secs(60)
            });
        }
        let b = agents.entry(agent.to_string()).or_insert(Bucket {
            tokens: BURST,
            last: now,
            pending: Pending::default(),
        });
        let refill = now.duration_since(b.last).as_secs_f64() * RATE_PER_SEC;
        b.tokens = (b.tokens + refill).min(BURST);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Admit::Record {
                before: std::mem::take(&mut b.pending),
            }
        } else {
            b.pending.events += 1;
            b.pending.bytes = b.pending.bytes.saturating_add(bytes);
            Admit::Count {
                schedule_flush: b.pending.events == 1,
            }
        }
    }

    /// The events of `agent` counted and not yet carried by a record.
    pub fn take(&self, agent: &str) -> Pending {
        let mut agents = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        agents
            .get_mut(agent)
            .map(|b| std::mem::take(&mut b.pending))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_counted_past_the_burst_and_each_refusal_is_accounted_once() {
        let d = Denials::default();
        let t0 = Instant::now();
        let mut recorded = 0;
        let mut carried = 0;
        let mut flushes = 0;
        let mut bytes = 0;
        // 10 000 events of 3 bytes each within one second.
        for i in 0..10_000u32 {
            match d.admit("a", t0 + Duration::from_micros(u64::from(i) * 100), 3) {
                Admit::Record { before } => {
                    recorded += 1;
                    carried += before.events;
                    bytes += before.bytes;
                }
                Admit::Count { schedule_flush } => flushes += u64::from(schedule_flush),
            }
        }
        assert!(recorded <= (BURST + RATE_PER_SEC) as u64 + 1, "{recorded}");
        assert!(flushes >= 1);
        let left = d.take("a");
        assert_eq!(
            recorded + carried + left.events,
            10_000,
            "every event counted once"
        );
        assert_eq!(
            bytes + left.bytes,
            3 * (carried + left.events),
            "and its bytes"
        );
        // Another agent has its own bucket.
        assert_eq!(
            d.admit("b", t0 + Duration::from_secs(1), 0),
            Admit::Record {
                before: Pending::default()
            }
        );
        // After a quiet spell the next event is recorded again.
        assert!(matches!(
            d.admit("a", t0 + Duration::from_secs(30), 0),
            Admit::Record { .. }
        ));
    }
}
