//! A run that ends takes its worker's next run in the same statement.
//!
//! A worker that finishes a run has a slot free the moment the run ends, so
//! instead of committing the end and then claiming again (two commits, two
//! round trips), the run's task does both in one statement
//! (`Store::finish_run_and_claim`) and hands the claimed run to the claim
//! loop through this channel. Once the worker stops claiming (shutdown) the
//! handoff is closed and ending runs only finish; a run that was claimed
//! while the loop was already going away is handed back to the queue.

use kiln_protocol::Run;
use kiln_store::Lease;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The run tasks' side.
#[derive(Clone)]
pub struct Handoff {
    tx: mpsc::UnboundedSender<(Run, Lease)>,
    closed: CancellationToken,
}

/// The claim loop's side.
pub struct Successors {
    rx: mpsc::UnboundedReceiver<(Run, Lease)>,
    closed: CancellationToken,
}

pub fn channel() -> (Handoff, Successors) {
    let (tx, rx) = mpsc::unbounded_channel();
    let closed = CancellationToken::new();
    (Handoff { tx, closed: closed.clone() }, Successors { rx, closed })
}

impl Handoff {
    /// Whether the worker still takes new runs.
    pub fn is_open(&self) -> bool {
        !self.closed.is_cancelled()
    }

    /// Gives a claimed run to the claim loop; when the loop is gone, hands
    /// back its lease (for the caller to release).
    pub fn give(&self, run: Run, lease: Lease) -> Result<(), Lease> {
        self.tx.send((run, lease)).map_err(|e| e.0.1)
    }
}

impl Successors {
    /// Stops ending runs from claiming, and from handing over: a run
    /// claimed all the same (the handoff was open when its end began) is
    /// refused by `give` and goes back to the queue from the ending run's
    /// task. What was handed over before stays to be taken with `try_next`.
    pub fn close(&mut self) {
        self.closed.cancel();
        self.rx.close();
    }

    /// A run handed over, if one is waiting.
    pub fn try_next(&mut self) -> Option<(Run, Lease)> {
        self.rx.try_recv().ok()
    }

    /// Waits for a run handed over.
    pub async fn next(&mut self) -> Option<(Run, Lease)> {
        self.rx.recv().await
    }
}
