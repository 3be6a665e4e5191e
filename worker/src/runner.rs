//! The claim loop: wait for queued runs, claim them up to the concurrency
//! limit, drive each in its own task, reap expired leases, shut down
//! gracefully.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::Docker;
use kiln_protocol::RunStatus;
use kiln_store::{Listener, Notice, Store, channels};
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::config::{Providers, WorkerConfig};
use crate::providers::pricing::PriceTable;
use crate::run_task::{self, RunSignals};
use crate::sandbox;
use crate::tools::Registry;

/// Shared by the claim loop and every run task.
pub struct WorkerContext {
    pub store: Store,
    pub docker: Docker,
    pub config: WorkerConfig,
    pub providers: Providers,
    /// Prices per model, for cost budgets and `step.finished` events.
    pub prices: PriceTable,
    pub tools: Registry,
}

pub struct Worker {
    ctx: Arc<WorkerContext>,
    listener: Listener,
    /// Signals of the runs this worker drives, so a cancel notification can
    /// reach the right one.
    active: Arc<Mutex<HashMap<Uuid, RunSignals>>>,
}

impl Worker {
    pub fn new(ctx: WorkerContext, listener: Listener) -> Self {
        Worker { ctx: Arc::new(ctx), listener, active: Arc::default() }
    }

    /// Runs until `shutdown` fires, then stops claiming, gives running runs
    /// the grace period, hands back the rest and returns.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut notices = self.listener.subscribe();
        let mut tasks = JoinSet::new();
        self.clean_up_leftovers().await;
        let mut reap = tokio::time::interval(self.ctx.config.lease / 2);
        let mut poll = tokio::time::interval(self.ctx.config.poll_interval);
        tracing::info!(worker = %self.ctx.config.worker_id, "worker started");
        loop {
            self.claim_while_capacity(&mut tasks).await;
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = poll.tick() => {}
                _ = reap.tick() => self.reap().await,
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                notice = notices.recv() => self.on_notice(notice),
            }
        }
        self.shut_down(tasks).await;
    }

    async fn claim_while_capacity(&self, tasks: &mut JoinSet<()>) {
        while tasks.len() < self.ctx.config.concurrency {
            match self.ctx.store.claim_run(&self.ctx.config.worker_id, self.ctx.config.lease).await {
                Ok(Some((run, lease))) => {
                    tracing::info!(run_id = %run.id, attempt = lease.attempt, "claimed run");
                    let signals = RunSignals::default();
                    lock(&self.active).insert(run.id, signals.clone());
                    let ctx = self.ctx.clone();
                    let active = self.active.clone();
                    tasks.spawn(async move {
                        let id = run.id;
                        run_task::execute(ctx, run, lease, signals).await;
                        lock(&active).remove(&id);
                    });
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "claiming failed");
                    return;
                }
            }
        }
    }

    fn on_notice(&self, notice: Result<Notice, RecvError>) {
        match notice {
            Ok(Notice::Notification { channel, payload }) if channel == channels::RUN_CANCEL => {
                if let Ok(id) = Uuid::parse_str(&payload)
                    && let Some(signals) = lock(&self.active).get(&id)
                {
                    signals.cancel.cancel();
                }
            }
            Ok(Notice::Notification { channel, payload }) if channel == channels::RUN_CONTROL => {
                if let Ok(id) = Uuid::parse_str(&payload)
                    && let Some(signals) = lock(&self.active).get(&id)
                {
                    signals.control.notify_one();
                }
            }
            // Queued runs, reconnects and lag all mean "try claiming"; the
            // loop does that on every turn. Heartbeats also carry
            // cancellation, so a missed cancel notice costs a heartbeat.
            _ => {}
        }
    }

    async fn reap(&self) {
        match self.ctx.store.reap_expired_leases().await {
            Ok(reaped) => {
                for r in reaped {
                    tracing::warn!(run_id = %r.run_id, attempt = r.attempt, status = %r.status, "reaped expired lease");
                }
            }
            Err(e) => tracing::warn!(error = %e, "reaping failed"),
        }
    }

    /// Removes containers whose runs are no longer active (finished, or back
    /// in the queue): left by a worker that died, or by this one before a crash.
    async fn clean_up_leftovers(&self) {
        let containers = match sandbox::list_managed_with_runs(&self.ctx.docker).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "listing sandboxes failed");
                return;
            }
        };
        for (container, run_id) in containers {
            // A container whose run this database does not know belongs to
            // another Kiln deployment sharing the engine: not ours to remove.
            let Some(run_id) = run_id else { continue };
            let leftover = match self.ctx.store.get_run_unscoped(run_id).await {
                Ok(Some(run)) => !matches!(run.status, RunStatus::Running | RunStatus::AwaitingApproval),
                Ok(None) | Err(_) => false,
            };
            if leftover {
                tracing::info!(%container, %run_id, "removing leftover sandbox");
                sandbox::remove_by_id(&self.ctx.docker, &container).await;
            }
        }
    }

    async fn shut_down(&self, mut tasks: JoinSet<()>) {
        tracing::info!(runs = tasks.len(), "worker stopping; no new claims");
        let grace = tokio::time::sleep(self.ctx.config.shutdown_grace);
        tokio::pin!(grace);
        loop {
            tokio::select! {
                next = tasks.join_next() => if next.is_none() { return },
                _ = &mut grace => break,
            }
        }
        // Out of grace: ask the remaining runs to hand their leases back so
        // another worker takes them at once.
        for signals in lock(&self.active).values() {
            signals.release.cancel();
        }
        let deadline = tokio::time::sleep(Duration::from_secs(10));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                next = tasks.join_next() => if next.is_none() { return },
                _ = &mut deadline => {
                    tasks.abort_all();
                    return;
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panicking run task must not take the claim loop down with it.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
