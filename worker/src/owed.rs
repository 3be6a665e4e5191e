//! Owed work, made one way whatever it is: a run's or a group's git push
//! (`git_delivery::owed`), a GitHub report (`github::owed`), a completion
//! callback (`callbacks`). Each is a row owed in the database, with its run's
//! end or a group's choice (`kiln_store`'s `owed.rs` shares their SQL). A
//! worker claims one under a lease; makes attempts while a [`LeaseKeeper`]
//! extends the lease, stopping them the moment it is lost (another worker
//! makes it by then, and two must not post or push at once); settles each
//! attempt into how the row ends and the event that says so; and records
//! both, fenced by the lease, riding out a database blink. Past the lease
//! another worker may make it again: at least once.
//!
//! What differs by kind is an [`Owed`]: how to claim, extend and end its row,
//! what one attempt is, and what it comes to. A kind retries either by ending
//! its row owed again after a backoff (a push: any worker takes it up later)
//! or by asking for another attempt under the same claim ([`Settled::again_in`],
//! a callback), which stopping between attempts hands back.

use std::time::Duration;

use kiln_protocol::EventBody;
use kiln_store::StoreError;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::lease_keeper::{Beat, LeaseKeeper};
use crate::retry::{self, Verdict};

/// One kind of owed work.
pub(crate) trait Owed: Sync {
    /// A claimed row: what to make, and the lease's holder.
    type Claim: Sync;
    /// What one attempt came to.
    type Outcome;
    /// How an attempt ends the row.
    type End: Sync;
    /// What the lease covers, for the logs.
    const WHAT: &'static str;

    /// How long a claim holds without being extended: how long work a dead
    /// worker left waits before another worker takes it over. Extended
    /// every third of it, and given up a third early (the work must stop
    /// before another worker may start it).
    fn lease(&self) -> Duration;
    fn run_id(claim: &Self::Claim) -> Uuid;
    /// Attempts made before this claim (by this worker or a dead one).
    fn attempts_before(_claim: &Self::Claim) -> u32 {
        0
    }
    /// Takes the lease of run `run_id`'s row, or with `None` the
    /// longest-owed one. `None`: nothing owed, or all of it held.
    async fn claim(&self, run_id: Option<Uuid>) -> Result<Option<Self::Claim>, StoreError>;
    /// Extends `claim`'s lease; false once it is no longer `claim`'s.
    async fn extend(&self, claim: &Self::Claim) -> Result<bool, StoreError>;
    /// Attempt number `number` (from 1, earlier claims' counted).
    async fn attempt(&self, claim: &Self::Claim, number: u32) -> Self::Outcome;
    /// What attempt `number` comes to for the row and the run's events.
    fn settle(&self, claim: &Self::Claim, number: u32, outcome: Self::Outcome) -> Settled<Self::End>;
    /// Records `end` and `event`; false, recording nothing, once the lease
    /// is no longer `claim`'s.
    async fn end(&self, claim: &Self::Claim, end: &Self::End, event: &EventBody) -> Result<bool, StoreError>;
    /// Hands `claim` back unsettled, so another worker takes it over at once.
    /// Only a kind that asks for [`Settled::again_in`] is ever stopped between
    /// attempts.
    async fn release(&self, _claim: &Self::Claim) -> Result<(), StoreError> {
        Ok(())
    }
}

/// What an attempt came to: how the row ends, the event that says so, and
/// whether another attempt follows under the same claim.
#[derive(Debug)]
pub(crate) struct Settled<E> {
    pub end: E,
    pub event: EventBody,
    /// Attempt again after this long, still holding the lease (the row's
    /// end said so too).
    pub again_in: Option<Duration>,
}

impl<E> Settled<E> {
    /// Settled with `end` and `event`; no attempt follows under this claim.
    pub fn once(end: E, event: EventBody) -> Self {
        Settled { end, event, again_in: None }
    }
}

/// Makes owed work of `work` until `shutdown`: what is owed now, then again
/// every `poll`.
pub(crate) async fn serve<W: Owed>(work: &W, poll: Duration, shutdown: &CancellationToken) {
    loop {
        while !shutdown.is_cancelled() && make_one(work, None).await {}
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(poll) => {}
        }
    }
}

/// Claims and makes one owed row of `work`: run `run_id`'s, or with `None`
/// the longest-owed one. Whether there was one to claim.
pub(crate) async fn make_one<W: Owed>(work: &W, run_id: Option<Uuid>) -> bool {
    match work.claim(run_id).await {
        Ok(Some(claim)) => {
            make(work, &claim, None).await;
            true
        }
        Ok(None) => false,
        Err(e) => {
            tracing::warn!(?run_id, work = W::WHAT, error = %e, "claiming owed work failed");
            false
        }
    }
}

/// Makes `claim`: attempts under its lease, each settled and recorded,
/// until one settles the row, the lease is lost, or `shutdown` comes
/// between two attempts (the claim is handed back).
pub(crate) async fn make<W: Owed>(work: &W, claim: &W::Claim, shutdown: Option<&CancellationToken>) {
    // An attempt stops (git's children are killed on drop, a request is
    // dropped) as soon as the lease is lost: another worker makes it by then.
    tokio::select! {
        () = attempts(work, claim, shutdown) => {}
        () = keep_lease(work, claim) => {
            tracing::warn!(run_id = %W::run_id(claim), work = W::WHAT, "lost owed work's lease; another worker makes it");
        }
    }
}

async fn attempts<W: Owed>(work: &W, claim: &W::Claim, shutdown: Option<&CancellationToken>) {
    let mut number = W::attempts_before(claim);
    loop {
        number = number.saturating_add(1);
        let outcome = work.attempt(claim, number).await;
        let settled = work.settle(claim, number, outcome);
        if !record(work, claim, &settled).await {
            return;
        }
        let Some(wait) = settled.again_in else { return };
        let stopping = async {
            match shutdown {
                Some(shutdown) => shutdown.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stopping => {
                if let Err(e) = work.release(claim).await {
                    let run_id = W::run_id(claim);
                    tracing::warn!(%run_id, work = W::WHAT, error = %e, "handing back owed work failed; its lease will run out");
                }
                return;
            }
        }
    }
}

/// Records an attempt, retrying while the database blinks. False: stop (the
/// lease is gone, or the record could not be made).
async fn record<W: Owed>(work: &W, claim: &W::Claim, settled: &Settled<W::End>) -> bool {
    let run_id = W::run_id(claim);
    let recorded = retry::retry(
        &retry::DATABASE,
        || work.end(claim, &settled.end, &settled.event),
        |_| Verdict::Retry,
        |e, attempt, _| tracing::warn!(%run_id, work = W::WHAT, error = %e, attempt, "recording owed work failed"),
    )
    .await;
    match recorded {
        Ok(true) => true,
        Ok(false) => {
            tracing::warn!(%run_id, work = W::WHAT, "owed work's lease ran out before its attempt was recorded");
            false
        }
        Err(e) => {
            tracing::warn!(%run_id, work = W::WHAT, error = %e, "recording owed work failed; giving up");
            false
        }
    }
}

/// Extends `claim`'s lease; returns once it is lost: taken over, or about to
/// run out because the database has not answered (given up a third early).
async fn keep_lease<W: Owed>(work: &W, claim: &W::Claim) {
    let lease = work.lease();
    LeaseKeeper::new(W::WHAT, W::run_id(claim), lease)
        .giving_up_early(lease / 3)
        .keep(|| async { work.extend(claim).await.map(Beat::extended_if) })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Owed work that logs what is done to it; attempt `n` asks for the
    /// `n`-th of `again` (none past its end).
    struct Fake {
        before: u32,
        again: Vec<Option<Duration>>,
        hang: bool,
        extends: bool,
        records: bool,
        log: Mutex<Vec<String>>,
    }

    impl Fake {
        fn new(before: u32, again: Vec<Option<Duration>>) -> Self {
            Fake { before, again, hang: false, extends: true, records: true, log: Mutex::new(Vec::new()) }
        }

        fn note(&self, what: String) {
            self.log.lock().unwrap_or_else(|e| e.into_inner()).push(what);
        }

        fn log(&self) -> Vec<String> {
            self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
        }
    }

    impl Owed for Fake {
        type Claim = u32;
        type Outcome = u32;
        type End = u32;
        const WHAT: &'static str = "test";

        fn lease(&self) -> Duration {
            Duration::from_secs(30)
        }
        fn run_id(_claim: &u32) -> Uuid {
            Uuid::nil()
        }
        fn attempts_before(claim: &u32) -> u32 {
            *claim
        }
        async fn claim(&self, _run_id: Option<Uuid>) -> Result<Option<u32>, StoreError> {
            Ok(Some(self.before))
        }
        async fn extend(&self, _claim: &u32) -> Result<bool, StoreError> {
            self.note("extend".into());
            Ok(self.extends)
        }
        async fn attempt(&self, _claim: &u32, number: u32) -> u32 {
            self.note(format!("attempt {number}"));
            if self.hang {
                std::future::pending::<()>().await;
            }
            number
        }
        fn settle(&self, _claim: &u32, number: u32, outcome: u32) -> Settled<u32> {
            let index = usize::try_from(number - self.before - 1).unwrap_or(usize::MAX);
            let again_in = self.again.get(index).copied().flatten();
            Settled { end: outcome, event: EventBody::DeliveryFailed { error: number.to_string() }, again_in }
        }
        async fn end(&self, _claim: &u32, end: &u32, _event: &EventBody) -> Result<bool, StoreError> {
            self.note(format!("end {end}"));
            Ok(self.records)
        }
        async fn release(&self, _claim: &u32) -> Result<(), StoreError> {
            self.note("release".into());
            Ok(())
        }
    }

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_go_on_under_one_claim_while_asked_numbered_after_earlier_ones() {
        let fake = Fake::new(2, vec![Some(Duration::from_secs(1)), Some(Duration::from_secs(1)), None]);
        assert!(make_one(&fake, None).await);
        assert_eq!(fake.log(), strings(&["attempt 3", "end 3", "attempt 4", "end 4", "attempt 5", "end 5"]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_lease_stops_the_attempt_and_nothing_is_recorded() {
        let fake = Fake { hang: true, extends: false, ..Fake::new(0, vec![None]) };
        let started = tokio::time::Instant::now();
        make(&fake, &0, None).await;
        assert_eq!(fake.log(), strings(&["attempt 1", "extend"]));
        assert_eq!(started.elapsed(), Duration::from_secs(10), "lost at the first beat");
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_record_stops_the_attempts() {
        let fake = Fake { records: false, ..Fake::new(0, vec![Some(Duration::from_secs(1)); 3]) };
        make(&fake, &0, None).await;
        assert_eq!(fake.log(), strings(&["attempt 1", "end 1"]));
    }

    #[tokio::test(start_paused = true)]
    async fn stopping_between_attempts_hands_the_claim_back() {
        let fake = Fake::new(0, vec![Some(Duration::from_secs(60)); 3]);
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            stop.cancel();
        });
        make(&fake, &0, Some(&shutdown)).await;
        let log: Vec<String> = fake.log().into_iter().filter(|l| l != "extend").collect();
        assert_eq!(log, strings(&["attempt 1", "end 1", "release"]));
    }
}
