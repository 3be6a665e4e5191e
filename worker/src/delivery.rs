//! Where a run's result goes once its end is written. Each kind is a
//! [`Delivery`]; what a run is owed follows from its origin and its spec,
//! decided here once, and the run's life makes them in one call
//! ([`deliver_finished`]):
//! - a GitHub report (branch, pull request, comment) for a run a webhook
//!   started, owed in the database with the run's end and made here at
//!   once, or by any worker later (`github::serve_pending_deliveries`);
//! - a push to a git remote for a run that asked for `deliver.git`
//!   (`git_delivery`), owed in the database with the run's end and tried
//!   here at once, or by any worker later, with retries
//!   (`git_delivery::owed::serve`); a group of attempts pushes its chosen
//!   attempt's change once chosen, never from here;
//! - completion callbacks (`callback_url`) are owed with the end too, and
//!   sent by `callbacks::serve`, woken by the end's notice: nothing to do
//!   here.
//!
//! Every one takes the change the capture stored (`run_changes`): one
//! capture path, whatever the delivery. Their outcomes are `delivery.*`
//! events after the terminal one; none changes the run's result.

use kiln_protocol::Run;

use crate::context::WorkerContext;
use crate::github::Github;
use crate::origin::Origin;

/// One place a finished run's result goes.
pub enum Delivery<'a> {
    GithubReport(&'a Github),
    GitPush,
}

impl<'a> Delivery<'a> {
    /// What `run` is owed on this worker, in the order they are made.
    pub fn owed(ctx: &'a WorkerContext, run: &Run) -> Vec<Delivery<'a>> {
        let mut owed = Vec::new();
        if let Origin::Github(github) = Origin::of(ctx, run) {
            owed.push(Delivery::GithubReport(github));
        }
        if crate::git_delivery::asked(run) {
            owed.push(Delivery::GitPush);
        }
        owed
    }

    async fn make(&self, ctx: &WorkerContext, run: &Run) {
        match self {
            Delivery::GithubReport(github) => crate::github::deliver_finished(github, &ctx.store, run).await,
            // Tried at once (if no other worker holds it); a failure is
            // retried later by any worker.
            Delivery::GitPush => {
                crate::git_delivery::owed::deliver_owed(ctx, Some(run.id)).await;
            }
        }
    }
}

/// After the run's end is written: makes what it is owed.
pub async fn deliver_finished(ctx: &WorkerContext, run: &Run) {
    for delivery in Delivery::owed(ctx, run) {
        delivery.make(ctx, run).await;
    }
}
