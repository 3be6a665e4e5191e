//! Owed pushes (`git_deliveries`): a single run's, owed with its end, and
//! a group's, owed with each choice — claimed, made and recorded the same
//! way. The worker that ends a run tries its push at once; every worker
//! polls for the rest: pushes whose worker died (once their lease runs
//! out), retries whose backoff has passed, groups once chosen.
//!
//! A push that fails for a reason that may pass (the remote down or
//! answering 5xx, a network error: [`DeliveryError::may_pass`]) is owed
//! again after a backoff, up to `KILN_GIT_DELIVERY_ATTEMPTS` attempts;
//! each attempt ends with an event: `delivery.succeeded`,
//! `delivery.retrying`, or `delivery.failed` (refused, or given up).

use std::sync::Arc;
use std::time::Duration;

use kiln_protocol::EventBody;
use kiln_store::{GitDeliveryClaim, GitDeliveryEnd};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{Attempt, GitDeliverySettings};
use crate::context::WorkerContext;
use crate::lease_keeper::{Beat, LeaseKeeper};

/// Makes owed pushes until `shutdown`, polling every `poll_interval` when
/// there are none.
pub async fn serve(ctx: Arc<WorkerContext>, shutdown: CancellationToken) {
    loop {
        while !shutdown.is_cancelled() && deliver_owed(&ctx, None).await {}
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(ctx.config.poll_interval) => {}
        }
    }
}

/// Claims, makes and records one owed push: run `run_id`'s, or with
/// `None` the longest-owed one. Whether there was one to claim.
pub async fn deliver_owed(ctx: &WorkerContext, run_id: Option<Uuid>) -> bool {
    let lease = ctx.config.lease;
    let claim = match ctx.store.claim_git_delivery(run_id, lease).await {
        Ok(Some(claim)) => claim,
        Ok(None) => return false,
        Err(e) => {
            tracing::warn!(?run_id, error = %e, "claiming a git delivery failed");
            return false;
        }
    };
    let run_id = claim.run.id;
    // Pushing stops (git's children are killed on drop) if the lease is
    // lost: another worker is pushing by then.
    let attempt = tokio::select! {
        attempt = super::attempt(ctx, &claim.run) => attempt,
        () = keep_lease(ctx, &claim, lease) => {
            tracing::warn!(%run_id, "lost a git delivery's lease; another worker makes it");
            return true;
        }
    };
    let (end, event) = settle(&ctx.config.git_delivery, &claim, attempt);
    match crate::db_retry::with_retry(|| ctx.store.end_git_delivery(&claim, end, &event)).await {
        Ok(true) => {}
        Ok(false) => tracing::warn!(%run_id, "a git delivery's lease ran out before it was recorded"),
        Err(e) => tracing::warn!(%run_id, error = %e, "recording a git delivery failed"),
    }
    true
}

/// What an attempt comes to for the row and the run's events.
fn settle(settings: &GitDeliverySettings, claim: &GitDeliveryClaim, attempt: Attempt) -> (GitDeliveryEnd, EventBody) {
    let run_id = claim.run.id;
    let number = claim.attempts.saturating_add(1);
    match attempt {
        Attempt::Pushed(p) => {
            tracing::info!(%run_id, branch = %p.branch, commit = %p.commit, "pushed the run's change");
            let event = EventBody::DeliverySucceeded {
                pull_request: None,
                comment: None,
                branch: Some(p.branch),
                commit: Some(p.commit),
                remote: Some(p.remote),
            };
            (GitDeliveryEnd::Delivered, event)
        }
        // Owed because it asked; should its spec say otherwise now, the
        // claim still ends, saying so.
        Attempt::NotAsked => {
            let error = "the run asked for no git delivery".to_owned();
            (GitDeliveryEnd::GaveUp, EventBody::DeliveryFailed { error })
        }
        Attempt::Failed { error, may_pass } => match settings.retry_after(number).filter(|_| may_pass) {
            Some(wait) => {
                tracing::warn!(%run_id, attempt = number, %error, ?wait, "pushing the run's change failed; will retry");
                let retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
                (GitDeliveryEnd::RetryIn(wait), EventBody::DeliveryRetrying { attempt: number, error, retry_in_ms })
            }
            None => {
                tracing::warn!(%run_id, attempt = number, %error, "pushing the run's change failed; giving up");
                let error = if may_pass { format!("gave up after {number} attempts: {error}") } else { error };
                (GitDeliveryEnd::GaveUp, EventBody::DeliveryFailed { error })
            }
        },
    }
}

/// Extends `claim`'s lease; returns once it is lost (taken over, or about
/// to run out because the database has not answered).
async fn keep_lease(ctx: &WorkerContext, claim: &GitDeliveryClaim, lease: Duration) {
    LeaseKeeper::new("git delivery", claim.run.id, lease)
        .giving_up_early(lease / 3)
        .keep(|| async { ctx.store.extend_git_delivery(claim, lease).await.map(Beat::extended_if) })
        .await;
}
