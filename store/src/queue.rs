//! The run queue: claim, heartbeat, finish, reap.
//!
//! Claiming is one short statement (`FOR UPDATE SKIP LOCKED`), committed at
//! once; the agent loop runs outside any transaction. Every write a worker
//! makes afterwards is fenced by its [`Lease`].

use std::sync::LazyLock;
use std::time::Duration;

use kiln_protocol::{EventBody, Run, RunStatus};
use uuid::Uuid;

use crate::end_batch::End;
use crate::events::insert_event_tx;
use crate::lease::{HEARTBEAT, HeartbeatOutcome, Lease, ReapedRun, millis, terminal_parts};
use crate::queue_sql::{claim_statement, finish_and_claim_statement, finish_statement};
use crate::rows::run_from_row;
use crate::{Store, StoreError, channels};

/// Built once: the hot paths look them up in the prepared-statement cache.
static CLAIM: LazyLock<String> = LazyLock::new(claim_statement);
static FINISH: LazyLock<String> = LazyLock::new(finish_statement);
static FINISH_AND_CLAIM: LazyLock<String> = LazyLock::new(finish_and_claim_statement);

impl Store {
    /// Claims the oldest queued run (highest priority first) for `worker`.
    pub async fn claim_run(&self, worker: &str, lease: Duration) -> Result<Option<(Run, Lease)>, StoreError> {
        let client = self.client().await?;
        // Prepared once per connection: claims are the queue's hot path, and
        // an unprepared query costs a second round trip every time.
        let claim = client.prepare_cached(&CLAIM).await?;
        let row = client.query_opt(&claim, &[&worker, &millis(lease)]).await?;
        let Some(row) = row else { return Ok(None) };
        let run = run_from_row(&row)?;
        let lease = Lease { run_id: run.id, attempt: run.attempt, worker: worker.to_owned() };
        Ok(Some((run, lease)))
    }

    /// Extends the lease. Fails with `LeaseLost` when the run was reclaimed
    /// or finished, which tells the worker to stop touching it.
    pub async fn heartbeat(&self, lease: &Lease, extend: Duration) -> Result<HeartbeatOutcome, StoreError> {
        let client = self.client().await?;
        // Prepared once per connection: every running run beats.
        let statement = client.prepare_cached(HEARTBEAT).await?;
        let row =
            client.query_opt(&statement, &[&lease.run_id, &lease.attempt, &lease.worker, &millis(extend)]).await?;
        match row {
            Some(r) => Ok(HeartbeatOutcome { cancel_requested: r.try_get(0)? }),
            None => Err(StoreError::LeaseLost(lease.run_id)),
        }
    }

    /// Moves a held run to a terminal status and writes its terminal event,
    /// in one statement.
    pub async fn finish_run(
        &self,
        lease: &Lease,
        terminal: &EventBody,
        result: Option<&serde_json::Value>,
    ) -> Result<(), StoreError> {
        let (status, error, kind, payload) = terminal_parts(terminal)?;
        // The status move, the seq bump and the terminal event in one
        // statement: one round trip and one commit, and nothing at all when
        // the lease is gone. The notification follows the commit (notifier).
        let client = self.client().await?;
        let finish = client.prepare_cached(&FINISH).await?;
        let row = client
            .query_opt(
                &finish,
                &[&lease.run_id, &lease.attempt, &lease.worker, &status.as_str(), &result, &error, &kind, &payload],
            )
            .await?;
        drop(client);
        let Some(row) = row else { return Err(StoreError::LeaseLost(lease.run_id)) };
        self.announce_event(lease.run_id, row.try_get("seq")?);
        if row.try_get("follow_up_owed")? {
            self.queue_owed_follow_ups(&[lease.run_id]).await;
        }
        Ok(())
    }

    /// [`Store::finish_run`], and in the same statement (one commit) the
    /// claim of the next queued run for `next_worker`, as
    /// [`Store::claim_run`] would: for a worker that has a slot free once
    /// this run ends. Runs of one worker that end while such a statement is
    /// in flight share the next one (`end_batch`).
    pub async fn finish_run_and_claim(
        &self,
        lease: &Lease,
        terminal: &EventBody,
        result: Option<&serde_json::Value>,
        next_worker: &str,
        next_lease: Duration,
    ) -> Result<Option<(Run, Lease)>, StoreError> {
        let end = End {
            lease: lease.clone(),
            terminal: terminal.clone(),
            result: result.cloned(),
            next_worker: next_worker.to_owned(),
            next_lease,
        };
        self.end_batcher.end(self, end).await
    }

    /// [`Store::finish_run_and_claim`] for this run alone.
    pub(crate) async fn finish_run_and_claim_alone(&self, end: &End) -> Result<Option<(Run, Lease)>, StoreError> {
        let End { lease, terminal, result, next_worker, next_lease } = end;
        let (status, error, kind, payload) = terminal_parts(terminal)?;
        let client = self.client().await?;
        let statement = client.prepare_cached(&FINISH_AND_CLAIM).await?;
        let row = client
            .query_opt(
                &statement,
                &[
                    &lease.run_id,
                    &lease.attempt,
                    &lease.worker,
                    &status.as_str(),
                    &result,
                    &error,
                    &kind,
                    &payload,
                    &next_worker,
                    &millis(*next_lease),
                ],
            )
            .await?;
        drop(client);
        let Some(row) = row else { return Err(StoreError::LeaseLost(lease.run_id)) };
        self.announce_event(lease.run_id, row.try_get("ended_seq")?);
        if row.try_get("follow_up_owed")? {
            self.queue_owed_follow_ups(&[lease.run_id]).await;
        }
        if row.try_get::<_, Option<Uuid>>(0)?.is_none() {
            return Ok(None);
        }
        let run = run_from_row(&row)?;
        let next = Lease { run_id: run.id, attempt: run.attempt, worker: next_worker.clone() };
        Ok(Some((run, next)))
    }

    /// Hands a held run back to the queue (graceful shutdown), so another
    /// worker takes it at once instead of after the lease times out.
    pub async fn release_run(&self, lease: &Lease) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "WITH rel AS (
                     UPDATE runs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL
                     WHERE id = $1 AND attempt = $2 AND lease_owner = $3
                       AND status IN ('running', 'awaiting_approval')
                     RETURNING id
                 )
                 SELECT pg_notify($4, id::text) FROM rel",
                &[&lease.run_id, &lease.attempt, &lease.worker, &channels::RUNS_QUEUED],
            )
            .await?;
        Ok(())
    }

    /// Hands back runs `worker` holds but is not running (`running` lists
    /// what it runs) and has not extended for `quiet`: claims whose commit
    /// succeeded while their answer was lost with the connection (a run's
    /// end claims the next in its statement), or left by an earlier process
    /// with the same worker id. Another worker (or this one) takes them now,
    /// not when their lease runs out, and they do not count as lost. A claim
    /// younger than `quiet` is left alone: it may be on its way to a task.
    pub async fn release_unattended(
        &self,
        worker: &str,
        running: &[Uuid],
        lease: Duration,
        quiet: Duration,
    ) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let released = client
            .query(
                "WITH rel AS (
                     UPDATE runs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL
                     WHERE lease_owner = $1 AND status IN ('running', 'awaiting_approval')
                       AND id <> ALL($2)
                       AND lease_expires_at < now() + ($3::float8 - $4::float8) * interval '1 millisecond'
                     RETURNING id
                 )
                 SELECT pg_notify($5, id::text) FROM rel",
                &[&worker, &running, &millis(lease), &millis(quiet), &channels::RUNS_QUEUED],
            )
            .await?;
        Ok(released.len() as u64)
    }

    /// Returns runs whose lease expired to the queue, or fails them when
    /// their worker has been lost `max_attempts` times (graceful releases
    /// do not count).
    pub async fn reap_expired_leases(&self) -> Result<Vec<ReapedRun>, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let reaped = lose_runs(
            &tx,
            "SELECT id FROM runs
             WHERE status IN ('running', 'awaiting_approval') AND lease_expires_at < now()
             FOR UPDATE SKIP LOCKED",
            &[],
        )
        .await?;
        tx.commit().await?;
        drop(client);
        // An attempt failed here ends in its group's stream too.
        for run in reaped.iter().filter(|r| r.status.is_terminal()) {
            if let Err(e) = self.attempt_ended(run.run_id).await {
                tracing::warn!(run_id = %run.run_id, error = %e, "recording a lost attempt's end in its group failed");
            }
        }
        // The runs failed here may owe a follow-up, and so may runs whose
        // ending process stopped before it queued theirs (`follow_ups`).
        if let Err(e) = self.sweep_owed_follow_ups().await {
            tracing::warn!(error = %e, "looking for owed follow-ups failed; the next sweep will");
        }
        Ok(reaped)
    }
}

/// Returns the runs `lost` selects (a query answering their ids, locking
/// them) to the queue, or fails them when their worker has now been lost
/// `max_attempts` times: their worker is gone, so the loss counts.
pub(crate) async fn lose_runs(
    tx: &deadpool_postgres::Transaction<'_>,
    lost: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<ReapedRun>, StoreError> {
    let rows = tx
        .query(
            &format!(
                "WITH lost AS ({lost})
                 UPDATE runs r SET
                     status = CASE WHEN r.losses + 1 >= r.max_attempts THEN 'failed' ELSE 'queued' END,
                     finished_at = CASE WHEN r.losses + 1 >= r.max_attempts THEN now() END,
                     error = CASE WHEN r.losses + 1 >= r.max_attempts
                                  THEN 'the worker running this run was lost ' || (r.losses + 1) || ' times; giving up'
                             END,
                     losses = r.losses + 1,
                     lease_owner = NULL, lease_expires_at = NULL
                 FROM lost e WHERE r.id = e.id
                 RETURNING r.id, r.status, r.attempt, r.losses"
            ),
            params,
        )
        .await?;
    let mut reaped = Vec::with_capacity(rows.len());
    for row in &rows {
        let run_id: Uuid = row.try_get(0)?;
        let status: String = row.try_get(1)?;
        let attempt: i32 = row.try_get(2)?;
        let losses: i32 = row.try_get(3)?;
        let status: RunStatus =
            status.parse().map_err(|e: kiln_protocol::run::UnknownStatus| StoreError::Corrupt(e.to_string()))?;
        if status == RunStatus::Failed {
            let error = format!("the worker running this run was lost {losses} times; giving up");
            insert_event_tx(tx, run_id, &EventBody::RunFailed { error }).await?;
        } else {
            tx.execute("SELECT pg_notify($1, $2)", &[&channels::RUNS_QUEUED, &run_id.to_string()]).await?;
        }
        reaped.push(ReapedRun { run_id, status, attempt });
    }
    Ok(reaped)
}
