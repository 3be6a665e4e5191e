//! How a run learns that a client sent it a message or an approval decision.
//!
//! The claim loop signals on each `kiln_run_control` notification. Two
//! readers need it differently: a call waiting for approval waits to be woken,
//! and the loop, between steps, asks whether anything was announced since it
//! last read the inbox. A wake-up permit alone would serve only one of them
//! (the approval wait would use up the permit a steering message left), so
//! announcements are also counted.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

#[derive(Debug, Default)]
pub struct Control {
    wake: Notify,
    announced: AtomicU64,
}

impl Control {
    /// A message or a decision was stored for the run.
    pub fn signal(&self) {
        self.announced.fetch_add(1, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Waits for the next signal (or one that came since the last wait).
    pub async fn wait(&self) {
        self.wake.notified().await;
    }

    /// How many signals have come so far.
    pub fn announced(&self) -> u64 {
        self.announced.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn a_wait_that_takes_the_wake_up_leaves_the_count_for_the_loop() {
        let control = Control::default();
        let seen = control.announced();
        control.signal();
        assert!(control.wait().now_or_never().is_some(), "the waiter is woken");
        assert_ne!(control.announced(), seen, "and the loop still sees that something came");
    }
}
