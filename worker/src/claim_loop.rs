//! The claim loop: wait for queued runs, claim them while there is a free
//! session slot, drive each in its own task, reap expired leases and unused
//! sandboxes, keep the warm pool filled, shut down gracefully.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kiln_protocol::Run;
use kiln_store::{Lease, Listener, Notice, channels};
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::context::WorkerContext;
use crate::handoff::{self, Handoff, Successors};
use crate::run_lifecycle::{self, RunSignals};
use crate::sandbox::pool::WarmPool;
use crate::sandbox_reaper::{self, ReapPolicy};

pub struct Worker {
    ctx: Arc<WorkerContext>,
    listener: Listener,
    /// Signals of the runs this worker drives, so a cancel notification can
    /// reach the right one.
    active: Arc<Mutex<HashMap<Uuid, RunSignals>>>,
    pool: Option<Arc<WarmPool>>,
}

impl Worker {
    pub fn new(ctx: WorkerContext, listener: Listener) -> Self {
        let pool = (ctx.config.warm_pool > 0).then(|| {
            Arc::new(WarmPool::new(
                &ctx.sandboxes,
                ctx.config.sandbox.clone(),
                ctx.config.worker_id.clone(),
                ctx.config.warm_pool,
            ))
        });
        Worker { ctx: Arc::new(ctx), listener, active: Arc::default(), pool }
    }

    /// The warm pool, if this worker keeps one.
    pub fn pool(&self) -> Option<Arc<WarmPool>> {
        self.pool.clone()
    }

    /// What this worker's run tasks share, for the tasks started beside
    /// its claim loop.
    pub fn context(&self) -> Arc<WorkerContext> {
        self.ctx.clone()
    }

    /// Runs until `shutdown` fires, then stops claiming, gives running runs
    /// the grace period, hands back the rest and returns.
    pub async fn run(self, shutdown: CancellationToken) {
        // Held until the worker has wound down, runs handed back included.
        let stop_presence = CancellationToken::new();
        let presence_task = tokio::spawn(self.ctx.presence.clone().keep(stop_presence.clone()));
        let engine = self.start_up().await;
        let pool_task = self.pool.clone().map(|pool| {
            let stop = shutdown.child_token();
            tokio::spawn(async move { pool.run(stop).await })
        });
        tracing::info!(worker = %self.ctx.config.worker_id, "worker started");
        let (tasks, successors) = self.claim_until(&shutdown, engine.as_deref()).await;
        self.shut_down(tasks, successors).await;
        if let Some(task) = pool_task {
            // Cancelled with `shutdown`: it removes its containers and ends.
            let _ = task.await;
        }
        self.wind_down(engine.as_deref()).await;
        stop_presence.cancel();
        let _ = presence_task.await;
    }

    /// Before the first claim: says it is here, clears what dead workers
    /// left, and sets the host firewall up. Which engine this worker drives,
    /// so that the last worker on it knows to clear its idle sessions when
    /// it stops (see `leave_engine`).
    async fn start_up(&self) -> Option<String> {
        let engine = self.ctx.sandboxes.engine_id().await;
        self.announce(engine.as_deref()).await;
        self.reap_sandboxes(true).await;
        // After the reaper: rules of the networks it removed are gone, and
        // those a dead worker left for bridges that no longer exist too.
        let egress = &self.ctx.config.sandbox.egress;
        let any_egress = egress.deployment.mode != kiln_protocol::egress::EgressMode::None;
        egress.host_firewall.announce(any_egress, egress.port).await;
        engine
    }

    /// The claim loop proper: claims while a slot is free whenever the queue
    /// may hold something, and keeps the worker's chores on their ticks,
    /// until `shutdown`. Gives back the runs still going.
    async fn claim_until(&self, shutdown: &CancellationToken, engine: Option<&str>) -> (JoinSet<()>, Successors) {
        let mut notices = self.listener.subscribe();
        let mut presence = self.ctx.presence.subscribe();
        let mut tasks = JoinSet::new();
        let (handoff, mut successors) = handoff::channel();
        let mut ticks = Ticks::new(&self.ctx.config);
        // Whether the queue may hold something for this worker now. Every
        // event anywhere is a notification on a channel it listens to; a
        // claim for each would be hundreds of empty queries a second.
        let mut claim_due = true;
        // Whatever else woke the loop, a worker told to stop claims nothing
        // more.
        while !shutdown.is_cancelled() {
            // Runs handed over by ending runs first: they hold the slots
            // those runs freed, and must not be claimed around.
            while let Some((run, lease)) = successors.try_next() {
                self.spawn_run(&mut tasks, run, lease, &handoff);
            }
            if claim_due {
                self.claim_while_capacity(&mut tasks, &handoff, shutdown).await;
            }
            claim_due = tokio::select! {
                // Shutdown first: a tick or a notice ready at the same time
                // must not take the loop round to another claim.
                biased;
                _ = shutdown.cancelled() => break,
                _ = ticks.poll.tick() => true,
                _ = ticks.reap.tick() => {
                    self.announce(engine).await;
                    // Reaped runs go back to the queue.
                    self.reap().await;
                    true
                }
                _ = ticks.dead_check.tick(), if ticks.check_dead => self.hand_back_dead_workers().await,
                // The lock was taken (again): runs may be claimed.
                Ok(()) = presence.changed() => presence.borrow_and_update().held,
                _ = ticks.reap_sandboxes.tick() => {
                    self.reap_sandboxes(false).await;
                    false
                }
                // A slot came free.
                Some(_) = tasks.join_next(), if !tasks.is_empty() => true,
                Some((run, lease)) = successors.next() => {
                    self.spawn_run(&mut tasks, run, lease, &handoff);
                    false
                }
                notice = notices.recv() => self.on_notice(notice),
            };
        }
        (tasks, successors)
    }

    /// After the runs are handed back: the warm environments go, the engine
    /// is left (its idle sessions cleared by the last worker on it), the
    /// firewall swept, and the worker signs off.
    async fn wind_down(&self, engine: Option<&str>) {
        self.ctx.environment_pools.shutdown().await;
        if let Some(engine) = engine {
            self.leave_engine(engine).await;
        }
        // Rules of bridges gone meanwhile (networks removed by hand, or
        // whose removal failed to clean up); live networks keep theirs:
        // their sandboxes outlive this process.
        self.ctx.config.sandbox.egress.host_firewall.sweep().await;
        if let Err(e) = self.ctx.store.worker_gone(&self.ctx.config.worker_id).await {
            tracing::warn!(error = %e, "could not sign off; other workers will notice after a while");
        }
    }

    /// Hands back the runs of workers whose lock is free: they died. `true`
    /// when runs went back to the queue (one may be for this worker).
    async fn hand_back_dead_workers(&self) -> bool {
        // A worker without its own lock may be the one that is gone.
        if !self.ctx.presence.state().held {
            return false;
        }
        let dead = match self.ctx.store.hand_back_dead_workers().await {
            Ok(dead) => dead,
            Err(e) => {
                tracing::warn!(error = %e, "looking for dead workers failed");
                return false;
            }
        };
        if dead.workers.is_empty() {
            return false;
        }
        for r in &dead.runs {
            tracing::warn!(run_id = %r.run_id, attempt = r.attempt, status = %r.status, "handed back a dead worker's run");
        }
        tracing::warn!(workers = ?dead.workers, runs = dead.runs.len(), "found workers without their lock: gone");
        // Their warm containers are nobody's now.
        self.reap_sandboxes(false).await;
        !dead.runs.is_empty()
    }

    /// Tells the database this worker is alive (see `sandbox_reaper`).
    async fn announce(&self, engine: Option<&str>) {
        if let Err(e) = self.ctx.store.worker_seen(&self.ctx.config.worker_id, engine).await {
            tracing::warn!(error = %e, "recording this worker's presence failed");
        }
    }

    async fn claim_while_capacity(&self, tasks: &mut JoinSet<()>, handoff: &Handoff, shutdown: &CancellationToken) {
        while tasks.len() < self.ctx.config.concurrency && !shutdown.is_cancelled() {
            // Without its lock the worker could not keep what it claims.
            let presence = self.ctx.presence.state();
            if !presence.held {
                return;
            }
            match self.ctx.store.claim_run(&self.ctx.config.worker_id, self.ctx.config.lease).await {
                Ok(Some((run, lease))) => self.spawn_run_in(tasks, run, lease, handoff, presence.tenure),
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "claiming failed");
                    return;
                }
            }
        }
    }

    /// Drives a run claimed by an ending run's statement (`handoff`).
    fn spawn_run(&self, tasks: &mut JoinSet<()>, run: Run, lease: Lease, handoff: &Handoff) {
        let tenure = self.ctx.presence.state().tenure;
        self.spawn_run_in(tasks, run, lease, handoff, tenure);
    }

    /// Drives a run claimed while the worker's lock was in `tenure`.
    fn spawn_run_in(&self, tasks: &mut JoinSet<()>, run: Run, lease: Lease, handoff: &Handoff, tenure: u64) {
        crate::metrics::run_claimed(&run, lease.attempt);
        let handoff = self.ctx.config.claim_on_end.then(|| handoff.clone());
        let signals = RunSignals { handoff, ..Default::default() };
        lock(&self.active).insert(run.id, signals.clone());
        let ctx = self.ctx.clone();
        let pool = self.pool.clone();
        let active = self.active.clone();
        tasks.spawn(async move {
            let id = run.id;
            run_lifecycle::execute(ctx, pool, run, lease, signals, tenure).await;
            lock(&active).remove(&id);
        });
    }

    /// Passes on cancel and control notices to their runs; `true` when the
    /// notice means the queue may hold a run to claim.
    fn on_notice(&self, notice: Result<Notice, RecvError>) -> bool {
        match notice {
            Ok(Notice::Notification { channel, .. }) if channel == channels::RUNS_QUEUED => true,
            Ok(Notice::Notification { channel, payload }) if channel == channels::RUN_CANCEL => {
                if let Ok(id) = Uuid::parse_str(&payload)
                    && let Some(signals) = lock(&self.active).get(&id)
                {
                    signals.cancel.cancel();
                }
                false
            }
            Ok(Notice::Notification { channel, payload }) if channel == channels::RUN_CONTROL => {
                if let Ok(id) = Uuid::parse_str(&payload)
                    && let Some(signals) = lock(&self.active).get(&id)
                {
                    signals.control.signal();
                }
                false
            }
            // An environment's cache was reset, or it changed or went: its
            // warm containers are of an image no run of it will use again.
            Ok(Notice::Notification { channel, payload }) if channel == channels::ENVIRONMENT_CHANGED => {
                if let Ok(id) = Uuid::parse_str(&payload) {
                    let pools = self.ctx.environment_pools.clone();
                    tokio::spawn(async move { pools.forget_environment(id).await });
                }
                false
            }
            // Events of runs anywhere: nothing for the queue.
            Ok(Notice::Notification { .. }) => false,
            // Reconnected, or fell behind: anything may have been missed,
            // a queued run too. (Heartbeats also carry cancellation, so a
            // missed cancel notice costs a heartbeat.)
            Ok(Notice::Reconnected) | Err(_) => true,
        }
    }

    async fn reap(&self) {
        let running: Vec<Uuid> = lock(&self.active).keys().copied().collect();
        let config = &self.ctx.config;
        // A driven run's lease is extended every third of it; half a lease
        // without one means nobody here drives it.
        match self.ctx.store.release_unattended(&config.worker_id, &running, config.lease, config.lease / 2).await {
            Ok(0) => {}
            Ok(n) => {
                tracing::warn!(released = n, "handed back runs held under this worker's name that it was not running")
            }
            Err(e) => tracing::warn!(error = %e, "handing back unattended runs failed"),
        }
        match self.ctx.store.reap_expired_leases().await {
            Ok(reaped) => {
                for r in reaped {
                    tracing::warn!(run_id = %r.run_id, attempt = r.attempt, status = %r.status, "reaped expired lease");
                }
            }
            Err(e) => tracing::warn!(error = %e, "reaping failed"),
        }
    }

    /// Removes sandboxes nobody will use again (see `sandbox_reaper`).
    async fn reap_sandboxes(&self, at_start: bool) {
        let policy = ReapPolicy {
            worker: &self.ctx.config.worker_id,
            at_start,
            idle: self.ctx.config.sandbox_idle,
            // Announced every lease/2: four missed announcements.
            worker_gone_after: self.ctx.config.lease * 2,
            firewall: &self.ctx.config.sandbox.egress.host_firewall,
            sandbox: &self.ctx.config.sandbox,
        };
        sandbox_reaper::reap(&self.ctx.sandboxes, &self.ctx.store, &policy).await;
    }

    /// On a clean stop: when no other live worker of this deployment drives
    /// this engine, nobody would ever remove the idle sessions' containers
    /// here (they are kept for follow-ups; the reaper of a live worker on
    /// the engine removes them once idle). So this worker removes them now;
    /// such a session's next run starts a fresh container and brings its
    /// repository in again. Sessions with a run still queued or running
    /// keep theirs: a worker that comes back to this engine resumes them.
    async fn leave_engine(&self, engine: &str) {
        let window = self.ctx.config.lease * 2;
        match self.ctx.store.other_live_workers_on_engine(&self.ctx.config.worker_id, engine, window).await {
            Ok(0) => {}
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(error = %e, "could not tell whether other workers use this engine; leaving its sandboxes");
                return;
            }
        }
        let removed = sandbox_reaper::remove_idle_sessions(
            &self.ctx.sandboxes,
            &self.ctx.store,
            &self.ctx.config.sandbox.egress.host_firewall,
        )
        .await;
        if removed > 0 {
            tracing::info!(removed, "removed idle session sandboxes: no other worker uses this engine");
        }
    }

    async fn shut_down(&self, tasks: JoinSet<()>, mut successors: Successors) {
        // From here on an ending run hands back what it claimed itself.
        successors.close();
        // Runs that ending runs claimed just before the handoff closed: no
        // task of this worker will drive them and nothing extends their
        // leases, so another worker should have them now, not after the
        // grace period.
        while let Some((run, lease)) = successors.try_next() {
            if let Err(e) = self.ctx.store.release_run(&lease).await {
                tracing::warn!(run_id = %run.id, error = %e, "releasing run failed; its lease will expire");
            }
        }
        self.wait_for_runs(tasks).await;
    }

    async fn wait_for_runs(&self, mut tasks: JoinSet<()>) {
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

/// The claim loop's chores, each on its own tick.
struct Ticks {
    /// Expired leases reaped (and this worker announced), every half lease.
    reap: tokio::time::Interval,
    /// Unused sandboxes removed.
    reap_sandboxes: tokio::time::Interval,
    /// A claim without a notice (one may have been missed).
    poll: tokio::time::Interval,
    /// Dead workers' runs handed back, where the deployment checks.
    dead_check: tokio::time::Interval,
    check_dead: bool,
}

impl Ticks {
    fn new(config: &crate::config::WorkerConfig) -> Self {
        // Off: an hour's tick that is never looked at.
        let check_every = config.dead_worker_check;
        let mut dead_check = tokio::time::interval(check_every.unwrap_or(Duration::from_secs(3600)));
        dead_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ticks {
            reap: tokio::time::interval(config.lease / 2),
            reap_sandboxes: tokio::time::interval(sandbox_reaper::interval(config.sandbox_idle)),
            poll: tokio::time::interval(config.poll_interval),
            dead_check,
            check_dead: check_every.is_some(),
        }
    }
}
