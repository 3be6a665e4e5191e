//! What the tables of owed work share: `git_deliveries` (a run's or a
//! group's push), `github_runs`' delivery columns (a GitHub report) and
//! `run_callbacks` (a completion callback). Each holds one row per run that
//! is owed something; a worker claims a row under a lease (a random holder
//! and a time it runs out), keeps extending it while it works, and ends it —
//! settled, or owed again — with an event in the same transaction, fenced by
//! the holder. A row a dead worker left is taken over once its lease runs
//! out, never while a live worker holds it.
//!
//! Each table names its columns and what makes a row owed ([`OwedTable`]);
//! the statements are built here, once, so the three claim, extend and end
//! the same way. How a row ends (its `SET`) stays each table's own.

use std::time::Duration;

use kiln_protocol::{EventBody, Run};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use crate::events::insert_event_tx;
use crate::{Store, StoreError};

/// One table of owed work, keyed by `run_id`. In the claim, the row claimed
/// is `d` and the candidate looked for is `o`.
#[derive(Debug)]
pub(crate) struct OwedTable {
    pub table: &'static str,
    /// The lease's holder: the claim's random id.
    pub holder: &'static str,
    /// When the lease runs out.
    pub until: &'static str,
    /// What else a row must be for its holder to extend or end it
    /// (` AND …`), or "".
    pub fence: &'static str,
    /// What else a claim sets (`, column = …`), or "".
    pub claim_sets: &'static str,
    /// What the candidate is joined to (` JOIN runs r ON r.id = o.run_id`),
    /// or "".
    pub join: &'static str,
    /// What makes candidate `o` owed, besides a free lease.
    pub owed: &'static str,
    /// The column of `o` the longest-owed row is found by.
    pub since: &'static str,
    /// The tables a claim locks while it takes the candidate (`o`, `o, r`).
    pub lock: &'static str,
    /// What a claim returns after `d.run_id` (`, d.column, …`), or "".
    pub returning: &'static str,
    /// What is owed, for errors ("git delivery").
    pub what: &'static str,
}

/// A claimed row: the run it is owed by (as it is now), the lease's holder,
/// and the claim's row (`run_id` at 0, then [`OwedTable::returning`]).
pub(crate) struct Claimed {
    pub run: Run,
    pub holder: Uuid,
    pub row: Row,
}

impl OwedTable {
    /// `$1` the holder, `$2` the lease in seconds, `$3` the run (NULL: the
    /// longest-owed).
    fn claim_sql(&self) -> String {
        let OwedTable { table, holder, until, claim_sets, join, owed, since, lock, returning, .. } = self;
        // SKIP LOCKED: two workers claiming at once never get the same row;
        // a row whose lease was just taken is re-checked and left alone.
        format!(
            "UPDATE {table} d
             SET {holder} = $1, {until} = now() + make_interval(secs => $2){claim_sets}
             WHERE d.run_id = (
                 SELECT o.run_id FROM {table} o{join}
                 WHERE {owed}
                   AND (o.{until} IS NULL OR o.{until} < now())
                   AND ($3::uuid IS NULL OR o.run_id = $3)
                 ORDER BY o.{since}
                 LIMIT 1
                 FOR UPDATE OF {lock} SKIP LOCKED)
             RETURNING d.run_id{returning}"
        )
    }

    /// The update of a row its holder still holds: `$1` the run, `$2` the
    /// holder, `sets` numbering its own parameters from `$3`.
    fn held_sql(&self, sets: &str) -> String {
        let OwedTable { table, holder, fence, .. } = self;
        format!("UPDATE {table} SET {sets} WHERE run_id = $1 AND {holder} = $2{fence}")
    }
}

impl Store {
    /// Takes the lease of an owed row of `table` whose lease is free or has
    /// run out: run `run_id`'s, or with `None` the longest-owed. `None`:
    /// nothing owed, or all of it held.
    pub(crate) async fn claim_owed(
        &self,
        table: &OwedTable,
        run_id: Option<Uuid>,
        lease: Duration,
    ) -> Result<Option<Claimed>, StoreError> {
        let holder = Uuid::new_v4();
        let client = self.client().await?;
        let row = client.query_opt(&table.claim_sql(), &[&holder, &lease.as_secs_f64(), &run_id]).await?;
        let Some(row) = row else { return Ok(None) };
        drop(client);
        let run_id: Uuid = row.try_get(0)?;
        let run = self
            .get_run_unscoped(run_id)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("run {run_id} vanished while its {} was owed", table.what)))?;
        Ok(Some(Claimed { run, holder, row }))
    }

    /// Extends `holder`'s lease on run `run_id`'s row; false when it is no
    /// longer `holder`'s (it ran out and another worker took the row over).
    pub(crate) async fn extend_owed(
        &self,
        table: &OwedTable,
        run_id: Uuid,
        holder: Uuid,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let sql = table.held_sql(&format!("{} = now() + make_interval(secs => $3)", table.until));
        let client = self.client().await?;
        let n = client.execute(&sql, &[&run_id, &holder, &lease.as_secs_f64()]).await?;
        Ok(n == 1)
    }

    /// Ends an attempt on run `run_id`'s row: applies `sets` (with `params`
    /// as `$3`, …) and appends `event` to the run's events, in one
    /// transaction. The event's seq; `None`, recording nothing, when the
    /// row is no longer `holder`'s.
    ///
    /// Not fenced by the run's lease: the run has ended and holds none. The
    /// event comes after the terminal one; a live SSE stream has closed by
    /// then, a replay sees it.
    pub(crate) async fn end_owed(
        &self,
        table: &OwedTable,
        (run_id, holder): (Uuid, Uuid),
        sets: &str,
        params: &[&(dyn ToSql + Sync)],
        event: &EventBody,
    ) -> Result<Option<i64>, StoreError> {
        let sql = table.held_sql(sets);
        let all: Vec<&(dyn ToSql + Sync)> =
            [&run_id as &(dyn ToSql + Sync), &holder].into_iter().chain(params.iter().copied()).collect();
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        if tx.execute(&sql, &all).await? == 0 {
            return Ok(None);
        }
        let seq = insert_event_tx(&tx, run_id, event).await?;
        tx.commit().await?;
        Ok(Some(seq))
    }

    /// Hands `holder`'s row back unsettled, so another worker takes it over
    /// at once instead of after the lease.
    pub(crate) async fn release_owed(&self, table: &OwedTable, run_id: Uuid, holder: Uuid) -> Result<(), StoreError> {
        let sql = table.held_sql(&format!("{} = NULL, {} = NULL", table.holder, table.until));
        let client = self.client().await?;
        client.execute(&sql, &[&run_id, &holder]).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: OwedTable = OwedTable {
        table: "t",
        holder: "h",
        until: "u",
        fence: " AND done IS NULL",
        claim_sets: ", started = now()",
        join: " JOIN runs r ON r.id = o.run_id",
        owed: "o.owed",
        since: "since",
        lock: "o, r",
        returning: ", d.x",
        what: "test",
    };

    fn words(sql: &str) -> String {
        sql.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn a_claim_takes_a_free_or_lapsed_lease_of_the_longest_owed_row() {
        assert_eq!(
            words(&T.claim_sql()),
            "UPDATE t d SET h = $1, u = now() + make_interval(secs => $2), started = now() \
             WHERE d.run_id = ( SELECT o.run_id FROM t o JOIN runs r ON r.id = o.run_id \
             WHERE o.owed AND (o.u IS NULL OR o.u < now()) AND ($3::uuid IS NULL OR o.run_id = $3) \
             ORDER BY o.since LIMIT 1 FOR UPDATE OF o, r SKIP LOCKED) RETURNING d.run_id, d.x"
        );
    }

    #[test]
    fn only_the_holder_changes_its_row() {
        assert_eq!(T.held_sql("a = $3"), "UPDATE t SET a = $3 WHERE run_id = $1 AND h = $2 AND done IS NULL");
    }
}
