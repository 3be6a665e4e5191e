//! The request span, the access log and the HTTP metrics of every request,
//! all done when the response's head is produced.
//!
//! Not tower-http's `TraceLayer`: it wraps every response body to enter
//! the request's span around each frame, which for an event stream is each
//! event sent to each client (issue 33's profile of 10,000 streams: a
//! tenth of Kiln's excess per frame over a plain axum server). Nothing
//! here touches the body: an event stream is logged and counted once, as
//! its headers go out, and its frames cost nothing more.

use std::fmt;
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use crate::metrics::{self, HttpLabels};

pub(crate) async fn access(request: Request, next: Next) -> Response {
    // The span names the path only: a query may carry `access_token`. The
    // handler runs in it, so whatever it logs names the request.
    let span = tracing::info_span!("request", method = %request.method(), path = %request.uri().path());
    let labels = HttpLabels::of(&request);
    let started = Instant::now();
    let response = next.run(request).instrument(span.clone()).await;
    let latency = Millis(started.elapsed());
    let status = response.status();
    // The access log: one line per request at info (a refused token leaves
    // a trace on the server), and a server error's at error besides. The
    // lines `TraceLayer` logged, word for word.
    tracing::info!(parent: &span, %latency, status = status.as_u16(), "finished processing request");
    if status.is_server_error() {
        tracing::error!(
            parent: &span,
            classification = %format_args!("Status code: {status}"),
            %latency,
            "response failed"
        );
    }
    metrics::record_http(labels, status, latency.0);
    response
}

/// A latency as the access log shows it: whole milliseconds.
#[derive(Clone, Copy)]
struct Millis(Duration);

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ms", self.0.as_millis())
    }
}
