//! The event retention task: now and then, prune the events of runs that
//! ended longer ago than `KILN_EVENT_RETENTION_DAYS` (see
//! `kiln_store::Store::prune_events`). Every worker runs it; concurrent passes
//! are harmless, and the work is small batches that never hold long locks.

use std::time::Duration;

use kiln_store::Store;
use tokio_util::sync::CancellationToken;

/// Events deleted per statement.
const BATCH: i64 = 1000;
/// Between passes. Retention is counted in days; an hour late is fine.
const EVERY: Duration = Duration::from_secs(3600);

/// Prunes once at start, then every [`EVERY`], until `shutdown` fires.
pub async fn serve(store: Store, keep: Duration, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(EVERY);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        // A pass cut short by shutdown loses nothing: the next one resumes.
        tokio::select! {
            _ = shutdown.cancelled() => return,
            pruned = store.prune_events(keep, BATCH) => match pruned {
                Ok(p) if p.events > 0 || p.runs > 0 => {
                    tracing::info!(events = p.events, runs = p.runs, "pruned events of old runs");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "pruning old events failed; trying again next pass"),
            },
        }
    }
}
