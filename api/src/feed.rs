//! One reader per followed run: the new events of a run are read from the
//! table once per API instance and handed to every SSE stream of that run,
//! instead of each stream querying on every notification (with a thousand
//! clients on one run that was a thousand queries per event).
//!
//! The table stays the truth. A stream reads it itself to catch up, and
//! whenever the feed cannot vouch for continuity (it fell behind, skipped
//! ahead, or ended); the feed only saves the queries of streams that are
//! already caught up. A feed lives while it has subscribers and ends after
//! the run's terminal event. The reader also renders each event as an SSE
//! event once, for all of its streams. It is woken by its run's
//! notifications only (`crate::notice_router`), and its reads go to the
//! database beside other runs' when they come together
//! (`crate::page_reads`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::response::sse::Event;
use kiln_protocol::StoredEvent;
use kiln_protocol::event::is_terminal_kind;
use tokio::sync::broadcast;
use uuid::Uuid;

use crate::AppState;

/// A batch of consecutive events, shared by every subscriber.
pub type Batch = Arc<[FedEvent]>;

/// An event as the feed hands it to its streams: rendered as an SSE event
/// by the feed's reader, once, rather than by each stream (with 10,000
/// streams on one run, serialising the payload per stream made each event
/// written 10,000 serialisations: issue 33's events bench, 1.5–2.4× the
/// plain server when events come one at a time). A stream sends a copy
/// of the rendered bytes.
#[derive(Debug)]
pub struct FedEvent {
    pub seq: i64,
    /// The run's terminal event: the stream ends after it.
    pub terminal: bool,
    pub sse: Event,
}

impl FedEvent {
    fn of(ev: &StoredEvent) -> Self {
        FedEvent { seq: ev.seq, terminal: is_terminal_kind(&ev.kind), sse: sse_event(ev) }
    }
}

/// The SSE event of a stored event: `id:` its seq, `event:` its kind,
/// `data:` its payload as JSON.
pub fn sse_event(ev: &StoredEvent) -> Event {
    Event::default().id(ev.seq.to_string()).event(&ev.kind).data(ev.payload.to_string())
}

/// Batches a subscriber may fall behind before it is told it lagged (and
/// reads the table instead). Small on purpose: the channel keeps every batch
/// a subscriber has not read yet, so a client that stops reading pins up to
/// this many batches (each at most `event_page_bytes`, or one event) in the
/// API's memory.
/// Falling behind costs only a table read.
const CAPACITY: usize = 16;

/// A subscription to a run's feed, and where its reader started.
pub enum Joined {
    /// The run's reader was running: it may have sent events this
    /// subscriber never gets, so the subscriber reads the table once more.
    Existing(broadcast::Receiver<Batch>),
    /// Started for this subscriber, from its position: nothing missed.
    Started(broadcast::Receiver<Batch>),
}

impl Joined {
    /// The subscription, for a caller that reads the table again anyway.
    pub fn into_receiver(self) -> broadcast::Receiver<Batch> {
        match self {
            Joined::Existing(rx) | Joined::Started(rx) => rx,
        }
    }
}

/// The feeds of one API instance, by run.
#[derive(Debug, Default)]
pub struct Feeds {
    runs: Mutex<HashMap<Uuid, broadcast::Sender<Batch>>>,
}

impl Feeds {
    fn lock(&self) -> MutexGuard<'_, HashMap<Uuid, broadcast::Sender<Batch>>> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Subscribes to the run's feed if it has one; starts none.
    pub fn join(&self, run_id: Uuid) -> Option<broadcast::Receiver<Batch>> {
        self.lock().get(&run_id).map(broadcast::Sender::subscribe)
    }

    /// Subscribes to the run's feed, starting a reader (from `after`) when
    /// the run has none; says whether the reader was started here
    /// (from `after`: it sends every event after it) or was running already
    /// (and may have sent events after `after` before this subscription).
    pub fn join_or_start(&self, state: &AppState, run_id: Uuid, after: i64) -> Joined {
        let mut runs = self.lock();
        if let Some(tx) = runs.get(&run_id) {
            return Joined::Existing(tx.subscribe());
        }
        let (tx, rx) = broadcast::channel(CAPACITY);
        runs.insert(run_id, tx.clone());
        tokio::spawn(read_run(state.clone(), run_id, after, tx));
        Joined::Started(rx)
    }

    /// Ends a reader nobody listens to any more. Under the map's lock, so a
    /// subscriber cannot join a reader that is about to stop.
    fn retire_if_unheard(&self, run_id: Uuid, tx: &broadcast::Sender<Batch>, finished: bool) -> bool {
        let mut runs = self.lock();
        if !finished && tx.receiver_count() > 0 {
            return false;
        }
        if runs.get(&run_id).is_some_and(|t| t.same_channel(tx)) {
            runs.remove(&run_id);
        }
        true
    }
}

/// The reader of one run: after every notification for it, reads what is
/// new and sends it to the subscribers.
async fn read_run(state: AppState, run_id: Uuid, mut after: i64, tx: broadcast::Sender<Batch>) {
    // Registered before the first read: what is committed after it is
    // announced to this reader.
    let news = state.notices.register(run_id);
    loop {
        // Shutdown ends the reader even in the middle of a read (the
        // database may be away): its streams hear of the shutdown through
        // the channel closing (`routes::events`), not each by its own wait.
        let read = tokio::select! {
            read = read_news(&state, run_id, &mut after, &tx) => read,
            _ = state.shutdown.cancelled() => {
                state.feeds.retire_if_unheard(run_id, &tx, true);
                return;
            }
        };
        if state.feeds.retire_if_unheard(run_id, &tx, read == Read::Finished) {
            return;
        }
        // After a failed read, wait for an announcement newer than those
        // already seen (or the poll), not retry at once.
        let known = if read == Read::Failed { after.max(news.announced()) } else { after };
        tokio::select! {
            _ = news.news_after(known, state.settings.sse_poll) => {}
            _ = state.shutdown.cancelled() => {
                state.feeds.retire_if_unheard(run_id, &tx, true);
                return;
            }
        }
    }
}

/// How a [`read_news`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// Every event there was is sent; the run goes on.
    CaughtUp,
    /// The run's terminal event was among those sent.
    Finished,
    /// A read failed; what was sent before it stands.
    Failed,
}

/// Reads the run's events after `after` and sends them to the subscribers,
/// page by page, until none is left, the run's terminal event is among
/// them, or a read fails.
async fn read_news(state: &AppState, run_id: Uuid, after: &mut i64, tx: &broadcast::Sender<Batch>) -> Read {
    loop {
        let batch = match state.page_reads.page(run_id, *after).await {
            Ok(batch) => batch,
            Err(e) => {
                // Subscribers still read the table themselves on a gap;
                // try again at the next notification or poll.
                tracing::warn!(error = %e, %run_id, "feed: reading events failed");
                return Read::Failed;
            }
        };
        let Some(last) = batch.events.last() else { return Read::CaughtUp };
        *after = last.seq;
        let finished = batch.events.iter().any(|e| is_terminal_kind(&e.kind));
        // No subscriber: fine, checked by the caller.
        let _ = tx.send(batch.events.iter().map(FedEvent::of).collect());
        if finished {
            return Read::Finished;
        }
        if !batch.more {
            return Read::CaughtUp;
        }
    }
}
