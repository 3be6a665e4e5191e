//! `GET /v1/runs/{id}/events`: the run's events as SSE, or as a JSON page.
//!
//! The stream reads from the events table, never from memory: a notification
//! only says "look again". So a reconnect to any API instance with
//! `Last-Event-ID: N` gets exactly the events after N, and a slow client
//! merely falls behind and catches up from the table. Streams that are
//! caught up share one reader per run (`crate::feed`).
//!
//! Every read of the table is bounded in count and in bytes
//! (`ApiSettings::event_page_bytes`): a run's events can be large (its
//! output), and a thousand of them in one read would hold that much in the
//! API's memory. A read always returns at least one event, and the next
//! continues after the last it returned.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::header::ACCEPT;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use kiln_protocol::StoredEvent;
use kiln_protocol::event::is_terminal_kind;
use kiln_protocol::rules::Range;
use kiln_store::{EventBatch, StoreError};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use uuid::Uuid;

use crate::auth::Subject;
use crate::event_reads::{BATCH, page_bytes};
use crate::extract::{ApiQuery, RunIdPath};
use crate::feed::{Batch, FedEvent, Joined, sse_event};
use crate::limits::SseSlot;
use crate::{ApiError, AppState};

/// `limit` of a JSON page.
pub(crate) static PAGE: Range<i64> = Range::new(1, 1000);
/// A resume point: `after` and `Last-Event-ID`.
pub(crate) static RESUME: Range<i64> = Range::new(0, i64::MAX);

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Only events after this seq (`Last-Event-ID` wins over it).
    after: Option<i64>,
    /// Events per page of the JSON form (default 500). Fewer when they are
    /// large: a page holds at most the deployment's `KILN_EVENT_PAGE_BYTES`
    /// (2 MiB by default) of events, and always at least one; page on with
    /// `next_after`. The stream ignores it.
    limit: Option<i64>,
    /// Accepted here only so the query extractor doesn't refuse it; the
    /// auth extractor reads it. (Documented as the `access_token` security
    /// scheme, not as a parameter.)
    #[allow(dead_code)]
    #[param(ignore)]
    access_token: Option<String>,
}

/// A page of a run's events, oldest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct EventPage {
    events: Vec<StoredEvent>,
    /// Pass as `after` to get the next page.
    next_after: i64,
    /// True once the page holds the run's terminal event.
    done: bool,
}

/// Follow a run's events
///
/// As `text/event-stream` (the default): every event after the resume
/// point, then each new one as it happens, until the run's terminal event
/// (`run.succeeded`, `run.failed`, `run.cancelled`, `run.timed_out`), after
/// which the stream ends. Each SSE event has `id:` its seq, `event:` its
/// kind and `data:` its payload as JSON (schema `SseEvent`; the kinds and
/// their payloads are `EventBody`); a `: keep-alive` comment comes every
/// 15 s. Reconnect with `Last-Event-ID` to resume, from any API instance,
/// with nothing missed or repeated. A resume point past the run's last
/// event is refused (409: no event of the run has that seq yet); once the
/// run has ended, resuming at or after its terminal event answers 204
/// (nothing more will come).
///
/// With `Accept: application/json` (and not `text/event-stream`): one page
/// of stored events as JSON instead.
#[utoipa::path(
    get,
    path = "/v1/runs/{id}/events",
    operation_id = "run_events",
    tag = "events",
    params(
        ("id" = uuid::Uuid, Path, description = "The run's id."),
        ("Last-Event-ID" = Option<i64>, Header,
            description = "Resume after this seq (what EventSource sends on reconnect)."),
        EventsQuery,
    ),
    security(("bearer" = []), ("access_token" = [])),
    responses(
        (status = 200, description = "The run's events.", content(
            (crate::openapi::bodies::SseEvent = "text/event-stream"),
            (EventPage = "application/json"),
        )),
        (status = 204, description = "The run has ended and the client has had its terminal event \
            (the resume point is at or past it): nothing to stream. An EventSource stops reconnecting."),
        (status = 400, response = crate::openapi::errors::BadRequest),
        (status = 404, response = crate::openapi::errors::NotFound),
        (status = 409, response = crate::openapi::errors::Conflict),
        (status = 429, response = crate::openapi::errors::TooManyRequests),
        (status = 401, response = crate::openapi::errors::Unauthorized),
        (status = 500, response = crate::openapi::errors::Internal),
        (status = 503, response = crate::openapi::errors::Unavailable),
    )
)]
pub async fn events(
    State(state): State<AppState>,
    Subject(owner): Subject,
    RunIdPath(id): RunIdPath,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<EventsQuery>,
) -> Result<Response, ApiError> {
    // Both checked whichever form answers and whichever resume point wins:
    // what the document calls invalid is refused however it is sent.
    let after = resume_point(&headers, q.after)?;
    let limit = q.limit.unwrap_or(BATCH);
    if !PAGE.contains(limit) {
        return Err(ApiError::BadRequest(format!("limit must be between {} and {}", PAGE.min, PAGE.max)));
    }
    let json = wants_json(&headers);
    // A stream joins its run's feed, when the run has one, before its first
    // read: every batch the feed sends after that read then reaches it.
    let feed = if json { None } else { state.feeds.join(id) };
    // The run (its owner checked), its end and the first page: one query.
    let page_limit = if json { limit } else { BATCH };
    let opening = state
        .store
        .open_events(&owner, id, after, page_limit, page_bytes(&state.settings))
        .await?
        .ok_or_else(ApiError::run_not_found)?;
    // A resume point nobody could have been sent: refused, rather than a
    // stream (and the run's shared feed) waiting for seqs that never come.
    // Well formed, but not yet: a conflict with the run's state.
    if after > opening.last_event_seq {
        return Err(ApiError::Conflict(format!(
            "resume point {after} is past this run's last event ({})",
            opening.last_event_seq
        )));
    }
    // Where an ended run's stream ends (retention keeps that event).
    let terminal_seq = opening.terminal_seq;
    if json {
        return Ok(json_page(opening.page.events, after, terminal_seq));
    }
    if terminal_seq.is_some_and(|end| after >= end) {
        // The client has had the terminal event: nothing to stream, and 204
        // is what tells an EventSource to stop reconnecting.
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let slot =
        state.sse.acquire(&owner, state.settings.max_sse_per_subject).ok_or_else(|| ApiError::TooManyRequests {
            message: format!(
                "at most {} event streams may be open per subject; close one first",
                state.settings.max_sse_per_subject
            ),
            retry_after_s: 5,
        })?;
    let keep_alive = KeepAlive::new().interval(state.settings.sse_keep_alive).text("keep-alive");
    // A stream ends after `sse_max_duration` however it is going; the client
    // resumes where it was, from any instance.
    let lifetime = tokio::time::sleep(state.settings.sse_max_duration);
    let start = Start { page: opening.page, feed };
    let events = event_stream(state, id, after, slot, start).take_until(lifetime);
    Ok(Sse::new(events).keep_alive(keep_alive).into_response())
}

/// The JSON form: one page of the run's events after `after`.
fn json_page(events: Vec<StoredEvent>, after: i64, terminal_seq: Option<i64>) -> Response {
    let next_after = events.last().map_or(after, |e| e.seq);
    let done = events.iter().any(|e| is_terminal_kind(&e.kind)) || terminal_seq.is_some_and(|end| next_after >= end);
    Json(EventPage { events, next_after, done }).into_response()
}

/// `Last-Event-ID` wins over `?after=`: it is what a reconnecting
/// EventSource sends. Both must be valid, whichever wins.
fn resume_point(headers: &HeaderMap, after: Option<i64>) -> Result<i64, ApiError> {
    if after.is_some_and(|a| !RESUME.contains(a)) {
        return Err(ApiError::BadRequest("after must be a non-negative integer".into()));
    }
    let header = headers
        .get("last-event-id")
        .map(|v| {
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
                .filter(|n| RESUME.contains(*n))
                .ok_or_else(|| ApiError::BadRequest("Last-Event-ID must be a non-negative integer".into()))
        })
        .transpose()?;
    Ok(header.or(after).unwrap_or(0))
}

fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get(ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/json") && !v.contains("text/event-stream"))
}

/// Where a stream starts: the first page after its resume point, read as
/// the request was checked, and its run's feed if the run had one then.
struct Start {
    page: EventBatch,
    feed: Option<broadcast::Receiver<Batch>>,
}

/// `slot` lives as long as the stream, holding the subject's SSE slot.
fn event_stream(
    state: AppState,
    run_id: Uuid,
    mut after: i64,
    slot: SseSlot,
    start: Start,
) -> impl Stream<Item = Result<Event, Infallible>> {
    async_stream::stream! {
        let _slot = slot;
        let Start { page, mut feed } = start;
        let mut first = Some(page);
        loop {
            // Catch up: the first page, then from the table.
            let Some(batch) = catch_up(&state, run_id, after, &mut first).await else { return };
            let more = batch.more;
            for ev in batch.events {
                after = ev.seq;
                let terminal = is_terminal_kind(&ev.kind);
                yield Ok(sse_event(&ev));
                if terminal {
                    return;
                }
            }
            if more {
                continue;
            }
            // Caught up: to the run's feed (back to the table first when
            // the feed cannot vouch for what came after the last read).
            let Some(feed) = joined(&state, run_id, after, &mut feed) else { continue };
            // Follow the feed for as long as it continues exactly where
            // this stream is; anything else sends it back to the table.
            loop {
                let batch = match next_from_feed(&state, feed, run_id, after).await {
                    FeedNews::Events(batch) => batch,
                    FeedNews::Reread => break,
                    // Shutting down: end the stream; the client resumes elsewhere.
                    FeedNews::Shutdown => return,
                };
                let (next, gap) = continuing(&batch, after);
                for ev in next {
                    after = ev.seq;
                    yield Ok(ev.sse.clone());
                    if ev.terminal {
                        return;
                    }
                }
                if gap {
                    break;
                }
            }
        }
    }
}

/// The next page a stream sends while it catches up: its first page (read
/// with the request's checks), then reads of the table, retried while the
/// database is away: the client stays connected. `None`: the API is
/// shutting down meanwhile.
async fn catch_up(state: &AppState, run_id: Uuid, after: i64, first: &mut Option<EventBatch>) -> Option<EventBatch> {
    if let Some(page) = first.take() {
        return Some(page);
    }
    loop {
        match table_read(state, run_id, after).await {
            Ok(batch) => return Some(batch),
            Err(e) => {
                if !pause_before_retry(state, run_id, &e).await {
                    return None;
                }
            }
        }
    }
}

/// The feed a caught-up stream follows, joined now unless it was before
/// the stream's first read. A reader started here begins where the stream
/// is. `None`: the stream joined a reader that was running already, which
/// may have sent what followed the stream's last read: it reads the table
/// once more first.
fn joined<'a>(
    state: &AppState,
    run_id: Uuid,
    after: i64,
    feed: &'a mut Option<broadcast::Receiver<Batch>>,
) -> Option<&'a mut broadcast::Receiver<Batch>> {
    if feed.is_none() {
        match state.feeds.join_or_start(state, run_id, after) {
            Joined::Started(rx) => *feed = Some(rx),
            Joined::Existing(rx) => {
                *feed = Some(rx);
                return None;
            }
        }
    }
    feed.as_mut()
}

/// Logs a failed read of the table and waits a second; false if the API is
/// shutting down meanwhile.
async fn pause_before_retry(state: &AppState, run_id: Uuid, e: &StoreError) -> bool {
    tracing::warn!(error = %e, %run_id, "reading events failed; retrying");
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs(1)) => true,
        _ = state.shutdown.cancelled() => false,
    }
}

/// What the feed told a caught-up stream.
enum FeedNews {
    Events(Batch),
    /// Read the table again: the stream lagged, or the feed closed (and
    /// was joined again).
    Reread,
    Shutdown,
}

/// The feed's next batch for a stream that has read up to `after`.
///
/// Shutdown is heard through the feed: its reader ends when the API shuts
/// down, which closes the channel. Not a `select!` on the shutdown token:
/// that registers a waiter with the token at every batch, for every stream,
/// under one lock (with 10,000 streams on a run, 20,000 lock round trips
/// for each event the run writes).
async fn next_from_feed(state: &AppState, feed: &mut broadcast::Receiver<Batch>, run_id: Uuid, after: i64) -> FeedNews {
    match feed.recv().await {
        Ok(batch) => FeedNews::Events(batch),
        Err(RecvError::Lagged(_)) => FeedNews::Reread,
        Err(RecvError::Closed) if state.shutdown.is_cancelled() => FeedNews::Shutdown,
        Err(RecvError::Closed) => {
            *feed = state.feeds.join_or_start(state, run_id, after).into_receiver();
            FeedNews::Reread
        }
    }
}

/// The next page of the run's events from the table. Boxed: a generator is
/// as large as its largest state, so an idle stream (waiting on the feed,
/// where it spends its life) would otherwise keep room for a read of the
/// table (a pooled connection's and a query's futures) for as long as it
/// lives.
fn table_read(
    state: &AppState,
    run_id: Uuid,
    after: i64,
) -> Pin<Box<impl Future<Output = Result<EventBatch, StoreError>> + '_>> {
    Box::pin(state.store.events_page(run_id, after, BATCH, page_bytes(&state.settings)))
}

/// The events of a feed's batch (consecutive, in seq order) that continue
/// exactly after `after` (those at or before it were sent already), and
/// whether a gap follows them: an event the feed skipped, which the stream
/// then reads from the table. A slice of the batch: nothing is allocated
/// per stream.
fn continuing(batch: &[FedEvent], after: i64) -> (&[FedEvent], bool) {
    let rest = &batch[batch.partition_point(|ev| ev.seq <= after)..];
    let next = rest.iter().zip(after + 1..).take_while(|(ev, want)| ev.seq == *want).count();
    (&rest[..next], next < rest.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(seqs: &[i64]) -> Vec<FedEvent> {
        seqs.iter().map(|&seq| FedEvent { seq, terminal: false, sse: Event::default() }).collect()
    }

    fn seqs(events: &[FedEvent]) -> Vec<i64> {
        events.iter().map(|e| e.seq).collect()
    }

    #[test]
    fn a_batch_continues_after_what_was_sent_and_stops_at_a_gap() {
        let b = batch(&[3, 4, 5, 6]);
        let (next, gap) = continuing(&b, 4);
        assert_eq!((seqs(next), gap), (vec![5, 6], false));
        let (next, gap) = continuing(&b, 6);
        assert_eq!((seqs(next), gap), (vec![], false), "all sent already");
        let (next, gap) = continuing(&b, 1);
        assert_eq!((seqs(next), gap), (vec![], true), "seq 2 was skipped");
        let b = batch(&[5, 6, 8]);
        let (next, gap) = continuing(&b, 4);
        assert_eq!((seqs(next), gap), (vec![5, 6], true), "seq 7 was skipped");
    }
}
