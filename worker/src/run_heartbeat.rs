//! A run's heartbeat: its lease kept over the worker's lock connection
//! (`presence`) for as long as the run's task holds it, reporting a cancel
//! request and a lost lease through tokens. Used by a run's life and by a
//! sub-agent's (which has a lease of its own), so it sits below both.

use std::sync::Arc;

use kiln_store::{Lease, StoreError};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::context::WorkerContext;
use crate::lease_keeper::{Beat, LeaseKeeper};

/// The heartbeat task; aborted when dropped. A run task torn down mid-way
/// must stop extending its lease, or nobody could take the run over.
pub struct RunHeartbeat(tokio::task::JoinHandle<()>);

impl RunHeartbeat {
    /// Starts beating for `lease` in the current span: `cancel` fires when a
    /// client asked to cancel, `lost` once the lease is lost.
    pub fn start(ctx: Arc<WorkerContext>, lease: Lease, cancel: CancellationToken, lost: CancellationToken) -> Self {
        RunHeartbeat(tokio::spawn(beat(ctx, lease, cancel, lost).instrument(tracing::Span::current())))
    }
}

impl Drop for RunHeartbeat {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn beat(ctx: Arc<WorkerContext>, lease: Lease, cancel: CancellationToken, lost: CancellationToken) {
    LeaseKeeper::new("run", lease.run_id, ctx.config.lease)
        .reporting_cancel(cancel)
        .keep(|| async {
            match ctx.presence.heartbeat(&lease, ctx.config.lease).await {
                Ok(beat) if beat.cancel_requested => Ok(Beat::CancelRequested),
                Ok(_) => Ok(Beat::Extended),
                Err(StoreError::LeaseLost(_)) => Ok(Beat::Lost),
                Err(e) => Err(e),
            }
        })
        .await;
    lost.cancel();
}
