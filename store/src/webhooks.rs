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

use kiln_protocol::{CreateRun, RepoSpec, Trigger};
use tokio_postgres::Row;
use uuid::Uuid;

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
    /// `run.queued` event, `github_runs` row) in one transaction, and wakes a
    /// worker. If the delivery was already recorded, or a run was already
    /// made for the same event (its trigger key), creates nothing. With a
    /// `quota`, refuses (recording the delivery as ignored) when the run's
    /// repository or sender is over it.
    pub async fn create_github_run(
        &self,
        delivery: &Delivery,
        new: &NewGithubRun,
        quota: Option<&Quota>,
    ) -> Result<Recorded, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // The delivery row goes first: a concurrent copy of this delivery
        // blocks on its primary key until this transaction ends, then finds
        // the conflict and creates nothing.
        let claimed = tx
            .query_opt(
                "INSERT INTO webhook_deliveries (delivery_id, event, action, repo, outcome)
                 VALUES ($1, $2, $3, $4, 'run')
                 ON CONFLICT (delivery_id) DO NOTHING
                 RETURNING delivery_id",
                &[&delivery.id, &delivery.event, &delivery.action, &delivery.repo],
            )
            .await?;
        if claimed.is_none() {
            let row =
                tx.query_one("SELECT run_id FROM webhook_deliveries WHERE delivery_id = $1", &[&delivery.id]).await?;
            let past = PastDelivery { run_id: row.try_get(0)? };
            tx.rollback().await?;
            return Ok(Recorded::Duplicate(past));
        }

        // The same event under another delivery id (a replayed body).
        // Copies of one event queue behind this lock, so the second sees
        // the first's row.
        tx.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 17))", &[&new.trigger_key]).await?;
        let earlier =
            tx.query_opt("SELECT run_id FROM github_runs WHERE trigger_key = $1", &[&new.trigger_key]).await?;
        if let Some(row) = earlier {
            let run_id: Uuid = row.try_get(0)?;
            let outcome = format!("duplicate: the same event as run {run_id}");
            tx.execute(
                "UPDATE webhook_deliveries SET outcome = $2, run_id = $3 WHERE delivery_id = $1",
                &[&delivery.id, &outcome, &run_id],
            )
            .await?;
            tx.commit().await?;
            return Ok(Recorded::Duplicate(PastDelivery { run_id: Some(run_id) }));
        }

        if let Some(quota) = quota
            && let Some(reason) = github_quota_tx(&tx, &new.origin, quota).await?
        {
            tx.execute(
                "UPDATE webhook_deliveries SET outcome = $2 WHERE delivery_id = $1",
                &[&delivery.id, &format!("ignored: {reason}")],
            )
            .await?;
            tx.commit().await?;
            return Ok(Recorded::Refused { reason });
        }

        // The same rows `create_run` writes for an API run; model and limits
        // take the worker's configuration.
        let run = NewRun {
            owner: new.owner.clone(),
            spec: CreateRun {
                prompt: new.prompt.clone(),
                repo: Some(new.repo.clone()),
                environment: new.environment.clone(),
                ..Default::default()
            },
            trigger: Trigger::Github,
            idempotency_key: None,
        };
        let run_id = insert_queued_run_tx(&tx, &QueuedRun::first(&run)?)
            .await?
            .ok_or_else(|| StoreError::Corrupt("a run without an idempotency key conflicted".into()))?;
        let o = &new.origin;
        tx.execute(
            "INSERT INTO github_runs (run_id, delivery_id, event, repo_full_name, issue_number, pr_number,
                                      comment_id, installation_id, sender_login, trigger_key)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
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
            ],
        )
        .await?;
        tx.execute("UPDATE webhook_deliveries SET run_id = $2 WHERE delivery_id = $1", &[&delivery.id, &run_id])
            .await?;
        tx.commit().await?;
        self.announce_queued(run_id);
        Ok(Recorded::New { run_id: Some(run_id) })
    }

    /// Where run `run_id` came from, if GitHub triggered it.
    pub async fn github_origin(&self, run_id: Uuid) -> Result<Option<GithubOrigin>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT event, repo_full_name, issue_number, pr_number, comment_id, installation_id, sender_login
                 FROM github_runs WHERE run_id = $1",
                &[&run_id],
            )
            .await?;
        row.as_ref().map(origin_from_row).transpose()
    }
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
    tx: &deadpool_postgres::Transaction<'_>,
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
