//! Owed `deliver.git` pushes (`git_deliveries`, see
//! `migrations/V24__group_delivery_and_base.sql` and
//! `V25__git_deliveries_owed_and_retried.sql`): one claim, one lease and
//! one record for a single run's push and a group's.
//!
//! Nothing here talks git. A single run that asked for `deliver.git` owes
//! its push with its end (a trigger, in the transaction that ends it); a
//! group owes its push with each choice (`attempts::delivery`). A worker
//! claims an owed push once its run has ended, under a lease it keeps
//! extending; records each attempt's outcome (an event, fenced by the
//! lease); and settles the row — pushed, or given up — or owes it again
//! after a backoff. A push a dead worker left is taken over once its lease
//! runs out, never while a live worker holds it.

use std::time::Duration;

use kiln_protocol::{EventBody, Run};
use uuid::Uuid;

use crate::owed::{Claimed, OwedTable};
use crate::{Store, StoreError};

/// A claimed push: the run (or group; its change is the chosen
/// attempt's), the attempts made before this one, and the claim's holder,
/// which extending and recording check.
#[derive(Debug, Clone)]
pub struct GitDeliveryClaim {
    pub run: Run,
    /// Attempts already made (by this worker or a dead one).
    pub attempts: u32,
    pub holder: Uuid,
}

/// What an attempt came to, for the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GitDeliveryEnd {
    /// Pushed: settled.
    Delivered,
    /// Failed for a reason that may pass: owed again after this long.
    RetryIn(Duration),
    /// Failed for good, or too often: settled, not delivered (a group's is
    /// owed again by its next choice).
    GaveUp,
}

/// `git_deliveries` as owed work: owed once its run has ended and its
/// backoff has passed. The claim locks the run's row too (skipping a group
/// while a choice is being made), so a choice either lands before the claim
/// or is refused after it.
const GIT_DELIVERIES: OwedTable = OwedTable {
    table: "git_deliveries",
    holder: "holder",
    until: "claimed_until",
    fence: "",
    claim_sets: "",
    join: " JOIN runs r ON r.id = o.run_id",
    owed: "o.owed AND o.delivered_at IS NULL AND (o.not_before IS NULL OR o.not_before <= now())
           AND r.status IN ('succeeded', 'failed', 'cancelled', 'timed_out')",
    since: "owed_since",
    lock: "o, r",
    returning: ", d.attempts",
    what: "git delivery",
};

impl Store {
    /// Takes the lease of an owed push whose run has ended, whose lease is
    /// free or has run out and whose backoff has passed: run `run_id`'s, or
    /// with `None` the longest-owed one. `None`: nothing to do.
    pub async fn claim_git_delivery(
        &self,
        run_id: Option<Uuid>,
        lease: Duration,
    ) -> Result<Option<GitDeliveryClaim>, StoreError> {
        let Some(Claimed { run, holder, row }) = self.claim_owed(&GIT_DELIVERIES, run_id, lease).await? else {
            return Ok(None);
        };
        let attempts = u32::try_from(row.try_get::<_, i32>(1)?).unwrap_or(0);
        Ok(Some(GitDeliveryClaim { run, attempts, holder }))
    }

    /// Extends `claim`'s lease; false when it is no longer `claim`'s (it
    /// ran out and another worker took the push over).
    pub async fn extend_git_delivery(&self, claim: &GitDeliveryClaim, lease: Duration) -> Result<bool, StoreError> {
        self.extend_owed(&GIT_DELIVERIES, claim.run.id, claim.holder, lease).await
    }

    /// Records how `claim`'s attempt went (`event`, after the run's
    /// terminal one), counts it, and releases the claim: settled, or owed
    /// again after a backoff (`end`). False when the claim was no longer
    /// `claim`'s: nothing is recorded.
    pub async fn end_git_delivery(
        &self,
        claim: &GitDeliveryClaim,
        end: GitDeliveryEnd,
        event: &EventBody,
    ) -> Result<bool, StoreError> {
        let (owed, retry_in) = match end {
            GitDeliveryEnd::RetryIn(wait) => (true, Some(wait.as_secs_f64())),
            GitDeliveryEnd::Delivered | GitDeliveryEnd::GaveUp => (false, None),
        };
        let delivered = end == GitDeliveryEnd::Delivered;
        let seq = self
            .end_owed(
                &GIT_DELIVERIES,
                (claim.run.id, claim.holder),
                "holder = NULL, claimed_until = NULL, attempts = attempts + 1, owed = $3,
                 not_before = now() + make_interval(secs => $4::float8),
                 delivered_at = CASE WHEN $5 THEN now() END",
                &[&owed, &retry_in, &delivered],
                event,
            )
            .await?;
        let Some(seq) = seq else { return Ok(false) };
        self.announce_event(claim.run.id, seq);
        Ok(true)
    }
}
