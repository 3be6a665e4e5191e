//! The feeds' reads of the events table, gathered: the reads the feeds
//! (`crate::feed`) ask for while earlier ones are in flight go to the
//! database together, as one statement ([`Store::events_pages`]).
//!
//! A notification wakes only its run's reader, but when many followed runs
//! move at once (a deployment's busy hour; issue 33's events bench, 1,000
//! runs each writing an event a step) each reader made a query of its own:
//! a pool checkout, a round trip and a statement's fixed cost in Postgres
//! per run per event, on the database the writers need. Gathered, a burst
//! of N runs' news costs a few statements.
//!
//! Nothing waits to be gathered: a read goes at once when fewer than
//! [`IN_FLIGHT`] are running; only reads that would have queued for the
//! database anyway are put together. The bounds of one page hold for the
//! whole statement: each of its k runs may read a k-th of
//! `event_page_bytes` (and always its next event), so the rows a statement
//! brings back stay near one page's however many runs it covers.

use std::sync::Arc;

use kiln_store::{EventBatch, Store, StoreError};
use tokio::sync::{Semaphore, mpsc, oneshot};
use uuid::Uuid;

use crate::event_reads::BATCH;

/// Statements of gathered reads running at once. A few, so a slow
/// statement does not hold up every feed, and few enough that the feeds
/// leave the pool to the requests.
const IN_FLIGHT: usize = 4;

/// Runs read by one statement at most.
const MAX_RUNS: usize = 128;

/// A read failed; every read gathered into the same statement gets it.
pub type ReadError = Arc<StoreError>;

/// One read asked for: the run's events after `after`.
struct Request {
    run: Uuid,
    after: i64,
    reply: oneshot::Sender<Result<EventBatch, ReadError>>,
}

/// Hands a feed's read to the gathering task. Cheap to share; the task
/// ends when the last handle is dropped. The queue is unbounded but holds
/// at most one read per followed run: a feed asks for its next read only
/// once its last was answered.
#[derive(Debug)]
pub struct PageReads {
    requests: mpsc::UnboundedSender<Request>,
}

impl PageReads {
    /// Gathers reads of `store`, each run's page bounded by `page_bytes`
    /// (and [`BATCH`] events). Spawns the gathering task, so it must be
    /// called within a Tokio runtime.
    pub fn new(store: Store, page_bytes: i64) -> Self {
        let (requests, queue) = mpsc::unbounded_channel();
        tokio::spawn(gather(store, page_bytes, queue));
        PageReads { requests }
    }

    /// The run's events after `after`, as [`Store::events_page`] bounds
    /// them, read alone or beside other runs'.
    pub async fn page(&self, run: Uuid, after: i64) -> Result<EventBatch, ReadError> {
        let (reply, answer) = oneshot::channel();
        self.requests.send(Request { run, after, reply }).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// The gathering task stopped (the process is shutting down).
fn gone() -> ReadError {
    Arc::new(StoreError::Unavailable("the feeds' reader stopped".into()))
}

/// Takes the reads asked for, as many as are waiting (up to [`MAX_RUNS`])
/// each time a statement may start, and runs them as one.
async fn gather(store: Store, page_bytes: i64, mut queue: mpsc::UnboundedReceiver<Request>) {
    let in_flight = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(first) = queue.recv().await {
        // Waiting for a permit is what gathers: the reads asked for
        // meanwhile join this statement.
        let Ok(permit) = in_flight.clone().acquire_owned().await else { return };
        let mut reads = vec![first];
        while reads.len() < MAX_RUNS {
            match queue.try_recv() {
                Ok(request) => reads.push(request),
                Err(_) => break,
            }
        }
        let store = store.clone();
        tokio::spawn(async move {
            read(&store, page_bytes, reads).await;
            drop(permit);
        });
    }
}

/// One statement for `reads`; each asker gets its page (or the error).
async fn read(store: &Store, page_bytes: i64, reads: Vec<Request>) {
    ::metrics::counter!("kiln_sse_feed_reads_total").increment(1);
    ::metrics::counter!("kiln_sse_feed_read_runs_total").increment(reads.len() as u64);
    let asked: Vec<(Uuid, i64)> = reads.iter().map(|r| (r.run, r.after)).collect();
    let share = page_bytes / i64::try_from(reads.len()).unwrap_or(i64::MAX).max(1);
    match store.events_pages(&asked, BATCH, share).await {
        Ok(pages) => {
            for (request, page) in reads.into_iter().zip(pages) {
                // An asker that went away (its feed ended) needs nothing.
                let _ = request.reply.send(Ok(page));
            }
        }
        Err(e) => {
            let e = Arc::new(e);
            for request in reads {
                let _ = request.reply.send(Err(e.clone()));
            }
        }
    }
}
