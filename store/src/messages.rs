//! The conversation of a session, appended by the worker holding the run.

use kiln_protocol::{Message, Role, Usage};
use uuid::Uuid;

use crate::lease::Lease;
use crate::{Store, StoreError};

/// The statement of [`Store::insert_message`]: the message's seq, stored
/// now, or by an earlier try under the same `message_id`; no row if the
/// lease is lost. The run row is locked, not just read: a takeover that
/// commits while this runs is waited for, and then refuses it (a plain
/// EXISTS would read the old lease from its snapshot).
const INSERT_MESSAGE: &str = "WITH earlier AS (
         SELECT seq FROM messages WHERE message_id = $10
     ), run AS (
         UPDATE runs SET last_event_seq = last_event_seq
         WHERE id = $2 AND attempt = $3 AND lease_owner = $4
           AND status IN ('running', 'awaiting_approval')
           AND NOT EXISTS (SELECT 1 FROM earlier)
         RETURNING id
     ), ins AS (
         INSERT INTO messages (session_id, seq, run_id, role, parts, usage, model, summary_keeps, message_id)
         SELECT $1, COALESCE((SELECT max(seq) FROM messages WHERE session_id = $1), 0) + 1,
                $2, $5, $6, $7, $8, $9, $10
         FROM run
         RETURNING seq
     )
     SELECT seq FROM ins UNION ALL SELECT seq FROM earlier";

impl Store {
    /// Appends a message to the session, fenced by the run's lease, under a
    /// fresh message id. Callers that retry should use
    /// [`Store::append_message_once`] with one id for all attempts.
    pub async fn append_message(
        &self,
        lease: &Lease,
        session_id: Uuid,
        message: &Message,
        usage: Option<&Usage>,
        model: Option<&str>,
    ) -> Result<i32, StoreError> {
        self.insert_message(lease, Uuid::now_v7(), session_id, message, usage, model, None).await
    }

    /// Appends a message; returns its seq. Idempotent in `message_id`: when
    /// an earlier attempt with the same id was committed (its answer lost
    /// with the connection), returns that message's seq and stores nothing.
    pub async fn append_message_once(
        &self,
        lease: &Lease,
        message_id: Uuid,
        session_id: Uuid,
        message: &Message,
        usage: Option<&Usage>,
        model: Option<&str>,
    ) -> Result<i32, StoreError> {
        self.insert_message(lease, message_id, session_id, message, usage, model, None).await
    }

    /// Appends a compaction summary: from now on the conversation loads as
    /// this message followed by the `keeps` messages stored just before it
    /// (and whatever comes after).
    #[allow(clippy::too_many_arguments)]
    pub async fn append_summary(
        &self,
        lease: &Lease,
        message_id: Uuid,
        session_id: Uuid,
        message: &Message,
        keeps: usize,
        usage: Option<&Usage>,
        model: Option<&str>,
    ) -> Result<i32, StoreError> {
        let keeps = i32::try_from(keeps).map_err(|_| StoreError::Corrupt(format!("summary keeps {keeps}")))?;
        self.insert_message(lease, message_id, session_id, message, usage, model, Some(keeps)).await
    }

    #[allow(clippy::too_many_arguments)]
    async fn insert_message(
        &self,
        lease: &Lease,
        message_id: Uuid,
        session_id: Uuid,
        message: &Message,
        usage: Option<&Usage>,
        model: Option<&str>,
        summary_keeps: Option<i32>,
    ) -> Result<i32, StoreError> {
        let (parts, usage) = message_columns(message, usage)?;
        let client = self.client().await?;
        // Prepared once per connection: this runs on every step.
        let statement = client.prepare_cached(INSERT_MESSAGE).await?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 10] = [
            &session_id,
            &lease.run_id,
            &lease.attempt,
            &lease.worker,
            &message.role.as_str(),
            &parts,
            &usage,
            &model,
            &summary_keeps,
            &message_id,
        ];
        let result = query_taking_seq(&client, &statement, &params).await;
        let row = match result {
            Ok(row) => row,
            // The earlier attempt committed while this one ran: the unique
            // index refused the copy; the message is stored, find its seq.
            Err(e) if is_duplicate_message_id(&e) => {
                client.query_opt("SELECT seq FROM messages WHERE message_id = $1", &[&message_id]).await?
            }
            Err(e) => return Err(e.into()),
        };
        match row {
            Some(r) => Ok(r.try_get(0)?),
            None => Err(StoreError::LeaseLost(lease.run_id)),
        }
    }

    /// The conversation of a session as the model should see it, in order:
    /// from its latest compaction summary on (see [`Store::append_summary`]),
    /// or all of it.
    pub async fn load_messages(&self, session_id: Uuid) -> Result<Vec<Message>, StoreError> {
        let client = self.client().await?;
        // A child run's messages are its own conversation, not the session's.
        let rows = client
            .query(
                "SELECT m.role, m.parts, m.summary_keeps FROM messages m
                 WHERE m.session_id = $1
                   AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = m.run_id AND r.parent_run_id IS NOT NULL)
                 ORDER BY m.seq",
                &[&session_id],
            )
            .await?;
        conversation(&rows)
    }
}

/// The conversation `rows` (role, parts, summary_keeps; in seq order) make,
/// from the latest compaction summary on.
pub(crate) fn conversation(rows: &[tokio_postgres::Row]) -> Result<Vec<Message>, StoreError> {
    let mut keeps = Vec::with_capacity(rows.len());
    for r in rows {
        keeps.push(r.try_get::<_, Option<i32>>(2)?);
    }
    let visible = visible_rows(&keeps);
    visible
        .into_iter()
        .map(|i| &rows[i])
        .map(|r| {
            let role: String = r.try_get(0)?;
            let parts: serde_json::Value = r.try_get(1)?;
            let role = match role.as_str() {
                "system" => Role::System,
                "user" => Role::User,
                "assistant" => Role::Assistant,
                "tool" => Role::Tool,
                other => return Err(StoreError::Corrupt(format!("message role {other:?}"))),
            };
            let parts =
                serde_json::from_value(parts).map_err(|e| StoreError::Corrupt(format!("message parts: {e}")))?;
            Ok(Message { role, parts })
        })
        .collect()
}

impl Store {
    /// Messages the session's conversation holds so far.
    pub async fn count_session_messages(&self, session_id: Uuid) -> Result<i64, StoreError> {
        let client = self.client().await?;
        let row = client.query_one("SELECT count(*) FROM messages WHERE session_id = $1", &[&session_id]).await?;
        Ok(row.try_get(0)?)
    }

    /// How many messages of `role` a run has stored (e.g. its steps so far).
    pub async fn count_run_messages(&self, run_id: Uuid, role: &str) -> Result<i64, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one("SELECT count(*) FROM messages WHERE run_id = $1 AND role = $2", &[&run_id, &role])
            .await?;
        Ok(row.try_get(0)?)
    }
}

impl Store {
    /// Total model usage of a run so far (its assistant messages).
    pub async fn run_usage(&self, run_id: Uuid) -> Result<Usage, StoreError> {
        let client = self.client().await?;
        let rows =
            client.query("SELECT usage FROM messages WHERE run_id = $1 AND usage IS NOT NULL", &[&run_id]).await?;
        let mut total = Usage::default();
        for row in rows {
            let value: serde_json::Value = row.try_get(0)?;
            let usage: Usage =
                serde_json::from_value(value).map_err(|e| StoreError::Corrupt(format!("message usage: {e}")))?;
            total.add(&usage);
        }
        Ok(total)
    }
}

/// A message's `parts` and `usage` columns.
pub(crate) fn message_columns(
    message: &Message,
    usage: Option<&Usage>,
) -> Result<(serde_json::Value, Option<serde_json::Value>), StoreError> {
    let parts = serde_json::to_value(&message.parts).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let usage = usage.map(serde_json::to_value).transpose().map_err(|e| StoreError::Corrupt(e.to_string()))?;
    Ok((parts, usage))
}

/// Runs a message insert, again while another writer to the session took
/// the seq it chose: a parent's children write to one session at once (each
/// to its own conversation), and the statement picks `max(seq) + 1` from
/// its snapshot. Nothing was stored by the refused attempt.
pub(crate) async fn query_taking_seq(
    client: &tokio_postgres::Client,
    statement: &tokio_postgres::Statement,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Option<tokio_postgres::Row>, tokio_postgres::Error> {
    const TRIES: usize = 50;
    let mut tries = 0;
    loop {
        match client.query_opt(statement, params).await {
            Err(e) if is_seq_taken(&e) && tries < TRIES => tries += 1,
            other => return other,
        }
    }
}

fn is_seq_taken(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        *db.code() == tokio_postgres::error::SqlState::UNIQUE_VIOLATION && db.constraint() == Some("messages_pkey")
    })
}

pub(crate) fn is_duplicate_message_id(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        *db.code() == tokio_postgres::error::SqlState::UNIQUE_VIOLATION
            && db.constraint() == Some("messages_message_id")
    })
}

/// Which rows (by index, in the order to show them) make up the
/// conversation, given each row's `summary_keeps`: the latest summary, then
/// the `keeps` non-summary rows just before it, then everything after it.
fn visible_rows(keeps: &[Option<i32>]) -> Vec<usize> {
    let Some(summary) = keeps.iter().rposition(Option::is_some) else {
        return (0..keeps.len()).collect();
    };
    let wanted = keeps[summary].unwrap_or(0).max(0) as usize;
    let mut kept: Vec<usize> = (0..summary).rev().filter(|&i| keeps[i].is_none()).take(wanted).collect();
    kept.reverse();
    std::iter::once(summary).chain(kept).chain(summary + 1..keeps.len()).collect()
}

#[cfg(test)]
mod tests {
    use super::visible_rows;

    #[test]
    fn the_latest_summary_stands_in_for_what_it_summarised() {
        assert_eq!(visible_rows(&[None, None, None]), [0, 1, 2]);
        // u0 a1 t2 u3 S(keeps 2) a5
        assert_eq!(visible_rows(&[None, None, None, None, Some(2), None]), [4, 2, 3, 5]);
        // A second summary: earlier summaries are never "kept" messages.
        assert_eq!(visible_rows(&[None, None, Some(1), None, None, Some(2), None]), [5, 3, 4, 6]);
        assert_eq!(visible_rows(&[None, Some(0)]), [1]);
        assert_eq!(visible_rows(&[Some(5)]), [0]);
    }
}
