//! Completion callbacks: POSTing a run's final state to the `callback_url`
//! it named, once it has ended, however it ended.
//!
//! A run that ends owes its callback, recorded in the transaction that ends
//! it (see `migrations/V8__callbacks.sql`), so a run cancelled while queued
//! or failed by the reaper is called back too. Every worker with a callback
//! secret serves owed callbacks ([`serve`]), woken by the trigger's
//! notification and polling besides; each callback is claimed under a lease
//! the worker keeps extending while it tries ([`deliver`]; made as all owed
//! work is, by `crate::owed`), so two workers never call the same receiver
//! at once and a dead worker's callback is taken over when its lease runs
//! out. Delivery is at least once: receivers drop repeats by the
//! `X-Kiln-Delivery` id.

mod deliver;
pub mod send;
pub mod target;

use std::sync::Arc;
use std::time::Duration;

use kiln_store::{Listener, Notice, Store, channels};
use secrecy::{ExposeSecret, SecretSlice};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use self::deliver::Callbacks;
use crate::owed::{self, Owed};

/// The deployment's callback secret (its `Debug` prints no key). Callbacks
/// are signed with a key derived from it for the run's owner
/// (`kiln_protocol::callback::subject_key`), never with the secret itself.
#[derive(Debug, Clone)]
pub struct CallbackSecret(SecretSlice<u8>);

impl CallbackSecret {
    /// `None` for an empty secret: a signature under an empty key proves nothing.
    pub fn new(secret: &[u8]) -> Option<Self> {
        (!secret.is_empty()).then(|| CallbackSecret(secret.to_vec().into()))
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        self.0.expose_secret()
    }
}

/// How a worker delivers callbacks.
#[derive(Debug, Clone)]
pub struct CallbackSettings {
    pub secret: CallbackSecret,
    /// Let callbacks reach loopback, private and link-local addresses (tests,
    /// on-prem receivers). Off: refused after resolving the host.
    pub allow_private: bool,
    /// Attempts per callback, the first included.
    pub max_attempts: u32,
    /// Delay before the second attempt; doubles each time, with jitter.
    pub base_delay: Duration,
    /// Longest backoff between attempts.
    pub max_delay: Duration,
    /// Whole-request timeout of one attempt.
    pub timeout: Duration,
    /// How often to look for owed callbacks without a notification.
    pub poll: Duration,
    /// How long a claimed callback stays claimed without being extended.
    pub lease: Duration,
    /// Callbacks one worker delivers at once (a slow receiver must not hold
    /// up the others).
    pub concurrency: usize,
}

/// Default number of attempts: about a minute of retrying with the default
/// delays (1, 2, 4, 8, 16 s between them).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 6;
/// Default timeout of one attempt.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

impl CallbackSettings {
    pub fn new(secret: CallbackSecret) -> Self {
        CallbackSettings {
            secret,
            allow_private: false,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(60),
            timeout: DEFAULT_TIMEOUT,
            poll: Duration::from_secs(2),
            lease: Duration::from_secs(30),
            concurrency: 8,
        }
    }
}

/// Delivers owed callbacks until `shutdown`: claims while it has a free
/// slot, then waits for a notification, a slot, or the poll interval.
pub async fn serve(settings: CallbackSettings, store: Store, listener: Listener, shutdown: CancellationToken) {
    let concurrency = settings.concurrency.max(1);
    let (poll, callbacks) = (settings.poll, Callbacks { settings: Arc::new(settings), store });
    let mut notices = listener.subscribe();
    let mut tasks = JoinSet::new();
    loop {
        while tasks.len() < concurrency && !shutdown.is_cancelled() {
            match callbacks.claim(None).await {
                Ok(Some(job)) => {
                    let (callbacks, stop) = (callbacks.clone(), shutdown.clone());
                    // Deliveries see `shutdown` too: they hand their callbacks back between attempts.
                    tasks.spawn(async move { owed::make(&callbacks, &job, Some(&stop)).await });
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "claiming a callback failed");
                    break;
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(poll) => {}
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            () = owed_notice(&mut notices) => {}
        }
    }
    // Give the deliveries a moment to hand their callbacks back, then stop
    // the rest (their leases run out).
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(5), drain).await.is_err() {
        tasks.abort_all();
    }
}

/// Returns at the next notice that may mean a callback is owed: one from the
/// trigger, a reconnect or lag (notices may have been missed). The many
/// other notices on the shared listener (every event of every run) are
/// skipped here rather than each costing a claim query.
async fn owed_notice(notices: &mut broadcast::Receiver<Notice>) {
    loop {
        match notices.recv().await {
            Ok(Notice::Notification { channel, .. }) if channel != channels::CALLBACKS_OWED => {}
            Ok(_) | Err(RecvError::Lagged(_)) => return,
            // The listener is gone: polling alone from now on.
            Err(RecvError::Closed) => std::future::pending().await,
        }
    }
}
