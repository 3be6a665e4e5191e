//! Cancelling a group: every attempt with it.

use kiln_protocol::EventBody;
use uuid::Uuid;

use crate::events::insert_event_tx;
use crate::{StoreError, channels};

/// Marks group `group` (its row locked by the caller) cancelled by its
/// client and cancels each of its attempts as a cancel of that run would:
/// a queued one at once, an active one by asking its worker. Returns the
/// attempts that have ended, here or before (their ends go into the
/// group's stream after the commit, `Store::attempt_ended`, which skips
/// those already there: so a cancel also mends a group whose attempt's
/// worker died between writing the attempt's end and the group's record).
pub(crate) async fn cancel_group_tx(
    tx: &deadpool_postgres::Transaction<'_>,
    group: Uuid,
) -> Result<Vec<Uuid>, StoreError> {
    tx.execute("UPDATE runs SET cancel_requested = true WHERE id = $1", &[&group]).await?;
    let queued = tx
        .query(
            "UPDATE runs SET status = 'cancelled', cancel_requested = true, finished_at = now(),
                    error = 'cancelled before it started'
             WHERE group_run_id = $1 AND status = 'queued' RETURNING id",
            &[&group],
        )
        .await?;
    for row in &queued {
        let id: Uuid = row.try_get(0)?;
        let reason = "the group of attempts was cancelled before this attempt started".to_owned();
        insert_event_tx(tx, id, &EventBody::RunCancelled { reason }).await?;
    }
    let active = tx
        .query(
            "UPDATE runs SET cancel_requested = true
             WHERE group_run_id = $1 AND status IN ('running', 'awaiting_approval') RETURNING id",
            &[&group],
        )
        .await?;
    for row in &active {
        let id: Uuid = row.try_get(0)?;
        tx.execute("SELECT pg_notify($1, $2)", &[&channels::RUN_CANCEL, &id.to_string()]).await?;
    }
    let ended = tx
        .query(
            "SELECT id FROM runs
             WHERE group_run_id = $1 AND status IN ('succeeded', 'failed', 'cancelled', 'timed_out')",
            &[&group],
        )
        .await?;
    ended.iter().map(|r| r.try_get(0).map_err(StoreError::from)).collect()
}
