//! Trying an operation again when it failed only because something else had
//! what it needs for a moment: a lock file another git holds, a directory a
//! sweep removed, a request a draining supervisor did not take, a server
//! that asked for a pause. Every such site states its [`Policy`] as a value
//! and which errors are worth another try; the loop, the pauses and the
//! bounds are written once, here.

use std::time::{Duration, Instant};

/// How often and how patiently to try: at most `tries` tries in all (the
/// first included), a pause before each retry that starts at `first_pause`
/// and doubles up to `max_pause`, and optionally no retry once `within`
/// has passed since the first try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    tries: u32,
    first_pause: Duration,
    max_pause: Duration,
    within: Option<Duration>,
    already_failed: u32,
}

/// What a site says of one failure (see [`Policy::run_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not worth another try: the error is the answer.
    GiveUp,
    /// Try again after the policy's pause.
    Retry,
    /// Try again after this pause (a server's `retry-after`), still no
    /// longer than the policy's longest pause.
    RetryAfter(Duration),
}

/// The last error of a run that did not succeed, with how many tries it
/// made and how long they took (for a message that says so).
#[derive(Debug)]
pub struct Spent<E> {
    pub error: E,
    pub tries: u32,
    pub elapsed: Duration,
}

impl Policy {
    /// `tries` tries with no pause between them: for a race lost to another
    /// process's quick step (a sweep, a replaced file), where the next try
    /// sees the new state at once.
    pub const fn immediate(tries: u32) -> Self {
        Self::backoff(tries, Duration::ZERO, Duration::ZERO)
    }

    /// `tries` tries, pausing `first` before the second and doubling each
    /// time, never longer than `max`.
    pub const fn backoff(tries: u32, first: Duration, max: Duration) -> Self {
        Self {
            tries,
            first_pause: first,
            max_pause: max,
            within: None,
            already_failed: 0,
        }
    }

    /// Try every `every` until `limit` has passed since the first try (for
    /// a holder whose release cannot be predicted, only bounded).
    pub const fn polling(every: Duration, limit: Duration) -> Self {
        Self {
            tries: u32::MAX,
            first_pause: every,
            max_pause: every,
            within: Some(limit),
            already_failed: 0,
        }
    }

    /// The same policy, with no retry once `limit` has passed since the
    /// first try.
    pub const fn within(self, limit: Duration) -> Self {
        Self {
            within: Some(limit),
            ..self
        }
    }

    /// The same policy for a caller that already made `n` failed tries of
    /// its own: the run starts with the pause the next retry is due and
    /// makes only the tries that remain.
    pub const fn after_failures(self, n: u32) -> Self {
        Self {
            already_failed: n,
            ..self
        }
    }

    /// The pause after `failures` failed tries (1: before the second try).
    pub fn pause(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let doubling = 1u32 << (failures - 1).min(30);
        self.first_pause
            .saturating_mul(doubling)
            .min(self.max_pause)
    }

    /// Run `op` until it succeeds, `retryable` says an error is final, or
    /// the policy is spent; the last error is returned. `retryable` is
    /// asked only when another try is allowed.
    pub fn run<T, E>(
        &self,
        mut retryable: impl FnMut(&E) -> bool,
        op: impl FnMut() -> Result<T, E>,
    ) -> Result<T, E> {
        self.run_with(op, |e, _| verdict(retryable(e)))
            .map_err(|s| s.error)
    }

    /// [`Policy::run`] for a site that acts on each retry (reports it, takes
    /// the server's pause): `judge` gets the error and the number of the
    /// retry it would start (1 for the first), only when one is allowed.
    pub fn run_with<T, E>(
        &self,
        mut op: impl FnMut() -> Result<T, E>,
        mut judge: impl FnMut(&E, u32) -> Verdict,
    ) -> Result<T, Spent<E>> {
        let mut schedule = Schedule::start(self);
        if let Some(pause) = schedule.first_pause() {
            std::thread::sleep(pause);
        }
        loop {
            let error = match op() {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            match schedule.after_failure(&error, &mut judge) {
                Some(pause) => std::thread::sleep(pause),
                None => return Err(schedule.spent(error)),
            }
        }
    }

    /// Wait, as the policy paces it, until `ready` says so; whether it
    /// did before the policy was spent (a bounded wait for another
    /// process: a socket to appear, a group to empty, a child to end).
    pub fn wait_for(&self, mut ready: impl FnMut() -> bool) -> bool {
        self.run(|_| true, || if ready() { Ok(()) } else { Err(()) })
            .is_ok()
    }

    /// [`Policy::run`] in a task: the pauses do not hold a thread.
    pub async fn run_async<T, E, F>(
        &self,
        mut retryable: impl FnMut(&E) -> bool,
        mut op: impl FnMut() -> F,
    ) -> Result<T, E>
    where
        F: std::future::Future<Output = Result<T, E>>,
    {
        let mut schedule = Schedule::start(self);
        let mut judge = |e: &E, _| verdict(retryable(e));
        if let Some(pause) = schedule.first_pause() {
            tokio::time::sleep(pause).await;
        }
        loop {
            let error = match op().await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            match schedule.after_failure(&error, &mut judge) {
                Some(pause) => tokio::time::sleep(pause).await,
                None => return Err(error),
            }
        }
    }
}

/// Wait for `child` to exit, looking as `policy` paces it; `None` when it
/// still ran once the policy was spent (its fate is the caller's).
pub fn wait_child(
    child: &mut std::process::Child,
    policy: &Policy,
) -> std::io::Result<Option<std::process::ExitStatus>> {
    let mut seen = None;
    policy.wait_for(|| match child.try_wait() {
        Ok(None) => false,
        other => {
            seen = Some(other);
            true
        }
    });
    seen.transpose().map(Option::flatten)
}

fn verdict(retryable: bool) -> Verdict {
    if retryable {
        Verdict::Retry
    } else {
        Verdict::GiveUp
    }
}

/// One run's count of failures: the decisions both loops share.
struct Schedule<'p> {
    policy: &'p Policy,
    failures: u32,
    began: Instant,
}

impl<'p> Schedule<'p> {
    fn start(policy: &'p Policy) -> Self {
        Self {
            policy,
            failures: policy.already_failed,
            began: Instant::now(),
        }
    }

    /// The pause before the first try of this run, after a caller's own
    /// failed ones.
    fn first_pause(&self) -> Option<Duration> {
        Some(self.policy.pause(self.failures)).filter(|p| !p.is_zero())
    }

    /// The pause before the next try, or `None` when there is none.
    fn after_failure<E>(
        &mut self,
        error: &E,
        judge: &mut impl FnMut(&E, u32) -> Verdict,
    ) -> Option<Duration> {
        self.failures = self.failures.saturating_add(1);
        let p = self.policy;
        if self.failures >= p.tries || p.within.is_some_and(|w| self.began.elapsed() >= w) {
            return None;
        }
        match judge(error, self.failures - p.already_failed) {
            Verdict::GiveUp => None,
            Verdict::Retry => Some(p.pause(self.failures)),
            Verdict::RetryAfter(wanted) => Some(wanted.min(p.max_pause)),
        }
    }

    fn spent<E>(&self, error: E) -> Spent<E> {
        Spent {
            error,
            tries: self.failures - self.policy.already_failed,
            elapsed: self.began.elapsed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// An operation that fails `fails` times with its try number, then
    /// succeeds; it counts its calls.
    fn flaky(fails: u32, calls: &mut u32) -> impl FnMut() -> Result<u32, u32> + '_ {
        move || {
            *calls += 1;
            if *calls > fails {
                Ok(*calls)
            } else {
                Err(*calls)
            }
        }
    }

    #[test]
    fn a_wait_ends_when_ready_or_when_the_policy_is_spent() {
        let mut asked = 0;
        assert!(Policy::immediate(5).wait_for(|| {
            asked += 1;
            asked == 3
        }));
        assert_eq!(asked, 3);
        let began = Instant::now();
        assert!(!Policy::polling(MS, 20 * MS).wait_for(|| false));
        assert!(began.elapsed() >= 20 * MS);
    }

    #[test]
    fn a_child_is_waited_for_within_the_bound() {
        let mut quick = std::process::Command::new("true").spawn().unwrap();
        let pace = Policy::backoff(u32::MAX, MS, 20 * MS).within(Duration::from_secs(10));
        assert!(wait_child(&mut quick, &pace).unwrap().unwrap().success());
        let mut slow = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let began = Instant::now();
        let pace = Policy::backoff(u32::MAX, MS, 20 * MS).within(50 * MS);
        assert_eq!(wait_child(&mut slow, &pace).unwrap(), None);
        assert!(began.elapsed() < Duration::from_secs(2));
        slow.kill().unwrap();
        slow.wait().unwrap();
    }

    #[test]
    fn tries_at_most_the_policy_and_returns_the_last_error() {
        let mut calls = 0;
        let r = Policy::immediate(4).run(|_| true, flaky(99, &mut calls));
        assert_eq!(r, Err(4));
        assert_eq!(calls, 4);
    }

    #[test]
    fn a_later_success_is_returned() {
        let mut calls = 0;
        let r = Policy::immediate(4).run(|_| true, flaky(3, &mut calls));
        assert_eq!(r, Ok(4));
    }

    #[test]
    fn an_error_not_worth_a_retry_ends_at_once() {
        let mut calls = 0;
        let mut asked = 0;
        let r = Policy::immediate(8).run(
            |e: &u32| {
                asked += 1;
                *e < 2
            },
            flaky(99, &mut calls),
        );
        assert_eq!((r, calls, asked), (Err(2), 2, 2));
        // The last try's error is not judged: there is no retry to decide.
        let mut asked = 0;
        let mut calls = 0;
        let _ = Policy::immediate(3).run(
            |_: &u32| {
                asked += 1;
                true
            },
            flaky(99, &mut calls),
        );
        assert_eq!((calls, asked), (3, 2));
    }

    #[test]
    fn pauses_double_up_to_the_longest() {
        let p = Policy::backoff(9, 25 * MS, 200 * MS);
        let pauses: Vec<u128> = (0..7).map(|n| p.pause(n).as_millis()).collect();
        assert_eq!(pauses, [0, 25, 50, 100, 200, 200, 200]);
        assert_eq!(p.pause(u32::MAX), 200 * MS);
        let big = Policy::backoff(9, Duration::from_secs(2), Duration::from_secs(120));
        assert_eq!(big.pause(u32::MAX), Duration::from_secs(120));
    }

    #[test]
    fn the_pauses_are_taken() {
        let began = Instant::now();
        let mut calls = 0;
        let r = Policy::backoff(4, 10 * MS, 20 * MS).run(|_| true, flaky(99, &mut calls));
        assert_eq!(r, Err(4));
        // 10 + 20 + 20 ms between the four tries.
        assert!(began.elapsed() >= 50 * MS, "{:?}", began.elapsed());
    }

    #[test]
    fn polling_ends_once_its_time_has_passed() {
        let began = Instant::now();
        let mut calls = 0;
        let r = Policy::polling(5 * MS, 40 * MS).run(|_| true, flaky(u32::MAX, &mut calls));
        let took = began.elapsed();
        assert!(r.is_err());
        assert!(took >= 40 * MS && took < 2000 * MS, "{took:?}");
        assert!((2..=9).contains(&calls), "{calls} tries");
    }

    #[test]
    fn a_judge_numbers_the_retries_and_may_set_the_pause() {
        let mut seen = Vec::new();
        let began = Instant::now();
        let mut calls = 0;
        let r = Policy::backoff(4, 1000 * MS, 5 * MS).run_with(flaky(99, &mut calls), |e, n| {
            seen.push((*e, n));
            Verdict::RetryAfter(Duration::from_secs(3600))
        });
        // A server's pause is held to the policy's longest.
        assert!(began.elapsed() < 1000 * MS, "{:?}", began.elapsed());
        assert_eq!(seen, [(1, 1), (2, 2), (3, 3)]);
        let spent = r.err().map(|s| (s.error, s.tries));
        assert_eq!(spent, Some((4, 4)));
    }

    #[test]
    fn a_caller_s_own_failures_count() {
        let began = Instant::now();
        let mut calls = 0;
        let p = Policy::backoff(4, 10 * MS, 40 * MS).after_failures(1);
        let r = p.run(|_| true, flaky(99, &mut calls));
        // Three tries remain, after pauses of 10, 20 and 40 ms.
        assert_eq!((r, calls), (Err(3), 3));
        assert!(began.elapsed() >= 70 * MS, "{:?}", began.elapsed());
    }

    #[test]
    fn the_task_form_follows_the_same_policy() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build();
        let Ok(rt) = rt else {
            panic!("no runtime");
        };
        let calls = std::cell::Cell::new(0u32);
        let op = || {
            calls.set(calls.get() + 1);
            let n = calls.get();
            async move { if n > 2 { Ok(n) } else { Err(n) } }
        };
        let r = rt.block_on(Policy::immediate(5).run_async(|_| true, op));
        assert_eq!(r, Ok(3));
        calls.set(0);
        let r = rt.block_on(Policy::immediate(2).run_async(|_| true, op));
        assert_eq!(r, Err(2));
        calls.set(0);
        let r = rt.block_on(Policy::immediate(5).run_async(|e| *e != 1, op));
        assert_eq!(r, Err(1));
    }
}
