//! A run's lease and the small parts every fenced write shares: the leaf
//! the queue, the event writes, the batched ends and presence all use, so
//! that none of them imports another for them.

use std::time::Duration;

use kiln_protocol::{EventBody, RunStatus};
use uuid::Uuid;

use crate::StoreError;

/// Proof that a worker holds a run at a given attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub run_id: Uuid,
    pub attempt: i32,
    pub worker: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatOutcome {
    /// A client asked to cancel the run.
    pub cancel_requested: bool,
}

/// A run whose lease had expired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReapedRun {
    pub run_id: Uuid,
    /// `Queued` when it will be retried, `Failed` when out of attempts.
    pub status: RunStatus,
    pub attempt: i32,
}

pub(crate) fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// [`Store::heartbeat`]'s statement.
pub(crate) const HEARTBEAT: &str = "UPDATE runs SET lease_expires_at = now() + $4 * interval '1 millisecond'
     WHERE id = $1 AND attempt = $2 AND lease_owner = $3
       AND status IN ('running', 'awaiting_approval')
     RETURNING cancel_requested";

/// The status, error, and event kind and payload a terminal event stands for.
pub(crate) fn terminal_parts(
    terminal: &EventBody,
) -> Result<(RunStatus, Option<String>, String, serde_json::Value), StoreError> {
    let Some(status) = terminal.terminal_status() else {
        return Err(StoreError::Corrupt(format!("not a terminal event: {terminal:?}")));
    };
    // What `runs.error` says of a run that did not succeed.
    let error = match terminal {
        EventBody::RunFailed { error } => Some(error.clone()),
        EventBody::RunCancelled { reason } => Some(reason.clone()),
        EventBody::RunTimedOut { limit_s } => Some(format!("the run exceeded its wall-clock limit of {limit_s} s")),
        _ => None,
    };
    let (kind, payload) = terminal.clone().into_parts().map_err(|e| StoreError::Corrupt(e.to_string()))?;
    Ok((status, error, kind, payload))
}
