//! Reading a run's events from the table: the bounds of one read. Shared by
//! each SSE stream (`routes::events`) and by the one reader per followed run
//! (`feed`, through `page_reads`).

use crate::ApiSettings;

/// Events read from the table per query (at most; see `event_page_bytes`).
pub(crate) const BATCH: i64 = 500;

/// The byte bound of one read of the events table.
pub(crate) fn page_bytes(settings: &ApiSettings) -> i64 {
    i64::try_from(settings.event_page_bytes).unwrap_or(i64::MAX)
}
