//! GitHub webhook deliveries and the runs they create.
//!
//! The delivery id (`X-GitHub-Delivery`) is the primary key of
//! `webhook_deliveries`, and the row is written in the same transaction as
//! the run it creates: a redelivery, or two copies of one delivery racing
//! each other, creates the run at most once. The delivery id is outside the
//! webhook's signature, so a run also carries a trigger key from inside the
//! signed body (unique in `github_runs`): a signed body replayed under a new
//! delivery id creates nothing either.
//!
//! Webhook runs all belong to one subject, so the per-subject quota is
//! applied per repository and per sender instead.

use deadpool_postgres::Transaction;
use kiln_protocol::{CreateRun, EventBody, RepoSpec, Trigger};
use tokio_postgres::Row;
use uuid::Uuid;

use crate::attempts::{InsertedGroup, SelectOutcome, insert_group_tx};
use crate::events::insert_event_tx;
use crate::queued::{NewRun, QueuedRun, insert_queued_run_tx};
use crate::runs::Quota;
use crate::{Store, StoreError};

/// A webhook delivery as GitHub labelled it.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// `X-GitHub-Delivery`: unique per delivery, kept on redelivery.
    pub id: String,
    /// `X-GitHub-Event`, e.g. `issue_comment`.
    pub event: String,
    pub action: Option<String>,
    /// `owner/name`, when the payload names a repository.
    pub repo: Option<String>,
}

/// Where a GitHub-triggered run came from: what the worker needs to report
/// back. One row of `github_runs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GithubOrigin {
    /// `issue_comment` or `issues`.
    pub event: String,
    /// `owner/name`.
    pub repo_full_name: String,
    pub issue_number: i64,
    /// Set when the run is about a pull request; its head branch is not in
    /// the webhook and is left to the worker to resolve.
    pub pr_number: Option<i64>,
    /// The comment that asked for the run; `None` when a label did.
    pub comment_id: Option<i64>,
    /// The GitHub App installation, when the webhook belongs to an App.
    pub installation_id: Option<i64>,
    /// Who asked: the comment's author or the user who added the label.
    pub sender_login: String,
}

/// A queued run to create for a delivery.
#[derive(Debug, Clone)]
pub struct NewGithubRun {
    /// The subject that owns webhook-created runs.
    pub owner: String,
    /// The environment (of `owner`) the run's sandbox is prepared with.
    pub environment: Option<String>,
    pub prompt: String,
    pub repo: RepoSpec,
    pub origin: GithubOrigin,
    /// The triggering event's own identity, from the signed body (e.g.
    /// `issue_comment:<comment id>`): one run per event, whatever the
    /// delivery id.
    pub trigger_key: String,
    /// How many attempts the trigger asked for (`/kiln --attempts N`): the
    /// run is a group of them. `None`: a single run.
    pub attempts: Option<u32>,
    /// A group takes its first attempt to succeed as its choice and opens
    /// its pull request at once (`KILN_GITHUB_ATTEMPTS_TAKE_FIRST`).
    pub take_first_success: bool,
    /// Why the request cannot be honoured as asked (e.g. more attempts than
    /// the deployment allows): the run is made failed with this reason, so
    /// the person who asked gets it as a comment like any run's end.
    pub refusal: Option<String>,
}

/// What an earlier copy of a delivery came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PastDelivery {
    /// The run it created, if it created one.
    pub run_id: Option<Uuid>,
}

/// What recording a delivery came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// The first copy of this delivery; `run_id` is the run it created, if any.
    New { run_id: Option<Uuid> },
    /// Seen before (a redelivery, or a concurrent copy got there first, or
    /// the same event under another delivery id): nothing was created.
    Duplicate(PastDelivery),
    /// Recorded, but the repository or the sender is over its quota: no run
    /// was created; `reason` says which limit.
    Refused { reason: String },
}

impl Store {
    /// The earlier copy of delivery `id`, if there was one.
    pub async fn past_delivery(&self, id: &str) -> Result<Option<PastDelivery>, StoreError> {
        let client = self.client().await?;
        let row = client.query_opt("SELECT run_id FROM webhook_deliveries WHERE delivery_id = $1", &[&id]).await?;
        row.map(|r| Ok(PastDelivery { run_id: r.try_get(0)? })).transpose()
    }

    /// Records a delivery that creates no run (a ping, or one Kiln ignores),
    /// so that its redeliveries are answered from the table. `outcome` says
    /// why, for operators.
    pub async fn record_delivery(&self, delivery: &Delivery, outcome: &str) -> Result<Recorded, StoreError> {
        let client = self.client().await?;
        let inserted = client
            .query_opt(
                "INSERT INTO webhook_deliveries (delivery_id, event, action, repo, outcome)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (delivery_id) DO NOTHING
                 RETURNING delivery_id",
                &[&delivery.id, &delivery.event, &delivery.action, &delivery.repo, &outcome],
            )
            .await?;
        if inserted.is_some() {
            return Ok(Recorded::New { run_id: None });
        }
        // A separate statement: the conflicting row was committed after this
        // one's snapshot was taken.
        let row =
            client.query_one("SELECT run_id FROM webhook_deliveries WHERE delivery_id = $1", &[&delivery.id]).await?;
        Ok(Recorded::Duplicate(PastDelivery { run_id: row.try_get(0)? }))
    }

    /// Records a delivery and the queued run it asks for (session, run,
    /// `run.queued` event, `github_runs` row; for a group its attempts too)
    /// in one transaction, and wakes a worker. If the delivery was already
    /// recorded, or a run was already made for the same event (its trigger
    /// key), creates nothing. With a `quota`, refuses (recording the
    /// delivery as ignored) when the run's repository or sender is over it.
    pub async fn create_github_run(
        &self,
        delivery: &Delivery,
        new: &NewGithubRun,
        quota: Option<&Quota>,
    ) -> Result<Recorded, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        if let Some(past) = claim_delivery_tx(&tx, delivery).await? {
            tx.rollback().await?;
            return Ok(Recorded::Duplicate(past));
        }
        if let Some(past) = same_event_tx(&tx, delivery, &new.trigger_key).await? {
            tx.commit().await?;
            return Ok(Recorded::Duplicate(past));
        }
        if let Some(quota) = quota
            && let Some(reason) = github_quota_tx(&tx, &new.origin, quota).await?
        {
            set_outcome_tx(&tx, delivery, &format!("ignored: {reason}")).await?;
            tx.commit().await?;
            return Ok(Recorded::Refused { reason });
        }
        let inserted = insert_github_run_tx(&tx, delivery, new).await?;
        tx.commit().await?;
        match (&new.refusal, inserted.attempts.is_empty()) {
            // Failed already: its report is owed, and found by polling.
            (Some(_), _) => {}
            (None, true) => self.announce_queued(inserted.group),
            (None, false) => {
                self.announce_event(inserted.group, 1);
                inserted.attempts.iter().for_each(|&id| self.announce_queued(id));
            }
        }
        Ok(Recorded::New { run_id: Some(inserted.group) })
    }

    /// Where run `run_id` came from, if GitHub triggered it; for an
    /// attempt of a GitHub-triggered group, where its group came from.
    pub async fn github_origin(&self, run_id: Uuid) -> Result<Option<GithubOrigin>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT event, repo_full_name, issue_number, pr_number, comment_id, installation_id, sender_login
                 FROM github_runs
                 WHERE run_id = COALESCE((SELECT group_run_id FROM runs WHERE id = $1), $1)",
                &[&run_id],
            )
            .await?;
        row.as_ref().map(origin_from_row).transpose()
    }
}

/// What a `/kiln select K` comment came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GithubSelection {
    /// Attempt `attempt` is group `group`'s choice now; its pull request is
    /// owed.
    Selected { group: Uuid, attempt: u32 },
    /// Nothing was chosen, for this reason.
    Refused(String),
    /// The delivery was seen before: nothing was done again.
    Duplicate(PastDelivery),
}

impl Store {
    /// Records `delivery`, a `/kiln select K` comment by `origin`'s sender,
    /// and makes attempt `attempt` the choice of the latest group of
    /// attempts asked for on `origin`'s issue or pull request (owned by
    /// `owner`), as `POST /v1/runs/{id}/select` would; the worker checks the
    /// sender's access before it pushes the choice.
    pub async fn select_from_github(
        &self,
        delivery: &Delivery,
        owner: &str,
        origin: &GithubOrigin,
        attempt: u32,
    ) -> Result<GithubSelection, StoreError> {
        if let Recorded::Duplicate(past) = self.record_delivery(delivery, "select").await? {
            return Ok(GithubSelection::Duplicate(past));
        }
        let issue = origin.issue_number;
        let selection = match self.latest_github_group(owner, &origin.repo_full_name, issue).await? {
            None => GithubSelection::Refused(format!("no group of attempts was asked for on #{issue}")),
            Some(group) => match self.select_attempt_by(owner, group, attempt, Some(&origin.sender_login)).await? {
                SelectOutcome::Selected(_) => GithubSelection::Selected { group, attempt },
                other => GithubSelection::Refused(select_refusal(&other, attempt, group)),
            },
        };
        let (outcome, run_id) = match &selection {
            GithubSelection::Selected { group, .. } => (format!("selected attempt {attempt}"), Some(*group)),
            GithubSelection::Refused(reason) => (format!("ignored: {reason}"), None),
            GithubSelection::Duplicate(past) => return Ok(GithubSelection::Duplicate(*past)),
        };
        let client = self.client().await?;
        client
            .execute(
                "UPDATE webhook_deliveries SET outcome = $2, run_id = $3 WHERE delivery_id = $1",
                &[&delivery.id, &outcome, &run_id],
            )
            .await?;
        Ok(selection)
    }

    /// The group of attempts asked for last on issue `issue` of `repo`.
    async fn latest_github_group(&self, owner: &str, repo: &str, issue: i64) -> Result<Option<Uuid>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT g.run_id FROM github_runs g JOIN runs r ON r.id = g.run_id
                 WHERE g.repo_full_name = $1 AND g.issue_number = $2 AND r.owner = $3 AND r.attempt_count IS NOT NULL
                 ORDER BY g.created_at DESC LIMIT 1",
                &[&repo, &issue, &owner],
            )
            .await?;
        row.map(|r| r.try_get(0).map_err(StoreError::from)).transpose()
    }
}

/// Why choosing attempt `attempt` of `group` was refused, for the person
/// who asked.
fn select_refusal(outcome: &SelectOutcome, attempt: u32, group: Uuid) -> String {
    match outcome {
        SelectOutcome::NoSuchAttempt(count) => {
            format!("group {group} has {count} attempts; there is no attempt {attempt}")
        }
        SelectOutcome::NotEnded => format!("attempt {attempt} of group {group} has not ended yet"),
        SelectOutcome::Delivered => {
            format!("group {group}'s pull request was already opened (or is being opened); its choice stands")
        }
        SelectOutcome::NotFound | SelectOutcome::NotAGroup | SelectOutcome::Selected(_) => {
            format!("run {group} is not a group of attempts")
        }
    }
}

/// Records `delivery` as making a run, first of all: a concurrent copy of
/// it blocks on the primary key until this transaction ends, then finds
/// the conflict and creates nothing. What the earlier copy came to, if
/// there was one.
async fn claim_delivery_tx(tx: &Transaction<'_>, delivery: &Delivery) -> Result<Option<PastDelivery>, StoreError> {
    let claimed = tx
        .query_opt(
            "INSERT INTO webhook_deliveries (delivery_id, event, action, repo, outcome)
             VALUES ($1, $2, $3, $4, 'run')
             ON CONFLICT (delivery_id) DO NOTHING
             RETURNING delivery_id",
            &[&delivery.id, &delivery.event, &delivery.action, &delivery.repo],
        )
        .await?;
    if claimed.is_some() {
        return Ok(None);
    }
    let row = tx.query_one("SELECT run_id FROM webhook_deliveries WHERE delivery_id = $1", &[&delivery.id]).await?;
    Ok(Some(PastDelivery { run_id: row.try_get(0)? }))
}

/// The run an earlier delivery of the same event (a replayed body under
/// another delivery id) made, recorded as this delivery's outcome. Copies
/// of one event queue behind the lock, so the second sees the first's row.
async fn same_event_tx(
    tx: &Transaction<'_>,
    delivery: &Delivery,
    trigger_key: &str,
) -> Result<Option<PastDelivery>, StoreError> {
    tx.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 17))", &[&trigger_key]).await?;
    let earlier = tx.query_opt("SELECT run_id FROM github_runs WHERE trigger_key = $1", &[&trigger_key]).await?;
    let Some(row) = earlier else { return Ok(None) };
    let run_id: Uuid = row.try_get(0)?;
    let outcome = format!("duplicate: the same event as run {run_id}");
    tx.execute(
        "UPDATE webhook_deliveries SET outcome = $2, run_id = $3 WHERE delivery_id = $1",
        &[&delivery.id, &outcome, &run_id],
    )
    .await?;
    Ok(Some(PastDelivery { run_id: Some(run_id) }))
}

async fn set_outcome_tx(tx: &Transaction<'_>, delivery: &Delivery, outcome: &str) -> Result<(), StoreError> {
    tx.execute("UPDATE webhook_deliveries SET outcome = $2 WHERE delivery_id = $1", &[&delivery.id, &outcome]).await?;
    Ok(())
}

/// The rows `create_run` writes for an API run (a group and its attempts
/// when `new` asks for attempts; model and limits take the worker's
/// configuration), the run's origin, and the delivery's link to it. A
/// refused request's run is failed at once with the reason.
async fn insert_github_run_tx(
    tx: &Transaction<'_>,
    delivery: &Delivery,
    new: &NewGithubRun,
) -> Result<InsertedGroup, StoreError> {
    let attempts = new.attempts.filter(|_| new.refusal.is_none());
    let run = NewRun {
        owner: new.owner.clone(),
        spec: CreateRun {
            prompt: new.prompt.clone(),
            repo: Some(new.repo.clone()),
            environment: new.environment.clone(),
            attempts,
            ..Default::default()
        },
        trigger: Trigger::Github,
        idempotency_key: None,
    };
    let inserted = match attempts {
        Some(n) => insert_group_tx(tx, &run, n).await?,
        None => insert_queued_run_tx(tx, &QueuedRun::first(&run)?)
            .await?
            .map(|group| InsertedGroup { group, attempts: Vec::new() }),
    };
    let inserted = inserted.ok_or_else(|| StoreError::Corrupt("a run without an idempotency key conflicted".into()))?;
    insert_origin_tx(tx, delivery, new, inserted.group).await?;
    if let Some(reason) = &new.refusal {
        fail_at_once_tx(tx, inserted.group, reason).await?;
    }
    Ok(inserted)
}

async fn insert_origin_tx(
    tx: &Transaction<'_>,
    delivery: &Delivery,
    new: &NewGithubRun,
    run_id: Uuid,
) -> Result<(), StoreError> {
    let o = &new.origin;
    tx.execute(
        "INSERT INTO github_runs (run_id, delivery_id, event, repo_full_name, issue_number, pr_number,
                                  comment_id, installation_id, sender_login, trigger_key, take_first_success)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        &[
            &run_id,
            &delivery.id,
            &o.event,
            &o.repo_full_name,
            &o.issue_number,
            &o.pr_number,
            &o.comment_id,
            &o.installation_id,
            &o.sender_login,
            &new.trigger_key,
            &new.take_first_success,
        ],
    )
    .await?;
    tx.execute("UPDATE webhook_deliveries SET run_id = $2 WHERE delivery_id = $1", &[&delivery.id, &run_id]).await?;
    Ok(())
}

/// Ends queued run `run_id` failed with `reason` before any worker sees
/// it; its end owes a report on GitHub (the trigger of V7), which says why.
async fn fail_at_once_tx(tx: &Transaction<'_>, run_id: Uuid, reason: &str) -> Result<(), StoreError> {
    tx.execute("UPDATE runs SET status = 'failed', finished_at = now(), error = $2 WHERE id = $1", &[&run_id, &reason])
        .await?;
    insert_event_tx(tx, run_id, &EventBody::RunFailed { error: reason.to_owned() }).await?;
    Ok(())
}

fn origin_from_row(row: &Row) -> Result<GithubOrigin, StoreError> {
    Ok(GithubOrigin {
        event: row.try_get(0)?,
        repo_full_name: row.try_get(1)?,
        issue_number: row.try_get(2)?,
        pr_number: row.try_get(3)?,
        comment_id: row.try_get(4)?,
        installation_id: row.try_get(5)?,
        sender_login: row.try_get(6)?,
    })
}

/// Whether a run for `origin` would take its repository or its sender over
/// `quota` (active runs; runs made in the last minute): the reason, if so.
/// Each is checked under its own advisory lock, taken in a fixed order
/// (repository, then sender), so concurrent deliveries cannot both slip
/// under a limit.
async fn github_quota_tx(
    tx: &Transaction<'_>,
    origin: &GithubOrigin,
    quota: &Quota,
) -> Result<Option<String>, StoreError> {
    let scopes = [
        ("repo_full_name", format!("github:{}", origin.repo_full_name), &origin.repo_full_name, "repository"),
        ("sender_login", format!("github-sender:{}", origin.sender_login), &origin.sender_login, "sender"),
    ];
    for (column, lock, value, what) in scopes {
        tx.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 7))", &[&lock]).await?;
        let row = tx
            .query_one(
                &format!(
                    "SELECT count(*) FILTER (WHERE r.status IN ('queued', 'running', 'awaiting_approval')),
                            count(*) FILTER (WHERE g.created_at > now() - interval '1 minute')
                     FROM github_runs g JOIN runs r ON r.id = g.run_id
                     WHERE g.{column} = $1
                       AND (r.status IN ('queued', 'running', 'awaiting_approval')
                            OR g.created_at > now() - interval '1 minute')"
                ),
                &[value],
            )
            .await?;
        let (active, recent): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
        let limit = if active >= quota.max_active_runs {
            format!("{} active runs", quota.max_active_runs)
        } else if recent >= quota.max_runs_per_minute {
            format!("{} runs in the last minute", quota.max_runs_per_minute)
        } else {
            continue;
        };
        return Ok(Some(format!("over quota: the {what} {value} already has {limit}; try again later")));
    }
    Ok(None)
}
