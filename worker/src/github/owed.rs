//! Owed deliveries: claiming one, keeping its lease while delivering, and
//! recording how it went.
//!
//! A GitHub run that ends owes a delivery, recorded in the transaction that
//! ends it (see `migrations/V7__github_owed_deliveries.sql`). The worker that
//! finished a run delivers it at once; every worker with GitHub configured
//! also polls for owed deliveries nobody is working on: runs cancelled while
//! queued (no worker ever held them), runs the reaper failed, retries asked
//! for through `POST /v1/runs/{id}/deliver`, and deliveries whose worker died.

use std::time::Duration;

use kiln_protocol::EventBody;
use kiln_store::{DeliveryJob, Store};
use uuid::Uuid;

use super::delivery::deliver_job;
use super::groups::{self, Reported};
use super::{Github, GithubError};
use crate::lease_keeper::{Beat, LeaseKeeper};
use crate::retry::{self, Verdict};

/// How long a claimed delivery stays claimed without being extended: how
/// long a delivery a dead worker left waits before another worker takes it.
/// Extended every third of it, so only a worker that cannot reach the
/// database for the whole lease loses it.
const DELIVERY_LEASE: Duration = Duration::from_secs(60);

/// Claims and delivers one owed delivery, run `run_id`'s or with `None` the
/// longest-owed one, and records the outcome as an event. Returns whether
/// there was one to claim.
pub async fn deliver_owed(github: &Github, store: &Store, run_id: Option<Uuid>) -> bool {
    let job = match store.claim_github_delivery(run_id, DELIVERY_LEASE).await {
        Ok(Some(job)) => job,
        Ok(None) => return false,
        Err(e) => {
            tracing::warn!(?run_id, error = %e, "claiming a GitHub delivery failed");
            return false;
        }
    };
    let run_id = job.run.id;
    // Delivering stops (git's children are killed on drop) if the lease is
    // lost: another worker is delivering by then, and two must not post.
    let result = tokio::select! {
        result = report(github, store, &job) => result,
        () = keep_lease(store, &job) => {
            tracing::warn!(%run_id, "lost the GitHub delivery's lease; another worker delivers it");
            return true;
        }
    };
    let (delivered, event) = match result {
        Ok(Reported { pull_request, comment, delivered }) => {
            tracing::info!(%run_id, ?pull_request, "delivered to GitHub");
            (
                delivered,
                EventBody::DeliverySucceeded { pull_request, comment, branch: None, commit: None, remote: None },
            )
        }
        Err(e) => {
            let error = github.redact(&e.to_string()).await;
            tracing::warn!(%run_id, %error, "delivery to GitHub failed");
            (false, EventBody::DeliveryFailed { error })
        }
    };
    // The database may blink; the delivery's record is worth a few tries.
    // Past the lease another worker may deliver again: at-least-once.
    let recorded = retry::retry(
        &retry::DATABASE,
        || store.end_github_delivery(&job, delivered, &event),
        |_| Verdict::Retry,
        |e, attempt, _| tracing::warn!(%run_id, error = %e, attempt, "recording the delivery failed"),
    )
    .await;
    match recorded {
        Ok(true) => {}
        Ok(false) => tracing::warn!(%run_id, "the GitHub delivery's lease ran out before it was recorded"),
        Err(e) => tracing::warn!(%run_id, error = %e, "recording the delivery failed; giving up"),
    }
    true
}

/// Reports `job`'s run, or its group of attempts ([`groups`]).
async fn report(github: &Github, store: &Store, job: &DeliveryJob) -> Result<Reported, GithubError> {
    if job.run.attempts.is_some() {
        return groups::deliver(github, store, job).await;
    }
    let (pull_request, comment) = deliver_job(github, store, job).await?;
    Ok(Reported { pull_request, comment, delivered: true })
}

/// Extends `job`'s lease; returns once the lease is lost: taken over, or
/// about to run out because the database has not answered (given up a
/// third early, so the worker stops before another can start).
async fn keep_lease(store: &Store, job: &DeliveryJob) {
    LeaseKeeper::new("GitHub delivery", job.run.id, DELIVERY_LEASE)
        .giving_up_early(DELIVERY_LEASE / 3)
        .keep(|| async { store.extend_github_delivery(job, DELIVERY_LEASE).await.map(Beat::extended_if) })
        .await;
}
