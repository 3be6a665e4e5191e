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

use crate::events::insert_event_tx;
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

impl Store {
    /// Takes the lease of an owed push whose run has ended, whose lease is
    /// free or has run out and whose backoff has passed: run `run_id`'s, or
    /// with `None` the longest-owed one. Locks the run's row too (skipping
    /// a group while a choice is being made), so a choice either lands
    /// before the claim or is refused after it. `None`: nothing to do.
    pub async fn claim_git_delivery(
        &self,
        run_id: Option<Uuid>,
        lease: Duration,
    ) -> Result<Option<GitDeliveryClaim>, StoreError> {
        let holder = Uuid::new_v4();
        let client = self.client().await?;
        // SKIP LOCKED: two workers claiming at once never get the same row.
        let row = client
            .query_opt(
                "UPDATE git_deliveries d
                 SET holder = $1, claimed_until = now() + make_interval(secs => $2)
                 WHERE d.run_id = (
                     SELECT o.run_id FROM git_deliveries o JOIN runs r ON r.id = o.run_id
                     WHERE o.owed AND o.delivered_at IS NULL
                       AND (o.claimed_until IS NULL OR o.claimed_until < now())
                       AND (o.not_before IS NULL OR o.not_before <= now())
                       AND r.status IN ('succeeded', 'failed', 'cancelled', 'timed_out')
                       AND ($3::uuid IS NULL OR o.run_id = $3)
                     ORDER BY o.owed_since
                     LIMIT 1
                     FOR UPDATE OF o, r SKIP LOCKED)
                 RETURNING d.run_id, d.attempts",
                &[&holder, &lease.as_secs_f64(), &run_id],
            )
            .await?;
        let Some(row) = row else { return Ok(None) };
        drop(client);
        let run_id: Uuid = row.try_get(0)?;
        let attempts = u32::try_from(row.try_get::<_, i32>(1)?).unwrap_or(0);
        let run = self
            .get_run_unscoped(run_id)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("run {run_id} vanished during its git delivery")))?;
        Ok(Some(GitDeliveryClaim { run, attempts, holder }))
    }

    /// Extends `claim`'s lease; false when it is no longer `claim`'s (it
    /// ran out and another worker took the push over).
    pub async fn extend_git_delivery(&self, claim: &GitDeliveryClaim, lease: Duration) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let n = client
            .execute(
                "UPDATE git_deliveries SET claimed_until = now() + make_interval(secs => $3)
                 WHERE run_id = $1 AND holder = $2",
                &[&claim.run.id, &claim.holder, &lease.as_secs_f64()],
            )
            .await?;
        Ok(n == 1)
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
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let ours = tx
            .execute(
                "UPDATE git_deliveries
                 SET holder = NULL, claimed_until = NULL, attempts = attempts + 1, owed = $3,
                     not_before = now() + make_interval(secs => $4::float8),
                     delivered_at = CASE WHEN $5 THEN now() END
                 WHERE run_id = $1 AND holder = $2",
                &[&claim.run.id, &claim.holder, &owed, &retry_in, &delivered],
            )
            .await?;
        if ours == 0 {
            return Ok(false);
        }
        let seq = insert_event_tx(&tx, claim.run.id, event).await?;
        tx.commit().await?;
        drop(client);
        self.announce_event(claim.run.id, seq);
        Ok(true)
    }
}
