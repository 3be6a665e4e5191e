//! News of sandboxes that stop, as their backend hears it: one feed per
//! backend (Docker: one subscription to the engine's events per worker),
//! handed to every toolbox connection, so that a call into a sandbox that
//! died ends at once instead of each connection asking the engine every
//! few seconds (see `toolbox_watch`).
//!
//! The feed says whether it is up: while it is not, stops can be missed,
//! and the connections fall back to asking. When it comes back it says
//! [`StopNews::Resumed`], and each connection with a call in flight asks
//! once for what it may have missed.

use tokio::sync::{broadcast, watch};

use super::backend::Stopped;

/// News a slow connection may fall behind by before it is told it lagged
/// (it then asks the engine once, as after a gap in the feed).
const BACKLOG: usize = 256;

/// A sandbox the backend says stopped, and how, as far as the news says
/// (a listener asks the backend to be sure: an `oom` may have killed one
/// process of a sandbox that still runs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxStop {
    /// The backend's handle of it.
    pub id: String,
    /// Its name, when the news gives it.
    pub name: Option<String>,
    pub how: Stopped,
}

impl SandboxStop {
    /// Whether this is the sandbox `handle` names: its id, an id prefix of
    /// the engine's short form or longer, or its name.
    pub fn is(&self, handle: &str) -> bool {
        const SHORT_ID: usize = 12;
        let handle = handle.trim_start_matches('/');
        self.id == handle
            || (handle.len() >= SHORT_ID && self.id.starts_with(handle))
            || self.name.as_deref().map(|n| n.trim_start_matches('/')) == Some(handle)
    }
}

/// What a feed says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopNews {
    Stopped(SandboxStop),
    /// The feed is back after a gap: stops in between may have been missed.
    Resumed,
}

/// One listener's end of a backend's feed.
#[derive(Debug)]
pub struct StopFeed {
    pub news: broadcast::Receiver<StopNews>,
    up: watch::Receiver<bool>,
}

impl StopFeed {
    /// Whether the feed is up now (else stops may go unheard).
    pub fn is_up(&self) -> bool {
        *self.up.borrow()
    }
}

/// The backend's end: it tells, every listener hears.
#[derive(Debug)]
pub struct StopHub {
    news: broadcast::Sender<StopNews>,
    up: watch::Sender<bool>,
}

impl Default for StopHub {
    fn default() -> Self {
        StopHub { news: broadcast::channel(BACKLOG).0, up: watch::channel(false).0 }
    }
}

impl StopHub {
    pub fn subscribe(&self) -> StopFeed {
        StopFeed { news: self.news.subscribe(), up: self.up.subscribe() }
    }

    /// Tells every listener that a sandbox stopped.
    pub fn stopped(&self, stop: SandboxStop) {
        // No listener (no toolbox connected): nobody to wake.
        let _ = self.news.send(StopNews::Stopped(stop));
    }

    /// Marks the feed up or down; coming up says [`StopNews::Resumed`].
    pub fn set_up(&self, up: bool) {
        let was = self.up.send_replace(up);
        if up && !was {
            let _ = self.news.send(StopNews::Resumed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_is_its_sandbox_by_id_short_id_or_name() {
        let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let stop = SandboxStop { id: id.into(), name: Some("kiln-session-x".into()), how: Stopped::default() };
        assert!(stop.is(id));
        assert!(stop.is(&id[..12]));
        assert!(stop.is("kiln-session-x") && stop.is("/kiln-session-x"));
        assert!(!stop.is("0123") && !stop.is("kiln-session-y"));
    }

    #[tokio::test]
    async fn coming_up_says_resumed_once() {
        let hub = StopHub::default();
        let mut feed = hub.subscribe();
        assert!(!feed.is_up());
        hub.set_up(true);
        hub.set_up(true);
        assert!(feed.is_up());
        assert_eq!(feed.news.recv().await.ok(), Some(StopNews::Resumed));
        assert!(feed.news.try_recv().is_err(), "only the change from down to up is news");
    }
}
