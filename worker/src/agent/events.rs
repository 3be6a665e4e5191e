//! Writes a run's events, coalescing streamed deltas.
//!
//! A model streams text a few characters at a time; storing each piece as a
//! row would cost a round trip and a NOTIFY per token. Consecutive deltas of
//! the same kind are merged and written at most every [`COALESCE`], or as
//! soon as any other event needs to go out (order is preserved).
//!
//! Events that need not be seen at once ([`EventSink::emit_soon`]: a step
//! starting, a step's usage, a tool's result) wait the same way and go out
//! in one statement with whatever is written next: every commit waits for
//! the WAL flush, so fewer commits a step is most of the loop's overhead.

use std::time::{Duration, Instant};

use kiln_protocol::EventBody;
use kiln_store::{Lease, Store, StoreError};
use uuid::Uuid;

use super::db_retry::with_retry;

/// Longest a delta waits before it is written.
pub const COALESCE: Duration = Duration::from_millis(50);

pub struct EventSink {
    store: Store,
    lease: Lease,
    /// Events waiting to be written, in order, each with the id it keeps
    /// across retries.
    queued: Vec<(Uuid, EventBody)>,
    /// A delta still growing (it goes after `queued`).
    pending: Option<EventBody>,
    /// When the oldest of `queued` and `pending` was emitted.
    since: Option<Instant>,
}

impl EventSink {
    pub fn new(store: Store, lease: Lease) -> Self {
        EventSink { store, lease, queued: Vec::new(), pending: None, since: None }
    }

    /// Queues or writes `body`. Deltas are merged and wait; anything else is
    /// written at once, with everything waiting before it.
    pub async fn emit(&mut self, body: EventBody) -> Result<(), StoreError> {
        if is_delta(&body) {
            self.push_delta(body);
            return self.flush_if_stale().await;
        }
        self.queue(body);
        self.flush().await
    }

    /// Queues `body` to go out with the next write (at the latest after
    /// [`COALESCE`] at the next [`EventSink::flush_if_stale`], or at the next
    /// [`EventSink::flush`]): for events nobody needs in the next moment.
    pub async fn emit_soon(&mut self, body: EventBody) -> Result<(), StoreError> {
        self.queue(body);
        self.flush_if_stale().await
    }

    fn push_delta(&mut self, body: EventBody) {
        if let Some(pending) = &mut self.pending
            && merge(pending, &body)
        {
            return;
        }
        if let Some(done) = self.pending.take() {
            self.queued.push((Uuid::now_v7(), done));
        }
        self.pending = Some(body);
        self.since.get_or_insert_with(Instant::now);
    }

    fn queue(&mut self, body: EventBody) {
        if let Some(done) = self.pending.take() {
            self.queued.push((Uuid::now_v7(), done));
        }
        self.queued.push((Uuid::now_v7(), body));
        self.since.get_or_insert_with(Instant::now);
    }

    /// Writes what is waiting if the oldest of it has waited long enough.
    pub async fn flush_if_stale(&mut self) -> Result<(), StoreError> {
        match self.since {
            Some(since) if since.elapsed() >= COALESCE => self.flush().await,
            _ => Ok(()),
        }
    }

    /// Writes everything waiting, in one statement.
    pub async fn flush(&mut self) -> Result<(), StoreError> {
        if let Some(done) = self.pending.take() {
            self.queued.push((Uuid::now_v7(), done));
        }
        if self.queued.is_empty() {
            self.since = None;
            return Ok(());
        }
        // The ids were chosen when the events were queued and stay the same
        // on every attempt: a retry after a commit whose answer was lost
        // finds the stored batch instead of storing it again.
        let batch = &self.queued;
        with_retry(|| self.store.append_events_once(&self.lease, batch)).await?;
        self.queued.clear();
        self.since = None;
        Ok(())
    }
}

fn is_delta(body: &EventBody) -> bool {
    matches!(body, EventBody::TextDelta { .. } | EventBody::ReasoningDelta { .. } | EventBody::ToolCallDelta { .. })
}

/// Appends `next` to `pending` when both are deltas of the same stream.
fn merge(pending: &mut EventBody, next: &EventBody) -> bool {
    match (pending, next) {
        (EventBody::TextDelta { text }, EventBody::TextDelta { text: more })
        | (EventBody::ReasoningDelta { text }, EventBody::ReasoningDelta { text: more }) => {
            text.push_str(more);
            true
        }
        (
            EventBody::ToolCallDelta { call_id, arguments_delta },
            EventBody::ToolCallDelta { call_id: next_id, arguments_delta: more },
        ) if call_id == next_id => {
            arguments_delta.push_str(more);
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_deltas_of_the_same_stream_merge() {
        let mut a = EventBody::TextDelta { text: "he".into() };
        assert!(merge(&mut a, &EventBody::TextDelta { text: "llo".into() }));
        assert_eq!(a, EventBody::TextDelta { text: "hello".into() });
        assert!(!merge(&mut a, &EventBody::ReasoningDelta { text: "x".into() }));
        let mut c = EventBody::ToolCallDelta { call_id: "1".into(), arguments_delta: "{".into() };
        assert!(!merge(&mut c, &EventBody::ToolCallDelta { call_id: "2".into(), arguments_delta: "}".into() }));
        assert!(merge(&mut c, &EventBody::ToolCallDelta { call_id: "1".into(), arguments_delta: "}".into() }));
    }
}
