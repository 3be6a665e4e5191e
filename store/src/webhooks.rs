//! GitHub webhook deliveries and the runs they create.
//!
//! The delivery id (`X-GitHub-Delivery`) is the primary key of
//! `webhook_deliveries`, and the row is written in the same transaction as
//! the run it creates: a redelivery, or two copies of one delivery racing
//! each other, creates the run at most once.

use kiln_protocol::{CreateRun, RepoSpec, Trigger};
use tokio_postgres::Row;
use uuid::Uuid;

use crate::queued::{QueuedRun, insert_queued_run_tx};
use crate::runs::NewRun;
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
    pub prompt: String,
    pub repo: RepoSpec,
    pub origin: GithubOrigin,
}

/// What an earlier copy of a delivery came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PastDelivery {
    /// The run it created, if it created one.
    pub run_id: Option<Uuid>,
}

/// What recording a delivery came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// The first copy of this delivery; `run_id` is the run it created, if any.
    New { run_id: Option<Uuid> },
    /// Seen before (a redelivery, or a concurrent copy got there first):
    /// nothing was created.
    Duplicate(PastDelivery),
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
    /// worker. If the delivery was already recorded, creates nothing.
    pub async fn create_github_run(&self, delivery: &Delivery, new: &NewGithubRun) -> Result<Recorded, StoreError> {
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

        // The same rows `create_run` writes for an API run; model and limits
        // take the worker's configuration.
        let run = NewRun {
            owner: new.owner.clone(),
            spec: CreateRun { prompt: new.prompt.clone(), repo: Some(new.repo.clone()), ..Default::default() },
            trigger: Trigger::Github,
            idempotency_key: None,
        };
        let run_id = insert_queued_run_tx(&tx, &QueuedRun::first(&run)?)
            .await?
            .ok_or_else(|| StoreError::Corrupt("a run without an idempotency key conflicted".into()))?;
        let o = &new.origin;
        tx.execute(
            "INSERT INTO github_runs (run_id, delivery_id, event, repo_full_name, issue_number, pr_number,
                                      comment_id, installation_id, sender_login)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
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
