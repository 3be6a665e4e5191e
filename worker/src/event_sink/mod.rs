//! Writes a run's events, coalescing streamed deltas.
//!
//! A model streams text a few characters at a time; storing each piece as a
//! row would cost a round trip and a NOTIFY per token. Consecutive deltas of
//! the same kind are merged and written at most every [`COALESCE`], or as
//! soon as anything else is written (order is preserved).
//!
//! Every commit waits for the WAL flush, so fewer commits a step is most of
//! the loop's overhead. The verbs say when a write happens:
//! - [`EventSink::write_now`] and [`EventSink::commit`]: a commit now, with
//!   everything buffered before it;
//! - [`EventSink::write_soon`]: buffered to go out with the next commit, or
//!   on its own once it has waited [`COALESCE`] ([`EventSink::write_if_stale`]
//!   checks);
//! - [`EventSink::write_message`] and [`EventSink::hold_message`]: a message
//!   of the session, with the events about it, now or in the next commit.
//!   A step's message and its events share a commit: a step with a tool
//!   call makes two, the model's message with its events and the tool
//!   message with the results. The second is held: usually the next model
//!   call makes it while its request goes out
//!   ([`EventSink::commit_alongside`]); any commit before that (a stale
//!   buffer, another message, the inbox, the loop's end) takes it along.
//!
//! What it stores counts against the run's [`EventBudget`]: past it, events
//! are dropped (messages are still written, the conversation stays whole)
//! and [`EventSink::exhausted`] says why the loop must end the run.

pub mod budget;
pub mod nesting;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_protocol::{EventBody, Message, Usage};
use kiln_store::{Lease, Store, StoreError};
use uuid::Uuid;

use crate::db_retry::with_retry;
use crate::egress::NetworkLog;
use budget::EventBudget;
use nesting::NestingStream;

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
    /// When the oldest of `queued` and `pending` was buffered.
    since: Option<Instant>,
    /// A message to write with the next commit.
    held: Option<HeldMessage>,
    /// The bytes of events the run may still store.
    budget: EventBudget,
    /// The model call under way and what the provider has reported it used.
    unfinished: Option<UnfinishedStep>,
    /// The egress proxy's decisions for this run, taken in at each commit
    /// (the proxy never waits on the database).
    network: Option<Arc<NetworkLog>>,
    /// Streams that get a copy of each commit (a sub-agent's parent's, an
    /// attempt's group's): see `nesting`.
    nesting: Vec<Box<dyn NestingStream>>,
}

/// A step whose model call has started but not answered: what the
/// provider reported so far (e.g. Anthropic's `message_start` reports the
/// input before a single token is streamed). A run that ends mid-call —
/// cancelled, timed out, failed — still paid for it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UnfinishedStep {
    pub step: u32,
    pub usage: Usage,
}

/// A message to append to the session.
#[derive(Debug, Clone)]
pub struct NewMessage {
    pub session_id: Uuid,
    pub message: Message,
    /// What the model call that wrote it used (assistant messages only).
    pub usage: Option<Usage>,
    pub model: Option<String>,
}

impl NewMessage {
    /// A message no model call paid for (a user message, tool results).
    pub fn plain(session_id: Uuid, message: Message) -> Self {
        NewMessage { session_id, message, usage: None, model: None }
    }
}

/// A message waiting for the next commit, with the id it keeps across retries.
struct HeldMessage {
    id: Uuid,
    new: NewMessage,
}

impl EventSink {
    pub fn new(store: Store, lease: Lease) -> Self {
        EventSink {
            store,
            lease,
            queued: Vec::new(),
            pending: None,
            since: None,
            held: None,
            budget: EventBudget::unlimited(),
            unfinished: None,
            network: None,
            nesting: Vec::new(),
        }
    }

    /// Copies what is committed from now on into `stream` (this sink is a
    /// sub-agent's or an attempt's).
    pub fn nest_into(&mut self, stream: impl NestingStream + 'static) {
        self.nesting.push(Box::new(stream));
    }

    /// Takes the egress proxy's decisions into the run's stream from now on.
    pub fn attach_network_log(&mut self, log: Arc<NetworkLog>) {
        self.network = Some(log);
    }

    /// Stops taking from the attached log (a phase's proxy is done): what
    /// it still holds waits for the next commit.
    pub fn detach_network_log(&mut self) {
        if let Some(log) = self.network.take() {
            for body in log.take() {
                self.buffer(body);
            }
        }
    }

    /// Step `step`'s model call has so far reported `usage`.
    pub fn note_usage_so_far(&mut self, step: u32, usage: Usage) {
        self.unfinished = Some(UnfinishedStep { step, usage });
    }

    /// The model call has answered: its usage goes with the step's message.
    pub fn step_answered(&mut self) {
        self.unfinished = None;
    }

    /// The model call that was under way when the loop stopped, if the
    /// provider had reported any usage for it.
    pub fn take_unfinished_step(&mut self) -> Option<UnfinishedStep> {
        self.unfinished.take().filter(|u| u.usage != Usage::default())
    }

    /// Counts what is stored from now on against `budget`.
    pub fn limit(&mut self, budget: EventBudget) {
        self.budget = budget;
    }

    /// Why the run must end: its event budget is spent, or what waits for
    /// the next commit will not fit in it (a step's results wait for the
    /// next model call: a call none of whose events could be stored is not
    /// worth making). `None` while events are still stored.
    pub fn exhausted(&self) -> Option<String> {
        let waiting = self.queued.iter().map(|(_, body)| body).chain(self.pending.as_ref());
        self.budget.exhausted(waiting)
    }

    /// Writes `body` now, in one commit with everything buffered before it.
    pub async fn write_now(&mut self, body: EventBody) -> Result<(), StoreError> {
        self.buffer(body);
        self.commit().await
    }

    /// Buffers `body` to go out with the next commit, whenever that is; if
    /// none comes, it is written on its own once the oldest buffered event
    /// has waited [`COALESCE`] (checked here and by
    /// [`EventSink::write_if_stale`]). For events nobody needs in the next
    /// moment: a step starting, a tool's result, a streamed delta.
    pub async fn write_soon(&mut self, body: EventBody) -> Result<(), StoreError> {
        self.buffer(body);
        self.write_if_stale().await
    }

    /// Commits what is buffered if the oldest of it has waited [`COALESCE`].
    pub async fn write_if_stale(&mut self) -> Result<(), StoreError> {
        if self.network.as_ref().is_some_and(|log| log.has_pending()) {
            return self.commit().await;
        }
        match self.since {
            Some(since) if since.elapsed() >= COALESCE => self.commit().await,
            _ => Ok(()),
        }
    }

    /// Appends `message` to the session now, in one commit with everything
    /// buffered and then `along` (the events about the message, which are
    /// thus never stored without it).
    pub async fn write_message(&mut self, message: NewMessage, along: Vec<EventBody>) -> Result<(), StoreError> {
        self.hold_message(message, along).await?;
        self.commit().await
    }

    /// Like [`EventSink::write_message`], but the message (and `along`) waits
    /// for the next commit, which the caller is about to make (e.g. the
    /// `tool_call.ready` of the message's first call). A message already
    /// held is committed first.
    pub async fn hold_message(&mut self, message: NewMessage, along: Vec<EventBody>) -> Result<(), StoreError> {
        if self.held.is_some() {
            self.commit().await?;
        }
        for body in along {
            self.buffer(body);
        }
        // One id for every attempt: a retry after a commit whose answer was
        // lost finds the stored message, not a copy.
        self.held = Some(HeldMessage { id: Uuid::now_v7(), new: message });
        Ok(())
    }

    /// Like [`EventSink::commit`], while `alongside` runs: the commit's
    /// wait for the WAL flush overlaps work that does not depend on it (a
    /// model request going out). Both are driven to their end.
    pub async fn commit_alongside<T>(&mut self, alongside: impl Future<Output = T>) -> (Result<(), StoreError>, T) {
        tokio::join!(self.commit(), alongside)
    }

    /// Writes everything buffered, and the held message, now, in one commit.
    pub async fn commit(&mut self) -> Result<(), StoreError> {
        if let Some(log) = self.network.clone() {
            for body in log.take() {
                self.buffer(body);
            }
        }
        if let Some(done) = self.pending.take() {
            self.queued.push((Uuid::now_v7(), done));
        }
        // What does not fit the budget is dropped here, before the write;
        // it is counted once the write succeeded (a retried commit must
        // not count twice).
        let (fitting, bytes) = self.budget.fitting(&self.queued);
        let refused = fitting < self.queued.len();
        self.queued.truncate(fitting);
        // The ids were chosen when the events and the message were buffered
        // and stay the same on every attempt: a retry after a commit whose
        // answer was lost finds the stored rows instead of storing them again.
        let batch = &self.queued;
        let last_seq = if let Some(HeldMessage { id, new: m }) = &self.held {
            let written = with_retry(|| {
                self.store.append_message_with_events_once(
                    &self.lease,
                    *id,
                    m.session_id,
                    &m.message,
                    m.usage.as_ref(),
                    m.model.as_deref(),
                    batch,
                )
            })
            .await?;
            self.held = None;
            written.last_event_seq
        } else if !batch.is_empty() {
            Some(with_retry(|| self.store.append_events_once(&self.lease, batch)).await?)
        } else {
            None
        };
        // `None`: an earlier try stored them, and copied them then if it could.
        if let Some(last_seq) = last_seq {
            for stream in &self.nesting {
                nesting::forward(stream.as_ref(), last_seq, &self.queued).await;
            }
        }
        self.queued.clear();
        self.since = None;
        self.budget.spend(bytes, refused);
        Ok(())
    }

    /// Adds `body` to what waits for the next commit: a delta merges with
    /// the one before it when both are of the same stream.
    fn buffer(&mut self, body: EventBody) {
        // Nothing more is stored: don't hold it in memory either.
        if !self.budget.is_open() {
            return;
        }
        if is_delta(&body)
            && let Some(pending) = &mut self.pending
            && merge(pending, &body)
        {
            return;
        }
        if let Some(done) = self.pending.take() {
            self.queued.push((Uuid::now_v7(), done));
        }
        if is_delta(&body) {
            self.pending = Some(body);
        } else {
            self.queued.push((Uuid::now_v7(), body));
        }
        self.since.get_or_insert_with(Instant::now);
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
