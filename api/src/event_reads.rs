//! Reading a run's events from the table: the bounds of one read and the
//! wait for news between reads. Shared by each SSE stream
//! (`routes::events`) and by the one reader per followed run (`feed`).

use std::time::Duration;

use kiln_store::{Notice, channels};
use tokio::sync::broadcast::error::RecvError;

use crate::AppState;

/// Events read from the table per query (at most; see `event_page_bytes`).
pub(crate) const BATCH: i64 = 500;

/// The byte bound of one read of the events table.
pub(crate) fn page_bytes(state: &AppState) -> i64 {
    i64::try_from(state.settings.event_page_bytes).unwrap_or(i64::MAX)
}

/// Waits until a notification names this run, the listener reconnected or
/// fell behind (anything may have been missed), or the poll interval passed.
pub(crate) async fn wait_for_news(
    notices: &mut tokio::sync::broadcast::Receiver<Notice>,
    prefix: &str,
    poll: Duration,
) {
    let deadline = tokio::time::sleep(poll);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            _ = &mut deadline => return,
            notice = notices.recv() => match notice {
                Ok(Notice::Notification { channel, payload }) => {
                    if channel == channels::RUN_EVENTS && payload.starts_with(prefix) {
                        return;
                    }
                }
                Ok(Notice::Reconnected) | Err(RecvError::Lagged(_)) => return,
                Err(RecvError::Closed) => {
                    // No listener: fall back to polling alone.
                    deadline.as_mut().await;
                    return;
                }
            }
        }
    }
}
