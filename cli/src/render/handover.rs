//! How a run's work is handed over, in one line each, for the live display
//! and the plain printer alike: the change captured, its delivery (a push,
//! a GitHub report) and the completion callback.

use kiln_protocol::EventBody;
use kiln_protocol::changes::ChangeTotals;

/// The line for a hand-over event, without its leading mark; `None` for
/// any other event.
pub fn line(body: &EventBody) -> Option<String> {
    let line = match body {
        EventBody::ChangesCaptured { files, additions, deletions, too_large } => {
            let totals = ChangeTotals { files: *files, additions: *additions, deletions: *deletions };
            super::diffstat::captured(&totals, *too_large)
        }
        EventBody::DeliverySucceeded { branch: Some(branch), commit, remote, .. } => format!(
            "pushed {} to {branch} of {}",
            commit.as_deref().unwrap_or_default(),
            remote.as_deref().unwrap_or_default()
        ),
        EventBody::DeliverySucceeded { pull_request, comment, .. } => {
            format!("reported on GitHub: {}", pull_request.as_ref().or(comment.as_ref()).map_or("", String::as_str))
        }
        EventBody::DeliveryFailed { error } => format!("delivery failed: {error}"),
        EventBody::DeliveryRetrying { attempt, error, retry_in_ms } => {
            format!("push attempt {attempt} failed: {error}; retrying in {}s", retry_in_ms.div_ceil(1000))
        }
        EventBody::CallbackSucceeded { attempt, status, .. } => {
            format!("completion callback delivered (HTTP {status}, attempt {attempt})")
        }
        EventBody::CallbackFailed { attempt, error, .. } => {
            format!("completion callback attempt {attempt} failed: {error}")
        }
        _ => return None,
    };
    Some(line)
}
