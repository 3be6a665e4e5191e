//! Completion callbacks owed by ended runs (`run_callbacks`, see
//! `migrations/V8__callbacks.sql`).
//!
//! Nothing here talks HTTP. A run with a `callback_url` that ends owes a
//! callback (a row, inserted by a trigger in the transaction that ends it,
//! whoever ends it); a worker claims an owed callback under a lease it keeps
//! extending, records every attempt (an event, and the attempt count) fenced
//! by that lease, and settles the row when the receiver answered with a 2xx
//! or it gives up. A callback a dead worker left is taken over once its lease
//! runs out, never while a live worker holds it, so two workers never call
//! the same receiver at once.

use std::time::Duration;

use kiln_protocol::{EventBody, Run};
use uuid::Uuid;

use crate::owed::{Claimed, OwedTable};
use crate::{Store, StoreError};

/// Everything a worker needs to deliver one callback.
#[derive(Debug, Clone)]
pub struct CallbackJob {
    /// The run as it ended.
    pub run: Run,
    /// The subject owning the run, whose callback key signs the callback.
    pub owner: String,
    pub url: String,
    /// Sent on every attempt, so the receiver can drop repeats.
    pub delivery_id: Uuid,
    /// Attempts already made (by this worker or a dead one).
    pub attempts: u32,
    /// This claim's hold on the callback (fences extending and recording).
    pub holder: Uuid,
}

/// What an attempt came to, for the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallbackAttempt {
    /// Answered with a 2xx: settled.
    Delivered,
    /// Failed; another attempt follows.
    WillRetry,
    /// Failed for good: settled, not delivered.
    GaveUp,
}

/// `run_callbacks` as owed work: owed until settled. A holder keeps its
/// lease through the backoff between attempts, and extends or records only
/// while the callback is unsettled.
const CALLBACKS: OwedTable = OwedTable {
    table: "run_callbacks",
    holder: "holder",
    until: "lease_until",
    fence: " AND settled_at IS NULL",
    claim_sets: "",
    join: "",
    owed: "o.settled_at IS NULL",
    since: "owed_since",
    lock: "o",
    returning: ", d.url, d.delivery_id, d.attempts, (SELECT r.owner FROM runs r WHERE r.id = d.run_id)",
    what: "callback",
};

impl Store {
    /// Takes the lease of an owed callback whose lease is free or has run
    /// out, longest-owed first. `None`: nothing owed, or all of it held.
    pub async fn claim_callback(&self, lease: Duration) -> Result<Option<CallbackJob>, StoreError> {
        self.claim_callback_of(None, lease).await
    }

    /// [`Store::claim_callback`], of run `run_id` alone when it is `Some`.
    pub async fn claim_callback_of(
        &self,
        run_id: Option<Uuid>,
        lease: Duration,
    ) -> Result<Option<CallbackJob>, StoreError> {
        let Some(Claimed { mut run, holder, row }) = self.claim_owed(&CALLBACKS, run_id, lease).await? else {
            return Ok(None);
        };
        let run_id = run.id;
        let attempts: i32 = row.try_get(3)?;
        let owner: Option<String> = row.try_get(4)?;
        let owner =
            owner.ok_or_else(|| StoreError::Corrupt(format!("run {run_id} vanished while its callback was owed")))?;
        // The run as the API shows it: with its change's totals.
        run.changes = self.change_totals(&[run_id]).await?.get(&run_id).copied();
        Ok(Some(CallbackJob {
            run,
            owner,
            url: row.try_get(1)?,
            delivery_id: row.try_get(2)?,
            attempts: u32::try_from(attempts).unwrap_or(0),
            holder,
        }))
    }

    /// Extends `job`'s lease; false when it is no longer `job`'s (it ran out
    /// and another worker took the callback over).
    pub async fn extend_callback(&self, job: &CallbackJob, lease: Duration) -> Result<bool, StoreError> {
        self.extend_owed(&CALLBACKS, job.run.id, job.holder, lease).await
    }

    /// Records one attempt of `job`'s callback: counts it, appends `event`
    /// (a `callback.*` event) to the run, and settles the callback unless
    /// another attempt follows (which releases nothing: the holder keeps the
    /// lease through its backoff). False, recording nothing, when the lease
    /// is no longer `job`'s.
    pub async fn record_callback_attempt(
        &self,
        job: &CallbackJob,
        outcome: CallbackAttempt,
        event: &EventBody,
    ) -> Result<bool, StoreError> {
        let settled = outcome != CallbackAttempt::WillRetry;
        let delivered = outcome == CallbackAttempt::Delivered;
        let seq = self
            .end_owed(
                &CALLBACKS,
                (job.run.id, job.holder),
                "attempts = attempts + 1,
                 settled_at = CASE WHEN $3 THEN now() END,
                 delivered = $4,
                 holder = CASE WHEN $3 THEN NULL ELSE holder END,
                 lease_until = CASE WHEN $3 THEN NULL ELSE lease_until END",
                &[&settled, &delivered],
                event,
            )
            .await?;
        Ok(seq.is_some())
    }

    /// Hands `job`'s callback back unsettled (the worker is stopping), so
    /// another worker takes it over at once instead of after the lease.
    pub async fn release_callback(&self, job: &CallbackJob) -> Result<(), StoreError> {
        self.release_owed(&CALLBACKS, job.run.id, job.holder).await
    }
}
