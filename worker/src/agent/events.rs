//! Writes a run's events, coalescing streamed deltas.
//!
//! A model streams text a few characters at a time; storing each piece as a
//! row would cost a round trip and a NOTIFY per token. Consecutive deltas of
//! the same kind are merged and written at most every [`COALESCE`], or as
//! soon as any other event needs to go out (order is preserved).

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
    pending: Option<(EventBody, Instant)>,
}

impl EventSink {
    pub fn new(store: Store, lease: Lease) -> Self {
        EventSink { store, lease, pending: None }
    }

    /// Queues or writes `body`. Deltas are merged; anything else flushes the
    /// pending delta first and is written at once.
    pub async fn emit(&mut self, body: EventBody) -> Result<(), StoreError> {
        if let Some((pending, _)) = &mut self.pending
            && merge(pending, &body)
        {
            return self.flush_if_stale().await;
        }
        self.flush().await?;
        if is_delta(&body) {
            self.pending = Some((body, Instant::now()));
            Ok(())
        } else {
            self.write(&body).await
        }
    }

    /// Writes the pending delta if it has waited long enough.
    pub async fn flush_if_stale(&mut self) -> Result<(), StoreError> {
        match &self.pending {
            Some((_, since)) if since.elapsed() >= COALESCE => self.flush().await,
            _ => Ok(()),
        }
    }

    pub async fn flush(&mut self) -> Result<(), StoreError> {
        if let Some((body, _)) = self.pending.take() {
            self.write(&body).await?;
        }
        Ok(())
    }

    async fn write(&self, body: &EventBody) -> Result<(), StoreError> {
        // One id for every attempt: a retry after a commit whose answer was
        // lost finds the stored event instead of storing it again.
        let event_id = Uuid::now_v7();
        with_retry(|| self.store.append_event_once(&self.lease, event_id, body)).await.map(|_| ())
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
