//! One retry policy for everything the worker retries: model calls, GitHub
//! calls, completion callbacks and database writes.
//!
//! The wait after the n-th failed attempt is `base · 2^(n-1)`, capped at
//! `max_delay`, scaled by a random factor between ½ and 1 (callers that
//! failed together, such as many runs hitting one rate limit or one database
//! restart, do not come back together), and never shorter than what the
//! other side asked for (`Retry-After`), up to a bound. A policy stops after
//! a number of attempts or once its patience is spent.
//!
//! Most callers hand an operation to [`retry`]. A caller that must do async
//! work between attempts with the state the operation also borrows (the model
//! call emits `model.retry` through the event sink it streams into; a
//! callback records each attempt and hands the job back on shutdown) drives
//! a [`Schedule`] itself: the waits are the same.
//!
//! Not `backon`: its jitter lengthens waits (up to double) rather than
//! spreading them under the cap, its hooks between attempts are synchronous,
//! and its operations cannot borrow what the hook borrows.

use std::future::Future;
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

/// How to retry one kind of operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Wait after the first failed attempt; doubled after each further one.
    base: Duration,
    /// Longest wait the doubling reaches.
    max_delay: Duration,
    /// When to stop trying.
    bound: Bound,
    /// How much of a wait the other side asks for is honoured.
    retry_after: RetryAfter,
}

/// When a policy stops trying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bound {
    /// Attempts in all, the first included.
    Attempts(u32),
    /// Keeps retrying while less than this has passed since the first
    /// attempt began (a database restart takes however long it takes).
    Patience(Duration),
}

/// What to do when the other side names its own wait (`Retry-After`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryAfter {
    /// Wait what was asked, but at most this long, then try anyway.
    Capped(Duration),
    /// Wait what was asked; asked for longer than this, give up rather than
    /// hold a worker's slot (a GitHub rate limit may last an hour).
    GiveUpOver(Duration),
}

/// What a failed attempt says about trying again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Retrying cannot help.
    GiveUp,
    /// Try again after the backoff.
    Retry,
    /// Try again, not before this long (the other side's `Retry-After`).
    RetryAfter(Duration),
}

impl Verdict {
    /// [`Verdict::Retry`] when `retryable`, else [`Verdict::GiveUp`].
    pub fn retry_if(retryable: bool) -> Self {
        if retryable { Verdict::Retry } else { Verdict::GiveUp }
    }
}

/// A database the worker cannot do without, on its way back (a restart, a
/// failover): ridden out for as long as a lease lasts. Longer would be
/// pointless: past the lease another worker may take the run over anyway.
pub const DATABASE: Policy =
    Policy::within(Duration::from_secs(30), Duration::from_millis(100), Duration::from_secs(2));

impl Policy {
    /// At most `attempts` attempts, the first included, waiting `base`,
    /// doubled each time up to `max_delay`; a `Retry-After` is honoured up
    /// to twice `max_delay`.
    pub const fn attempts(attempts: u32, base: Duration, max_delay: Duration) -> Self {
        Policy {
            base,
            max_delay,
            bound: Bound::Attempts(attempts),
            retry_after: RetryAfter::Capped(max_delay.saturating_mul(2)),
        }
    }

    /// Retries for `patience`, waiting `base`, doubled each time up to
    /// `max_delay`.
    pub const fn within(patience: Duration, base: Duration, max_delay: Duration) -> Self {
        Policy {
            base,
            max_delay,
            bound: Bound::Patience(patience),
            retry_after: RetryAfter::Capped(max_delay.saturating_mul(2)),
        }
    }

    /// The same, with `retry_after` deciding how a `Retry-After` is honoured.
    pub const fn honouring(self, retry_after: RetryAfter) -> Self {
        Policy { retry_after, ..self }
    }

    /// The schedule of a new operation.
    pub fn schedule(&self) -> Schedule {
        self.schedule_after(0)
    }

    /// The schedule of an operation of which `failed` attempts were already
    /// made elsewhere (a callback another worker started): the bound and the
    /// backoff go on from there.
    pub fn schedule_after(&self, failed: u32) -> Schedule {
        Schedule { policy: *self, failed, started: Instant::now() }
    }

    /// The wait after failed attempt number `attempt` (from 1), with a
    /// random factor. `None`: asked to wait too long.
    pub fn backoff(&self, attempt: u32, retry_after: Option<Duration>) -> Option<Duration> {
        self.delay(attempt, retry_after, rand::rng().random_range(0.5..=1.0))
    }

    /// The wait after failed attempt number `attempt` (from 1), with the
    /// random factor given (½ to 1). `None`: asked to wait too long.
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>, jitter: f64) -> Option<Duration> {
        let doubling = 1u32 << attempt.saturating_sub(1).min(20);
        let backoff = self.base.saturating_mul(doubling).min(self.max_delay).mul_f64(jitter.clamp(0.0, 1.0));
        let Some(asked) = retry_after else { return Some(backoff) };
        let asked = match self.retry_after {
            RetryAfter::Capped(cap) => asked.min(cap),
            RetryAfter::GiveUpOver(cap) if asked > cap => return None,
            RetryAfter::GiveUpOver(_) => asked,
        };
        Some(backoff.max(asked))
    }
}

/// Where one operation is in its policy: how many attempts failed, and
/// since when it has been trying.
#[derive(Debug, Clone)]
pub struct Schedule {
    policy: Policy,
    failed: u32,
    started: Instant,
}

impl Schedule {
    /// The number of the attempt being made, from 1.
    pub fn attempt(&self) -> u32 {
        self.failed + 1
    }

    /// Notes that the current attempt failed in a way that may be retried;
    /// returns how long to wait before the next, or `None` once the policy
    /// is spent (or the other side asked for too long a wait).
    pub fn next_delay(&mut self, retry_after: Option<Duration>) -> Option<Duration> {
        self.failed += 1;
        let spent = match self.policy.bound {
            Bound::Attempts(attempts) => self.failed >= attempts,
            Bound::Patience(patience) => self.started.elapsed() >= patience,
        };
        if spent {
            return None;
        }
        self.policy.backoff(self.failed, retry_after)
    }

    /// The wait after a failure judged `verdict`, or `None` to give up.
    pub fn after(&mut self, verdict: Verdict) -> Option<Duration> {
        match verdict {
            Verdict::GiveUp => None,
            Verdict::Retry => self.next_delay(None),
            Verdict::RetryAfter(asked) => self.next_delay(Some(asked)),
        }
    }
}

/// Runs `op` until it succeeds, `judge` gives its error up, or `policy` is
/// spent; returns the last result. `on_retry` hears each error that will be
/// retried, with the failed attempt's number and the wait (to log it).
pub async fn retry<T, E, F, Fut>(
    policy: &Policy,
    mut op: F,
    judge: impl Fn(&E) -> Verdict,
    mut on_retry: impl FnMut(&E, u32, Duration),
) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut schedule = policy.schedule();
    loop {
        let attempt = schedule.attempt();
        match op().await {
            Ok(value) => return Ok(value),
            Err(e) => match schedule.after(judge(&e)) {
                Some(delay) => {
                    on_retry(&e, attempt, delay);
                    tokio::time::sleep(delay).await;
                }
                None => return Err(e),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    const POLICY: Policy = Policy::attempts(4, Duration::from_secs(1), Duration::from_secs(8));

    #[test]
    fn the_wait_doubles_up_to_the_cap_and_jitter_shortens_it() {
        assert_eq!(POLICY.delay(1, None, 1.0), Some(Duration::from_secs(1)));
        assert_eq!(POLICY.delay(3, None, 1.0), Some(Duration::from_secs(4)));
        assert_eq!(POLICY.delay(3, None, 0.5), Some(Duration::from_secs(2)));
        assert_eq!(POLICY.delay(60, None, 1.0), Some(Duration::from_secs(8)));
        assert_eq!(POLICY.delay(1, None, 7.0), Some(Duration::from_secs(1)));
    }

    #[test]
    fn retry_after_is_a_floor_up_to_its_bound() {
        assert_eq!(POLICY.delay(1, Some(Duration::from_secs(5)), 1.0), Some(Duration::from_secs(5)));
        assert_eq!(POLICY.delay(3, Some(Duration::from_millis(1)), 1.0), Some(Duration::from_secs(4)));
        assert_eq!(POLICY.delay(1, Some(Duration::from_secs(3600)), 1.0), Some(Duration::from_secs(16)));
        let strict = POLICY.honouring(RetryAfter::GiveUpOver(Duration::from_secs(60)));
        assert_eq!(strict.delay(1, Some(Duration::from_secs(60)), 1.0), Some(Duration::from_secs(60)));
        assert_eq!(strict.delay(1, Some(Duration::from_secs(61)), 1.0), None);
    }

    #[test]
    fn attempts_bound_the_schedule_also_when_resumed() {
        let mut schedule = POLICY.schedule();
        assert_eq!(schedule.attempt(), 1);
        let waits: Vec<_> = std::iter::from_fn(|| schedule.next_delay(None)).collect();
        assert_eq!(waits.len(), 3, "four attempts: three waits");
        assert!(waits[2] >= Duration::from_secs(2) && waits[2] <= Duration::from_secs(4), "{waits:?}");
        let mut resumed = POLICY.schedule_after(3);
        assert_eq!(resumed.attempt(), 4);
        assert_eq!(resumed.next_delay(None), None);
        assert_eq!(POLICY.schedule().after(Verdict::GiveUp), None);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_stops_at_success_at_a_final_error_and_when_spent() {
        let calls = AtomicU32::new(0);
        let mut heard = Vec::new();
        let ok = retry(
            &POLICY,
            || async { if calls.fetch_add(1, Ordering::SeqCst) < 2 { Err("busy") } else { Ok(7) } },
            |_| Verdict::Retry,
            |e, attempt, _| heard.push((*e, attempt)),
        )
        .await;
        assert_eq!(ok, Ok(7));
        assert_eq!(heard, [("busy", 1), ("busy", 2)]);

        let calls = AtomicU32::new(0);
        let counted = || async { Err::<(), _>(calls.fetch_add(1, Ordering::SeqCst)) };
        let err = retry(&POLICY, counted, |_| Verdict::Retry, |_, _, _| {}).await;
        assert_eq!(err, Err(3), "the fourth attempt's error");
        let err = retry(&POLICY, || async { Err::<(), _>("bad") }, |_| Verdict::GiveUp, |_, _, _| {}).await;
        assert_eq!(err, Err("bad"));
    }

    #[tokio::test(start_paused = true)]
    async fn patience_counts_the_time_since_the_first_attempt() {
        let started = Instant::now();
        let calls = AtomicU32::new(0);
        let err = retry(
            &DATABASE,
            || async {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(1)).await;
                Err::<(), _>("down")
            },
            |_| Verdict::Retry,
            |_, _, _| {},
        )
        .await;
        assert_eq!(err, Err("down"));
        let took = started.elapsed();
        assert!(took >= Duration::from_secs(30) && took < Duration::from_secs(34), "{took:?}");
        assert!(calls.load(Ordering::SeqCst) < 30);
    }
}
