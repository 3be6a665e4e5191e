//! One claimed run's work, as named phases in their order: prepare the
//! sandbox, connect its network, fill its workspace, connect its tools,
//! drive the agent. What comes after the run's end is decided (capture the
//! change, put the sandbox to rest, write the end, deliver) is in
//! `run_lifecycle::execute_in_span`, since a cancel or a timeout ends this
//! future from outside.

mod agent;
mod connect;
mod sandbox;

use std::sync::Arc;

use kiln_protocol::{EventBody, Run};
use kiln_store::Lease;

use crate::agent::control::Control;
use crate::agent::{AgentError, Outcome};
use crate::context::WorkerContext;
use crate::db_retry;
use crate::event_sink::EventSink;
use crate::event_sink::budget::EventBudget;
use crate::sandbox::pool::WarmPool;

/// Why a phase ended the run early.
#[derive(Debug, thiserror::Error)]
pub enum PhaseError {
    /// The run ends so (it fails, saying why: a refused sandbox spec, a
    /// checkout or sandbox that could not be made, …).
    #[error("the run ended before its agent: {0:?}")]
    Ended(Outcome),
    #[error(transparent)]
    Agent(#[from] AgentError),
}

impl PhaseError {
    fn failed(error: impl Into<String>) -> Self {
        PhaseError::Ended(Outcome::Failed { error: error.into() })
    }
}

impl From<kiln_store::StoreError> for PhaseError {
    fn from(e: kiln_store::StoreError) -> Self {
        PhaseError::Agent(e.into())
    }
}

/// Runs the phases; a phase that fails the run ends it as `Failed`.
pub async fn drive(
    ctx: &Arc<WorkerContext>,
    pool: Option<&WarmPool>,
    run: &Run,
    lease: &Lease,
    events: &mut EventSink,
    control: Arc<Control>,
) -> Result<Outcome, AgentError> {
    match phases(ctx, pool, run, lease, events, control).await {
        Ok(outcome) => Ok(outcome),
        Err(PhaseError::Ended(outcome)) => Ok(outcome),
        Err(PhaseError::Agent(e)) => Err(e),
    }
}

async fn phases(
    ctx: &Arc<WorkerContext>,
    pool: Option<&WarmPool>,
    run: &Run,
    lease: &Lease,
    events: &mut EventSink,
    control: Arc<Control>,
) -> Result<Outcome, PhaseError> {
    start(ctx, run, lease, events).await?;
    let acquired = sandbox::acquire(ctx, pool, run, events).await?;
    let _active = crate::metrics::ActiveSandbox::enter();
    // Serves the sandbox's network for as long as the run lasts.
    let _proxy = connect::network(ctx, run, &acquired, events).await?;
    let ready = sandbox::fill_workspace(ctx, run, lease, acquired, events).await?;
    // For the capture, however the run ends (see `sandbox::held`).
    ctx.held_sandboxes.hold(run.id, &ready.sandbox);
    let tools = connect::tools(ctx, run, &ready.sandbox, ready.environment_mcp, ready.notice).await;
    let outcome = agent::drive(ctx, run, lease, &ready.sandbox, tools, events, control).await?;
    // What the loop queued goes out before anything else writes events.
    events.commit().await?;
    Ok(outcome)
}

/// `run.started`, with the event budget what earlier attempts left of it.
async fn start(ctx: &WorkerContext, run: &Run, lease: &Lease, events: &mut EventSink) -> Result<(), AgentError> {
    // A run taken over counts what its earlier attempts stored.
    let spent = if lease.attempt > 1 { db_retry::with_retry(|| ctx.store.run_event_bytes(run.id)).await? } else { 0 };
    events.limit(EventBudget::new(ctx.config.max_event_bytes_per_run, spent));
    events.write_now(EventBody::RunStarted { worker: ctx.config.worker_id.clone(), attempt: lease.attempt }).await?;
    Ok(())
}
