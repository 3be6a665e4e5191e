//! A message and the events that go with it, in one statement.
//!
//! Every commit waits for the WAL flush, and a step of the agent loop used to
//! make one for its events and another for its message. Written together they
//! cost one: the events stored with the model's message are its step's start,
//! what it streamed and its end; those stored with a tool message are the
//! tools' results.

use kiln_protocol::{EventBody, Message, Usage};
use uuid::Uuid;

use crate::events::EventColumns;
use crate::lease::Lease;
use crate::messages::message_columns;
use crate::{Store, StoreError};

/// What [`Store::append_message_with_events_once`] stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepWrite {
    /// The message's seq in its session.
    pub message_seq: i32,
    /// The seq of the last event written; `None` when there were none or an
    /// earlier attempt had stored them.
    pub last_event_seq: Option<i64>,
}

/// The message and event rows of [`Store::append_message_with_events_once`].
/// Fenced like every worker write: nothing is stored unless `$2..$4` still
/// hold the run. Idempotent in the message id `$9`: the message and its
/// events commit together, so a stored message means stored events too.
const STATEMENT: &str = "WITH earlier AS (
         SELECT seq FROM messages WHERE message_id = $9
     ), bump AS (
         UPDATE runs SET last_event_seq = last_event_seq + $10
         WHERE id = $2 AND attempt = $3 AND lease_owner = $4
           AND status IN ('running', 'awaiting_approval')
           AND NOT EXISTS (SELECT 1 FROM earlier)
         RETURNING last_event_seq
     ), msg AS (
         INSERT INTO messages (session_id, seq, run_id, role, parts, usage, model, message_id)
         SELECT $1, COALESCE((SELECT max(seq) FROM messages WHERE session_id = $1), 0) + 1,
                $2, $5, $6, $7, $8, $9
         FROM bump
         RETURNING seq
     ), ins AS (
         INSERT INTO events (run_id, seq, kind, payload, event_id)
         SELECT $2, bump.last_event_seq - $10 + e.ord, e.kind, e.payload, e.id
         FROM bump, unnest($11::text[], $12::jsonb[], $13::uuid[]) WITH ORDINALITY AS e(kind, payload, id, ord)
         RETURNING seq
     ), last AS (
         SELECT max(seq) AS seq FROM ins
     )
     SELECT msg.seq, last.seq FROM msg, last
     UNION ALL
     SELECT seq, NULL FROM earlier";

impl Store {
    /// Appends `message` to the session and `events` to the run, in one
    /// fenced statement (one commit). Ids as in
    /// [`Store::append_message_once`]: a retry with the same `message_id`
    /// after a commit whose answer was lost stores nothing twice.
    #[allow(clippy::too_many_arguments)]
    pub async fn append_message_with_events_once(
        &self,
        lease: &Lease,
        message_id: Uuid,
        session_id: Uuid,
        message: &Message,
        usage: Option<&Usage>,
        model: Option<&str>,
        events: &[(Uuid, EventBody)],
    ) -> Result<StepWrite, StoreError> {
        let (parts, usage) = message_columns(message, usage)?;
        let EventColumns { kinds, payloads, ids } = EventColumns::of(events)?;
        let count = events.len() as i64;
        let client = self.client().await?;
        // Prepared once per connection: two of these per step of every run.
        let statement = client.prepare_cached(STATEMENT).await?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 13] = [
            &session_id,
            &lease.run_id,
            &lease.attempt,
            &lease.worker,
            &message.role.as_str(),
            &parts,
            &usage,
            &model,
            &message_id,
            &count,
            &kinds,
            &payloads,
            &ids,
        ];
        let result = crate::messages::query_taking_seq(&client, &statement, &params).await;
        let row = match result {
            Ok(row) => row,
            // The earlier attempt committed while this one ran: the unique
            // index refused the copy; all of it is stored.
            Err(e) if crate::messages::is_duplicate_message_id(&e) => {
                client.query_opt("SELECT seq, NULL::bigint FROM messages WHERE message_id = $1", &[&message_id]).await?
            }
            Err(e) => return Err(e.into()),
        };
        let Some(row) = row else { return Err(StoreError::LeaseLost(lease.run_id)) };
        let written = StepWrite { message_seq: row.try_get(0)?, last_event_seq: row.try_get(1)? };
        if let Some(seq) = written.last_event_seq {
            self.announce_event(lease.run_id, seq);
        }
        Ok(written)
    }
}
