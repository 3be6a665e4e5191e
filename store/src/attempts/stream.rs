//! Copies of an attempt's events in its group's stream.

use kiln_protocol::EventBody;
use uuid::Uuid;

use crate::events::{EventColumns, is_duplicate_event_id};
use crate::{Store, StoreError};

impl Store {
    /// Appends `events` to group `group`'s stream while it is running, in
    /// one statement (dense seqs, one notification). Not fenced by a lease:
    /// no worker holds the group, and several attempts' workers write to it
    /// at once (the seq bump on the group's row orders them). Nothing is
    /// written once the group has ended, so its stream still ends with its
    /// terminal event. Idempotent in the events' ids, as a run's own
    /// appends are. Returns the last seq written, if any.
    pub async fn append_group_events(
        &self,
        group: Uuid,
        events: &[(Uuid, EventBody)],
    ) -> Result<Option<i64>, StoreError> {
        if events.is_empty() {
            return Ok(None);
        }
        let EventColumns { kinds, payloads, ids } = EventColumns::of(events)?;
        let count = events.len() as i64;
        let client = self.client().await?;
        let statement = client
            .prepare_cached(
                "WITH bump AS (
                     UPDATE runs SET last_event_seq = last_event_seq + $5
                     WHERE id = $1 AND attempt_count IS NOT NULL AND status = 'running'
                     RETURNING last_event_seq
                 ), ins AS (
                     INSERT INTO events (run_id, seq, kind, payload, event_id)
                     SELECT $1, bump.last_event_seq - $5 + e.ord, e.kind, e.payload, e.id
                     FROM bump, unnest($2::text[], $3::jsonb[], $4::uuid[]) WITH ORDINALITY AS e(kind, payload, id, ord)
                     RETURNING seq
                 )
                 SELECT max(seq) FROM ins",
            )
            .await?;
        let seq: Option<i64> = match client.query_one(&statement, &[&group, &kinds, &payloads, &ids, &count]).await {
            Ok(row) => row.try_get(0)?,
            // An earlier try of this batch was stored; its answer was lost.
            Err(e) if is_duplicate_event_id(&e) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if let Some(seq) = seq {
            self.announce_event(group, seq);
        }
        Ok(seq)
    }
}
