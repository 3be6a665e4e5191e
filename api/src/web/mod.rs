//! The web view: one page of plain HTML, CSS and JavaScript served at `/`.
//!
//! No build step and no files on disk at run time: the three files beside
//! this module are compiled into the binary, so `kiln serve` is still one
//! file to deploy. The page talks only to the public `/v1` API with the
//! token a person pastes in (kept in the tab's session storage), so it can
//! do nothing a client of the API couldn't.
//!
//! Model output is hostile. The script never parses untrusted text as HTML
//! (it builds the DOM from text nodes), and the Content-Security-Policy
//! below is the second line: no inline script or style, no `eval`, nothing
//! loaded or contacted but this origin, no framing.

use axum::Router;
use axum::http::{HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

const INDEX_HTML: &str = include_str!("index.html");
const APP_JS: &str = include_str!("app.js");
const APP_CSS: &str = include_str!("app.css");

/// Everything from this origin only; `connect-src 'self'` covers `fetch`
/// and `EventSource`; `data:` images only for the empty favicon.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Routes of the web view. Generic over the state so it merges into the
/// API router without needing anything from it.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }))
        .route("/web/app.js", get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }))
        .route("/web/app.css", get(|| async { asset("text/css; charset=utf-8", APP_CSS) }))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY)),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        // The page's URLs carry no secrets, but nothing needs the referrer.
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
        // Embedded in the binary: an upgrade changes them, so revalidate.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (HeaderName::from_static("cross-origin-opener-policy"), HeaderValue::from_static("same-origin")),
    ];
    (headers, body).into_response()
}
