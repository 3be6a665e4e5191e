//! Owed deliveries: what a GitHub report is as owed work. Claiming one,
//! keeping its lease while delivering and recording how it went are the
//! driver's of all owed work (`crate::owed`).
//!
//! A GitHub run that ends owes a delivery, recorded in the transaction that
//! ends it (see `migrations/V7__github_owed_deliveries.sql`). The worker that
//! finished a run delivers it at once; every worker with GitHub configured
//! also polls for owed deliveries nobody is working on: runs cancelled while
//! queued (no worker ever held them), runs the reaper failed, retries asked
//! for through `POST /v1/runs/{id}/deliver`, and deliveries whose worker died.

use std::time::Duration;

use kiln_protocol::EventBody;
use kiln_store::{DeliveryJob, Store, StoreError};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::delivery::deliver_job;
use super::groups::{self, Reported};
use super::{Github, GithubError};
use crate::owed::{self, Owed, Settled};

/// How long a claimed delivery stays claimed without being extended: how
/// long a delivery a dead worker left waits before another worker takes it.
/// Extended every third of it, so only a worker that cannot reach the
/// database for the whole lease loses it.
const DELIVERY_LEASE: Duration = Duration::from_secs(60);

/// Claims and delivers one owed delivery, run `run_id`'s or with `None` the
/// longest-owed one, and records the outcome as an event. Returns whether
/// there was one to claim.
pub async fn deliver_owed(github: &Github, store: &Store, run_id: Option<Uuid>) -> bool {
    owed::make_one(&Reports { github, store }, run_id).await
}

/// Makes owed deliveries until `shutdown`, polling every `poll` when there
/// are none.
pub async fn serve(github: &Github, store: &Store, poll: Duration, shutdown: &CancellationToken) {
    owed::serve(&Reports { github, store }, poll, shutdown).await;
}

/// Owed GitHub reports, as owed work: one attempt per claim; a failed one
/// is settled too (retried when asked for again).
struct Reports<'a> {
    github: &'a Github,
    store: &'a Store,
}

impl Owed for Reports<'_> {
    type Claim = DeliveryJob;
    /// The report, or why it failed (redacted).
    type Outcome = Result<Reported, String>;
    /// Whether the run's result is on GitHub.
    type End = bool;
    const WHAT: &'static str = "GitHub delivery";

    fn lease(&self) -> Duration {
        DELIVERY_LEASE
    }
    fn run_id(job: &DeliveryJob) -> Uuid {
        job.run.id
    }
    async fn claim(&self, run_id: Option<Uuid>) -> Result<Option<DeliveryJob>, StoreError> {
        self.store.claim_github_delivery(run_id, DELIVERY_LEASE).await
    }
    async fn extend(&self, job: &DeliveryJob) -> Result<bool, StoreError> {
        self.store.extend_github_delivery(job, DELIVERY_LEASE).await
    }
    async fn attempt(&self, job: &DeliveryJob, _number: u32) -> Result<Reported, String> {
        match report(self.github, self.store, job).await {
            Ok(reported) => Ok(reported),
            Err(e) => Err(self.github.redact(&e.to_string()).await),
        }
    }
    fn settle(&self, job: &DeliveryJob, _number: u32, outcome: Result<Reported, String>) -> Settled<bool> {
        let run_id = job.run.id;
        match outcome {
            Ok(Reported { pull_request, comment, delivered }) => {
                tracing::info!(%run_id, ?pull_request, "delivered to GitHub");
                let event =
                    EventBody::DeliverySucceeded { pull_request, comment, branch: None, commit: None, remote: None };
                Settled::once(delivered, event)
            }
            Err(error) => {
                tracing::warn!(%run_id, %error, "delivery to GitHub failed");
                Settled::once(false, EventBody::DeliveryFailed { error })
            }
        }
    }
    async fn end(&self, job: &DeliveryJob, delivered: &bool, event: &EventBody) -> Result<bool, StoreError> {
        self.store.end_github_delivery(job, *delivered, event).await
    }
}

/// Reports `job`'s run, or its group of attempts ([`groups`]).
async fn report(github: &Github, store: &Store, job: &DeliveryJob) -> Result<Reported, GithubError> {
    if job.run.attempts.is_some() {
        return groups::deliver(github, store, job).await;
    }
    let (pull_request, comment) = deliver_job(github, store, job).await?;
    Ok(Reported { pull_request, comment, delivered: true })
}
