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

use kiln_protocol::EventBody;
use kiln_store::{Lease, Store, StoreError};
use uuid::Uuid;

use crate::agent::db_retry::with_retry;

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

    /// Copies what the child just committed (`committed`, whose last event
    /// took seq `last_seq` in the child's stream) into the parent's stream.
    /// A failure is logged, not returned: the child's own stream has it all.
    pub async fn forward(&self, last_seq: i64, committed: &[(Uuid, EventBody)]) {
        let first = last_seq - committed.len() as i64 + 1;
        let batch: Vec<(Uuid, EventBody)> = committed
            .iter()
            .zip(first..)
            .filter_map(|((_, body), seq)| self.wrap(seq, body))
            .map(|body| (Uuid::now_v7(), body))
            .collect();
        if batch.is_empty() {
            return;
        }
        if let Err(e) = with_retry(|| self.store.append_events_once(&self.lease, &batch)).await {
            tracing::warn!(child = %self.child, error = %e, "copying a sub-agent's events to its parent failed");
        }
    }

    /// `body` (seq `seq` of the child's stream) as the parent sees it, or
    /// `None` for what is not copied.
    fn wrap(&self, seq: i64, body: &EventBody) -> Option<EventBody> {
        let (kind, payload) = copied(body)?.into_parts().ok()?;
        Some(EventBody::SubagentEvent {
            call_id: self.call_id.clone(),
            run_id: self.child,
            agent_path: self.path.clone(),
            seq,
            event: serde_json::json!({ "kind": kind, "payload": payload }),
        })
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
