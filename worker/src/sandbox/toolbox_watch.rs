//! Watching a toolbox's sandbox while calls wait for it. A container that
//! stops does not always end the stream of the exec attached to it: under
//! gVisor a Sentry that died (out of host threads, or memory) left the
//! toolbox's stream open and its call waiting forever. So while any call
//! waits, the engine is asked every [`CHECK_EVERY`] whether the sandbox
//! still runs; once it does not, every waiting call ends with how it
//! stopped, and the connection is done.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::task::AbortHandle;

use super::backend::Backend;
use super::toolbox::ToolboxError;
use super::toolbox_reader::{PendingMap, lock};

/// How often a sandbox with a call in flight is checked: a call into a dead
/// sandbox ends within about this long.
pub(super) const CHECK_EVERY: Duration = Duration::from_secs(2);

/// The connection a watch looks after.
pub(super) struct Watched {
    pub backend: Backend,
    pub sandbox: String,
    pub pending: PendingMap,
    pub alive: Arc<AtomicBool>,
    /// The reader, stopped with the connection (its stream may never end).
    pub reader: AbortHandle,
}

/// Runs until the connection ends (its reader clears `alive`) or its
/// sandbox stops.
pub(super) async fn watch(w: Watched) {
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        if !w.alive.load(Ordering::Acquire) {
            return;
        }
        if lock(&w.pending).is_empty() {
            continue;
        }
        match w.backend.stopped(&w.sandbox).await {
            Ok(None) => {}
            Ok(Some(how)) => {
                tracing::warn!(container = %w.sandbox, stopped = %how, "the sandbox stopped under a tool call");
                w.alive.store(false, Ordering::Release);
                w.reader.abort();
                let waiting: Vec<_> = lock(&w.pending).drain().map(|(_, p)| p).collect();
                for p in waiting {
                    let _ = p.reply.send(Err(ToolboxError::SandboxStopped(how.clone())));
                }
                return;
            }
            // The engine did not answer: the next check asks again.
            Err(e) => tracing::debug!(container = %w.sandbox, error = %e, "checking the sandbox failed"),
        }
    }
}
