//! The `events` benchmark's baseline: a plain axum SSE endpoint serving a
//! run's rows of the `events` table, as a competent engineer would write it
//! without Kiln: one `LISTEN kiln_run_events` connection (the channel Kiln's
//! store notifies after each commit), one reader per watched run that reads
//! the new rows once per wake-up and broadcasts them to that run's streams,
//! and a catch-up read per stream from its `Last-Event-ID`.
//!
//! Left out, against Kiln's endpoint: authentication and the run's owner
//! check (both once per connection, outside the latency measured), the
//! fallback poll that covers lost notifications, per-subject stream limits,
//! and ending a reader nobody watches any more.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::get;
use futures::{Stream, StreamExt};
use tokio::sync::{Mutex, Notify, broadcast};
use tokio_postgres::{AsyncMessage, NoTls};
use uuid::Uuid;

/// A stored event, as streamed.
struct Row {
    seq: i64,
    kind: String,
    payload: String,
}

type Batch = Arc<Vec<Arc<Row>>>;

/// A watched run: what wakes its reader, and where its rows go.
struct Feed {
    wake: Arc<Notify>,
    rows: broadcast::Sender<Batch>,
}

#[derive(Clone)]
struct AppState {
    pool: deadpool_postgres::Pool,
    feeds: Arc<Mutex<HashMap<Uuid, Feed>>>,
}

/// Serves `GET /v1/runs/{id}/events` on `listener` until the process ends.
pub async fn serve(db_url: String, listener: tokio::net::TcpListener) -> anyhow::Result<()> {
    let config: tokio_postgres::Config = db_url.parse()?;
    let manager = deadpool_postgres::Manager::new(config.clone(), NoTls);
    let pool = deadpool_postgres::Pool::builder(manager).max_size(16).build()?;
    let state = AppState { pool, feeds: Arc::default() };
    listen(&config, state.feeds.clone()).await?;
    let app = axum::Router::new().route("/v1/runs/{id}/events", get(events)).with_state(state);
    axum::serve(listener, app).await?;
    Ok(())
}

/// One connection LISTENing; each notification (`<run>:<seq>`) wakes the
/// run's reader, if anyone watches the run.
async fn listen(config: &tokio_postgres::Config, feeds: Arc<Mutex<HashMap<Uuid, Feed>>>) -> anyhow::Result<()> {
    let (client, mut conn) = config.connect(NoTls).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notification(n) = message
                && tx.send(n.payload().to_owned()).is_err()
            {
                break;
            }
        }
    });
    client.batch_execute("LISTEN kiln_run_events").await?;
    tokio::spawn(async move {
        // The client must live as long as the connection listens.
        let _client = client;
        while let Some(payload) = rx.recv().await {
            let Some(run) = payload.split(':').next().and_then(|r| r.parse::<Uuid>().ok()) else { continue };
            if let Some(feed) = feeds.lock().await.get(&run) {
                feed.wake.notify_one();
            }
        }
    });
    Ok(())
}

impl AppState {
    async fn rows_after(&self, run: Uuid, after: i64) -> anyhow::Result<Vec<Arc<Row>>> {
        let client = self.pool.get().await?;
        let statement = client
            .prepare_cached(
                "SELECT seq, kind, payload::text FROM events WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT 1000",
            )
            .await?;
        let rows = client.query(&statement, &[&run, &after]).await?;
        rows.iter()
            .map(|r| Ok(Arc::new(Row { seq: r.try_get(0)?, kind: r.try_get(1)?, payload: r.try_get(2)? })))
            .collect()
    }

    /// Subscribes to `run`'s rows, starting its reader if it has none. Rows
    /// committed before the reader started are the caller's to read.
    async fn subscribe(&self, run: Uuid) -> anyhow::Result<broadcast::Receiver<Batch>> {
        let mut feeds = self.feeds.lock().await;
        if let Some(feed) = feeds.get(&run) {
            return Ok(feed.rows.subscribe());
        }
        let start: i64 = {
            let client = self.pool.get().await?;
            client.query_one("SELECT coalesce(max(seq), 0) FROM events WHERE run_id = $1", &[&run]).await?.try_get(0)?
        };
        let (rows, receiver) = broadcast::channel(1024);
        let wake = Arc::new(Notify::new());
        feeds.insert(run, Feed { wake: wake.clone(), rows: rows.clone() });
        let state = self.clone();
        tokio::spawn(async move {
            let mut last = start;
            loop {
                wake.notified().await;
                // Wake-ups that came during the read are coalesced by
                // `Notify`: the next read takes everything they announced.
                let Ok(batch) = state.rows_after(run, last).await else { continue };
                if let Some(row) = batch.last() {
                    last = row.seq;
                    let _ = rows.send(Arc::new(batch));
                }
            }
        });
        Ok(receiver)
    }
}

async fn events(
    State(state): State<AppState>,
    Path(run): Path<Uuid>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, (StatusCode, String)> {
    let after: i64 =
        headers.get("last-event-id").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).unwrap_or(0);
    let failed = |e: anyhow::Error| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    let receiver = state.subscribe(run).await.map_err(failed)?;
    let caught_up = state.rows_after(run, after).await.map_err(failed)?;
    let start = (VecDeque::from(caught_up), receiver, after, state, run);
    let stream = futures::stream::unfold(start, |(mut queue, mut receiver, mut last, state, run)| async move {
        loop {
            if let Some(row) = queue.pop_front() {
                if row.seq <= last {
                    continue;
                }
                last = row.seq;
                let event = Event::default().id(row.seq.to_string()).event(&row.kind).data(&row.payload);
                return Some((Ok(event), (queue, receiver, last, state, run)));
            }
            match receiver.recv().await {
                Ok(batch) => queue.extend(batch.iter().cloned()),
                Err(broadcast::error::RecvError::Lagged(_)) => queue.extend(state.rows_after(run, last).await.ok()?),
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
