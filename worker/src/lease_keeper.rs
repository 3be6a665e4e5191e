//! Keeping a lease alive while its work goes on: a run, an owed GitHub
//! delivery, a completion callback. Each is claimed for a while and must be
//! extended before that while is over, or another worker takes it over.
//!
//! The rules, in one place: a beat every third of the lease; a beat that gets
//! no answer within that third counts as failed (a connection gone silent
//! must not hide the lease's end); the lease is reckoned to end a lease's
//! length after the last good beat was *sent* (the database's `now()` came
//! after that), less a margin for work that must stop before another worker
//! may start; and a beat answered "not yours any more" ends it at once.

use std::future::Future;
use std::time::Duration;

use kiln_store::StoreError;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// What one beat heard back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// The lease was extended.
    Extended,
    /// The lease was extended, and a client asked to cancel the run.
    CancelRequested,
    /// Someone else holds the lease now, or what it covered has ended.
    Lost,
}

/// Keeps one lease. [`LeaseKeeper::keep`] returns once the lease is lost.
#[derive(Debug, Clone)]
pub struct LeaseKeeper {
    /// What the lease covers, for the logs.
    what: &'static str,
    run_id: Uuid,
    /// How long one beat extends the lease.
    length: Duration,
    /// How long before the reckoned end to give the lease up.
    margin: Duration,
    /// Told when a beat hears of a cancel request (runs only).
    cancel: Option<CancellationToken>,
}

impl Beat {
    /// What an extension that reports whether it matched a lease heard.
    pub fn extended_if(matched: bool) -> Self {
        if matched { Beat::Extended } else { Beat::Lost }
    }
}

impl LeaseKeeper {
    /// Keeps a lease of `length` on `what` of run `run_id`, up to its end.
    pub fn new(what: &'static str, run_id: Uuid, length: Duration) -> Self {
        LeaseKeeper { what, run_id, length, margin: Duration::ZERO, cancel: None }
    }

    /// Gives the lease up `margin` before it would run out: for work whose
    /// effects no fencing stops (a POST to GitHub or a callback receiver),
    /// which must be over before another worker can begin it again.
    pub fn giving_up_early(self, margin: Duration) -> Self {
        LeaseKeeper { margin, ..self }
    }

    /// Cancels `cancel` when a beat hears that a client asked to cancel.
    pub fn reporting_cancel(self, cancel: CancellationToken) -> Self {
        LeaseKeeper { cancel: Some(cancel), ..self }
    }

    /// Beats with `beat` every third of the lease; returns once the lease is
    /// lost: a beat answered [`Beat::Lost`], or no beat succeeded for the
    /// lease's length (less the margin) since the last good one was sent.
    pub async fn keep<F, Fut>(&self, mut beat: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Beat, StoreError>>,
    {
        let interval = self.length / 3;
        let give_up_after = self.length.saturating_sub(self.margin);
        let mut tick = tokio::time::interval(interval);
        tick.tick().await;
        let mut last_good = Instant::now();
        loop {
            tick.tick().await;
            let sent = Instant::now();
            let answer = tokio::time::timeout(interval, beat())
                .await
                .unwrap_or_else(|_| Err(StoreError::Unavailable("the beat got no answer in time".into())));
            match answer {
                Ok(Beat::Lost) => return,
                Ok(heard) => {
                    last_good = sent;
                    if heard == Beat::CancelRequested
                        && let Some(cancel) = &self.cancel
                    {
                        cancel.cancel();
                    }
                }
                Err(e) => {
                    tracing::warn!(run_id = %self.run_id, lease = self.what, error = %e, "extending a lease failed");
                    if last_good.elapsed() >= give_up_after {
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    const LEASE: Duration = Duration::from_secs(30);

    fn keeper() -> LeaseKeeper {
        LeaseKeeper::new("test", Uuid::nil(), LEASE)
    }

    /// Keeps the lease with `answers` (one per beat, then `Lost`), each
    /// answered after its delay; returns when it was given up, from the
    /// start, and the times the beats were sent.
    async fn keep(keeper: LeaseKeeper, answers: Vec<(Duration, Result<Beat, ()>)>) -> (Duration, Vec<Duration>) {
        let start = Instant::now();
        let sent = Mutex::new(Vec::new());
        let answers = Mutex::new(answers.into_iter());
        keeper
            .keep(|| {
                let mut sent = sent.lock().unwrap_or_else(|e| e.into_inner());
                sent.push(start.elapsed());
                let next = answers.lock().unwrap_or_else(|e| e.into_inner()).next();
                async move {
                    let (delay, answer) = next.unwrap_or((Duration::ZERO, Ok(Beat::Lost)));
                    tokio::time::sleep(delay).await;
                    answer.map_err(|()| StoreError::Unavailable("down".into()))
                }
            })
            .await;
        (start.elapsed(), sent.into_inner().unwrap_or_default())
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[tokio::test(start_paused = true)]
    async fn a_beat_that_hangs_counts_as_failed() {
        let hang = (Duration::MAX, Ok(Beat::Extended));
        let (lost_at, sent) = keep(keeper(), vec![hang; 10]).await;
        assert_eq!(lost_at, LEASE, "beats sent at {sent:?}");
        // Work that must stop early hears of it a margin before.
        let (lost_at, _) = keep(keeper().giving_up_early(LEASE / 3), vec![hang; 10]).await;
        assert_eq!(lost_at, LEASE / 3 * 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_lease_is_lost_a_lease_after_the_last_good_beat_was_sent() {
        // The good beat is sent at 10 s and answered at 15 s; the lease is
        // reckoned from 10 s, so it is lost at the beat of 40 s.
        let slow_good = (secs(5), Ok(Beat::Extended));
        let failing = (Duration::ZERO, Err(()));
        let (lost_at, sent) = keep(keeper(), vec![slow_good, failing, failing, failing, failing]).await;
        assert_eq!(sent, [secs(10), secs(20), secs(30), secs(40)]);
        assert_eq!(lost_at, secs(40));
    }

    #[tokio::test(start_paused = true)]
    async fn a_beat_answered_lost_stops_at_once() {
        let (lost_at, sent) = keep(keeper(), vec![(Duration::ZERO, Ok(Beat::Lost))]).await;
        assert_eq!((lost_at, sent), (secs(10), vec![secs(10)]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancel_request_is_reported_and_the_lease_kept() {
        let cancel = CancellationToken::new();
        let answers = vec![(Duration::ZERO, Ok(Beat::Extended)), (Duration::ZERO, Ok(Beat::CancelRequested))];
        let (lost_at, _) = keep(keeper().reporting_cancel(cancel.clone()), answers).await;
        assert!(cancel.is_cancelled());
        assert_eq!(lost_at, secs(30), "kept until the third beat heard it was lost");
    }
}
