//! When a memory worker's instruction runs again: the pause that grows with
//! its failures, and what of a settled run is left to run again.

use super::queue::{self, QueuedWorker};

/// Pause before the first re-run of a failed instruction; it doubles with
/// each failure, up to [`WORKER_RETRY_MAX_DELAY`].
const WORKER_RETRY_DELAY: std::time::Duration = std::time::Duration::from_secs(2);
const WORKER_RETRY_MAX_DELAY: std::time::Duration = std::time::Duration::from_secs(120);

/// The pause before run `n + 1` of an instruction whose `n` runs failed.
pub fn retry_delay(n: u32) -> std::time::Duration {
    WORKER_RETRY_DELAY
        .saturating_mul(1 << n.saturating_sub(1).min(16))
        .min(WORKER_RETRY_MAX_DELAY)
}

/// The start of an instruction, for a log line (a repair's carries a patch).
pub fn log_excerpt(instruction: &str) -> String {
    const MAX: usize = 300;
    let mut s: String = instruction.chars().take(MAX).collect();
    if instruction.chars().nth(MAX).is_some() {
        s.push('…');
    }
    s
}

/// What of `item` runs again after a run that did not finish it, settled
/// as `settled`, and after how many failures — or `None`: it is gone, or,
/// once it has failed [`queue::MAX_ATTEMPTS`] times, kept marked failed
/// for the agent (reminded by the settling) to delegate again. An
/// acknowledged instruction is never dropped: one whose failure cannot be
/// recorded (the disk is full) is counted here and run again all the same,
/// and past the limit left, still pending on disk, for the next supervisor.
pub fn again(
    agent_id: &str,
    item: &QueuedWorker,
    settled: &queue::Settled,
) -> Option<(QueuedWorker, u32)> {
    let (again, n) = match settled {
        queue::Settled::Gone => return None,
        queue::Settled::Kept(k) if k.is_failed() => {
            tracing::error!(agent = %agent_id, item = %k.id, attempts = k.attempts, instruction = %log_excerpt(&k.instruction), "a memory worker failed too often: its instruction is kept, marked failed, and the agent is reminded");
            return None;
        }
        queue::Settled::Kept(k) => ((**k).clone(), k.attempts),
        queue::Settled::Unrecorded { attempts, error } => {
            tracing::warn!(agent = %agent_id, item = %item.id, "cannot record a failed memory worker run ({error}); it is tried again");
            if *attempts >= queue::MAX_ATTEMPTS {
                tracing::error!(agent = %agent_id, item = %item.id, "a memory worker failed too often and its queue cannot be written: the instruction is left for the next supervisor");
                return None;
            }
            let mut again = item.clone();
            again.attempts = *attempts;
            (again, *attempts)
        }
    };
    if n == queue::FAILING_AFTER {
        tracing::error!(agent = %agent_id, item = %item.id, attempts = n, instruction = %log_excerpt(&item.instruction), "a memory worker keeps failing; its instruction stays queued and is tried again");
    }
    Some((again, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_instructions_wait_longer_each_time() {
        let secs: Vec<u64> = (1..=9).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(secs, vec![2, 4, 8, 16, 32, 64, 120, 120, 120]);
        // The runs before an instruction is marked failed span minutes.
        let total: u64 = (1..queue::MAX_ATTEMPTS)
            .map(|n| retry_delay(n).as_secs())
            .sum();
        assert!((120..=600).contains(&total), "{total}");
        // However many failures: still a finite pause.
        assert_eq!(retry_delay(u32::MAX), WORKER_RETRY_MAX_DELAY);
        assert_eq!(retry_delay(0), WORKER_RETRY_DELAY);
        assert_eq!(log_excerpt("短"), "短");
        assert_eq!(log_excerpt(&"x".repeat(301)).chars().count(), 301);
    }
}
