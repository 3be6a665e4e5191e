//! Choosing one attempt as its group's result.

use kiln_protocol::{EventBody, Run};
use uuid::Uuid;

use super::delivery::{CHOICE_SETTLED, owe_tx};
use crate::events::insert_event_tx;
use crate::{Store, StoreError};

/// What selecting an attempt came to.
#[derive(Debug, Clone)]
pub enum SelectOutcome {
    /// The attempt is the group's result now (the group as it is now).
    Selected(Box<Run>),
    /// No run with this id for this owner.
    NotFound,
    /// The run is not a group of attempts.
    NotAGroup,
    /// The group has fewer attempts than the number asked for (it has this many).
    NoSuchAttempt(i32),
    /// The attempt has not ended: it has no change to choose yet.
    NotEnded,
    /// The group's result was already delivered (or a worker is pushing
    /// it, for `deliver.git`); the choice stands.
    Delivered,
}

impl Store {
    /// Makes attempt `number` of group `group` its result: the attempt's
    /// captured change (its own and its session's) becomes the group's,
    /// replacing an earlier choice, and `attempt.selected` goes into the
    /// group's stream; with `deliver.git`, the push is owed (again). Refused
    /// once the group's result was delivered or its push claimed.
    pub async fn select_attempt(&self, owner: &str, group: Uuid, number: u32) -> Result<SelectOutcome, StoreError> {
        self.select_attempt_by(owner, group, number, None).await
    }

    /// [`Store::select_attempt`], chosen on GitHub by `by` (a `/kiln
    /// select K` comment) when set: a GitHub-triggered group's pull request
    /// is owed, and the worker checks `by`'s access before it pushes.
    pub async fn select_attempt_by(
        &self,
        owner: &str,
        group: Uuid,
        number: u32,
        by: Option<&str>,
    ) -> Result<SelectOutcome, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let settled = format!(
            "SELECT r.attempt_count, {CHOICE_SETTLED}
             FROM runs r WHERE r.id = $1 AND r.owner = $2 FOR UPDATE"
        );
        let row = tx.query_opt(&settled, &[&group, &owner]).await?;
        let Some(row) = row else { return Ok(SelectOutcome::NotFound) };
        let Some(count) = row.try_get::<_, Option<i32>>(0)? else { return Ok(SelectOutcome::NotAGroup) };
        if row.try_get::<_, bool>(1)? || github_settled_tx(&tx, group).await? {
            return Ok(SelectOutcome::Delivered);
        }
        let number = match i32::try_from(number) {
            Ok(n) if (1..=count).contains(&n) => n,
            _ => return Ok(SelectOutcome::NoSuchAttempt(count)),
        };
        let attempt = tx
            .query_one(
                "SELECT id, status IN ('succeeded', 'failed', 'cancelled', 'timed_out')
                 FROM runs WHERE group_run_id = $1 AND attempt_number = $2",
                &[&group, &number],
            )
            .await?;
        let attempt_id: Uuid = attempt.try_get(0)?;
        if !attempt.try_get::<_, bool>(1)? {
            return Ok(SelectOutcome::NotEnded);
        }
        let seq = choose_tx(&tx, group, number, attempt_id, by).await?;
        tx.commit().await?;
        drop(client);
        self.announce_event(group, seq);
        let run = self.get_run(owner, group).await?.ok_or_else(|| StoreError::Corrupt("group vanished".into()))?;
        Ok(SelectOutcome::Selected(Box::new(run)))
    }
}

/// Whether GitHub-triggered group `group`'s pull request was opened, or a
/// worker holds its delivery while it has a choice (it may be pushing it;
/// see `migrations/V26__github_groups.sql`). Locks the group's `github_runs`
/// row, which a delivery's claim skips while it is held, and reads it as
/// it is once locked: a choice lands wholly before a claim, or meets its
/// lease after it.
async fn github_settled_tx(tx: &deadpool_postgres::Transaction<'_>, group: Uuid) -> Result<bool, StoreError> {
    let row = tx
        .query_opt(
            "SELECT g.delivered_at IS NOT NULL
                    OR (r.selected_attempt IS NOT NULL AND COALESCE(g.delivery_lease_until > now(), false))
             FROM github_runs g JOIN runs r ON r.id = g.run_id
             WHERE g.run_id = $1 FOR UPDATE OF g",
            &[&group],
        )
        .await?;
    Ok(row.map(|r| r.try_get::<_, bool>(0)).transpose()?.unwrap_or(false))
}

/// Makes attempt `number` (`attempt`, ended) group `group`'s result, in a
/// transaction holding the group's row: its change, the choice, what the
/// choice owes (a push for `deliver.git`, the pull request of a
/// GitHub-triggered group, whose chooser `by` the worker admits), and
/// `attempt.selected`. Returns the event's seq.
pub(crate) async fn choose_tx(
    tx: &deadpool_postgres::Transaction<'_>,
    group: Uuid,
    number: i32,
    attempt: Uuid,
    by: Option<&str>,
) -> Result<i64, StoreError> {
    take_change_tx(tx, group, attempt).await?;
    tx.execute("UPDATE runs SET selected_attempt = $2 WHERE id = $1", &[&group, &number]).await?;
    owe_tx(tx, group).await?;
    tx.execute(
        "UPDATE github_runs SET selected_by = $2, delivery_requested_at = now()
         WHERE run_id = $1 AND delivered_at IS NULL",
        &[&group, &by],
    )
    .await?;
    let selected = EventBody::AttemptSelected { attempt: number.max(0) as u32, run_id: attempt };
    insert_event_tx(tx, group, &selected).await
}

/// The group's change becomes the attempt's: both scopes, replacing what
/// an earlier choice copied.
async fn take_change_tx(tx: &deadpool_postgres::Transaction<'_>, group: Uuid, attempt: Uuid) -> Result<(), StoreError> {
    tx.execute("DELETE FROM run_changes WHERE run_id = $1", &[&group]).await?;
    tx.execute(
        "INSERT INTO run_changes (run_id, scope, base_commit, tree, files, file_count, additions, deletions,
                                  patch, patch_bytes, too_large)
         SELECT $1, scope, base_commit, tree, files, file_count, additions, deletions, patch, patch_bytes, too_large
         FROM run_changes WHERE run_id = $2",
        &[&group, &attempt],
    )
    .await?;
    Ok(())
}
