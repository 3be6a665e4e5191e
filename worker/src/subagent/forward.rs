//! A child's events in its parent's stream.
//!
//! The child writes its own stream as any run does. After each of its
//! commits, the step- and tool-level events of that commit are copied into
//! the parent's stream as `subagent.event`, tagged with the child's run id,
//! agent path and seq; streamed text, reasoning and command output are not
//! (they stay in the child's stream), so however chatty a child is, the
//! parent's stream grows by a few events per child step. The copy is written
//! under the parent's lease, with the parent's other events, so the
//! parent's seqs stay dense.
//!
//! The copies are written off the child's path ([`Forwarder`]): a commit of
//! the child hands them to a task of its own, which writes them in order.
//! Written inline, each child commit waited for a second one, on the
//! parent's row, which the parent's other children wrote too (bench
//! `subagents`).

use kiln_protocol::EventBody;
use kiln_store::{Lease, Store, StoreError};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::agent::db_retry::with_retry;
use crate::run_lifecycle::AbortOnDrop;

/// Commits' worth of copies waiting to be written; past this a child's
/// commit waits for the writer (memory stays bounded).
const QUEUED_COMMITS: usize = 32;
/// Most copies the writer puts in one statement when it has fallen behind.
const MAX_WRITE: usize = 256;

/// Longest tool output copied into the parent's stream, in characters (the
/// whole of it is in the child's).
pub const MAX_FORWARDED_OUTPUT: usize = 2000;

/// The parent's stream, as one child writes to it.
#[derive(Debug, Clone)]
pub struct ParentStream {
    pub store: Store,
    /// The parent's lease: the copies are fenced like the parent's writes.
    pub lease: Lease,
    pub call_id: String,
    pub child: Uuid,
    pub path: String,
}

impl ParentStream {
    /// Writes `body` into the parent's stream now.
    pub async fn write(&self, body: EventBody) -> Result<(), StoreError> {
        let batch = [(Uuid::now_v7(), body)];
        with_retry(|| self.store.append_events_once(&self.lease, &batch)).await.map(|_| ())
    }

    /// The copies, for the parent's stream, of what the child just
    /// committed (`committed`, whose last event took seq `last_seq` in the
    /// child's stream), each with the id it keeps across retries.
    fn copies(&self, last_seq: i64, committed: &[(Uuid, EventBody)]) -> Vec<(Uuid, EventBody)> {
        let first = last_seq - committed.len() as i64 + 1;
        committed
            .iter()
            .zip(first..)
            .filter_map(|((_, body), seq)| self.wrap(seq, body))
            .map(|body| (Uuid::now_v7(), body))
            .collect()
    }

    /// `body` (seq `seq` of the child's stream) as the parent sees it, or
    /// `None` for what is not copied.
    fn wrap(&self, seq: i64, body: &EventBody) -> Option<EventBody> {
        let body = match body {
            EventBody::StepStarted { .. }
            | EventBody::StepFinished { .. }
            | EventBody::ToolCallReady { .. }
            | EventBody::Todo { .. }
            | EventBody::ApprovalRequested { .. }
            | EventBody::ApprovalResolved { .. }
            | EventBody::Compaction { .. }
            | EventBody::SubagentStarted { .. }
            | EventBody::SubagentFinished { .. } => body.clone(),
            EventBody::ToolResult { call_id, name, output, is_error, duration_ms } => EventBody::ToolResult {
                call_id: call_id.clone(),
                name: name.clone(),
                output: cut(output, MAX_FORWARDED_OUTPUT),
                is_error: *is_error,
                duration_ms: *duration_ms,
            },
            _ => return None,
        };
        let (kind, payload) = body.into_parts().ok()?;
        Some(EventBody::SubagentEvent {
            call_id: self.call_id.clone(),
            run_id: self.child,
            agent_path: self.path.clone(),
            seq,
            event: serde_json::json!({ "kind": kind, "payload": payload }),
        })
    }
}

/// One child's copies on their way to the parent's stream: handed over by
/// the child's commits, written in that order by a task of their own.
/// Dropped, the task stops (the parent dropped the child).
pub struct Forwarder {
    stream: ParentStream,
    queue: Option<mpsc::Sender<Vec<(Uuid, EventBody)>>>,
    writer: AbortOnDrop,
}

impl Forwarder {
    pub fn start(stream: ParentStream) -> Self {
        let (queue, queued) = mpsc::channel(QUEUED_COMMITS);
        let writer = AbortOnDrop(tokio::spawn(write_in_order(stream.clone(), queued)));
        Forwarder { stream, queue: Some(queue), writer }
    }

    /// Hands over the copies of what the child just committed (see
    /// [`ParentStream::copies`]); waits only while the queue is full.
    pub async fn forward(&self, last_seq: i64, committed: &[(Uuid, EventBody)]) {
        let batch = self.stream.copies(last_seq, committed);
        if batch.is_empty() {
            return;
        }
        if let Some(queue) = &self.queue
            && queue.send(batch).await.is_err()
        {
            tracing::warn!(child = %self.stream.child, "the writer of a sub-agent's copies stopped; copies dropped");
        }
    }

    /// Waits until every copy handed over is written (or given up on):
    /// before the parent's stream says the child ended.
    pub async fn finish(mut self) {
        self.queue = None;
        if let Err(e) = (&mut self.writer.0).await {
            tracing::warn!(child = %self.stream.child, error = %e, "the writer of a sub-agent's copies failed");
        }
    }
}

/// Writes the copies in the order they came; what queued while a write was
/// under way goes in the next one together. A failure is logged, not
/// returned: the child's own stream has it all.
async fn write_in_order(stream: ParentStream, mut queued: mpsc::Receiver<Vec<(Uuid, EventBody)>>) {
    while let Some(mut batch) = queued.recv().await {
        while batch.len() < MAX_WRITE
            && let Ok(more) = queued.try_recv()
        {
            batch.extend(more);
        }
        if let Err(e) = with_retry(|| stream.store.append_events_once(&stream.lease, &batch)).await {
            tracing::warn!(child = %stream.child, error = %e, "copying a sub-agent's events to its parent failed");
        }
    }
}

/// `text` cut to at most `max` characters, with a marker when cut.
fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}… [cut; the whole output is in the sub-agent's own stream]", &text[..at]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_output_is_cut_on_a_character_boundary() {
        assert_eq!(cut("héllo", 10), "héllo");
        assert!(cut("héllo", 2).starts_with("hé…"));
    }
}
