//! Steering and approvals: a client talks to an active run through rows the
//! worker reads (the inbox, the approvals table) and a NOTIFY that wakes it.

use kiln_protocol::{EventBody, Run, RunStatus, Trigger};
use uuid::Uuid;

use crate::events::insert_event_tx;
use crate::queue::Lease;
use crate::rows::{RUN_COLUMNS, run_from_row};
use crate::{Store, StoreError, channels};

/// What sending a message to a run came to.
#[derive(Debug, Clone)]
pub enum MessageOutcome {
    /// The run is active: the message joins its conversation before the
    /// next model call.
    Queued(Run),
    /// The run had finished: a follow-up run was queued in the same session.
    FollowUp(Run),
    /// The run finished, but another run of its session is still active.
    SessionBusy {
        active_run: Uuid,
    },
    NotFound,
}

/// A person's answer to an approval request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub approved: bool,
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecideOutcome {
    Decided,
    AlreadyDecided,
    /// No such run for this owner, or no such pending call.
    NotFound,
}

/// Moves a run this lease holds between `running` and `awaiting_approval`.
async fn set_held_status(
    client: &impl deadpool_postgres::GenericClient,
    lease: &Lease,
    status: RunStatus,
) -> Result<(), StoreError> {
    let n = client
        .execute(
            "UPDATE runs SET status = $4
             WHERE id = $1 AND attempt = $2 AND lease_owner = $3 AND status IN ('running', 'awaiting_approval')",
            &[&lease.run_id, &lease.attempt, &lease.worker, &status.as_str()],
        )
        .await?;
    if n == 0 {
        return Err(StoreError::LeaseLost(lease.run_id));
    }
    Ok(())
}

const ACTIVE: &str = "('queued', 'running', 'awaiting_approval')";

impl Store {
    /// Sends `text` to run `id` of `owner`: queued for an active run, or a
    /// follow-up run in the same session for a finished one.
    pub async fn send_message(&self, owner: &str, id: Uuid, text: &str) -> Result<MessageOutcome, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let row = tx
            .query_opt("SELECT status, session_id FROM runs WHERE id = $1 AND owner = $2 FOR UPDATE", &[&id, &owner])
            .await?;
        let Some(row) = row else { return Ok(MessageOutcome::NotFound) };
        let status: String = row.try_get(0)?;
        let session_id: Uuid = row.try_get(1)?;
        let status: RunStatus =
            status.parse().map_err(|e: kiln_protocol::run::UnknownStatus| StoreError::Corrupt(e.to_string()))?;
        if !status.is_terminal() {
            tx.execute("INSERT INTO run_inbox (run_id, text) VALUES ($1, $2)", &[&id, &text]).await?;
            insert_event_tx(&tx, id, &EventBody::MessageQueued { text: text.to_owned() }).await?;
            tx.execute("SELECT pg_notify($1, $2)", &[&channels::RUN_CONTROL, &id.to_string()]).await?;
            tx.commit().await?;
            drop(client);
            let run = self.get_run(owner, id).await?.ok_or_else(|| StoreError::Corrupt("run vanished".into()))?;
            return Ok(MessageOutcome::Queued(run));
        }
        // Lock the session so two follow-ups cannot start side by side.
        tx.execute("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", &[&session_id]).await?;
        let busy = tx
            .query_opt(
                &format!("SELECT id FROM runs WHERE session_id = $1 AND status IN {ACTIVE} LIMIT 1"),
                &[&session_id],
            )
            .await?;
        if let Some(busy) = busy {
            return Ok(MessageOutcome::SessionBusy { active_run: busy.try_get(0)? });
        }
        let new_id = Uuid::now_v7();
        tx.execute(
            // The follow-up continues the same task: whoever asked to be
            // called back when it ended hears of the follow-up's end too.
            "INSERT INTO runs (id, session_id, owner, status, prompt, model, limits, trigger, policy, callback_url)
             SELECT $1, session_id, owner, 'queued', $2, model, limits, $3, policy, callback_url
             FROM runs WHERE id = $4",
            &[&new_id, &text, &Trigger::Api.as_str(), &id],
        )
        .await?;
        insert_event_tx(&tx, new_id, &EventBody::RunQueued { prompt: text.to_owned() }).await?;
        tx.execute("SELECT pg_notify($1, $2)", &[&channels::RUNS_QUEUED, &new_id.to_string()]).await?;
        let row = tx
            .query_one(
                &format!("SELECT {RUN_COLUMNS} FROM runs r JOIN sessions s ON s.id = r.session_id WHERE r.id = $1"),
                &[&new_id],
            )
            .await?;
        let run = run_from_row(&row)?;
        tx.commit().await?;
        Ok(MessageOutcome::FollowUp(run))
    }

    /// Moves the run's unread inbox messages out, oldest first (fenced).
    pub async fn take_inbox(&self, lease: &Lease) -> Result<Vec<String>, StoreError> {
        let client = self.client().await?;
        // Prepared once per connection: this runs on every step.
        let statement = client
            .prepare_cached(
                "UPDATE run_inbox SET consumed_at = now()
                 WHERE run_id = $1 AND consumed_at IS NULL
                   AND EXISTS (SELECT 1 FROM runs WHERE id = $1 AND attempt = $2 AND lease_owner = $3
                               AND status IN ('running', 'awaiting_approval'))
                 RETURNING id, text",
            )
            .await?;
        let rows = client.query(&statement, &[&lease.run_id, &lease.attempt, &lease.worker]).await?;
        let mut messages = rows
            .iter()
            .map(|r| Ok((r.try_get::<_, i64>(0)?, r.try_get::<_, String>(1)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        messages.sort_by_key(|(id, _)| *id);
        Ok(messages.into_iter().map(|(_, text)| text).collect())
    }

    /// Asks for approval of a call: the run waits in `awaiting_approval`
    /// and `approval.requested` is emitted. If this call was already decided
    /// (a resumed run asking again), returns that decision instead.
    pub async fn request_approval(
        &self,
        lease: &Lease,
        call_id: &str,
        name: &str,
        arguments: &serde_json::Value,
    ) -> Result<Option<Decision>, StoreError> {
        if let Some(decision) = self.approval_decision(lease.run_id, call_id).await? {
            return Ok(Some(decision));
        }
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        set_held_status(&tx, lease, RunStatus::AwaitingApproval).await?;
        let inserted = tx
            .execute(
                "INSERT INTO approvals (run_id, call_id, name, arguments) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (run_id, call_id) DO NOTHING",
                &[&lease.run_id, &call_id, &name, arguments],
            )
            .await?;
        if inserted == 1 {
            let body = EventBody::ApprovalRequested {
                call_id: call_id.to_owned(),
                name: name.to_owned(),
                arguments: arguments.clone(),
            };
            insert_event_tx(&tx, lease.run_id, &body).await?;
        }
        tx.commit().await?;
        Ok(None)
    }

    /// The decision on a call, if one was made.
    pub async fn approval_decision(&self, run_id: Uuid, call_id: &str) -> Result<Option<Decision>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT approved, reason FROM approvals WHERE run_id = $1 AND call_id = $2 AND approved IS NOT NULL",
                &[&run_id, &call_id],
            )
            .await?;
        row.map(|r| Ok(Decision { approved: r.try_get(0)?, reason: r.try_get(1)? })).transpose()
    }

    /// Puts a run that waited for approval back to `running` and marks the
    /// approved calls about to run as started, in one commit (fenced).
    pub async fn resume_after_approval(&self, lease: &Lease, starting: &[String]) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        set_held_status(&tx, lease, RunStatus::Running).await?;
        if !starting.is_empty() {
            tx.execute(
                "UPDATE approvals SET started_at = now()
                 WHERE run_id = $1 AND call_id = ANY($2) AND started_at IS NULL",
                &[&lease.run_id, &starting],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The run's approved calls that were let through to run (see
    /// [`Store::resume_after_approval`]): only these may have run.
    pub async fn started_approved_calls(&self, run_id: Uuid) -> Result<Vec<String>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query("SELECT call_id FROM approvals WHERE run_id = $1 AND started_at IS NOT NULL", &[&run_id])
            .await?;
        rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
    }

    /// Records `owner`'s decision on a pending call and wakes the worker.
    pub async fn decide_approval(
        &self,
        owner: &str,
        run_id: Uuid,
        call_id: &str,
        decision: &Decision,
    ) -> Result<DecideOutcome, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let owned =
            tx.query_opt("SELECT 1 FROM runs WHERE id = $1 AND owner = $2 FOR UPDATE", &[&run_id, &owner]).await?;
        if owned.is_none() {
            return Ok(DecideOutcome::NotFound);
        }
        let updated = tx
            .execute(
                "UPDATE approvals SET approved = $3, reason = $4, decided_by = $5, decided_at = now()
                 WHERE run_id = $1 AND call_id = $2 AND approved IS NULL",
                &[&run_id, &call_id, &decision.approved, &decision.reason, &owner],
            )
            .await?;
        if updated == 0 {
            let exists = tx
                .query_opt("SELECT 1 FROM approvals WHERE run_id = $1 AND call_id = $2", &[&run_id, &call_id])
                .await?;
            return Ok(if exists.is_some() { DecideOutcome::AlreadyDecided } else { DecideOutcome::NotFound });
        }
        let body = EventBody::ApprovalResolved {
            call_id: call_id.to_owned(),
            approved: decision.approved,
            reason: decision.reason.clone(),
        };
        insert_event_tx(&tx, run_id, &body).await?;
        tx.execute("SELECT pg_notify($1, $2)", &[&channels::RUN_CONTROL, &run_id.to_string()]).await?;
        tx.commit().await?;
        Ok(DecideOutcome::Decided)
    }
}
