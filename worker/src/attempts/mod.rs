//! Attempts of a best-of-N group (issue 29), as the worker sees them: an
//! attempt is a run like any other, whose step- and tool-level events are
//! also copied into its group's stream ([`GroupStream`]), and whose end is
//! recorded there once it is written ([`ended`]); the last attempt to end
//! ends the group (the store decides, serialised on the group's row).

use kiln_protocol::{EventBody, Run};
use kiln_store::Store;
use uuid::Uuid;

use crate::agent::db_retry::with_retry;
use crate::subagent::forward::copied;

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

    /// Copies what the attempt just committed (`committed`, whose last
    /// event took seq `last_seq` in its own stream) into the group's. A
    /// failure is logged, not returned: the attempt's own stream has it all.
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
        if let Err(e) = with_retry(|| self.store.append_group_events(self.group, &batch)).await {
            tracing::warn!(group = %self.group, error = %e, "copying an attempt's events to its group failed");
        }
    }

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
