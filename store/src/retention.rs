//! Event retention: removing the events of runs that ended long ago.
//!
//! Events are most of the database's bulk (every step, delta and command
//! output of every run). Once a run has ended and nobody will follow it
//! again, its stream can go; the run row (status, result, error) and the
//! conversation stay. The terminal event and anything after it (delivery
//! reports) are kept, so a client that opens the stream of a pruned run still
//! learns how it ended, and the stream still closes.
//!
//! The run's captured change (`run_changes`, patch included) goes with its
//! events; where it was taken from (`run_change_bases`, a few ids) stays.
//!
//! Work goes in small batches, each its own short statement, so pruning never
//! holds locks that claims, appends or reads would wait on for long.

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::events::terminal_kinds;
use crate::{Store, StoreError};

/// Runs looked at per batch. Each costs a scan of its events for the
/// terminal one; the event limit bounds the delete itself.
const RUNS_PER_BATCH: i64 = 50;

/// What one [`Store::prune_events`] call did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub events: u64,
    /// Runs finished with: all their prunable events are gone.
    pub runs: u64,
}

impl Store {
    /// Deletes events of runs that ended more than `older_than` ago, at most
    /// `batch` events per statement, until none are left. Safe to run from
    /// several workers at once: they delete the same rows at worst.
    pub async fn prune_events(&self, older_than: Duration, batch: i64) -> Result<Pruned, StoreError> {
        // One cutoff for the whole pass: a run that crosses it meanwhile must
        // not be marked pruned by a batch that never looked at its events.
        let age_ms = older_than.as_secs_f64() * 1000.0;
        let cutoff: DateTime<Utc> = self
            .client()
            .await?
            .query_one("SELECT now() - $1 * interval '1 millisecond'", &[&age_ms])
            .await?
            .try_get(0)?;
        let mut total = Pruned::default();
        loop {
            let step = self.prune_batch(cutoff, batch).await?;
            total.events += step.events;
            total.runs += step.runs;
            if step == Pruned::default() {
                return Ok(total);
            }
        }
    }

    /// One batch: delete up to `batch` events of the oldest ended runs not yet
    /// pruned (at most [`RUNS_PER_BATCH`] runs), then mark those of the runs
    /// it looked at that have nothing left to prune.
    async fn prune_batch(&self, cutoff: DateTime<Utc>, batch: i64) -> Result<Pruned, StoreError> {
        let client = self.client().await?;
        // Runs in `runs_prunable` order; per run, the events before its
        // terminal event. A run without a terminal event (it cannot be
        // ended, but be safe) yields none: `seq < NULL` is never true.
        // Returns the runs looked at, so that only those are marked.
        let row = client
            .query_one(
                concat!(
                    "WITH old AS (
                     SELECT r.id,
                            (SELECT min(t.seq) FROM events t WHERE t.run_id = r.id AND t.kind IN ",
                    terminal_kinds!(),
                    ") AS keep_from
                     FROM runs r
                     WHERE r.finished_at IS NOT NULL AND r.events_pruned_at IS NULL
                       AND r.finished_at < $1
                     ORDER BY r.finished_at
                     LIMIT $3
                 ), doomed AS (
                     SELECT e.run_id, e.seq FROM old o JOIN events e ON e.run_id = o.id AND e.seq < o.keep_from
                     LIMIT $2
                 ), deleted AS (
                     DELETE FROM events e USING doomed d WHERE e.run_id = d.run_id AND e.seq = d.seq RETURNING 1
                 ), changes AS (
                     -- A run's captured change goes with its events.
                     DELETE FROM run_changes c USING old o WHERE c.run_id = o.id
                 )
                 SELECT (SELECT count(*) FROM deleted), ARRAY(SELECT id FROM old)"
                ),
                &[&cutoff, &batch, &RUNS_PER_BATCH],
            )
            .await?;
        let events: i64 = row.try_get(0)?;
        let examined: Vec<Uuid> = row.try_get(1)?;
        if events > 0 {
            // More may be left in these runs; mark none until a batch finds
            // nothing to delete, so a run is never marked half-pruned.
            return Ok(Pruned { events: events.unsigned_abs(), runs: 0 });
        }
        // Nothing deleted does not mean nothing left: a concurrent pass may
        // have taken these rows and not yet finished these runs. So mark
        // only the runs this batch looked at, and only those that really
        // have no event left before their terminal one.
        let runs = client.execute(MARK_PRUNED, &[&examined]).await?;
        Ok(Pruned { events: 0, runs })
    }
}

/// Marks the runs `$1` pruned that have no event left before their
/// terminal one.
const MARK_PRUNED: &str = concat!(
    "UPDATE runs r SET events_pruned_at = now()
     WHERE r.id = ANY($1) AND r.events_pruned_at IS NULL
       AND NOT EXISTS (
           SELECT 1 FROM events e
           WHERE e.run_id = r.id
             AND e.seq < (SELECT min(t.seq) FROM events t WHERE t.run_id = r.id AND t.kind IN ",
    terminal_kinds!(),
    "))"
);
