//! Child runs (sub-agents): rows of `runs` with a `parent_run_id`, started
//! by a parent's `task` call in the parent's session.
//!
//! A child is driven by the worker task that holds its parent (it shares the
//! parent's sandbox, which lives on that worker's engine), under a lease of
//! its own: its messages and events are fenced like any run's. Claims skip
//! children; a child whose worker was lost is requeued like any run and
//! taken over by its parent's next attempt ([`Store::start_child`] again).

use kiln_protocol::{EventBody, Limits, Message, Policy, Run, Usage};
use uuid::Uuid;

use crate::events::insert_event_tx;
use crate::lease::{Lease, millis};
use crate::rows::{RUN_COLUMNS, RUN_RETURNING, run_from_row};
use crate::{Store, StoreError};

/// What the parent's call asks for.
#[derive(Debug, Clone)]
pub struct NewChild {
    /// The parent's call (`{step}-{n}`): one child per call.
    pub call_id: String,
    /// The agent kind (`explore`, `general`).
    pub kind: String,
    /// Where the child sits, e.g. `main/explore[1-1]`.
    pub path: String,
    pub prompt: String,
    /// Its share of the parent's remaining budget.
    pub limits: Limits,
    /// Its tools and approval mode.
    pub policy: Policy,
}

/// A child run held by this worker, or one that had already ended.
#[derive(Debug, Clone)]
pub enum ChildStart {
    /// Started now, or taken over from an earlier attempt of the parent.
    Held { run: Run, lease: Lease, taken_over: bool },
    /// The child ended before the parent's earlier attempt could use its
    /// answer: the row says how.
    Ended(Run),
}

/// A child as the parent sees it, for the API and the web view.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildSummary {
    pub run_id: Uuid,
    pub call_id: String,
    pub kind: String,
    pub path: String,
    pub status: String,
}

impl Store {
    /// Starts the child of `parent`'s call `new.call_id` for `worker`, or
    /// takes over the one an earlier attempt of the parent started. Fenced
    /// by the parent's lease: a parent that lost its run starts nothing.
    pub async fn start_child(
        &self,
        parent: &Lease,
        new: &NewChild,
        lease: std::time::Duration,
    ) -> Result<ChildStart, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // The parent row is locked first: a takeover of the parent that
        // commits meanwhile is waited for, and then refuses this.
        let held = tx
            .query_opt(
                "SELECT 1 FROM runs WHERE id = $1 AND attempt = $2 AND lease_owner = $3
                   AND status IN ('running', 'awaiting_approval') FOR UPDATE",
                &[&parent.run_id, &parent.attempt, &parent.worker],
            )
            .await?;
        if held.is_none() {
            return Err(StoreError::LeaseLost(parent.run_id));
        }
        let start = match insert_child(&tx, parent, new, lease).await? {
            Some(run) => {
                insert_event_tx(&tx, run.id, &EventBody::RunQueued { prompt: new.prompt.clone() }).await?;
                let lease = Lease { run_id: run.id, attempt: run.attempt, worker: parent.worker.clone() };
                ChildStart::Held { run, lease, taken_over: false }
            }
            None => earlier_child(&tx, parent, &new.call_id, lease).await?,
        };
        tx.commit().await?;
        Ok(start)
    }

    /// A child's own conversation, in order (compaction summaries apply as
    /// in [`Store::load_messages`]).
    pub async fn load_child_messages(&self, child: Uuid) -> Result<Vec<Message>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query("SELECT role, parts, summary_keeps FROM messages WHERE run_id = $1 ORDER BY seq", &[&child])
            .await?;
        crate::messages::conversation(&rows)
    }

    /// What `parent`'s children have spent so far: their model usage and
    /// their steps (the parent's budget counts both).
    pub async fn children_spend(&self, parent: Uuid) -> Result<(Usage, u32), StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT m.usage FROM messages m JOIN runs r ON r.id = m.run_id
                 WHERE r.parent_run_id = $1 AND m.role = 'assistant'",
                &[&parent],
            )
            .await?;
        let mut total = Usage::default();
        for row in &rows {
            if let Some(value) = row.try_get::<_, Option<serde_json::Value>>(0)? {
                let usage: Usage =
                    serde_json::from_value(value).map_err(|e| StoreError::Corrupt(format!("message usage: {e}")))?;
                total.add(&usage);
            }
        }
        Ok((total, rows.len() as u32))
    }

    /// `parent`'s children, oldest first.
    pub async fn children(&self, parent: Uuid) -> Result<Vec<ChildSummary>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT id, parent_call_id, agent_kind, agent_path, status FROM runs
                 WHERE parent_run_id = $1 ORDER BY created_at, id",
                &[&parent],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(ChildSummary {
                    run_id: r.try_get(0)?,
                    call_id: r.try_get(1)?,
                    kind: r.try_get::<_, Option<String>>(2)?.unwrap_or_default(),
                    path: r.try_get::<_, Option<String>>(3)?.unwrap_or_default(),
                    status: r.try_get(4)?,
                })
            })
            .collect()
    }

    /// Ends every descendant of `parent` that has not ended (held, or waiting
    /// for a takeover) with `terminal`, each with its terminal event: the
    /// parent ended, so nobody will drive them. Returns how many ended.
    pub async fn end_children(&self, parent: Uuid, terminal: &EventBody) -> Result<u64, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let ended = end_children_tx(&tx, parent, terminal).await?;
        tx.commit().await?;
        Ok(ended)
    }
}

/// [`Store::end_children`] inside `tx`.
pub(crate) async fn end_children_tx(
    tx: &deadpool_postgres::Transaction<'_>,
    parent: Uuid,
    terminal: &EventBody,
) -> Result<u64, StoreError> {
    let (status, error, _, _) = crate::lease::terminal_parts(terminal)?;
    let rows = tx
        .query(
            "WITH RECURSIVE tree AS (
                 SELECT id FROM runs WHERE parent_run_id = $1
                 UNION SELECT r.id FROM runs r JOIN tree t ON r.parent_run_id = t.id
             )
             UPDATE runs SET status = $2, finished_at = now(), error = $3,
                    lease_owner = NULL, lease_expires_at = NULL, cancel_requested = true
             WHERE id IN (SELECT id FROM tree) AND finished_at IS NULL
             RETURNING id",
            &[&parent, &status.as_str(), &error],
        )
        .await?;
    for row in &rows {
        let id: Uuid = row.try_get(0)?;
        insert_event_tx(tx, id, terminal).await?;
    }
    Ok(rows.len() as u64)
}

/// The child run of `new.call_id`, inserted running under the parent's
/// worker; `None` when an earlier attempt of the parent started it already.
async fn insert_child(
    tx: &deadpool_postgres::Transaction<'_>,
    parent: &Lease,
    new: &NewChild,
    lease: std::time::Duration,
) -> Result<Option<Run>, StoreError> {
    let limits = serde_json::to_value(new.limits).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let policy = serde_json::to_value(&new.policy).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let inserted = tx
        .query_opt(
            &format!(
                "INSERT INTO runs AS r (id, session_id, owner, status, prompt, model, limits, trigger, priority,
                                       attempt, max_attempts, lease_owner, lease_expires_at, started_at, policy,
                                       parent_run_id, parent_call_id, agent_kind, agent_path)
                 SELECT $1, p.session_id, p.owner, 'running', $2, p.model, $3, 'api', p.priority,
                        1, p.max_attempts, $4, now() + $5 * interval '1 millisecond', now(), $6,
                        p.id, $7, $8, $9
                 FROM runs p WHERE p.id = $10
                 ON CONFLICT (parent_run_id, parent_call_id) WHERE parent_run_id IS NOT NULL DO NOTHING
                 RETURNING {RUN_RETURNING}"
            ),
            &[
                &Uuid::now_v7(),
                &new.prompt,
                &limits,
                &parent.worker,
                &millis(lease),
                &policy,
                &new.call_id,
                &new.kind,
                &new.path,
                &parent.run_id,
            ],
        )
        .await?;
    inserted.map(|row| run_from_row(&row)).transpose()
}

/// The child an earlier attempt of the parent started for `call_id`: taken
/// over under the parent's worker unless it ended, in which case its end.
async fn earlier_child(
    tx: &deadpool_postgres::Transaction<'_>,
    parent: &Lease,
    call_id: &str,
    lease: std::time::Duration,
) -> Result<ChildStart, StoreError> {
    let taken = tx
        .query_opt(
            &format!(
                "UPDATE runs r SET status = 'running', attempt = attempt + 1, lease_owner = $3,
                        lease_expires_at = now() + $4 * interval '1 millisecond'
                 WHERE parent_run_id = $1 AND parent_call_id = $2 AND finished_at IS NULL
                 RETURNING {RUN_RETURNING}"
            ),
            &[&parent.run_id, &call_id, &parent.worker, &millis(lease)],
        )
        .await?;
    if let Some(row) = taken {
        let run = run_from_row(&row)?;
        let lease = Lease { run_id: run.id, attempt: run.attempt, worker: parent.worker.clone() };
        return Ok(ChildStart::Held { run, lease, taken_over: true });
    }
    let row = tx
        .query_one(
            &format!(
                "SELECT {RUN_COLUMNS} FROM runs r JOIN sessions s ON s.id = r.session_id
                 WHERE r.parent_run_id = $1 AND r.parent_call_id = $2"
            ),
            &[&parent.run_id, &call_id],
        )
        .await?;
    Ok(ChildStart::Ended(run_from_row(&row)?))
}
