//! The events table: dense per-run seqs, fenced appends, paged reads.

use deadpool_postgres::GenericClient;
use kiln_protocol::{EventBody, StoredEvent};
use uuid::Uuid;

use crate::queue::Lease;
use crate::{Store, StoreError, channels};

fn split(body: &EventBody) -> Result<(String, serde_json::Value), StoreError> {
    body.clone().into_parts().map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// Appends an event inside a caller's transaction, unfenced: for the API and
/// the reaper, which act on a run without holding its lease. The caller has
/// already locked or checked the run row.
pub(crate) async fn insert_event_tx(
    tx: &impl GenericClient,
    run_id: Uuid,
    body: &EventBody,
) -> Result<i64, StoreError> {
    let (kind, payload) = split(body)?;
    let row = tx
        .query_one(
            "WITH bump AS (
                 UPDATE runs SET last_event_seq = last_event_seq + 1 WHERE id = $1 RETURNING last_event_seq
             ), ins AS (
                 INSERT INTO events (run_id, seq, kind, payload)
                 SELECT $1, last_event_seq, $2, $3 FROM bump RETURNING seq
             )
             SELECT seq, pg_notify($4, $1::text || ':' || seq) IS NULL FROM ins",
            &[&run_id, &kind, &payload, &channels::RUN_EVENTS],
        )
        .await?;
    Ok(row.try_get(0)?)
}

impl Store {
    /// Appends an event for a run this worker holds. The seq bump, the insert
    /// and the notification are one statement, so seqs stay dense and a
    /// worker that lost the lease writes nothing.
    pub async fn append_event(&self, lease: &Lease, body: &EventBody) -> Result<i64, StoreError> {
        let (kind, payload) = split(body)?;
        let client = self.client().await?;
        let row = client
            .query_opt(
                "WITH bump AS (
                     UPDATE runs SET last_event_seq = last_event_seq + 1
                     WHERE id = $1 AND attempt = $2 AND lease_owner = $3
                       AND status IN ('running', 'awaiting_approval')
                     RETURNING last_event_seq
                 ), ins AS (
                     INSERT INTO events (run_id, seq, kind, payload)
                     SELECT $1, last_event_seq, $4, $5 FROM bump RETURNING seq
                 )
                 SELECT seq, pg_notify($6, $1::text || ':' || seq) IS NULL FROM ins",
                &[&lease.run_id, &lease.attempt, &lease.worker, &kind, &payload, &channels::RUN_EVENTS],
            )
            .await?;
        match row {
            Some(row) => Ok(row.try_get(0)?),
            None => Err(StoreError::LeaseLost(lease.run_id)),
        }
    }

    /// Events of a run with seq > `after`, oldest first, at most `limit`.
    pub async fn events_after(&self, run_id: Uuid, after: i64, limit: i64) -> Result<Vec<StoredEvent>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT seq, kind, payload, at FROM events
                 WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                &[&run_id, &after, &limit],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(StoredEvent { seq: r.try_get(0)?, kind: r.try_get(1)?, payload: r.try_get(2)?, at: r.try_get(3)? })
            })
            .collect()
    }
}
