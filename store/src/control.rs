//! Steering and approvals: a client talks to an active run through rows the
//! worker reads (the inbox, the approvals table) and a NOTIFY that wakes it.

use kiln_protocol::{EventBody, Message, Run, RunStatus};
use uuid::Uuid;

use crate::events::insert_event_tx;
use crate::follow_ups::{queue_follow_up_tx, take_owed_follow_up_tx};
use crate::lease::Lease;
use crate::messages::{is_duplicate_message_id, message_columns};
use crate::rows::run_from_row;
use crate::runs::{Quota, QuotaRefusal, SELECT_RUN, check_quota_tx};
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
    /// The run finished and a follow-up would take its owner over quota.
    OverQuota(QuotaRefusal),
    NotFound,
}

/// A person's answer to an approval request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub approved: bool,
    pub reason: Option<String>,
}

/// Where asking for approval of a call left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Approval {
    /// A person is asked (or was, and has not answered yet).
    Waiting,
    /// This call was decided already (a resumed run asking again).
    Decided(Decision),
    /// The run's row under this call id is another call's, which may have
    /// run or is being decided: this call must not run.
    IdTaken,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecideOutcome {
    Decided,
    AlreadyDecided,
    /// The run has ended: no worker will act on a decision.
    RunEnded,
    /// No such run for this owner, or no such pending call.
    NotFound,
}

/// Queues `text` in an active run's inbox and tells its worker.
async fn queue_in_inbox_tx(tx: &deadpool_postgres::Transaction<'_>, id: Uuid, text: &str) -> Result<(), StoreError> {
    tx.execute("INSERT INTO run_inbox (run_id, text) VALUES ($1, $2)", &[&id, &text]).await?;
    // Arms the end-of-run check for unread messages (migrations/V12).
    tx.execute("UPDATE runs SET steered = true WHERE id = $1 AND NOT steered", &[&id]).await?;
    insert_event_tx(tx, id, &EventBody::MessageQueued { text: text.to_owned() }).await?;
    tx.execute("SELECT pg_notify($1, $2)", &[&channels::RUN_CONTROL, &id.to_string()]).await?;
    Ok(())
}

/// A run of the session that keeps it busy. One that owes a follow-up
/// counts as active: its follow-up is about to be queued.
async fn busy_run_of_session_tx(
    tx: &deadpool_postgres::Transaction<'_>,
    session_id: Uuid,
) -> Result<Option<Uuid>, StoreError> {
    let busy = tx
        .query_opt(
            &format!("SELECT id FROM runs WHERE session_id = $1 AND (status IN {ACTIVE} OR follow_up_owed) LIMIT 1"),
            &[&session_id],
        )
        .await?;
    busy.map(|row| row.try_get(0)).transpose().map_err(StoreError::from)
}

/// The call a run asks approval for, as its `approvals` row records it.
struct AskedCall<'a> {
    run_id: Uuid,
    call_id: &'a str,
    name: &'a str,
    arguments: &'a serde_json::Value,
}

impl AskedCall<'_> {
    async fn insert_tx(&self, tx: &deadpool_postgres::Transaction<'_>) -> Result<(), StoreError> {
        tx.execute(
            "INSERT INTO approvals (run_id, call_id, name, arguments) VALUES ($1, $2, $3, $4)",
            &[&self.run_id, &self.call_id, &self.name, self.arguments],
        )
        .await?;
        Ok(())
    }

    /// Puts this call in the row of another, decided, call under the same
    /// id, undecided.
    async fn ask_again_tx(&self, tx: &deadpool_postgres::Transaction<'_>) -> Result<(), StoreError> {
        tx.execute(
            "UPDATE approvals SET name = $3, arguments = $4, requested_at = now(), approved = NULL,
                    reason = NULL, decided_by = NULL, decided_at = NULL
             WHERE run_id = $1 AND call_id = $2",
            &[&self.run_id, &self.call_id, &self.name, self.arguments],
        )
        .await?;
        Ok(())
    }
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

/// The statement of [`Store::consume_inbox`]. The run row is locked first
/// (fenced like every worker write: `$1..$3` must still hold the run), so a
/// takeover committing meanwhile is waited for and then refuses the write.
/// Messages whose id (derived from the inbox row) is already stored are not
/// stored again.
const CONSUME_INBOX: &str = "WITH run AS (
         UPDATE runs SET last_event_seq = last_event_seq
         WHERE id = $1 AND attempt = $2 AND lease_owner = $3
           AND status IN ('running', 'awaiting_approval')
         RETURNING id
     ), taken AS (
         SELECT t.inbox_id, t.parts, t.ord, md5('kiln-run-inbox:' || t.inbox_id)::uuid AS message_id
         FROM run, unnest($5::bigint[], $6::jsonb[]) WITH ORDINALITY AS t(inbox_id, parts, ord)
     ), consumed AS (
         UPDATE run_inbox i SET consumed_at = now()
         FROM taken
         WHERE i.id = taken.inbox_id AND i.run_id = $1 AND i.consumed_at IS NULL
     ), fresh AS (
         SELECT taken.parts, taken.message_id, row_number() OVER (ORDER BY taken.ord) AS n
         FROM taken
         WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE m.message_id = taken.message_id)
     ), stored AS (
         INSERT INTO messages (session_id, seq, run_id, role, parts, message_id)
         SELECT $4, COALESCE((SELECT max(seq) FROM messages WHERE session_id = $4), 0) + fresh.n,
                $1, 'user', fresh.parts, fresh.message_id
         FROM fresh
     )
     SELECT count(*) FROM run";

/// A message a client sent to an active run, not yet in its conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxMessage {
    /// The inbox row; the stored message's id is derived from it.
    pub id: i64,
    pub text: String,
}

const ACTIVE: &str = "('queued', 'running', 'awaiting_approval')";

/// The MCP server, and the tool as that server names it, behind a call
/// that asks for approval: what `approval.requested` shows beside the
/// model's name for the tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct McpCall<'a> {
    pub server: &'a str,
    pub tool: &'a str,
}

impl Store {
    /// Sends `text` to run `id` of `owner`: queued for an active run, or a
    /// follow-up run in the same session for a finished one.
    /// A follow-up counts against `quota` like any new run.
    pub async fn send_message(
        &self,
        owner: &str,
        id: Uuid,
        text: &str,
        quota: Option<&Quota>,
    ) -> Result<MessageOutcome, StoreError> {
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
            queue_in_inbox_tx(&tx, id, text).await?;
            tx.commit().await?;
            drop(client);
            let run = self.get_run(owner, id).await?.ok_or_else(|| StoreError::Corrupt("run vanished".into()))?;
            return Ok(MessageOutcome::Queued(run));
        }
        // Lock the session so two follow-ups cannot start side by side.
        tx.execute("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE", &[&session_id]).await?;
        // The run's end left messages unread and their follow-up is on its
        // way (`follow_ups`): queued here instead, under this run's lock, the
        // session is busy with it, as if the end had queued it itself.
        if let Some(follow_up) = take_owed_follow_up_tx(&tx, id).await? {
            tx.commit().await?;
            self.announce_queued(follow_up);
            return Ok(MessageOutcome::SessionBusy { active_run: follow_up });
        }
        if let Some(active_run) = busy_run_of_session_tx(&tx, session_id).await? {
            return Ok(MessageOutcome::SessionBusy { active_run });
        }
        if let Some(quota) = quota
            && let Some(refusal) = check_quota_tx(&tx, owner, quota).await?
        {
            return Ok(MessageOutcome::OverQuota(refusal));
        }
        // The same follow-up a run's end makes of messages it did not read.
        let new_id = queue_follow_up_tx(&tx, id, text).await?;
        let row = tx.query_one(SELECT_RUN.as_str(), &[&new_id]).await?;
        let run = run_from_row(&row)?;
        tx.commit().await?;
        self.announce_queued(new_id);
        Ok(MessageOutcome::FollowUp(run))
    }

    /// The run's unread inbox messages, oldest first. Reading takes nothing
    /// out: [`Store::consume_inbox`] moves them into the conversation.
    pub async fn unread_inbox(&self, run_id: Uuid) -> Result<Vec<InboxMessage>, StoreError> {
        let client = self.client().await?;
        // Prepared once per connection: the loop looks at least every second.
        let statement = client
            .prepare_cached("SELECT id, text FROM run_inbox WHERE run_id = $1 AND consumed_at IS NULL ORDER BY id")
            .await?;
        let rows = client.query(&statement, &[&run_id]).await?;
        rows.iter().map(|r| Ok(InboxMessage { id: r.try_get(0)?, text: r.try_get(1)? })).collect()
    }

    /// Moves `unread` (from [`Store::unread_inbox`]) into the session's
    /// conversation as user messages, in one fenced statement: an inbox row
    /// is marked consumed in the commit that stores its message, so no crash
    /// or lost lease in between can lose a message the client was told was
    /// accepted. Idempotent: each message's id is derived from its inbox row,
    /// so a retry after a commit whose answer was lost stores nothing twice.
    pub async fn consume_inbox(
        &self,
        lease: &Lease,
        session_id: Uuid,
        unread: &[InboxMessage],
    ) -> Result<(), StoreError> {
        let ids: Vec<i64> = unread.iter().map(|m| m.id).collect();
        let parts = unread
            .iter()
            .map(|m| message_columns(&Message::user(m.text.clone()), None).map(|(parts, _)| parts))
            .collect::<Result<Vec<_>, _>>()?;
        let client = self.client().await?;
        let statement = client.prepare_cached(CONSUME_INBOX).await?;
        let result = client
            .query_one(&statement, &[&lease.run_id, &lease.attempt, &lease.worker, &session_id, &ids, &parts])
            .await;
        let row = match result {
            Ok(row) => row,
            // An earlier attempt committed while this one ran: the unique
            // index refused the copies; all of it is stored.
            Err(e) if is_duplicate_message_id(&e) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let held: i64 = row.try_get(0)?;
        if held == 0 {
            return Err(StoreError::LeaseLost(lease.run_id));
        }
        Ok(())
    }

    /// Asks for approval of a call: the run waits in `awaiting_approval`
    /// and `approval.requested` is emitted. If this call was already decided
    /// (a resumed run asking again), returns that decision instead.
    ///
    /// A decision is bound to the call's name and arguments, not only to
    /// its id: a row under the same id recorded for another call (an id
    /// reused, a row from before Kiln issued its own ids) never decides
    /// this one. If that other call was decided and never let through, the
    /// row is asked about again with this call in it; if it may have run
    /// (started) or a person may be deciding it right now (pending), this
    /// call is refused ([`Approval::IdTaken`]): its record must stand, and
    /// a decision on it must not land on another call.
    ///
    /// `mcp`: the MCP server and tool behind the call, for the event.
    pub async fn request_approval(
        &self,
        lease: &Lease,
        call_id: &str,
        name: &str,
        arguments: &serde_json::Value,
        mcp: Option<McpCall<'_>>,
    ) -> Result<Approval, StoreError> {
        let call = AskedCall { run_id: lease.run_id, call_id, name, arguments };
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let row = tx
            .query_opt(
                "SELECT approved, reason, started_at IS NOT NULL, name = $3 AND arguments = $4::jsonb
                 FROM approvals WHERE run_id = $1 AND call_id = $2 FOR UPDATE",
                &[&lease.run_id, &call_id, &name, arguments],
            )
            .await?;
        let asked = match row {
            None => {
                call.insert_tx(&tx).await?;
                true
            }
            Some(row) => {
                let approved: Option<bool> = row.try_get(0)?;
                let started: bool = row.try_get(2)?;
                let same_call: bool = row.try_get(3)?;
                match (same_call, approved) {
                    (true, Some(approved)) => {
                        return Ok(Approval::Decided(Decision { approved, reason: row.try_get(1)? }));
                    }
                    // Asked before (a resumed run): still waiting.
                    (true, None) => false,
                    (false, Some(_)) if !started => {
                        call.ask_again_tx(&tx).await?;
                        true
                    }
                    (false, _) => return Ok(Approval::IdTaken),
                }
            }
        };
        set_held_status(&tx, lease, RunStatus::AwaitingApproval).await?;
        if asked {
            let body = EventBody::ApprovalRequested {
                call_id: call_id.to_owned(),
                name: name.to_owned(),
                arguments: arguments.clone(),
                mcp_server: mcp.map(|m| m.server.to_owned()),
                mcp_tool: mcp.map(|m| m.tool.to_owned()),
            };
            insert_event_tx(&tx, lease.run_id, &body).await?;
        }
        tx.commit().await?;
        Ok(Approval::Waiting)
    }

    /// The decision on a call, if one was made for this name and these
    /// arguments (see [`Store::request_approval`]).
    pub async fn approval_decision(
        &self,
        run_id: Uuid,
        call_id: &str,
        name: &str,
        arguments: &serde_json::Value,
    ) -> Result<Option<Decision>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT approved, reason FROM approvals
                 WHERE run_id = $1 AND call_id = $2 AND name = $3 AND arguments = $4::jsonb AND approved IS NOT NULL",
                &[&run_id, &call_id, &name, arguments],
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
        let owned = tx
            .query_opt(
                "SELECT status IN ('succeeded', 'failed', 'cancelled', 'timed_out') FROM runs
                 WHERE id = $1 AND owner = $2 FOR UPDATE",
                &[&run_id, &owner],
            )
            .await?;
        let Some(owned) = owned else { return Ok(DecideOutcome::NotFound) };
        if owned.try_get::<_, bool>(0)? {
            let call = tx
                .query_opt(
                    "SELECT approved IS NOT NULL FROM approvals WHERE run_id = $1 AND call_id = $2",
                    &[&run_id, &call_id],
                )
                .await?;
            return Ok(match call {
                None => DecideOutcome::NotFound,
                Some(row) if row.try_get::<_, bool>(0)? => DecideOutcome::AlreadyDecided,
                Some(_) => DecideOutcome::RunEnded,
            });
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
