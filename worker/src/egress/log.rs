//! The proxy's decisions for one run, waiting to join the run's stream.
//!
//! The proxy runs beside the agent loop and must never wait on the
//! database, so it only appends here; the run's event sink takes what is
//! waiting whenever it commits. Both ends are bounded: at most
//! [`MAX_PENDING`] events wait (later refusals are counted and the count
//! rides on the next one written), and `network.allowed` is written once per
//! host and port for at most [`MAX_ALLOWED_HOSTS`] of them. Whatever is
//! stored still counts against the run's event budget.
//!
//! A log may hide values (an environment's secrets during its setup
//! phase: a script that requests `http://$TOKEN.example/` names the token
//! as a host): then every text of a decision is masked before it is
//! logged or waits for the stream.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use kiln_protocol::EventBody;

pub const MAX_PENDING: usize = 256;
pub const MAX_ALLOWED_HOSTS: usize = 64;
/// Longest host name kept in an event (a request's host is hostile input;
/// DNS names are at most 253).
const MAX_HOST_CHARS: usize = 253;

/// Masks what must reach neither events nor logs.
pub type Redact = Arc<dyn Fn(&str) -> String + Send + Sync>;

#[derive(Default)]
pub struct NetworkLog {
    state: Mutex<State>,
    redact: Option<Redact>,
}

impl std::fmt::Debug for NetworkLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetworkLog").field("redacting", &self.redact.is_some()).finish_non_exhaustive()
    }
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
    /// A log whose texts (hosts, methods, rules) pass through `redact`
    /// before they are logged or stored.
    pub fn redacting(redact: Redact) -> Self {
        NetworkLog { state: Mutex::default(), redact: Some(redact) }
    }

    /// `text` as it may be shown: masked, and bounded (after masking, so
    /// that the cut never leaves part of a secret unmasked).
    fn shown(&self, text: &str) -> String {
        match &self.redact {
            Some(redact) => bounded(&redact(text)),
            None => bounded(text),
        }
    }

    pub fn denied(&self, refusal: Refusal<'_>) {
        crate::metrics::egress_denied(refusal.layer);
        let (host, rule) = (self.shown(refusal.host), self.shown(&refusal.rule));
        let method = refusal.method.map(|m| self.shown(m));
        tracing::info!(host = %host, port = refusal.port, layer = refusal.layer, rule = %rule, "egress denied");
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.pending.len() >= MAX_PENDING {
            state.suppressed += 1;
            return;
        }
        let suppressed = std::mem::take(&mut state.suppressed);
        state.pending.push(EventBody::NetworkDenied {
            host,
            port: refusal.port,
            method,
            layer: refusal.layer.to_owned(),
            rule,
            suppressed,
        });
    }

    pub fn allowed(&self, host: &str, port: u16) {
        crate::metrics::egress_allowed();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.allowed_seen.len() >= MAX_ALLOWED_HOSTS || state.pending.len() >= MAX_PENDING {
            return;
        }
        let host = self.shown(host);
        if state.allowed_seen.insert((host.clone(), port)) {
            state.pending.push(EventBody::NetworkAllowed { host, port });
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
    fn a_redacting_log_masks_every_text_it_keeps() {
        let log = NetworkLog::redacting(Arc::new(|text: &str| text.replace("tok", "***")));
        let rule = "allowlist: no rule for tok.example:80".to_owned();
        log.denied(Refusal { host: "tok.example", port: 80, method: Some("tok"), layer: "setup", rule });
        log.allowed("tok.test", 443);
        let shown = format!("{:?}", log.take());
        assert!(!shown.contains("tok") && shown.matches("***").count() == 4, "{shown}");
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
