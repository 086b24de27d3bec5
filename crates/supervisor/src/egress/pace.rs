//! Connections a child may open through the proxy per second, per agent.
//!
//! Each connection costs the supervisor work before any verdict (accept,
//! read the request, decide, record), so a command looping on refused
//! requests could spend a core of the supervisor's CPU, shared by every
//! tenant. The accept loop of an agent's children takes a token from the
//! agent's bucket before each accept; past the burst it waits, so the
//! flood waits in its own listener's backlog (its `connect` blocks) and
//! costs the supervisor a bounded rate.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// New connections per second, per agent, once the burst is spent.
pub const RATE_PER_SEC: f64 = 250.0;
/// Connections an idle agent may open at once.
pub const BURST: f64 = 500.0;

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

/// Per-agent token buckets.
#[derive(Debug, Default)]
pub struct Pace {
    agents: Mutex<HashMap<String, Bucket>>,
}

impl Pace {
    /// How long `agent`'s next connection waits, taking its token now
    /// (a bucket may go below zero: later callers wait their turn).
    pub fn delay(&self, agent: &str, now: Instant) -> Duration {
        let mut agents = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        if agents.len() > 1024 {
            // Full buckets carry nothing: forget them.
            agents
                .retain(|_, b| b.tokens < BURST - 1.0 || now.duration_since(b.last).as_secs() < 60);
        }
        let b = agents.entry(agent.to_string()).or_insert(Bucket {
            tokens: BURST,
            last: now,
        });
        let refill = now.saturating_duration_since(b.last).as_secs_f64() * RATE_PER_SEC;
        b.tokens = (b.tokens + refill).min(BURST);
        b.last = now.max(b.last);
        b.tokens -= 1.0;
        if b.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-b.tokens / RATE_PER_SEC)
        }
    }

    /// Wait for `agent`'s next connection.
    pub async fn wait(&self, agent: &str) {
        let d = self.delay(agent, Instant::now());
        if !d.is_zero() {
            tokio::time::sleep(d).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_burst_connections_come_at_the_rate() {
        let p = Pace::default();
        let t0 = Instant::now();
        for _ in 0..BURST as usize {
            assert_eq!(p.delay("owl", t0), Duration::ZERO);
        }
        // The next ones queue one interval apart.
        let d1 = p.delay("owl", t0);
        let d2 = p.delay("owl", t0);
        let step = Duration::from_secs_f64(1.0 / RATE_PER_SEC);
        assert!(d1 >= step && d1 < step * 2, "{d1:?}");
        assert!(
            d2 > d1 && d2 - d1 >= step - Duration::from_micros(1),
            "{d1:?} {d2:?}"
        );
        // Another agent has its own bucket.
        assert_eq!(p.delay("wren", t0), Duration::ZERO);
        // A quiet second refills the rate's worth.
        let later = t0 + Duration::from_secs(2);
        assert_eq!(p.delay("owl", later), Duration::ZERO);
    }
}
