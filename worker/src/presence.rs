//! This worker's presence: the advisory lock it holds on a connection of its
//! own for as long as it lives (`kiln_store`'s `presence`), what its runs'
//! heartbeats ride on, and what its runs wait for.
//!
//! While the lock connection is up the worker drives its runs. When it
//! fails, the worker can no longer prove it owns them (another worker may
//! find the lock free and hand them back within a second), so every run
//! stops at once where it stands: its task is simply not polled, so it
//! sends no model request, starts no tool call and writes nothing. The
//! worker then connects again and takes its same key. If nobody found the
//! lock free meanwhile (a database restart, where every lock went and none
//! counts until taken again), the runs carry on as if nothing happened; if
//! somebody did, they are somebody else's now and are dropped, writing
//! nothing, and the worker carries on with new runs. A session's container
//! a dropped run leaves is adopted (and reset) by the next attempt.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kiln_store::{HeartbeatOutcome, Lease, PresenceSession, Store, StoreError};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Where the worker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// The lock is held now: runs may go on.
    pub held: bool,
    /// Counts the times the worker took its lock afresh (at start, and after
    /// others found it free): a run started under another tenure than the
    /// current one was handed back and belongs to somebody else.
    pub tenure: u64,
}

/// The run's tenure is over: others found this worker's lock free and
/// handed the run back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lost;

pub struct Presence {
    store: Store,
    worker: String,
    state: watch::Sender<State>,
    /// The connection holding the lock, while it is up.
    session: Mutex<Option<Arc<PresenceSession>>>,
}

/// Longest wait between attempts to take the lock again.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

impl Presence {
    pub fn new(store: Store, worker: String) -> Arc<Presence> {
        let (state, _) = watch::channel(State { held: false, tenure: 0 });
        Arc::new(Presence { store, worker, state, session: Mutex::new(None) })
    }

    pub fn state(&self) -> State {
        *self.state.borrow()
    }

    /// Changes of [`Presence::state`].
    pub fn subscribe(&self) -> watch::Receiver<State> {
        self.state.subscribe()
    }

    /// Holds the lock until `stop` fires, taking it again whenever its
    /// connection fails; then lets it go.
    pub async fn keep(self: Arc<Self>, stop: CancellationToken) {
        let mut key = None;
        let mut backoff = Duration::from_millis(50);
        while !stop.is_cancelled() {
            let registered = tokio::select! {
                r = self.store.register_worker(&self.worker, key) => r,
                _ = stop.cancelled() => break,
            };
            match registered {
                Ok(Some(registered)) => {
                    backoff = Duration::from_millis(50);
                    key = Some(registered.session.key());
                    let session = Arc::new(registered.session);
                    self.hold(session.clone(), registered.kept);
                    tokio::select! {
                        _ = session.closed() => {}
                        _ = stop.cancelled() => break,
                    }
                    *self.session.lock().unwrap_or_else(PoisonError::into_inner) = None;
                    self.state.send_modify(|s| s.held = false);
                    tracing::warn!(
                        worker = %self.worker,
                        "the worker's lock connection failed; its runs wait until it is back"
                    );
                    continue;
                }
                // The server still holds the key for the connection that
                // failed; it lets go once it notices.
                Ok(None) => {
                    tracing::info!(worker = %self.worker, "the worker's lock is still held by its old connection")
                }
                Err(e) => tracing::warn!(worker = %self.worker, error = %e, "taking the worker's lock failed"),
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stop.cancelled() => break,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
        *self.session.lock().unwrap_or_else(PoisonError::into_inner) = None;
        self.state.send_modify(|s| s.held = false);
    }

    fn hold(&self, session: Arc<PresenceSession>, kept: bool) {
        *self.session.lock().unwrap_or_else(PoisonError::into_inner) = Some(session);
        self.state.send_modify(|s| {
            if !kept {
                if s.tenure > 0 {
                    tracing::warn!(
                        worker = %self.worker,
                        "other workers found this worker's lock free and took its runs over; dropping them"
                    );
                }
                s.tenure += 1;
            }
            s.held = true;
        });
        tracing::info!(worker = %self.worker, kept, "holding the worker's lock");
    }

    /// Drives `work` while the lock is held in `tenure`: not polled while the
    /// lock connection is down, dropped (`Err(Lost)`) once the tenure is over.
    pub async fn while_held<F: Future>(&self, tenure: u64, work: F) -> Result<F::Output, Lost> {
        let mut state = self.state.subscribe();
        tokio::pin!(work);
        loop {
            let now = *state.borrow_and_update();
            if now.tenure != tenure {
                return Err(Lost);
            }
            tokio::select! {
                out = &mut work, if now.held => return Ok(out),
                changed = state.changed() => if changed.is_err() { return Err(Lost) },
            }
        }
    }

    /// Extends a run's lease over the lock connection: a worker without its
    /// lock extends nothing, and its leases run out.
    pub async fn heartbeat(&self, lease: &Lease, extend: Duration) -> Result<HeartbeatOutcome, StoreError> {
        let session = self.session.lock().unwrap_or_else(PoisonError::into_inner).clone();
        match session {
            Some(session) => session.heartbeat(lease, extend).await,
            None => Err(StoreError::Unavailable("the worker's lock connection is down".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn presence() -> Arc<Presence> {
        let store = Store::connect("postgres://kiln@127.0.0.1:1/kiln", 1).unwrap_or_else(|e| panic!("{e}"));
        Presence::new(store, "w".into())
    }

    #[tokio::test(start_paused = true)]
    async fn work_waits_while_the_lock_is_away_and_is_dropped_when_its_tenure_ends() {
        let p = presence();
        p.state.send_replace(State { held: true, tenure: 1 });
        let polled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = polled.clone();
        let work = async move {
            loop {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let task = {
            let p = p.clone();
            tokio::spawn(async move { p.while_held(1, work).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let before = polled.load(std::sync::atomic::Ordering::SeqCst);
        assert!(before > 0);
        // The connection fails: the work stands still.
        p.state.send_modify(|s| s.held = false);
        tokio::time::sleep(Duration::from_millis(15)).await;
        let stopped = polled.load(std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(polled.load(std::sync::atomic::Ordering::SeqCst), stopped);
        // Taken again in the same tenure: it goes on.
        p.state.send_modify(|s| s.held = true);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(polled.load(std::sync::atomic::Ordering::SeqCst) > stopped);
        // Others found it free: a new tenure, the work is dropped.
        p.state.send_replace(State { held: true, tenure: 2 });
        assert_eq!(task.await.ok(), Some(Err(Lost)));
    }
}
