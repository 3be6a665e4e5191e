//! Lets only a few of one process's run submissions per owner take a
//! database connection at once.
//!
//! The quota check is serialised per owner in the database (an advisory
//! lock, `kiln_quota_check`), which is what makes it correct across API
//! instances. But a statement waiting for that lock holds a pooled
//! connection: a burst of submissions from one owner would hold the whole
//! pool while they queue, and every other request would time out waiting
//! for a connection. Queuing them here first bounds an owner's burst to
//! `IN_FLIGHT` connections per instance. More than one, so that the next
//! submission is already waiting in the database when the lock is let go,
//! rather than a round trip away (one subject's submissions would otherwise
//! go one round trip apart).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// One owner's submissions holding a connection at once, per process; a
/// quarter of the default pool (16).
const IN_FLIGHT: usize = 4;

#[derive(Debug, Default)]
pub(crate) struct OwnerGate {
    /// Weak, so an owner with no submission in flight costs nothing; dead
    /// entries are swept when the map has grown.
    lines: Mutex<HashMap<String, Weak<Semaphore>>>,
}

impl OwnerGate {
    /// Waits until fewer than `IN_FLIGHT` of this owner's earlier
    /// submissions (in this process) are under way.
    pub(crate) async fn enter(&self, owner: &str) -> Result<OwnedSemaphorePermit, crate::StoreError> {
        let line = {
            let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
            if lines.len() > 1024 {
                lines.retain(|_, line| line.strong_count() > 0);
            }
            match lines.get(owner).and_then(Weak::upgrade) {
                Some(line) => line,
                None => {
                    let line = Arc::new(Semaphore::new(IN_FLIGHT));
                    lines.insert(owner.to_owned(), Arc::downgrade(&line));
                    line
                }
            }
        };
        // Nothing closes an owner's semaphore; the error cannot happen.
        line.acquire_owned().await.map_err(|e| crate::StoreError::Corrupt(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_owner_waits_for_itself_and_not_for_others() {
        let gate = Arc::new(OwnerGate::default());
        let mut alice = Vec::new();
        for _ in 0..IN_FLIGHT {
            alice.push(gate.enter("alice").await.unwrap());
        }
        // Bob goes through at once.
        let bob = tokio::time::timeout(Duration::from_millis(100), gate.enter("bob")).await;
        assert!(bob.is_ok());
        // Alice's next submission waits for one of hers to finish.
        let g = gate.clone();
        let next = tokio::spawn(async move { g.enter("alice").await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!next.is_finished());
        alice.pop();
        assert!(tokio::time::timeout(Duration::from_secs(1), next).await.is_ok());
    }
}
