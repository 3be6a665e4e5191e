//! An attempt's end in its group's stream, and the group's end.

use deadpool_postgres::Transaction;
use kiln_protocol::changes::ChangeTotals;
use kiln_protocol::{EventBody, RunStatus, StoredEvent, Usage};
use uuid::Uuid;

use crate::events::insert_event_tx;
use crate::lease::terminal_parts;
use crate::{Store, StoreError};

/// What one attempt spent, from its own stream.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Spent {
    usage: Usage,
    cost_usd: Option<f64>,
    steps: u32,
}

impl Default for Spent {
    fn default() -> Self {
        Spent { usage: Usage::default(), cost_usd: Some(0.0), steps: 0 }
    }
}

impl Spent {
    fn add(&mut self, usage: &Usage, cost: Option<f64>, steps: u32) {
        self.usage.add(usage);
        self.cost_usd = self.cost_usd.zip(cost).map(|(a, b)| a + b);
        self.steps += steps;
    }
}

/// An attempt as its end is recorded.
struct Ended {
    group: Uuid,
    number: i32,
    status: RunStatus,
    summary: String,
}

impl Store {
    /// Records in its group's stream that attempt `run_id` ended
    /// (`attempt.finished`, with what it spent and changed), and ends the
    /// group once every attempt has. Call after the attempt's end is
    /// committed, whoever ended it (its worker, a cancel while it was
    /// queued, the reaper). Does nothing for a run that is not an attempt,
    /// one that has not ended, or one already recorded; two attempts ending
    /// at once are serialised on the group's row, so exactly one of them
    /// ends the group.
    pub async fn attempt_ended(&self, run_id: Uuid) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let Some(ended) = ended_attempt(&tx, run_id).await? else {
            return Ok(());
        };
        let group_status: Option<String> = tx
            .query_opt("SELECT status FROM runs WHERE id = $1 FOR UPDATE", &[&ended.group])
            .await?
            .map(|r| r.try_get(0))
            .transpose()?;
        if group_status.as_deref() != Some("running") {
            return Ok(());
        }
        // Every attempt of the group that has ended and is not in its
        // stream yet, this one among them: another attempt's end may be
        // committed while its worker has not recorded it yet, and the group
        // must not end (below) without it, nor sum what it spent without it.
        let mut last = None;
        for attempt in attempts_of(&tx, ended.group).await? {
            let Some(other) = ended_attempt(&tx, attempt).await? else { continue };
            if already_recorded(&tx, ended.group, attempt).await? {
                continue;
            }
            let finished = finished_event(&tx, attempt, &other).await?;
            last = Some(insert_event_tx(&tx, ended.group, &finished).await?);
            if other.status == RunStatus::Succeeded
                && let Some(seq) = take_first_success_tx(&tx, ended.group, other.number, attempt).await?
            {
                last = Some(seq);
            }
        }
        if let Some(seq) = end_group_if_done(&tx, ended.group).await? {
            last = Some(seq);
        }
        tx.commit().await?;
        if let Some(last) = last {
            self.announce_event(ended.group, last);
        }
        Ok(())
    }
}

/// When group `group` (its row locked by the caller) was made to take its
/// first attempt to succeed (a GitHub deployment's setting) and has no
/// choice yet: chooses attempt `number` (`attempt`, which just succeeded),
/// which owes its pull request at once. The choice's seq, if made.
async fn take_first_success_tx(
    tx: &Transaction<'_>,
    group: Uuid,
    number: i32,
    attempt: Uuid,
) -> Result<Option<i64>, StoreError> {
    let takes = tx
        .query_opt(
            "SELECT 1 FROM runs r JOIN github_runs g ON g.run_id = r.id
             WHERE r.id = $1 AND g.take_first_success AND r.selected_attempt IS NULL AND g.delivered_at IS NULL",
            &[&group],
        )
        .await?;
    if takes.is_none() {
        return Ok(None);
    }
    Ok(Some(super::select::choose_tx(tx, group, number, attempt, None).await?))
}

/// The group's attempts, first to last.
async fn attempts_of(tx: &Transaction<'_>, group: Uuid) -> Result<Vec<Uuid>, StoreError> {
    let rows = tx.query("SELECT id FROM runs WHERE group_run_id = $1 ORDER BY attempt_number", &[&group]).await?;
    rows.iter().map(|r| r.try_get(0).map_err(StoreError::from)).collect()
}

async fn ended_attempt(tx: &Transaction<'_>, run_id: Uuid) -> Result<Option<Ended>, StoreError> {
    let row = tx
        .query_opt(
            "SELECT group_run_id, attempt_number, status, COALESCE(result->>'summary', error, '')
             FROM runs WHERE id = $1 AND group_run_id IS NOT NULL",
            &[&run_id],
        )
        .await?;
    let Some(row) = row else { return Ok(None) };
    let status: String = row.try_get(2)?;
    let status: RunStatus = status.parse().map_err(|e: kiln_protocol::run::UnknownStatus| StoreError::Corrupt(e.0))?;
    if !status.is_terminal() {
        return Ok(None);
    }
    Ok(Some(Ended { group: row.try_get(0)?, number: row.try_get(1)?, status, summary: row.try_get(3)? }))
}

async fn already_recorded(tx: &Transaction<'_>, group: Uuid, run_id: Uuid) -> Result<bool, StoreError> {
    let row = tx
        .query_opt(
            "SELECT 1 FROM events WHERE run_id = $1 AND kind = 'attempt.finished' AND payload->>'run_id' = $2",
            &[&group, &run_id.to_string()],
        )
        .await?;
    Ok(row.is_some())
}

/// `attempt.finished` for `ended`: what it spent (its steps, compactions
/// and sub-agents, as its stream reports them) and changed.
async fn finished_event(tx: &Transaction<'_>, run_id: Uuid, ended: &Ended) -> Result<EventBody, StoreError> {
    let rows = tx
        .query(
            "SELECT seq, kind, payload, at FROM events
             WHERE run_id = $1 AND kind IN ('step.finished', 'compaction', 'subagent.finished') ORDER BY seq",
            &[&run_id],
        )
        .await?;
    let mut spent = Spent::default();
    for row in &rows {
        let event =
            StoredEvent { seq: row.try_get(0)?, kind: row.try_get(1)?, payload: row.try_get(2)?, at: row.try_get(3)? };
        match event.body() {
            Some(EventBody::StepFinished { usage, cost_usd, .. }) => spent.add(&usage, cost_usd, 1),
            Some(EventBody::Compaction { usage, cost_usd, .. }) => spent.add(&usage, cost_usd, 0),
            Some(EventBody::SubagentFinished { usage, cost_usd, steps, .. }) => spent.add(&usage, cost_usd, steps),
            _ => {}
        }
    }
    let changes = tx
        .query_opt(
            "SELECT file_count, additions, deletions FROM run_changes WHERE run_id = $1 AND scope = 'run'",
            &[&run_id],
        )
        .await?
        .map(|r| -> Result<ChangeTotals, StoreError> {
            let count = |i: usize| r.try_get::<_, i64>(i).map(|n| n.max(0) as u64);
            Ok(ChangeTotals { files: count(0)?, additions: count(1)?, deletions: count(2)? })
        })
        .transpose()?;
    Ok(EventBody::AttemptFinished {
        attempt: ended.number.max(0) as u32,
        run_id,
        status: ended.status.as_str().to_owned(),
        summary: ended.summary.clone(),
        usage: spent.usage,
        cost_usd: spent.cost_usd,
        steps: spent.steps,
        changes,
    })
}

/// Ends group `group` (its row locked by the caller) if no attempt of it is
/// still to end, an attempt counting as ended once its `attempt.finished`
/// is in the group's stream — not by its status alone: an attempt whose
/// end commits after the caller's loop read it (each statement reads the
/// latest commits) would otherwise end the group without its event and
/// its spending, and its own call, finding the group ended, would add
/// neither. Left to that call, it ends the group then. `cancelled` when a
/// client cancelled the group,
/// `succeeded` when an attempt did, `failed` otherwise. Its result holds
/// each attempt's end and the sum of what they spent. Returns the terminal
/// event's seq.
async fn end_group_if_done(tx: &Transaction<'_>, group: Uuid) -> Result<Option<i64>, StoreError> {
    let rows = tx
        .query(
            "SELECT g.cancel_requested, a.attempt_number, a.status, a.id,
                    EXISTS (SELECT 1 FROM events e WHERE e.run_id = g.id AND e.kind = 'attempt.finished'
                            AND e.payload->>'run_id' = a.id::text)
             FROM runs g JOIN runs a ON a.group_run_id = g.id
             WHERE g.id = $1 ORDER BY a.attempt_number",
            &[&group],
        )
        .await?;
    let mut attempts = Vec::with_capacity(rows.len());
    let mut cancelled = false;
    for row in &rows {
        cancelled = row.try_get(0)?;
        let status: String = row.try_get(2)?;
        let status: RunStatus =
            status.parse().map_err(|e: kiln_protocol::run::UnknownStatus| StoreError::Corrupt(e.0))?;
        let recorded: bool = row.try_get(4)?;
        if !status.is_terminal() || !recorded {
            return Ok(None);
        }
        attempts.push((row.try_get::<_, i32>(1)?, status, row.try_get::<_, Uuid>(3)?));
    }
    let totals = group_totals(tx, group).await?;
    let succeeded = attempts.iter().filter(|(_, s, _)| *s == RunStatus::Succeeded).count();
    let summary =
        format!("{succeeded} of {} attempts succeeded; choose one with POST /v1/runs/{group}/select", attempts.len());
    let terminal = if cancelled {
        EventBody::RunCancelled { reason: "cancelled by client".into() }
    } else if succeeded > 0 {
        EventBody::RunSucceeded { summary: summary.clone() }
    } else {
        EventBody::RunFailed { error: format!("no attempt succeeded ({})", ends(&attempts)) }
    };
    let result = serde_json::json!({
        "summary": summary,
        "attempts": attempts.iter().map(|(n, s, id)| serde_json::json!({"attempt": n, "run_id": id, "status": s}))
            .collect::<Vec<_>>(),
        "usage": totals.usage,
        "cost_usd": totals.cost_usd,
        "steps": totals.steps,
    });
    let (status, error, _, _) = terminal_parts(&terminal)?;
    tx.execute(
        "UPDATE runs SET status = $2, finished_at = now(), result = $3, error = $4 WHERE id = $1",
        &[&group, &status.as_str(), &result, &error],
    )
    .await?;
    Ok(Some(insert_event_tx(tx, group, &terminal).await?))
}

/// "attempt 1 failed, attempt 2 cancelled".
fn ends(attempts: &[(i32, RunStatus, Uuid)]) -> String {
    attempts.iter().map(|(n, s, _)| format!("attempt {n} {s}")).collect::<Vec<_>>().join(", ")
}

/// The sum of the group's `attempt.finished` events.
async fn group_totals(tx: &Transaction<'_>, group: Uuid) -> Result<Spent, StoreError> {
    let rows = tx
        .query("SELECT seq, kind, payload, at FROM events WHERE run_id = $1 AND kind = 'attempt.finished'", &[&group])
        .await?;
    let mut totals = Spent::default();
    for row in &rows {
        let event =
            StoredEvent { seq: row.try_get(0)?, kind: row.try_get(1)?, payload: row.try_get(2)?, at: row.try_get(3)? };
        if let Some(EventBody::AttemptFinished { usage, cost_usd, steps, .. }) = event.body() {
            totals.add(&usage, cost_usd, steps);
        }
    }
    Ok(totals)
}
