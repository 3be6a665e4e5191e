//! A group's `deliver.git` (issue 29): the chosen attempt's change is
//! pushed by a worker after the choice (the API that takes the choice has
//! no git credentials). Each choice owes the push again; a worker claims it
//! once the group has ended, with a lease; from the claim on, the choice
//! stands (see `migrations/V24__group_delivery_and_base.sql`).

use std::time::Duration;

use kiln_protocol::{EventBody, Run};
use uuid::Uuid;

use crate::events::insert_event_tx;
use crate::{Store, StoreError};

/// A claimed group delivery: the group (its change is the chosen
/// attempt's) and the claim's holder, which recording the outcome checks.
#[derive(Debug, Clone)]
pub struct GroupDelivery {
    pub run: Run,
    pub holder: Uuid,
}

/// In a transaction holding the group's row: the choice just made owes a
/// push, if the group asked for `deliver.git`.
pub(crate) async fn owe_tx(tx: &deadpool_postgres::Transaction<'_>, group: Uuid) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO group_git_deliveries (run_id)
         SELECT id FROM runs WHERE id = $1 AND jsonb_typeof(policy->'deliver'->'git') = 'object'
         ON CONFLICT (run_id) DO UPDATE SET owed = true",
        &[&group],
    )
    .await?;
    Ok(())
}

/// SQL, true when group `r`'s choice may no longer change: its push was
/// made, or a worker is making it.
pub(crate) const CHOICE_SETTLED: &str = "EXISTS (SELECT 1 FROM group_git_deliveries d WHERE d.run_id = r.id
                AND (d.delivered_at IS NOT NULL OR d.claimed_until > now()))";

impl Store {
    /// Claims the longest-waiting owed group delivery whose group has
    /// ended and whose claim is free (or ran out), for `lease`. Locks the
    /// group's row too (skipping it while a choice is being made), so a
    /// choice either lands before the claim or is refused after it.
    pub async fn claim_group_git_delivery(&self, lease: Duration) -> Result<Option<GroupDelivery>, StoreError> {
        let holder = Uuid::new_v4();
        let client = self.client().await?;
        let row = client
            .query_opt(
                "UPDATE group_git_deliveries d
                 SET holder = $1, claimed_until = now() + make_interval(secs => $2)
                 WHERE d.run_id = (
                     SELECT o.run_id FROM group_git_deliveries o JOIN runs r ON r.id = o.run_id
                     WHERE o.owed AND o.delivered_at IS NULL
                       AND (o.claimed_until IS NULL OR o.claimed_until < now())
                       AND r.status IN ('succeeded', 'failed', 'cancelled', 'timed_out')
                     ORDER BY o.run_id
                     LIMIT 1
                     FOR UPDATE OF o, r SKIP LOCKED)
                 RETURNING d.run_id",
                &[&holder, &lease.as_secs_f64()],
            )
            .await?;
        let Some(row) = row else { return Ok(None) };
        drop(client);
        let run_id: Uuid = row.try_get(0)?;
        let run = self
            .get_run_unscoped(run_id)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("group {run_id} vanished during its delivery")))?;
        Ok(Some(GroupDelivery { run, holder }))
    }

    /// Records how `claim`'s delivery went (`event`, after the group's
    /// terminal one) and releases the claim: delivered, or owed again only
    /// by another choice. False when the claim was no longer `claim`'s (its
    /// lease ran out and another worker took it): nothing is recorded.
    pub async fn end_group_git_delivery(
        &self,
        claim: &GroupDelivery,
        delivered: bool,
        event: &EventBody,
    ) -> Result<bool, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let ours = tx
            .execute(
                "UPDATE group_git_deliveries
                 SET owed = false, holder = NULL, claimed_until = NULL,
                     delivered_at = CASE WHEN $3 THEN now() END
                 WHERE run_id = $1 AND holder = $2",
                &[&claim.run.id, &claim.holder, &delivered],
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
