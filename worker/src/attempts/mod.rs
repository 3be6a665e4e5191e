//! Attempts of a best-of-N group (issue 29), as the worker sees them: an
//! attempt is a run like any other, whose step- and tool-level events are
//! also copied into its group's stream ([`GroupStream`]), and whose end is
//! recorded there once it is written ([`ended`]); the last attempt to end
//! ends the group (the store decides, serialised on the group's row).

use kiln_protocol::{EventBody, Run};
use kiln_store::{Store, StoreError};
use uuid::Uuid;

use crate::db_retry::with_retry;
use crate::event_sink::nesting::{NestingStream, copied};

/// The group's stream, as one attempt writes to it.
#[derive(Debug, Clone)]
pub struct GroupStream {
    pub store: Store,
    pub group: Uuid,
    pub attempt: u32,
    pub run_id: Uuid,
}

impl GroupStream {
    /// For an attempt, its group's stream; `None` for any other run.
    pub fn of(store: &Store, run: &Run) -> Option<Self> {
        Some(GroupStream {
            store: store.clone(),
            group: run.group_run_id?,
            attempt: run.attempt_number?,
            run_id: run.id,
        })
    }
}

#[async_trait::async_trait]
impl NestingStream for GroupStream {
    /// `body` (seq `seq` of the attempt's stream) as the group's stream has
    /// it: what a parent gets of a sub-agent, and where the attempt runs and
    /// what it changed.
    fn wrap(&self, seq: i64, body: &EventBody) -> Option<EventBody> {
        let body = match body {
            EventBody::SandboxReady { .. } | EventBody::ChangesCaptured { .. } => body.clone(),
            other => copied(other)?,
        };
        let (kind, payload) = body.into_parts().ok()?;
        Some(EventBody::AttemptEvent {
            attempt: self.attempt,
            run_id: self.run_id,
            seq,
            event: serde_json::json!({ "kind": kind, "payload": payload }),
        })
    }

    async fn append(&self, batch: &[(Uuid, EventBody)]) -> Result<(), StoreError> {
        self.store.append_group_events(self.group, batch).await.map(|_| ())
    }

    fn describe(&self) -> String {
        format!("the stream of group {}", self.group)
    }
}

/// After an attempt's end was written: its end goes into its group's
/// stream, and the group ends if it was the last. Retried through a
/// database blink; should this worker die in between, a cancel of the
/// group records it (`Store::attempt_ended` is idempotent).
pub async fn ended(store: &Store, run: &Run) {
    if run.group_run_id.is_none() {
        return;
    }
    if let Err(e) = with_retry(|| store.attempt_ended(run.id)).await {
        tracing::warn!(run_id = %run.id, error = %e, "recording the attempt's end in its group failed");
    }
}
