//! Owed pushes (`git_deliveries`): a single run's, owed with its end, and
//! a group's, owed with each choice — claimed, made and recorded the same
//! way, by the driver of all owed work (`crate::owed`). The worker that ends a run tries its push at once; every worker
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
use kiln_store::{GitDeliveryClaim, GitDeliveryEnd, StoreError};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{Attempt, GitDeliverySettings};
use crate::context::WorkerContext;
use crate::owed::{self, Owed, Settled};

/// Makes owed pushes until `shutdown`, polling every `poll_interval` when
/// there are none.
pub async fn serve(ctx: Arc<WorkerContext>, shutdown: CancellationToken) {
    owed::serve(&Pushes(&ctx), ctx.config.poll_interval, &shutdown).await;
}

/// Claims, makes and records one owed push: run `run_id`'s, or with
/// `None` the longest-owed one. Whether there was one to claim.
pub async fn deliver_owed(ctx: &WorkerContext, run_id: Option<Uuid>) -> bool {
    owed::make_one(&Pushes(ctx), run_id).await
}

/// Owed pushes, as owed work: one attempt per claim, a failure that may
/// pass owed again after a backoff.
struct Pushes<'a>(&'a WorkerContext);

impl Owed for Pushes<'_> {
    type Claim = GitDeliveryClaim;
    type Outcome = Attempt;
    type End = GitDeliveryEnd;
    const WHAT: &'static str = "git delivery";

    fn lease(&self) -> Duration {
        self.0.config.lease
    }
    fn run_id(claim: &GitDeliveryClaim) -> Uuid {
        claim.run.id
    }
    fn attempts_before(claim: &GitDeliveryClaim) -> u32 {
        claim.attempts
    }
    async fn claim(&self, run_id: Option<Uuid>) -> Result<Option<GitDeliveryClaim>, StoreError> {
        self.0.store.claim_git_delivery(run_id, self.lease()).await
    }
    async fn extend(&self, claim: &GitDeliveryClaim) -> Result<bool, StoreError> {
        self.0.store.extend_git_delivery(claim, self.lease()).await
    }
    async fn attempt(&self, claim: &GitDeliveryClaim, _number: u32) -> Attempt {
        super::attempt(self.0, &claim.run).await
    }
    fn settle(&self, claim: &GitDeliveryClaim, number: u32, attempt: Attempt) -> Settled<GitDeliveryEnd> {
        let (end, event) = settle(&self.0.config.git_delivery, claim.run.id, number, attempt);
        Settled::once(end, event)
    }
    async fn end(&self, claim: &GitDeliveryClaim, end: &GitDeliveryEnd, event: &EventBody) -> Result<bool, StoreError> {
        self.0.store.end_git_delivery(claim, *end, event).await
    }
}

/// What an attempt comes to for the row and the run's events.
fn settle(settings: &GitDeliverySettings, run_id: Uuid, number: u32, attempt: Attempt) -> (GitDeliveryEnd, EventBody) {
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
