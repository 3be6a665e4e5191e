//! `GET /metrics` (Prometheus text) and the HTTP request counters.
//!
//! The API records through the `metrics` facade; the binary installs the
//! Prometheus recorder and hands over how to render it, so this crate does
//! not pick the exporter. Gauges that describe the whole deployment (runs
//! by status, the queue) are read from Postgres at scrape time, cached for
//! `ApiSettings::metrics_refresh` so many scrapers cannot load the database.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kiln_store::RunStats;

use crate::AppState;

/// Renders everything recorded in this process as Prometheus text.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// What `/metrics` serves from.
pub struct Exporter {
    render: Render,
    /// Database gauges are re-read at most this often.
    refresh: Duration,
    last: tokio::sync::Mutex<Option<Instant>>,
}

impl Exporter {
    pub fn new(render: Render, refresh: Duration) -> Self {
        Exporter { render, refresh, last: tokio::sync::Mutex::new(None) }
    }
}

pub fn routes() -> Router<AppState> {
    Router::new().route("/metrics", get(scrape))
}

/// Prometheus text exposition of this process's metrics (and, under
/// `kiln up`, the in-process worker's).
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "meta",
    security(()),
    responses(
        (status = 200, description = "Prometheus text exposition format 0.0.4: runs by status, queue depth and age, \
            HTTP requests by route and status, SSE connections, and (in-process) worker metrics.",
            content_type = "text/plain", body = String),
        (status = 404, description = "Metrics are not enabled in this process.", content_type = "text/plain",
            body = String),
    )
)]
pub(crate) async fn scrape(State(state): State<AppState>) -> Response {
    let Some(exporter) = state.metrics.clone() else {
        return (StatusCode::NOT_FOUND, "metrics are not enabled").into_response();
    };
    refresh_database_gauges(&state, &exporter).await;
    let open: usize = state.sse.total();
    ::metrics::gauge!("kiln_sse_connections").set(open as f64);
    let body = (exporter.render)();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}

/// Runs by status and the queue, unless read less than `refresh` ago. A
/// database that does not answer leaves the last values (the scrape still
/// serves the process's own metrics) and says so in `kiln_metrics_db_up`.
async fn refresh_database_gauges(state: &AppState, exporter: &Exporter) {
    let mut last = exporter.last.lock().await;
    if last.is_some_and(|at| at.elapsed() < exporter.refresh) {
        return;
    }
    match tokio::time::timeout(Duration::from_secs(5), state.store.run_stats()).await {
        Ok(Ok(stats)) => {
            set_run_gauges(&stats);
            ::metrics::gauge!("kiln_metrics_db_up").set(1.0);
            *last = Some(Instant::now());
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "reading run counts for /metrics failed");
            ::metrics::gauge!("kiln_metrics_db_up").set(0.0);
        }
        Err(_) => {
            tracing::warn!("reading run counts for /metrics timed out");
            ::metrics::gauge!("kiln_metrics_db_up").set(0.0);
        }
    }
}

fn set_run_gauges(stats: &RunStats) {
    // Every status, so a status whose runs are all gone reads 0, not stale.
    for status in kiln_protocol::RunStatus::ALL {
        let n = stats.by_status.iter().find(|(s, _)| s == status.as_str()).map_or(0, |(_, n)| *n);
        ::metrics::gauge!("kiln_runs", "status" => status.as_str()).set(n as f64);
    }
    ::metrics::gauge!("kiln_queue_depth").set(stats.queued as f64);
    ::metrics::gauge!("kiln_queue_oldest_age_seconds").set(stats.oldest_queued_age_s);
}

/// Counts and times every request by route template (`/v1/runs/{id}`, not
/// the raw URI: ids would make a series per run) and status. SSE streams
/// are timed to their response headers, not to their end.
pub async fn track_http(request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map_or("unmatched", |p| p.as_str()).to_owned();
    let method = method_label(request.method());
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    ::metrics::counter!("kiln_http_requests_total", "method" => method, "route" => route.clone(), "status" => status)
        .increment(1);
    ::metrics::histogram!("kiln_http_request_duration_seconds", "method" => method, "route" => route)
        .record(started.elapsed().as_secs_f64());
    response
}

/// Methods a client can make up are one label, not one each.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}
