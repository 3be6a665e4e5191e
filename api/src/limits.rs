//! Per-subject limits that keep one client from holding the service: SSE
//! connections per subject (per API instance), counted with a guard that
//! gives its slot back when the stream ends however it ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Open SSE streams per subject on this instance.
#[derive(Debug, Default)]
pub struct SseGauge {
    open: Mutex<HashMap<String, usize>>,
}

/// Holds one stream's slot; dropping it frees the slot.
#[derive(Debug)]
pub struct SseSlot {
    gauge: Arc<SseGauge>,
    subject: String,
}

impl SseGauge {
    /// Takes a slot for `subject` unless it already holds `max`.
    pub fn acquire(self: &Arc<Self>, subject: &str, max: usize) -> Option<SseSlot> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(subject.to_owned()).or_default();
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(SseSlot { gauge: self.clone(), subject: subject.to_owned() })
    }

    /// Open streams across all subjects (the `kiln_sse_connections` gauge).
    pub fn total(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).values().sum()
    }

    pub fn open_for(&self, subject: &str) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).get(subject).copied().unwrap_or(0)
    }
}

impl Drop for SseSlot {
    fn drop(&mut self) {
        let mut open = self.gauge.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = open.get_mut(&self.subject) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.subject);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_limited_per_subject_and_given_back_on_drop() {
        let gauge = Arc::new(SseGauge::default());
        let a = gauge.acquire("alice", 2).unwrap();
        let _b = gauge.acquire("alice", 2).unwrap();
        assert!(gauge.acquire("alice", 2).is_none());
        assert!(gauge.acquire("bob", 2).is_some(), "other subjects are not affected");
        assert_eq!(gauge.total(), 2, "bob's slot was dropped at once");
        drop(a);
        assert_eq!(gauge.open_for("alice"), 1);
        assert!(gauge.acquire("alice", 2).is_some());
    }
}
