//! Creating a group and its attempts in the submission's transaction.

use uuid::Uuid;

use crate::StoreError;
use crate::queued::{NewRun, QueuedRun, insert_queued_run_tx};

/// A group just inserted: its id and its attempts' ids, first attempt first.
pub(crate) struct InsertedGroup {
    pub group: Uuid,
    pub attempts: Vec<Uuid>,
}

/// Inserts the group of `new` (which asks for `attempts`) and its queued
/// attempts in the caller's transaction. `None` when the idempotency key is
/// already taken (the caller rolls back).
pub(crate) async fn insert_group_tx(
    tx: &deadpool_postgres::Transaction<'_>,
    new: &NewRun,
    attempts: u32,
) -> Result<Option<InsertedGroup>, StoreError> {
    let Some(group) = insert_queued_run_tx(tx, &QueuedRun::first(new)?).await? else {
        return Ok(None);
    };
    // Never claimed: the group runs no agent of its own. It is running from
    // now on and ends when its last attempt does.
    let count = i32::try_from(attempts).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    tx.execute(
        "UPDATE runs SET status = 'running', started_at = now(), attempt_count = $2 WHERE id = $1",
        &[&group, &count],
    )
    .await?;
    let mut ids = Vec::with_capacity(attempts as usize);
    for number in 1..=count {
        let attempt = attempt_of(new, number, attempts)?;
        let Some(id) = insert_queued_run_tx(tx, &QueuedRun::first(&attempt)?).await? else {
            return Err(StoreError::Corrupt("an attempt collided with an idempotency key".into()));
        };
        tx.execute("UPDATE runs SET group_run_id = $1, attempt_number = $2 WHERE id = $3", &[&group, &number, &id])
            .await?;
        ids.push(id);
    }
    Ok(Some(InsertedGroup { group, attempts: ids }))
}

/// The submission as attempt `number` of `attempts` is queued: its own
/// model if `attempt_models` names one, its share of the group's budget,
/// and none of what belongs to the group alone (its delivery, callback and
/// idempotency key). It keeps the group's trigger: a GitHub group's
/// attempts check out and are admitted as GitHub runs.
fn attempt_of(new: &NewRun, number: i32, attempts: u32) -> Result<NewRun, StoreError> {
    let mut spec = new.spec.clone();
    let number = u32::try_from(number).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    (spec.model, spec.limits) = new.spec.attempt_settings(number, attempts);
    spec.attempts = None;
    spec.attempt_models = None;
    spec.group_limits = None;
    spec.deliver = None;
    spec.callback_url = None;
    Ok(NewRun { owner: new.owner.clone(), spec, trigger: new.trigger, idempotency_key: None })
}
