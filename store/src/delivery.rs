//! Reporting GitHub-triggered runs back to GitHub: the state the worker's
//! delivery keeps in `github_runs` (see `migrations/V3__github_delivery.sql`).
//!
//! Nothing here talks to GitHub. The worker captures the run's patch while the
//! sandbox is alive, then delivers from these rows, so a retry can happen on
//! any worker long after the container is gone.

use kiln_protocol::{EventBody, Run};
use uuid::Uuid;

use crate::events::insert_event_tx;
use crate::webhooks::GithubOrigin;
use crate::{Store, StoreError};

/// A delivery lock older than this is a worker that died mid-delivery.
const STALE_DELIVERY: &str = "10 minutes";

/// Everything a worker needs to deliver one run.
#[derive(Debug, Clone)]
pub struct DeliveryJob {
    pub run: Run,
    pub origin: GithubOrigin,
    pub base_ref: Option<String>,
    pub base_sha: Option<String>,
    /// `None`: never captured (the run did not succeed, or capture failed).
    pub patch: Option<Vec<u8>>,
    /// The pull request an earlier attempt opened.
    pub pr_url: Option<String>,
}

/// What asking for a delivery came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryRequest {
    /// Queued; a worker will pick it up.
    Requested,
    /// No run with this id for this owner.
    NotFound,
    /// The run exists but GitHub did not trigger it.
    NotGithub,
    /// The run has not ended yet; it is delivered when it does.
    NotFinished,
    /// The run's result is already on GitHub.
    AlreadyDelivered,
}

impl Store {
    /// Marks the run's trigger as acknowledged; true the first time only.
    pub async fn mark_github_acked(&self, run_id: Uuid) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let n = client
            .execute("UPDATE github_runs SET acked_at = now() WHERE run_id = $1 AND acked_at IS NULL", &[&run_id])
            .await?;
        Ok(n == 1)
    }

    /// Records where the run's workspace was cloned from.
    pub async fn set_github_base(&self, run_id: Uuid, base_ref: &str, base_sha: &str) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE github_runs SET base_ref = $2, base_sha = $3 WHERE run_id = $1",
                &[&run_id, &base_ref, &base_sha],
            )
            .await?;
        Ok(())
    }

    /// Keeps the run's changes (empty: none) for delivery.
    pub async fn set_github_patch(&self, run_id: Uuid, patch: &[u8]) -> Result<(), StoreError> {
        let client = self.client().await?;
        client.execute("UPDATE github_runs SET patch = $2 WHERE run_id = $1", &[&run_id, &patch]).await?;
        Ok(())
    }

    /// Takes the delivery lock of a finished, undelivered GitHub run and
    /// returns what to deliver; `None` when there is nothing to do (not a
    /// GitHub run, not finished, delivered, or another worker is at it).
    pub async fn begin_github_delivery(&self, run_id: Uuid) -> Result<Option<DeliveryJob>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "UPDATE github_runs g SET delivery_started_at = now()
                     FROM runs r
                     WHERE g.run_id = $1 AND r.id = g.run_id
                       AND r.status IN ('succeeded', 'failed', 'cancelled', 'timed_out')
                       AND g.delivered_at IS NULL
                       AND (g.delivery_started_at IS NULL
                            OR g.delivery_started_at < now() - interval '{STALE_DELIVERY}')
                     RETURNING g.base_ref, g.base_sha, g.patch, g.pr_url"
                ),
                &[&run_id],
            )
            .await?;
        let Some(row) = row else { return Ok(None) };
        drop(client);
        let run = self.get_run_unscoped(run_id).await?;
        let origin = self.github_origin(run_id).await?;
        let (Some(run), Some(origin)) = (run, origin) else {
            return Err(StoreError::Corrupt(format!("github run {run_id} vanished during delivery")));
        };
        Ok(Some(DeliveryJob {
            run,
            origin,
            base_ref: row.try_get(0)?,
            base_sha: row.try_get(1)?,
            patch: row.try_get(2)?,
            pr_url: row.try_get(3)?,
        }))
    }

    /// Remembers the pull request opened for the run.
    pub async fn set_github_pr(&self, run_id: Uuid, pr_url: &str) -> Result<(), StoreError> {
        let client = self.client().await?;
        client.execute("UPDATE github_runs SET pr_url = $2 WHERE run_id = $1", &[&run_id, &pr_url]).await?;
        Ok(())
    }

    /// Releases the delivery lock, marking the run delivered if `delivered`,
    /// and appends `event` (a `delivery.*` event) to the run's events.
    ///
    /// Unfenced: the run has ended and holds no lease. The event comes after
    /// the terminal one; a live SSE stream has closed by then, a replay sees it.
    pub async fn end_github_delivery(
        &self,
        run_id: Uuid,
        delivered: bool,
        event: &EventBody,
    ) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        tx.execute(
            "UPDATE github_runs SET delivery_started_at = NULL,
                    delivered_at = CASE WHEN $2 THEN now() ELSE delivered_at END
             WHERE run_id = $1",
            &[&run_id, &delivered],
        )
        .await?;
        insert_event_tx(&tx, run_id, event).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Asks for run `id`'s result to be delivered (again) to GitHub.
    pub async fn request_github_delivery(&self, owner: &str, id: Uuid) -> Result<DeliveryRequest, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT r.status, g.run_id IS NOT NULL, g.delivered_at IS NOT NULL
                 FROM runs r LEFT JOIN github_runs g ON g.run_id = r.id
                 WHERE r.id = $1 AND r.owner = $2",
                &[&id, &owner],
            )
            .await?;
        let Some(row) = row else { return Ok(DeliveryRequest::NotFound) };
        let status: String = row.try_get(0)?;
        let is_github: bool = row.try_get(1)?;
        let delivered: bool = row.try_get(2)?;
        if !is_github {
            return Ok(DeliveryRequest::NotGithub);
        }
        if !matches!(status.as_str(), "succeeded" | "failed" | "cancelled" | "timed_out") {
            return Ok(DeliveryRequest::NotFinished);
        }
        if delivered {
            return Ok(DeliveryRequest::AlreadyDelivered);
        }
        client
            .execute(
                "UPDATE github_runs SET delivery_requested_at = now() WHERE run_id = $1 AND delivered_at IS NULL",
                &[&id],
            )
            .await?;
        Ok(DeliveryRequest::Requested)
    }

    /// Takes one pending delivery request (oldest first), clearing it.
    pub async fn take_github_delivery_request(&self) -> Result<Option<Uuid>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "UPDATE github_runs SET delivery_requested_at = NULL
                 WHERE run_id = (SELECT run_id FROM github_runs WHERE delivery_requested_at IS NOT NULL
                                 ORDER BY delivery_requested_at LIMIT 1 FOR UPDATE SKIP LOCKED)
                 RETURNING run_id",
                &[],
            )
            .await?;
        row.map(|r| r.try_get(0)).transpose().map_err(StoreError::from)
    }
}

impl Store {
    /// The commit run `run_id`'s workspace was cloned at, if recorded.
    pub async fn github_base_sha(&self, run_id: Uuid) -> Result<Option<String>, StoreError> {
        let client = self.client().await?;
        let row = client.query_opt("SELECT base_sha FROM github_runs WHERE run_id = $1", &[&run_id]).await?;
        Ok(row.map(|r| r.try_get::<_, Option<String>>(0)).transpose()?.flatten())
    }
}
