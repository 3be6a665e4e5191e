//! `GET /metrics` (Prometheus text) and the HTTP request counters.
//!
//! The API records through the `metrics` facade; the binary installs the
//! Prometheus recorder and hands over how to render it, so this crate does
//! not pick the exporter. Gauges that describe the whole deployment (runs
//! by status, the queue) are read from Postgres at scrape time, cached for
//! `ApiSettings::metrics_refresh` so many scrapers cannot load the database.
//!
//! Who may scrape: on the API's own listener, only a caller with the
//! metrics token (`KILN_METRICS_TOKEN`, a bearer token of its own, not a
//! user's JWT); without one configured, the API's listener serves no
//! metrics at all. [`listener_router`] serves them with no token on a
//! listener of their own (`KILN_API_METRICS_LISTEN`), kept off public
//! networks, which is how Prometheus' pod annotations scrape.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kiln_store::RunStats;
use secrecy::ExposeSecret;
use sha2::{Digest, Sha256};

use crate::{ApiError, AppState};

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

/// `/metrics` on the API's listener: for the metrics token only.
pub fn routes() -> Router<AppState> {
    Router::new().route("/metrics", get(scrape))
}

/// The router of a listener of the metrics' own: `GET /metrics` with no
/// token (the listener is the access control: bind it where only the
/// scraper reaches), and nothing else.
pub fn listener_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(|State(state): State<AppState>| async move { render(&state).await }))
        .fallback(crate::routes::not_found)
        .with_state(state)
}

/// Prometheus text exposition of this process's metrics (and, under
/// `kiln up`, the in-process worker's)
///
/// On the API's listener only with `Authorization: Bearer <KILN_METRICS_TOKEN>`
/// (a token of the deployment's, not a user's JWT); with no metrics token
/// configured, not at all (404): metrics are then served, if at all, on a
/// listener of their own (`KILN_API_METRICS_LISTEN`), without a token.
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "meta",
    security(("metrics_token" = [])),
    responses(
        (status = 200, description = "Prometheus text exposition format 0.0.4: runs by status, queue depth and age, \
            HTTP requests by route and status, SSE connections, and (in-process) worker metrics.",
            content_type = "text/plain", body = String),
        (status = 401, response = crate::openapi::errors::Unauthorized),
        (status = 404, response = crate::openapi::errors::NotFound),
    )
)]
pub(crate) async fn scrape(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let Some(expected) = &state.settings.metrics_token else {
        return Err(ApiError::NotFound(
            "metrics are not served on this listener: set KILN_METRICS_TOKEN to serve them here to that bearer \
             token, or KILN_API_METRICS_LISTEN to serve them on a listener of their own"
                .into(),
        ));
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    match given {
        Some(given) if same_secret(given.as_bytes(), expected.expose_secret().as_bytes()) => Ok(render(&state).await),
        Some(_) => Err(ApiError::Unauthorized("not the metrics token".into())),
        None => Err(ApiError::Unauthorized("/metrics needs `Authorization: Bearer <KILN_METRICS_TOKEN>`".into())),
    }
}

/// Compares digests in time independent of where they differ, so the
/// answer's timing does not spell out the token.
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    let (a, b) = (Sha256::digest(given), Sha256::digest(expected));
    a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn render(state: &AppState) -> Response {
    let Some(exporter) = state.metrics.clone() else {
        return (StatusCode::NOT_FOUND, "metrics are not enabled").into_response();
    };
    refresh_database_gauges(state, &exporter).await;
    let open: usize = state.sse.total();
    ::metrics::gauge!("kiln_sse_connections").set(open as f64);
    ::metrics::gauge!("kiln_submissions_in_admission").set(state.store.submissions_in_admission() as f64);
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

/// The labels a request is counted under: its method and its route
/// template (`/v1/runs/{id}`, not the raw URI: ids would make a series per
/// run). Taken before the request is handled, which consumes it.
pub(crate) struct HttpLabels {
    method: &'static str,
    route: String,
}

impl HttpLabels {
    pub(crate) fn of(request: &Request) -> Self {
        let route = request.extensions().get::<MatchedPath>().map_or("unmatched", |p| p.as_str()).to_owned();
        HttpLabels { method: method_label(request.method()), route }
    }
}

/// Counts and times a request by its labels and status. SSE streams are
/// timed to their response headers, not to their end (`crate::access`).
pub(crate) fn record_http(labels: HttpLabels, status: StatusCode, elapsed: Duration) {
    let HttpLabels { method, route } = labels;
    let status = status.as_u16().to_string();
    ::metrics::counter!("kiln_http_requests_total", "method" => method, "route" => route.clone(), "status" => status)
        .increment(1);
    ::metrics::histogram!("kiln_http_request_duration_seconds", "method" => method, "route" => route)
        .record(elapsed.as_secs_f64());
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
