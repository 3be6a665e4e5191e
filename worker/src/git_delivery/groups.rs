//! `deliver.git` of a group of attempts (issue 29): the group's change is
//! the chosen attempt's (`POST /v1/runs/{id}/select` copies it), so the push
//! waits for a choice and for the group's end. The API owes it in the
//! database (`migrations/V24__group_delivery_and_base.sql`); every worker with
//! git credentials polls for owed pushes and claims one at a time. From
//! the claim on, the choice can no longer change.

use std::sync::Arc;
use std::time::Duration;

use kiln_protocol::EventBody;
use tokio_util::sync::CancellationToken;

use crate::context::WorkerContext;

/// How long a claim holds. Not extended: a clone and a push take far less;
/// past it another worker may push again, which finds the same change on
/// the branch and reports it (`push::push_new_branch`), so at worst the
/// outcome is recorded by the second.
const LEASE: Duration = Duration::from_secs(300);

/// Makes owed group pushes until `shutdown`, polling every
/// `poll_interval` when there are none.
pub async fn serve(ctx: Arc<WorkerContext>, shutdown: CancellationToken) {
    loop {
        while !shutdown.is_cancelled() && deliver_one(&ctx).await {}
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(ctx.config.poll_interval) => {}
        }
    }
}

/// Claims, makes and records one owed group push; whether there was one.
async fn deliver_one(ctx: &WorkerContext) -> bool {
    let claim = match ctx.store.claim_group_git_delivery(LEASE).await {
        Ok(Some(claim)) => claim,
        Ok(None) => return false,
        Err(e) => {
            tracing::warn!(error = %e, "claiming a group's git delivery failed");
            return false;
        }
    };
    let group = claim.run.id;
    // The group was owed a push because it asked for one; should its spec
    // say otherwise now, the claim still ends, saying so.
    let event = super::outcome(ctx, &claim.run)
        .await
        .unwrap_or_else(|| EventBody::DeliveryFailed { error: "the group asked for no git delivery".into() });
    let delivered = matches!(event, EventBody::DeliverySucceeded { .. });
    match crate::db_retry::with_retry(|| ctx.store.end_group_git_delivery(&claim, delivered, &event)).await {
        Ok(true) => {}
        Ok(false) => tracing::warn!(%group, "the group's git delivery claim ran out before it was recorded"),
        Err(e) => tracing::warn!(%group, error = %e, "recording the group's git delivery failed"),
    }
    true
}
