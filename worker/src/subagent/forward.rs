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

use crate::db_retry::with_retry;
use crate::event_sink::nesting::{NestingStream, copied};

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
}

#[async_trait::async_trait]
impl NestingStream for ParentStream {
    /// `body` (seq `seq` of the child's stream) as the parent sees it.
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

    async fn append(&self, batch: &[(Uuid, EventBody)]) -> Result<(), StoreError> {
        self.store.append_events_once(&self.lease, batch).await.map(|_| ())
    }

    fn describe(&self) -> String {
        format!("the parent stream of sub-agent {}", self.child)
    }
}
