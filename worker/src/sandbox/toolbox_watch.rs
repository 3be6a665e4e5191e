//! Watching a toolbox's sandbox while calls wait for it. A container that
//! stops does not always end the stream of the exec attached to it: under
//! gVisor a Sentry that died (out of host threads, or memory) left the
//! toolbox's stream open and its call waiting forever. So the connection
//! listens to its backend's news of sandboxes stopping (`stops`: one
//! subscription to the engine per worker, not one request per sandbox
//! every few seconds); once its sandbox stopped, every waiting call ends
//! with how, and the connection is done.
//!
//! While the feed is down (or the backend has none) stops may go unheard,
//! so a connection with a call in flight asks the engine every
//! [`CHECK_EVERY`] instead; when the feed comes back, or this listener fell
//! behind it, it asks once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;
use tokio::task::AbortHandle;
use tokio::time::MissedTickBehavior;

use super::backend::{Backend, Stopped};
use super::stops::{StopFeed, StopNews};
use super::toolbox::ToolboxError;
use super::toolbox_reader::{PendingMap, lock};

/// How often a sandbox with a call in flight is asked after while the feed
/// is down: a call into a dead sandbox then ends within about this long.
/// (Also how soon a watch notices that its connection ended.)
pub(super) const CHECK_EVERY: Duration = Duration::from_secs(2);

/// The connection a watch looks after.
pub(super) struct Watched {
    pub backend: Backend,
    pub sandbox: String,
    pub pending: PendingMap,
    pub alive: Arc<AtomicBool>,
    /// The reader, stopped with the connection (its stream may never end).
    pub reader: AbortHandle,
    /// The backend's news of stops; `None`: it has none, so only asking.
    pub feed: Option<StopFeed>,
    /// Stops may have gone unheard (the feed came back, or this listener
    /// fell behind it) while no call waited: the next tick that finds one
    /// waiting asks once. Without it a sandbox that died while the feed was
    /// down would be asked about by no one, and its next call would wait
    /// forever.
    pub unsure: bool,
}

/// Whether the watch goes on.
enum Next {
    Watch,
    Done,
}

/// Runs until the connection ends (its reader clears `alive`) or its
/// sandbox stops.
pub(super) async fn watch(mut w: Watched) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + CHECK_EVERY, CHECK_EVERY);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        let next = match w.feed.as_mut() {
            Some(feed) => tokio::select! {
                news = feed.news.recv() => heard(&mut w, news).await,
                _ = tick.tick() => on_tick(&mut w).await,
            },
            None => {
                tick.tick().await;
                on_tick(&mut w).await
            }
        };
        if let Next::Done = next {
            return;
        }
    }
}

/// What the feed said.
async fn heard(w: &mut Watched, news: Result<StopNews, RecvError>) -> Next {
    if !w.alive.load(Ordering::Acquire) {
        return Next::Done;
    }
    match news {
        Ok(StopNews::Stopped(stop)) if stop.is(&w.sandbox) => check(w).await,
        Ok(StopNews::Stopped(_)) => Next::Watch,
        // Stops may have gone unheard: ask once if a call waits.
        Ok(StopNews::Resumed) | Err(RecvError::Lagged(_)) => {
            w.unsure = true;
            check_if_waiting(w).await
        }
        Err(RecvError::Closed) => {
            tracing::debug!(container = %w.sandbox, "the backend's stop feed ended; asking from now on");
            w.feed = None;
            check_if_waiting(w).await
        }
    }
}

/// Every [`CHECK_EVERY`]: ends with the connection, and asks while the
/// feed cannot be trusted to tell.
async fn on_tick(w: &mut Watched) -> Next {
    if !w.alive.load(Ordering::Acquire) {
        return Next::Done;
    }
    match &w.feed {
        Some(feed) if feed.is_up() && !w.unsure => Next::Watch,
        _ => check_if_waiting(w).await,
    }
}

/// Asks if a call waits (then nothing is left unsure).
async fn check_if_waiting(w: &mut Watched) -> Next {
    if lock(&w.pending).is_empty() {
        return Next::Watch;
    }
    w.unsure = false;
    check(w).await
}

/// Asks the backend whether the sandbox still runs (the news may be of a
/// process the OOM killer took in a sandbox that runs on, or of another
/// sandbox once under the same name); ends the connection if not.
async fn check(w: &Watched) -> Next {
    match w.backend.stopped(&w.sandbox).await {
        Ok(None) => Next::Watch,
        Ok(Some(how)) => {
            end(w, how);
            Next::Done
        }
        // The engine did not answer: the next news or check asks again.
        Err(e) => {
            tracing::debug!(container = %w.sandbox, error = %e, "checking the sandbox failed");
            Next::Watch
        }
    }
}

/// The sandbox stopped: every waiting call ends with how, and so does the
/// connection.
fn end(w: &Watched, how: Stopped) {
    w.alive.store(false, Ordering::Release);
    w.reader.abort();
    let waiting: Vec<_> = lock(&w.pending).drain().map(|(_, p)| p).collect();
    if waiting.is_empty() {
        tracing::debug!(container = %w.sandbox, stopped = %how, "the sandbox of an idle toolbox stopped");
    } else {
        tracing::warn!(container = %w.sandbox, stopped = %how, "the sandbox stopped under a tool call");
    }
    for p in waiting {
        let _ = p.reply.send(Err(ToolboxError::SandboxStopped(how.clone())));
    }
}
