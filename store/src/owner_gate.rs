//! Lines up one process's run submissions per owner before they take a
//! database connection.
//!
//! The quota check is serialised per owner in the database (an advisory
//! lock), which is what makes it correct across API instances. But a
//! transaction waiting for that lock holds a pooled connection: a burst of
//! submissions from one owner would hold the whole pool while they queue,
//! and every other request would time out waiting for a connection. Queuing
//! them here first means an owner's burst uses one connection per instance.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

#[derive(Debug, Default)]
pub(crate) struct OwnerGate {
    /// Weak, so an owner with no submission in flight costs nothing; dead
    /// entries are swept when the map has grown.
    lines: Mutex<HashMap<String, Weak<AsyncMutex<()>>>>,
}

impl OwnerGate {
    /// Waits for this owner's earlier submissions (in this process) to finish.
    pub(crate) async fn enter(&self, owner: &str) -> OwnedMutexGuard<()> {
        let line = {
            let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
            if lines.len() > 1024 {
                lines.retain(|_, line| line.strong_count() > 0);
            }
            match lines.get(owner).and_then(Weak::upgrade) {
                Some(line) => line,
                None => {
                    let line = Arc::new(AsyncMutex::new(()));
                    lines.insert(owner.to_owned(), Arc::downgrade(&line));
                    line
                }
            }
        };
        line.lock_owned().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_owner_waits_for_itself_and_not_for_others() {
        let gate = Arc::new(OwnerGate::default());
        let alice = gate.enter("alice").await;
        // Bob goes through at once.
        let bob = tokio::time::timeout(Duration::from_millis(100), gate.enter("bob")).await;
        assert!(bob.is_ok());
        // Alice's second submission waits for her first.
        let g = gate.clone();
        let second = tokio::spawn(async move { g.enter("alice").await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!second.is_finished());
        drop(alice);
        assert!(tokio::time::timeout(Duration::from_secs(1), second).await.is_ok());
    }
}
