//! Every request gets [`crate::ApiSettings::request_timeout`] to arrive and
//! be answered: a body sent a byte at a time, or a handler stuck behind the
//! database, ends in a 408 instead of holding a connection and a task.
//! An event stream counts until its headers; its body is bounded by
//! `sse_max_duration` and the connection's write-stall limit instead.

use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::ApiError;

pub(crate) async fn within(State(limit): State<Duration>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::RequestTimeout(format!(
            "the request was not received and answered within {} s",
            limit.as_secs_f64()
        ))
        .into_response(),
    }
}
