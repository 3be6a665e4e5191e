//! A group's `deliver.git` (issue 29): the chosen attempt's change is
//! pushed by a worker after the choice (the API that takes the choice has
//! no git credentials). Each choice owes the push again; a worker claims it
//! once the group has ended, with a lease (`crate::git_deliveries`, the
//! same claim as a single run's push); from the claim on, the choice
//! stands (see `migrations/V24__group_delivery_and_base.sql`).

use uuid::Uuid;

use crate::StoreError;

/// In a transaction holding the group's row: the choice just made owes a
/// push, if the group asked for `deliver.git` (a fresh one: the attempts
/// of an earlier choice's push count no more).
pub(crate) async fn owe_tx(tx: &deadpool_postgres::Transaction<'_>, group: Uuid) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO git_deliveries (run_id)
         SELECT id FROM runs WHERE id = $1 AND jsonb_typeof(policy->'deliver'->'git') = 'object'
         ON CONFLICT (run_id) DO UPDATE SET owed = true, attempts = 0, not_before = NULL, owed_since = now()",
        &[&group],
    )
    .await?;
    Ok(())
}

/// SQL, true when group `r`'s choice may no longer change: its push was
/// made, or a worker is making it.
pub(crate) const CHOICE_SETTLED: &str = "EXISTS (SELECT 1 FROM git_deliveries d WHERE d.run_id = r.id
                AND (d.delivered_at IS NOT NULL OR d.claimed_until > now()))";
