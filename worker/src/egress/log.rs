//! The proxy's decisions for one run, waiting to join the run's stream.
//!
//! The proxy runs beside the agent loop and must never wait on the
//! database, so it only appends here; the run's event sink takes what is
//! waiting whenever it commits. Both ends are bounded: at most
//! [`MAX_PENDING`] events wait (later refusals are counted and the count
//! rides on the next one written), and `network.allowed` is written once per
//! host and port for at most [`MAX_ALLOWED_HOSTS`] of them. Whatever is
//! stored still counts against the run's event budget.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

use kiln_protocol::EventBody;

pub const MAX_PENDING: usize = 256;
pub const MAX_ALLOWED_HOSTS: usize = 64;
/// Longest host name kept in an event (a request's host is hostile input;
/// DNS names are at most 253).
const MAX_HOST_CHARS: usize = 253;

#[derive(Debug, Default)]
pub struct NetworkLog {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    pending: Vec<EventBody>,
    /// Refusals not written since the last one that was.
    suppressed: u64,
    allowed_seen: HashSet<(String, u16)>,
}

/// One refusal, as the proxy saw it.
#[derive(Debug, Clone)]
pub struct Refusal<'a> {
    pub host: &'a str,
    pub port: u16,
    pub method: Option<&'a str>,
    pub layer: &'static str,
    pub rule: String,
}

impl NetworkLog {
    pub fn denied(&self, refusal: Refusal<'_>) {
        crate::metrics::egress_denied(refusal.layer);
        tracing::info!(host = refusal.host, port = refusal.port, layer = refusal.layer, rule = %refusal.rule, "egress denied");
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.pending.len() >= MAX_PENDING {
            state.suppressed += 1;
            return;
        }
        let suppressed = std::mem::take(&mut state.suppressed);
        state.pending.push(EventBody::NetworkDenied {
            host: bounded(refusal.host),
            port: refusal.port,
            method: refusal.method.map(bounded),
            layer: refusal.layer.to_owned(),
            rule: bounded(&refusal.rule),
            suppressed,
        });
    }

    pub fn allowed(&self, host: &str, port: u16) {
        crate::metrics::egress_allowed();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.allowed_seen.len() >= MAX_ALLOWED_HOSTS || state.pending.len() >= MAX_PENDING {
            return;
        }
        if state.allowed_seen.insert((host.to_owned(), port)) {
            state.pending.push(EventBody::NetworkAllowed { host: bounded(host), port });
        }
    }

    /// Everything waiting, oldest first.
    pub fn take(&self) -> Vec<EventBody> {
        std::mem::take(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner).pending)
    }

    pub fn has_pending(&self) -> bool {
        !self.state.lock().unwrap_or_else(PoisonError::into_inner).pending.is_empty()
    }
}

fn bounded(s: &str) -> String {
    s.chars().take(MAX_HOST_CHARS).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(host: &str) -> Refusal<'_> {
        Refusal { host, port: 443, method: None, layer: "run", rule: "r".into() }
    }

    #[test]
    fn pending_events_are_bounded_and_the_rest_counted() {
        let log = NetworkLog::default();
        for _ in 0..MAX_PENDING + 5 {
            log.denied(refusal("a.test"));
        }
        assert_eq!(log.take().len(), MAX_PENDING);
        log.denied(refusal("b.test"));
        let next = log.take();
        assert!(matches!(&next[..], [EventBody::NetworkDenied { suppressed: 5, .. }]), "{next:?}");
    }

    #[test]
    fn allowed_once_per_host_and_port() {
        let log = NetworkLog::default();
        log.allowed("a.test", 443);
        log.allowed("a.test", 443);
        log.allowed("a.test", 80);
        assert_eq!(log.take().len(), 2);
        log.allowed("a.test", 443);
        assert!(!log.has_pending());
    }
}
