//! The warm pool: containers started (toolbox running) before any session
//! asks, so a new session's first command runs in milliseconds. A warm
//! container goes to exactly one session and is never returned.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::backend::Backend;
use super::{Sandbox, SandboxConfig, SandboxError};

/// Wait after a failed start before trying again (a missing image, an
/// engine at its limits): the pool must not spin.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(5);
/// Longest a warm container's preparation command may take.
const PREPARE_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a session waits for a warm container that is being started
/// when none is ready. That start is already under way, so waiting for it
/// beats starting another; the bound covers a start that hangs.
const WAIT_FOR_STARTING: Duration = Duration::from_secs(15);

pub struct WarmPool {
    backend: Backend,
    config: SandboxConfig,
    worker: String,
    target: usize,
    ready: Mutex<VecDeque<Sandbox>>,
    /// A warm container is being started.
    starting: AtomicBool,
    /// Woken when a container is taken.
    taken: Notify,
    /// Woken when a container is ready (or a start failed).
    filled: Notify,
    /// Run (as the command user) in each container after it starts, before
    /// it counts as ready: a prepared environment's restore.
    prepare: Option<String>,
    /// The pool of one prepared image, which may be removed (cache bound):
    /// then the pool stops rather than retrying, and does not report as
    /// the deployment's warm pool.
    of_environment: bool,
}

impl WarmPool {
    pub fn new(backend: impl Into<Backend>, config: SandboxConfig, worker: String, target: usize) -> Self {
        WarmPool {
            backend: backend.into(),
            config,
            worker,
            target,
            ready: Mutex::default(),
            starting: AtomicBool::new(false),
            taken: Notify::new(),
            filled: Notify::new(),
            prepare: None,
            of_environment: false,
        }
    }

    /// A pool of a prepared environment's image: `restore` runs in each
    /// container before it is ready, and the pool ends when the image is
    /// gone.
    pub fn of_environment(
        backend: impl Into<Backend>,
        config: SandboxConfig,
        worker: String,
        target: usize,
        restore: String,
    ) -> Self {
        WarmPool { prepare: Some(restore), of_environment: true, ..WarmPool::new(backend, config, worker, target) }
    }

    /// Warm containers ready now.
    pub fn len(&self) -> usize {
        lock(&self.ready).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A ready container whose toolbox still answers; when none is ready
    /// but one is being started, waits for that one. `None`: start a
    /// container yourself. The pool starts a replacement.
    pub async fn take(&self) -> Option<Sandbox> {
        let deadline = tokio::time::Instant::now() + WAIT_FOR_STARTING;
        loop {
            // Registered before looking, so a fill in between is not missed.
            let filled = self.filled.notified();
            tokio::pin!(filled);
            filled.as_mut().enable();
            if let Some(sandbox) = self.take_ready() {
                return Some(sandbox);
            }
            if !self.starting.load(Ordering::SeqCst) {
                return None;
            }
            if tokio::time::timeout_at(deadline, filled).await.is_err() {
                return None;
            }
        }
    }

    fn take_ready(&self) -> Option<Sandbox> {
        let taken = {
            let mut ready = lock(&self.ready);
            // The oldest first: the one most likely to have gone bad is
            // checked (and dropped) rather than left to rot.
            let mut found = None;
            while let Some(sandbox) = ready.pop_front() {
                if sandbox.toolbox_alive() {
                    found = Some(sandbox);
                    break;
                }
                tokio::spawn(async move { sandbox.remove().await });
            }
            self.report_size(ready.len());
            found
        };
        self.taken.notify_one();
        taken
    }

    /// Keeps the pool filled until `shutdown`, then removes what it holds.
    pub async fn run(&self, shutdown: CancellationToken) {
        loop {
            while self.len() < self.target && !shutdown.is_cancelled() {
                self.starting.store(true, Ordering::SeqCst);
                let started = self.start_one().await;
                if let Ok(sandbox) = started.as_ref() {
                    let mut ready = lock(&self.ready);
                    ready.push_back(sandbox.clone());
                    self.report_size(ready.len());
                }
                self.starting.store(false, Ordering::SeqCst);
                self.filled.notify_waiters();
                match started {
                    Ok(_) => {}
                    Err(SandboxError::ImageMissing(image)) if self.of_environment => {
                        tracing::info!(image, "a prepared environment image is gone; its warm pool ends");
                        self.drain().await;
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "starting a warm sandbox failed");
                        tokio::select! {
                            _ = tokio::time::sleep(RETRY_AFTER_FAILURE) => {}
                            _ = shutdown.cancelled() => {}
                        }
                    }
                }
            }
            tokio::select! {
                _ = self.taken.notified() => {}
                _ = shutdown.cancelled() => break,
            }
        }
        self.drain().await;
    }

    /// A started container, prepared if the pool prepares them.
    async fn start_one(&self) -> Result<Sandbox, SandboxError> {
        let sandbox = Sandbox::start_warm(&self.backend, &self.config, &self.worker).await?;
        let Some(command) = &self.prepare else { return Ok(sandbox) };
        match sandbox.exec(command, PREPARE_TIMEOUT, 16 * 1024, |_| {}).await {
            Ok(out) if out.exit_code == Some(0) => Ok(sandbox),
            Ok(out) => {
                sandbox.remove().await;
                Err(SandboxError::Prepare(out.output.trim().to_owned()))
            }
            Err(e) => {
                sandbox.remove().await;
                Err(e)
            }
        }
    }

    fn report_size(&self, n: usize) {
        if !self.of_environment {
            crate::metrics::warm_pool_size(n);
        }
    }

    /// Removes every container the pool holds.
    pub async fn drain(&self) {
        let all: Vec<Sandbox> = lock(&self.ready).drain(..).collect();
        self.report_size(0);
        for sandbox in all {
            sandbox.remove().await;
        }
    }
}

fn lock(m: &Mutex<VecDeque<Sandbox>>) -> std::sync::MutexGuard<'_, VecDeque<Sandbox>> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
