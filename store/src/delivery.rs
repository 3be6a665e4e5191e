//! Reporting GitHub-triggered runs back to GitHub: the state the worker's
//! delivery keeps in `github_runs` (see `migrations/V3__github_delivery.sql`
//! and `V7__github_owed_deliveries.sql`).
//!
//! Nothing here talks to GitHub. The worker captures every run's change
//! while the sandbox is alive (`run_changes`, see `changes.rs`), then
//! delivers from these rows and that one, so a retry can happen on
//! any worker long after the container is gone.
//!
//! A run that ends owes a delivery (`delivery_requested_at`, set by a
//! trigger in the transaction that ends it, whoever ends it); a worker claims
//! an owed delivery under a lease it keeps extending, and settles it when
//! done. So a run cancelled while queued, which no worker ever held, is
//! delivered too, and a delivery a dead worker left is taken over once its
//! lease runs out, never while a live worker holds it.

use std::time::Duration;

use kiln_protocol::{EventBody, Run};
use uuid::Uuid;

use crate::owed::{Claimed, OwedTable};
use crate::webhooks::GithubOrigin;
use crate::{Store, StoreError};

/// `github_runs` as owed work: a delivery is owed once requested (by the
/// run's end, or again through the API) and its run has ended or, for a
/// group, has a choice. The claim notes when it started, so a request that
/// comes in during the attempt keeps the delivery owed.
const GITHUB_DELIVERIES: OwedTable = OwedTable {
    table: "github_runs",
    holder: "delivery_holder",
    until: "delivery_lease_until",
    fence: "",
    claim_sets: ", delivery_started_at = now()",
    join: " JOIN runs r ON r.id = o.run_id",
    owed: "o.delivery_requested_at IS NOT NULL AND o.delivered_at IS NULL
           AND (r.status IN ('succeeded', 'failed', 'cancelled', 'timed_out') OR r.selected_attempt IS NOT NULL)",
    since: "delivery_requested_at",
    lock: "o",
    returning: ", d.base_ref, d.base_sha,
        (SELECT c.patch FROM run_changes c WHERE c.run_id = d.run_id AND c.scope = 'session'),
        d.pr_url,
        COALESCE((SELECT c.too_large FROM run_changes c WHERE c.run_id = d.run_id AND c.scope = 'session'), false)",
    what: "GitHub delivery",
};

/// Everything a worker needs to deliver one run.
#[derive(Debug, Clone)]
pub struct DeliveryJob {
    pub run: Run,
    pub origin: GithubOrigin,
    /// This attempt's hold on the delivery (fences extending and ending it).
    pub holder: Uuid,
    pub base_ref: Option<String>,
    pub base_sha: Option<String>,
    /// The session's captured change (`run_changes`, scope `session`: what
    /// applies to `base_sha`); `None`: never captured (capture failed), or
    /// too large to keep (`patch_too_large`).
    pub patch: Option<Vec<u8>>,
    pub patch_too_large: bool,
    /// The pull request an earlier attempt opened.
    pub pr_url: Option<String>,
}

/// What asking for a delivery came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryRequest {
    /// Owed; a worker will deliver it.
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

    /// Takes the delivery lease of an owed delivery (a finished GitHub run
    /// not yet delivered, see `migrations/V7__github_owed_deliveries.sql`;
    /// or a GitHub-triggered group with a choice, ended or not, V26)
    /// whose lease is free or has run out, and returns what to deliver:
    /// run `run_id`'s, or with `None` the longest-owed one. `None` when there
    /// is nothing to do (nothing owed, or another worker holds the lease).
    ///
    /// The holder extends the lease with [`Store::extend_github_delivery`]
    /// while it works; a worker that dies stops doing so, and the next claim
    /// after the lease runs out takes the delivery over.
    pub async fn claim_github_delivery(
        &self,
        run_id: Option<Uuid>,
        lease: Duration,
    ) -> Result<Option<DeliveryJob>, StoreError> {
        let Some(Claimed { run, holder, row }) = self.claim_owed(&GITHUB_DELIVERIES, run_id, lease).await? else {
            return Ok(None);
        };
        let origin = self
            .github_origin(run.id)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("github run {} vanished during delivery", run.id)))?;
        Ok(Some(DeliveryJob {
            run,
            origin,
            holder,
            base_ref: row.try_get(1)?,
            base_sha: row.try_get(2)?,
            patch: row.try_get(3)?,
            patch_too_large: row.try_get(5)?,
            pr_url: row.try_get(4)?,
        }))
    }

    /// Extends the lease of `job`'s delivery; false when it is no longer
    /// `job`'s (it ran out and another worker took the delivery over).
    pub async fn extend_github_delivery(&self, job: &DeliveryJob, lease: Duration) -> Result<bool, StoreError> {
        self.extend_owed(&GITHUB_DELIVERIES, job.run.id, job.holder, lease).await
    }

    /// Remembers the pull request opened for the run.
    pub async fn set_github_pr(&self, run_id: Uuid, pr_url: &str) -> Result<(), StoreError> {
        let client = self.client().await?;
        client.execute("UPDATE github_runs SET pr_url = $2 WHERE run_id = $1", &[&run_id, &pr_url]).await?;
        Ok(())
    }

    /// Ends `job`'s delivery attempt: releases the lease, marks the run
    /// delivered if `delivered`, and appends `event` (a `delivery.*` event)
    /// to the run's events. The debt is settled either way (a failed
    /// delivery is retried on request), unless a request came in during the
    /// attempt. False, recording nothing, when the lease is no longer `job`'s.
    pub async fn end_github_delivery(
        &self,
        job: &DeliveryJob,
        delivered: bool,
        event: &EventBody,
    ) -> Result<bool, StoreError> {
        let seq = self
            .end_owed(
                &GITHUB_DELIVERIES,
                (job.run.id, job.holder),
                "delivery_holder = NULL, delivery_lease_until = NULL,
                 delivered_at = CASE WHEN $3 THEN now() ELSE delivered_at END,
                 delivery_requested_at = CASE
                     WHEN $3 OR delivery_requested_at <= delivery_started_at THEN NULL
                     ELSE delivery_requested_at END",
                &[&delivered],
                event,
            )
            .await?;
        Ok(seq.is_some())
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
}

/// A GitHub-triggered group's choice, as its delivery reads it once its
/// lease is held (the choice cannot change from then on).
#[derive(Debug, Clone)]
pub struct GroupChoice {
    /// The chosen attempt's number and run.
    pub attempt: u32,
    pub run: Run,
    /// Who chose it on GitHub (`/kiln select K`); `None`: the API or the
    /// deployment's setting.
    pub by: Option<String>,
    /// The chosen attempt's change, as [`DeliveryJob::patch`] (copied to
    /// the group by the choice).
    pub patch: Option<Vec<u8>>,
    pub patch_too_large: bool,
}

impl Store {
    /// Group `group`'s choice, if it has one.
    pub async fn github_group_choice(&self, group: Uuid) -> Result<Option<GroupChoice>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT r.selected_attempt, a.id, g.selected_by, c.patch, COALESCE(c.too_large, false)
                 FROM runs r JOIN runs a ON a.group_run_id = r.id AND a.attempt_number = r.selected_attempt
                 JOIN github_runs g ON g.run_id = r.id
                 LEFT JOIN run_changes c ON c.run_id = r.id AND c.scope = 'session'
                 WHERE r.id = $1",
                &[&group],
            )
            .await?;
        let Some(row) = row else { return Ok(None) };
        drop(client);
        let attempt_id: Uuid = row.try_get(1)?;
        let run = self
            .get_run_unscoped(attempt_id)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("attempt {attempt_id} vanished during its delivery")))?;
        Ok(Some(GroupChoice {
            attempt: row.try_get::<_, i32>(0)?.max(0) as u32,
            run,
            by: row.try_get(2)?,
            patch: row.try_get(3)?,
            patch_too_large: row.try_get(4)?,
        }))
    }
}

impl Store {
    /// Group `group`'s `attempt.finished` events, first attempt to end first:
    /// what a report of its attempts lists.
    pub async fn group_attempt_ends(&self, group: Uuid) -> Result<Vec<EventBody>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT seq, kind, payload, at FROM events WHERE run_id = $1 AND kind = 'attempt.finished' ORDER BY seq",
                &[&group],
            )
            .await?;
        let mut ends = Vec::with_capacity(rows.len());
        for row in &rows {
            let event = kiln_protocol::StoredEvent {
                seq: row.try_get(0)?,
                kind: row.try_get(1)?,
                payload: row.try_get(2)?,
                at: row.try_get(3)?,
            };
            ends.extend(event.body());
        }
        Ok(ends)
    }

    /// The commit run `run_id`'s workspace was cloned at, if recorded.
    pub async fn github_base_sha(&self, run_id: Uuid) -> Result<Option<String>, StoreError> {
        let client = self.client().await?;
        let row = client.query_opt("SELECT base_sha FROM github_runs WHERE run_id = $1", &[&run_id]).await?;
        Ok(row.map(|r| r.try_get::<_, Option<String>>(0)).transpose()?.flatten())
    }
}
