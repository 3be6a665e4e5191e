//! Runs as clients see them: create, read, list, cancel. Every query is
//! scoped by `owner` so one subject never sees another's runs.

use chrono::{DateTime, Datelike, Utc};
use kiln_protocol::{EventBody, Run, RunStatus};
use uuid::Uuid;

use crate::admission::Verdict;
use crate::events::insert_event_tx;
use crate::queued::{Candidate, NewRun, QueuedRun, QuotaCounts, QuotaLimits, insert_queued_run_tx};
use crate::rows::{RUN_COLUMNS, run_from_row};
use crate::{Store, StoreError, channels};

/// Per-subject limits checked when a run is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Runs queued, running or awaiting approval at once.
    pub max_active_runs: i64,
    /// Runs created in any sliding minute.
    pub max_runs_per_minute: i64,
}

impl Quota {
    /// A limit that is no limit: not counted, and with both limits so, a
    /// submission takes no per-subject lock.
    pub const UNLIMITED: i64 = QuotaLimits::UNLIMITED;
}

impl From<&Quota> for QuotaLimits {
    fn from(quota: &Quota) -> Self {
        QuotaLimits { max_active_runs: quota.max_active_runs, max_runs_per_minute: quota.max_runs_per_minute }
    }
}

/// Why a run was not created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuotaRefusal {
    TooManyActive { limit: i64 },
    TooFast { limit: i64, retry_after_s: u64 },
}

/// One page of a listing, newest first.
#[derive(Debug, Clone)]
pub struct RunPage {
    pub runs: Vec<Run>,
    /// Pass back as `cursor` to get the next page; `None` on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone)]
pub enum CancelOutcome {
    /// The run was queued and is now cancelled.
    Cancelled(Run),
    /// The run is active; its worker has been told to stop.
    Requested(Run),
    /// The run had already finished.
    AlreadyFinished(Run),
    NotFound,
}

impl Store {
    /// Creates a session and a queued run in one transaction, with its
    /// `run.queued` event, and wakes a worker. With an idempotency key, a
    /// second call returns the first run; the bool says whether it is new.
    pub async fn create_run(&self, new: NewRun) -> Result<(Run, bool), StoreError> {
        match self.create_run_within(new, None).await? {
            Ok(created) => Ok(created),
            Err(refusal) => Err(StoreError::Corrupt(format!("quota refusal without a quota: {refusal:?}"))),
        }
    }

    /// [`Store::create_run`], refusing when `owner` is over `quota`. The
    /// check and the insert are serialised per owner in the database, so
    /// concurrent requests cannot both slip under the limit.
    pub async fn create_run_within(
        &self,
        new: NewRun,
        quota: Option<&Quota>,
    ) -> Result<Result<(Run, bool), QuotaRefusal>, StoreError> {
        if let Some(key) = &new.idempotency_key
            && let Some(run) = self.run_by_idempotency_key(&new.owner, key).await?
        {
            return Ok(Ok((run, false)));
        }
        if let Some(quota) = quota
            && new.spec.attempts.is_none()
        {
            return self.create_admitted_run(&new, quota).await;
        }
        // A group of attempts is several statements: the quota's lock is
        // taken by the first and held to the commit.
        let _line = match quota {
            Some(_) => Some(self.owner_gate.enter(&new.owner).await?),
            None => None,
        };
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        if let Some(quota) = quota
            && let Some(refusal) = check_quota_tx(&tx, &new.owner, quota).await?
        {
            return Ok(Err(refusal));
        }
        let Some(crate::attempts::InsertedGroup { group: run_id, attempts }) = insert_run_tx(&tx, &new).await? else {
            // Lost a race with a concurrent request carrying the same key.
            tx.rollback().await?;
            drop(client);
            let key = new.idempotency_key.as_deref().unwrap_or_default();
            return match self.run_by_idempotency_key(&new.owner, key).await? {
                Some(run) => Ok(Ok((run, false))),
                None => Err(StoreError::Corrupt("idempotency conflict without a run".into())),
            };
        };
        let select = tx.prepare_cached(&SELECT_RUN).await?;
        let row = tx.query_one(&select, &[&run_id]).await?;
        let run = run_from_row(&row)?;
        tx.commit().await?;
        // After the commit, from the notifier (see `notifier`): a notifying
        // transaction holds a database-wide lock through its commit, so
        // notifying inside would make concurrent submissions commit one at
        // a time.
        self.announce_created(run_id, &attempts);
        Ok(Ok((run, true)))
    }

    /// Single-run submissions this process is admitting (waiting in an
    /// admission line or in its statement): the admission's backlog.
    pub fn submissions_in_admission(&self) -> usize {
        self.admission_lines.under_way()
    }

    /// Tells workers of a new run, or of a new group's attempts.
    fn announce_created(&self, run_id: Uuid, attempts: &[Uuid]) {
        if attempts.is_empty() {
            self.announce_queued(run_id);
        } else {
            // The group is never claimed; its attempts are.
            self.announce_event(run_id, 1);
            attempts.iter().for_each(|&id| self.announce_queued(id));
        }
    }

    /// A single run under `quota`: the check, the insert and the run as
    /// inserted are one autocommitted statement, shared with the subject's
    /// other submissions under way in this process (`admission`), so they
    /// wait for one another for at most a statement, not a commit each. The
    /// answer is the run as created (queued), whatever a worker that claims
    /// it at once does next.
    async fn create_admitted_run(
        &self,
        new: &NewRun,
        quota: &Quota,
    ) -> Result<Result<(Run, bool), QuotaRefusal>, StoreError> {
        let single = single_attempt(new);
        let candidate = Candidate::of(QueuedRun::first(&single)?)?;
        match self.admission_lines.admit(self, QuotaLimits::from(quota), candidate).await? {
            Verdict::Admitted(run) => {
                self.announce_queued(run.id);
                Ok(Ok((*run, true)))
            }
            Verdict::Refused(counts) => refusal(&counts, quota)
                .map(Err)
                .ok_or_else(|| StoreError::Corrupt("a submission refused under its quota".into())),
            Verdict::KeyTaken => {
                // Lost a race with a concurrent request carrying the same key.
                let key = new.idempotency_key.as_deref().unwrap_or_default();
                match self.run_by_idempotency_key(&new.owner, key).await? {
                    Some(run) => Ok(Ok((run, false))),
                    None => Err(StoreError::Corrupt("idempotency conflict without a run".into())),
                }
            }
        }
    }

    async fn run_by_idempotency_key(&self, owner: &str, key: &str) -> Result<Option<Run>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "SELECT {RUN_COLUMNS} FROM runs r JOIN sessions s ON s.id = r.session_id
                     WHERE r.owner = $1 AND r.idempotency_key = $2"
                ),
                &[&owner, &key],
            )
            .await?;
        row.as_ref().map(run_from_row).transpose()
    }

    /// The run if it exists and belongs to `owner`.
    pub async fn get_run(&self, owner: &str, id: Uuid) -> Result<Option<Run>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "SELECT {RUN_COLUMNS} FROM runs r JOIN sessions s ON s.id = r.session_id
                     WHERE r.id = $1 AND r.owner = $2"
                ),
                &[&id, &owner],
            )
            .await?;
        row.as_ref().map(run_from_row).transpose()
    }

    /// The run regardless of owner: for the worker, which holds its lease.
    pub async fn get_run_unscoped(&self, id: Uuid) -> Result<Option<Run>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!("SELECT {RUN_COLUMNS} FROM runs r JOIN sessions s ON s.id = r.session_id WHERE r.id = $1"),
                &[&id],
            )
            .await?;
        row.as_ref().map(run_from_row).transpose()
    }

    /// `owner`'s runs, newest first. `cursor` is a value from a previous
    /// page's `next_cursor`.
    pub async fn list_runs(
        &self,
        owner: &str,
        status: Option<RunStatus>,
        limit: u32,
        cursor: Option<&Cursor>,
    ) -> Result<RunPage, StoreError> {
        let client = self.client().await?;
        let status = status.map(RunStatus::as_str);
        let (after_at, after_id) = match cursor {
            Some(c) => (Some(c.created_at), Some(c.id)),
            None => (None, None),
        };
        // Fetch one extra row to know whether another page exists.
        let fetch = i64::from(limit) + 1;
        let rows = client
            .query(
                &format!(
                    "SELECT {RUN_COLUMNS} FROM runs r JOIN sessions s ON s.id = r.session_id
                     WHERE r.owner = $1
                       AND ($2::text IS NULL OR r.status = $2)
                       AND ($3::timestamptz IS NULL OR (r.created_at, r.id) < ($3, $4))
                     ORDER BY r.created_at DESC, r.id DESC
                     LIMIT $5"
                ),
                &[&owner, &status, &after_at, &after_id, &fetch],
            )
            .await?;
        let mut runs = rows.iter().map(run_from_row).collect::<Result<Vec<_>, _>>()?;
        let next_cursor = if runs.len() > limit as usize {
            runs.truncate(limit as usize);
            runs.last().map(|r| Cursor { created_at: r.created_at, id: r.id }.encode())
        } else {
            None
        };
        Ok(RunPage { runs, next_cursor })
    }

    /// Cancels a queued run at once, or asks the worker of an active run to
    /// stop (it writes `run.cancelled` when it has).
    pub async fn cancel_run(&self, owner: &str, id: Uuid) -> Result<CancelOutcome, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let row = tx
            .query_opt(
                "SELECT status, attempt_count IS NOT NULL FROM runs WHERE id = $1 AND owner = $2 FOR UPDATE",
                &[&id, &owner],
            )
            .await?;
        let Some(row) = row else {
            return Ok(CancelOutcome::NotFound);
        };
        let status: String = row.try_get(0)?;
        let status: RunStatus =
            status.parse().map_err(|e: kiln_protocol::run::UnknownStatus| StoreError::Corrupt(e.to_string()))?;
        if row.try_get::<_, bool>(1)? && !status.is_terminal() {
            let ended = crate::attempts::cancel_group_tx(&tx, id).await?;
            tx.commit().await?;
            drop(client);
            return self.group_cancelled(owner, id, &ended).await;
        }
        let outcome = match status {
            RunStatus::Queued => {
                cancel_queued_tx(&tx, id).await?;
                Kind::Cancelled
            }
            RunStatus::Running | RunStatus::AwaitingApproval => {
                request_cancel_tx(&tx, id).await?;
                Kind::Requested
            }
            _ => Kind::Finished,
        };
        tx.commit().await?;
        drop(client);
        if matches!(outcome, Kind::Cancelled) {
            // An attempt cancelled while queued: its group's stream says so.
            self.attempt_ended(id).await?;
        }
        let run = self.get_run(owner, id).await?.ok_or_else(|| StoreError::Corrupt("cancelled run vanished".into()))?;
        Ok(match outcome {
            Kind::Cancelled => CancelOutcome::Cancelled(run),
            Kind::Requested => CancelOutcome::Requested(run),
            Kind::Finished => CancelOutcome::AlreadyFinished(run),
        })
    }
}

/// Inserts `new` as one queued run, or as a group with its attempts; None if
/// a run with its idempotency key came first.
async fn insert_run_tx(
    tx: &deadpool_postgres::Transaction<'_>,
    new: &NewRun,
) -> Result<Option<crate::attempts::InsertedGroup>, StoreError> {
    Ok(match new.spec.attempts {
        Some(n) => crate::attempts::insert_group_tx(tx, new, n).await?,
        None => insert_queued_run_tx(tx, &QueuedRun::first(&single_attempt(new))?)
            .await?
            .map(|group| crate::attempts::InsertedGroup { group, attempts: Vec::new() }),
    })
}

/// Cancels a run that has not started, and the children waiting with it.
async fn cancel_queued_tx(tx: &deadpool_postgres::Transaction<'_>, id: Uuid) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE runs SET status = 'cancelled', cancel_requested = true, finished_at = now(),
                error = 'cancelled before it started'
         WHERE id = $1 AND status = 'queued'",
        &[&id],
    )
    .await?;
    insert_event_tx(tx, id, &EventBody::RunCancelled { reason: "cancelled by client before it started".into() })
        .await?;
    // A parent waiting for a takeover may have children waiting
    // with it; only its next attempt would have driven them.
    crate::children::end_children_tx(
        tx,
        id,
        &EventBody::RunCancelled { reason: "the parent run was cancelled".into() },
    )
    .await?;
    Ok(())
}

/// Asks the worker of an active run to stop.
async fn request_cancel_tx(tx: &deadpool_postgres::Transaction<'_>, id: Uuid) -> Result<(), StoreError> {
    tx.execute("UPDATE runs SET cancel_requested = true WHERE id = $1", &[&id]).await?;
    tx.execute("SELECT pg_notify($1, $2)", &[&channels::RUN_CANCEL, &id.to_string()]).await?;
    Ok(())
}

impl Store {
    /// After a group's cancel: the ends of the attempts cancelled while
    /// queued go into its stream (the last of them ends the group); the
    /// group is cancelled now, or once its active attempts' workers stop.
    async fn group_cancelled(&self, owner: &str, id: Uuid, ended: &[Uuid]) -> Result<CancelOutcome, StoreError> {
        for &attempt in ended {
            self.attempt_ended(attempt).await?;
        }
        let run =
            self.get_run(owner, id).await?.ok_or_else(|| StoreError::Corrupt("cancelled group vanished".into()))?;
        Ok(if run.status.is_terminal() { CancelOutcome::Cancelled(run) } else { CancelOutcome::Requested(run) })
    }
}

/// A run without `attempts` is its own single attempt: the first of its
/// `attempt_models` is its model, and `group_limits` narrows its budget.
fn single_attempt(new: &NewRun) -> std::borrow::Cow<'_, NewRun> {
    if new.spec.attempt_models.is_none() && new.spec.group_limits.is_none() {
        return std::borrow::Cow::Borrowed(new);
    }
    let mut single = new.clone();
    (single.spec.model, single.spec.limits) = new.spec.attempt_settings(1, 1);
    std::borrow::Cow::Owned(single)
}

/// Counts `owner`'s active and recent runs, each up to its limit, under a
/// per-owner lock held to the end of the caller's transaction
/// (`kiln_quota_check`, migrations/V29).
pub(crate) async fn check_quota_tx(
    tx: &deadpool_postgres::Transaction<'_>,
    owner: &str,
    quota: &Quota,
) -> Result<Option<QuotaRefusal>, StoreError> {
    // Prepared once per connection, like every statement of a submission:
    // an unprepared one costs a second round trip.
    let check = tx.prepare_cached("SELECT * FROM kiln_quota_check($1, $2, $3)").await?;
    let [max_active, max_recent] = QuotaLimits::from(quota).counted();
    let row = tx.query_one(&check, &[&owner, &max_active, &max_recent]).await?;
    Ok(refusal(&QuotaCounts::from_row(&row, 0)?, quota))
}

/// Why `quota` refuses one more run to a subject with these counts, if it does.
fn refusal(counts: &QuotaCounts, quota: &Quota) -> Option<QuotaRefusal> {
    if counts.active >= quota.max_active_runs {
        return Some(QuotaRefusal::TooManyActive { limit: quota.max_active_runs });
    }
    if counts.recent >= quota.max_runs_per_minute {
        // At most a minute: the count's clock is its transaction's start,
        // which may come before a run it counts was created (a statement
        // that waited for the subject's lock sees what committed meanwhile).
        let retry_after_s = counts.retry_after_s.unwrap_or(1.0).ceil().clamp(1.0, 60.0) as u64;
        return Some(QuotaRefusal::TooFast { limit: quota.max_runs_per_minute, retry_after_s });
    }
    None
}

/// A run with its session's repository, by id.
pub(crate) static SELECT_RUN: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!("SELECT {RUN_COLUMNS} FROM runs r JOIN sessions s ON s.id = r.session_id WHERE r.id = $1")
});

impl Store {
    /// Tells workers that `run_id` was queued, and SSE streams of its
    /// `run.queued` event (seq 1). Call after the commit that queued it.
    pub(crate) fn announce_queued(&self, run_id: Uuid) {
        self.notifier.notify(channels::RUNS_QUEUED, run_id.to_string());
        self.announce_event(run_id, 1);
    }
}

enum Kind {
    Cancelled,
    Requested,
    Finished,
}

/// Position in a newest-first listing: the last run of the previous page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub created_at: DateTime<Utc>,
    pub id: Uuid,
}

impl Cursor {
    pub fn encode(&self) -> String {
        format!("{}_{}", self.created_at.timestamp_micros(), self.id.simple())
    }

    pub fn decode(s: &str) -> Option<Cursor> {
        let (micros, id) = s.split_once('_')?;
        let created_at = DateTime::from_timestamp_micros(micros.parse().ok()?)?;
        // Postgres cannot bind every time chrono can hold (a 500); the API
        // only ever issues times of runs it created.
        if !(1..=9999).contains(&created_at.year()) {
            return None;
        }
        Some(Cursor { created_at, id: Uuid::parse_str(id).ok()? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_and_rejects_garbage() {
        let c =
            Cursor { created_at: DateTime::from_timestamp_micros(1_700_000_000_123_456).unwrap(), id: Uuid::now_v7() };
        assert_eq!(Cursor::decode(&c.encode()), Some(c));
        for bad in ["", "x_y", "123", "123_notauuid", "_"] {
            assert_eq!(Cursor::decode(bad), None, "{bad}");
        }
    }
}
