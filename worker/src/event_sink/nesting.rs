//! Streams that nest a run's events: a parent's stream holds a copy of its
//! sub-agents' step- and tool-level events (`subagent.event`), a group's
//! holds its attempts' (`attempt.event`). The loop's [`EventSink`] copies
//! each commit into the streams it was given; what a copy looks like and
//! where it is written is the nesting side's ([`NestingStream`],
//! implemented by `subagent::forward` and `attempts`), so the loop knows
//! neither sub-agents nor groups.
//!
//! [`EventSink`]: super::EventSink

use kiln_protocol::EventBody;
use kiln_store::StoreError;
use uuid::Uuid;

use crate::db_retry::with_retry;

/// Longest tool output copied into a nesting stream, in characters (the
/// whole of it is in the run's own stream).
pub const MAX_FORWARDED_OUTPUT: usize = 2000;

/// A stream that gets a copy of another run's events.
#[async_trait::async_trait]
pub trait NestingStream: Send + Sync {
    /// `body`, seq `seq` of the nested run's stream, as this stream holds
    /// it; `None` for what it does not copy.
    fn wrap(&self, seq: i64, body: &EventBody) -> Option<EventBody>;

    /// Writes `batch` into this stream, once (retries are the caller's).
    async fn append(&self, batch: &[(Uuid, EventBody)]) -> Result<(), StoreError>;

    /// What this stream is, for a log line.
    fn describe(&self) -> String;
}

/// Copies what the nested run just committed (`committed`, whose last event
/// took seq `last_seq` in its own stream) into `stream`. A failure is
/// logged, not returned: the run's own stream has it all.
pub async fn forward(stream: &dyn NestingStream, last_seq: i64, committed: &[(Uuid, EventBody)]) {
    let first = last_seq - committed.len() as i64 + 1;
    let batch: Vec<(Uuid, EventBody)> = committed
        .iter()
        .zip(first..)
        .filter_map(|((_, body), seq)| stream.wrap(seq, body))
        .map(|body| (Uuid::now_v7(), body))
        .collect();
    if batch.is_empty() {
        return;
    }
    if let Err(e) = with_retry(|| stream.append(&batch)).await {
        tracing::warn!(stream = %stream.describe(), error = %e, "copying a run's events into the stream nesting them failed");
    }
}

/// `body` as a stream that nests another run's events copies it (a
/// parent's of its sub-agent's, a group's of its attempt's): step- and
/// tool-level kinds, a tool's output cut; `None` for what is not copied.
pub fn copied(body: &EventBody) -> Option<EventBody> {
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
    Some(body)
}

/// `text` cut to at most `max` characters, with a marker when cut.
fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}… [cut; the whole output is in the run's own stream]", &text[..at]),
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
