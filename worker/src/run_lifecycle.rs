//! The lifecycle of one claimed run: heartbeat, its work (`crate::run`:
//! sandbox, network, workspace, tools, agent), the capture of its change,
//! and exactly one ending (succeeded, failed, cancelled, timed out,
//! released, or lost to another worker), then its delivery. The session's container outlives
//! the run (for follow-ups and takeovers) unless the deployment keeps none.

use std::sync::Arc;
use std::time::Duration;

use kiln_protocol::{EventBody, Run};
use kiln_store::{Lease, StoreError};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::agent::control::Control;
use crate::agent::{AgentError, Outcome};
use crate::context::WorkerContext;
use crate::db_retry;
use crate::event_sink::EventSink;
use crate::handoff::Handoff;
use crate::retry::{self, Verdict};
use crate::run_heartbeat::RunHeartbeat;
use crate::sandbox::lifecycle;
use crate::sandbox::pool::WarmPool;

/// Ways to stop a run from outside its task.
#[derive(Clone, Default)]
pub struct RunSignals {
    /// A client asked to cancel.
    pub cancel: CancellationToken,
    /// The worker is shutting down: hand the run back to the queue.
    pub release: CancellationToken,
    /// A client sent a message or an approval decision.
    pub control: Arc<Control>,
    /// Where the run's end may hand the worker's next run (see `handoff`).
    pub handoff: Option<Handoff>,
}

/// How the run's task ended.
enum Ending {
    Finished(Outcome),
    Cancelled,
    TimedOut,
    Released,
    /// The database stayed away longer than the loop's retries: hand the
    /// run back once it returns, to be continued from what is stored,
    /// rather than fail it for an outage.
    DatabaseAway(String),
    /// Another worker holds the run now; write nothing.
    LeaseLost,
    Error(String),
}

/// Drives one claimed run inside its `run` span: every log line and trace
/// span of the run carries its ids, and `step` follows the loop.
pub async fn execute(
    ctx: Arc<WorkerContext>,
    pool: Option<Arc<WarmPool>>,
    run: Run,
    lease: Lease,
    signals: RunSignals,
    tenure: u64,
) {
    let span = tracing::info_span!(
        "run",
        run_id = %run.id,
        session_id = %run.session_id,
        attempt = lease.attempt,
        // 0 until the first step starts; the loop records each step.
        step = 0u32,
        outcome = tracing::field::Empty,
    );
    execute_in_span(ctx, pool, run, lease, signals, tenure).instrument(span).await;
}

async fn execute_in_span(
    ctx: Arc<WorkerContext>,
    pool: Option<Arc<WarmPool>>,
    run: Run,
    lease: Lease,
    signals: RunSignals,
    tenure: u64,
) {
    // Logged here rather than by the claim loop so the line has the run's span.
    tracing::info!(attempt = lease.attempt, "claimed run");
    let lost = CancellationToken::new();
    // Aborted when this task ends *or is dropped*: a run task torn down
    // mid-way must stop extending its lease, or nobody could take the run over.
    let heartbeat = RunHeartbeat::start(ctx.clone(), lease.clone(), signals.cancel.clone(), lost.clone());
    // Whatever path the run takes, its sandbox handle is not held past it.
    let _hold = ctx.held_sandboxes.hold_until_dropped(run.id);
    let mut events = EventSink::new(ctx.store.clone(), lease.clone());
    if let Some(group) = crate::attempts::GroupStream::of(&ctx.store, &run) {
        events.nest_into(group);
    }

    let ending = work(&ctx, pool.as_deref(), &run, &lease, &signals, tenure, &lost, &mut events).await;
    record_unfinished_step(&ctx, &run, &ending, &mut events).await;
    let ending = after_work(&ctx, &run, &lease, ending, &mut events).await;
    if !matches!(ending, Ending::LeaseLost) {
        let _ = events.commit().await;
    }
    let recorded = finish(&ctx, &run, &lease, ending, signals.handoff.as_ref()).await;
    drop(heartbeat);
    if recorded {
        crate::attempts::ended(&ctx.store, &run).await;
        crate::delivery::deliver_finished(&ctx, &run).await;
    }
}

/// The run's work, until it ends on its own or is ended from outside (a
/// cancel, the worker's release, a lost lease, the wall clock).
#[allow(clippy::too_many_arguments)]
async fn work(
    ctx: &Arc<WorkerContext>,
    pool: Option<&WarmPool>,
    run: &Run,
    lease: &Lease,
    signals: &RunSignals,
    tenure: u64,
    lost: &CancellationToken,
    events: &mut EventSink,
) -> Ending {
    if run.cancel_requested {
        return Ending::Cancelled;
    }
    let remaining = remaining_time(run);
    let work = crate::run::drive(ctx, pool, run, lease, events, signals.control.clone());
    // Stands still while the worker's lock connection is down, and is
    // dropped if others took the run meanwhile (`presence`).
    let work = ctx.presence.while_held(tenure, work);
    tokio::select! {
        result = work => match result {
            Err(crate::presence::Lost) => Ending::LeaseLost,
            Ok(Ok(outcome)) => Ending::Finished(outcome),
            Ok(Err(AgentError::Store(StoreError::LeaseLost(_)))) => Ending::LeaseLost,
            Ok(Err(AgentError::Store(e))) if e.is_unavailable() => Ending::DatabaseAway(e.to_string()),
            Ok(Err(e)) => Ending::Error(e.to_string()),
        },
        _ = signals.cancel.cancelled() => Ending::Cancelled,
        _ = signals.release.cancelled() => Ending::Released,
        _ = lost.cancelled() => Ending::LeaseLost,
        _ = tokio::time::sleep(remaining) => Ending::TimedOut,
    }
}

/// After the work, for a run that ends here: capture its change, then put
/// its container to rest.
///
/// The heartbeat goes on until the end is written: putting the container
/// to rest, the last events and the terminal write (each with retries) can
/// together outlast the lease, and a run whose lease expired then would be
/// taken over although it is done. A beat that comes after the end matches
/// nothing and stops the loop.
///
/// A run handed to another worker leaves the container as it is: the next
/// attempt adopts it, resets it and captures. That includes a run whose
/// lease was taken without this task noticing yet.
async fn after_work(ctx: &WorkerContext, run: &Run, lease: &Lease, ending: Ending, events: &mut EventSink) -> Ending {
    if matches!(ending, Ending::Released | Ending::DatabaseAway(_) | Ending::LeaseLost) {
        return ending;
    }
    match ctx.presence.heartbeat(lease, ctx.config.lease).await {
        Ok(_) => {
            crate::capture::capture_change(ctx, run, lease, events).await;
            let keep = !ctx.config.sandbox_idle.is_zero();
            lifecycle::after_run(&ctx.sandboxes, &ctx.config.sandbox, run.session_id, keep).await;
            ending
        }
        Err(StoreError::LeaseLost(_)) => Ending::LeaseLost,
        Err(e) => {
            // Not knowing who holds the run, leave its container alone:
            // the next run of the session resets it, the reaper removes it.
            tracing::warn!(run_id = %run.id, error = %e, "could not confirm the lease; leaving the sandbox as it is");
            ending
        }
    }
}

/// A run that ends for good in the middle of a model call still paid for
/// what the provider reported of it: that usage goes in a `step.finished`
/// (its `finish_reason` says why the step ended), so totals and cost count
/// it. A run that will go on elsewhere (released, lease lost) leaves it to
/// the attempt that repeats the step.
async fn record_unfinished_step(ctx: &WorkerContext, run: &Run, ending: &Ending, events: &mut EventSink) {
    let finish_reason = match ending {
        Ending::Cancelled => "cancelled",
        Ending::TimedOut => "timed_out",
        Ending::Error(_) => "error",
        Ending::Finished(_) | Ending::Released | Ending::DatabaseAway(_) | Ending::LeaseLost => return,
    };
    let Some(unfinished) = events.take_unfinished_step() else { return };
    let model = run.model.name.clone().unwrap_or_else(|| ctx.config.default_model.clone());
    let cost_usd = ctx.prices.cost(&model, &unfinished.usage);
    let body = EventBody::StepFinished {
        step: unfinished.step,
        finish_reason: finish_reason.to_owned(),
        usage: unfinished.usage,
        cost_usd,
    };
    // Written with the run's last events by the commit that follows.
    if let Err(e) = events.write_soon(body).await {
        tracing::warn!(run_id = %run.id, error = %e, "could not record the interrupted step's usage");
    }
}

/// Time left of the run's wall-clock budget, counted from its first start.
fn remaining_time(run: &Run) -> Duration {
    let limit = Duration::from_secs(u64::from(run.limits.timeout_s()));
    let elapsed = run.started_at.map(|t| (chrono::Utc::now() - t).to_std().unwrap_or_default()).unwrap_or_default();
    limit.saturating_sub(elapsed)
}

/// Hands the run back to the queue, riding out a database still on its way
/// back; failing that, its lease expires and the reaper returns it.
async fn release(ctx: &WorkerContext, run: &Run, lease: &Lease) {
    if let Err(e) = db_retry::with_retry(|| ctx.store.release_run(lease)).await {
        tracing::warn!(run_id = %run.id, error = %e, "releasing run failed; its lease will expire");
    }
}

/// Writes the run's end; `true` when a terminal event was recorded.
async fn finish(ctx: &WorkerContext, run: &Run, lease: &Lease, ending: Ending, handoff: Option<&Handoff>) -> bool {
    let terminal = match ending {
        Ending::Finished(Outcome::Succeeded { summary }) => EventBody::RunSucceeded { summary },
        Ending::Finished(Outcome::Failed { error }) | Ending::Error(error) => EventBody::RunFailed { error },
        Ending::Cancelled => EventBody::RunCancelled { reason: "cancelled by client".into() },
        Ending::TimedOut => EventBody::RunTimedOut { limit_s: run.limits.timeout_s() },
        Ending::Finished(Outcome::TimedOut { limit_s }) => EventBody::RunTimedOut { limit_s },
        Ending::Released | Ending::DatabaseAway(_) => {
            if let Ending::DatabaseAway(why) = &ending {
                tracing::warn!(run_id = %run.id, error = %why, "the database stayed away; handing the run back");
            }
            tracing::Span::current().record("outcome", "released");
            release(ctx, run, lease).await;
            return false;
        }
        Ending::LeaseLost => {
            tracing::Span::current().record("outcome", "lease_lost");
            tracing::warn!(run_id = %run.id, "lease lost; another worker has the run");
            return false;
        }
    };
    // Its children end with it: nobody drives them now (a cancelled
    // parent's task dropped theirs mid-step).
    let children_end = match &terminal {
        EventBody::RunCancelled { .. } => EventBody::RunCancelled { reason: "the parent run was cancelled".into() },
        _ => EventBody::RunFailed { error: "the parent run ended while this sub-agent ran".into() },
    };
    if let Err(e) = db_retry::with_retry(|| ctx.store.end_children(run.id, &children_end)).await {
        tracing::warn!(run_id = %run.id, error = %e, "ending the run's sub-agents failed");
    }
    // Every arm above made a terminal event.
    let status = terminal.terminal_status().map_or("failed", kiln_protocol::RunStatus::as_str);
    tracing::Span::current().record("outcome", status);
    crate::metrics::run_finished(status);
    let result = match &terminal {
        EventBody::RunSucceeded { summary } => Some(serde_json::json!({ "summary": summary })),
        _ => None,
    };
    tracing::info!(run_id = %run.id, kind = ?terminal, "run finished");
    // The database may be briefly away; the terminal write is worth retrying.
    let recorded = retry::retry(
        &retry::DATABASE,
        || finish_and_maybe_claim(ctx, lease, &terminal, result.as_ref(), handoff),
        |e: &StoreError| Verdict::retry_if(!matches!(e, StoreError::LeaseLost(_))),
        |e, attempt, _| tracing::warn!(run_id = %run.id, error = %e, attempt, "recording the run's end failed"),
    )
    .await;
    match recorded {
        Ok(()) => true,
        Err(StoreError::LeaseLost(_)) => false,
        Err(e) => {
            tracing::warn!(run_id = %run.id, error = %e, "recording the run's end failed; giving up");
            false
        }
    }
}

/// Records the run's end; with a handoff open, claims the worker's next run
/// in the same statement and hands it to the claim loop.
async fn finish_and_maybe_claim(
    ctx: &WorkerContext,
    lease: &Lease,
    terminal: &EventBody,
    result: Option<&serde_json::Value>,
    handoff: Option<&Handoff>,
) -> Result<(), StoreError> {
    let Some(handoff) = handoff.filter(|h| h.is_open()) else {
        return ctx.store.finish_run(lease, terminal, result).await;
    };
    let next = ctx.store.finish_run_and_claim(lease, terminal, result, &ctx.config.worker_id, ctx.config.lease).await?;
    if let Some((run, next_lease)) = next
        && let Err(next_lease) = handoff.give(run, next_lease)
    {
        // The claim loop is gone (the worker is stopping): put it back.
        let run_id = next_lease.run_id;
        tracing::info!(%run_id, "handing back a run claimed while the worker stopped");
        if let Err(e) = ctx.store.release_run(&next_lease).await {
            tracing::warn!(%run_id, error = %e, "releasing run failed; its lease will expire");
        }
    }
    Ok(())
}
