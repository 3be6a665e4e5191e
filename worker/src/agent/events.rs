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
//! Messages go through here too ([`EventSink::append_message`],
//! [`EventSink::stage_message`]), so that a step's message and its events
//! share a commit: a step with a tool call makes two, the model's message
//! with its events and the tool message with the results.

use std::time::{Duration, Instant};

use kiln_protocol::{EventBody, Message, Usage};
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
    /// A message to write with the next flush.
    staged: Option<StagedMessage>,
}

/// A message of the session, with the id it keeps across retries.
struct StagedMessage {
    id: Uuid,
    session_id: Uuid,
    message: Message,
    usage: Option<Usage>,
    model: Option<String>,
}

impl EventSink {
    pub fn new(store: Store, lease: Lease) -> Self {
        EventSink { store, lease, queued: Vec::new(), pending: None, since: None, staged: None }
    }

    /// Appends `message` to the session now, with every event waiting, in
    /// one statement.
    pub async fn append_message(
        &mut self,
        session_id: Uuid,
        message: Message,
        usage: Option<Usage>,
        model: Option<String>,
    ) -> Result<(), StoreError> {
        self.stage_message(session_id, message, usage, model).await?;
        self.flush().await
    }

    /// Holds `message` back to be written with the next flush (the caller
    /// is about to emit an event that flushes). A message already held is
    /// written first.
    pub async fn stage_message(
        &mut self,
        session_id: Uuid,
        message: Message,
        usage: Option<Usage>,
        model: Option<String>,
    ) -> Result<(), StoreError> {
        if self.staged.is_some() {
            self.flush().await?;
        }
        // One id for every attempt: a retry after a commit whose answer was
        // lost finds the stored message, not a copy.
        self.staged = Some(StagedMessage { id: Uuid::now_v7(), session_id, message, usage, model });
        Ok(())
    }

    /// Queues `body` without writing anything: it goes out with the next
    /// write, whenever that is (use when one follows at once).
    pub fn queue_for_next_write(&mut self, body: EventBody) {
        self.queue(body);
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
        if is_delta(&body) {
            self.push_delta(body);
        } else {
            self.queue(body);
        }
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

    /// Writes everything waiting (and the held message), in one statement.
    pub async fn flush(&mut self) -> Result<(), StoreError> {
        if let Some(done) = self.pending.take() {
            self.queued.push((Uuid::now_v7(), done));
        }
        // The ids were chosen when the events and the message were queued
        // and stay the same on every attempt: a retry after a commit whose
        // answer was lost finds the stored rows instead of storing them again.
        let batch = &self.queued;
        if let Some(m) = &self.staged {
            with_retry(|| {
                self.store.append_message_with_events_once(
                    &self.lease,
                    m.id,
                    m.session_id,
                    &m.message,
                    m.usage.as_ref(),
                    m.model.as_deref(),
                    batch,
                )
            })
            .await?;
            self.staged = None;
        } else if !batch.is_empty() {
            with_retry(|| self.store.append_events_once(&self.lease, batch)).await?;
        }
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
