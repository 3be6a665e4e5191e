//! The OpenAPI 3.1 document of the API, generated from the handlers'
//! `#[utoipa::path]` attributes and the protocol types, served at
//! `GET /v1/openapi.json`.
//!
//! Covered: every route under `/v1`, `/healthz` and `/readyz`. Not covered:
//! the web view (`/`, `/web/*`), which is a page for people, not an API;
//! `tests/tests/openapi.rs` checks both directions against the router.

pub(crate) mod bodies;
mod constraints;
mod deployment;
pub(crate) mod errors;
mod events;

use std::sync::OnceLock;

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::routes::{
    attempts, callback_key, changes, control, deliver, environments, events as events_route, health, runs,
    stream_token, webhooks,
};
use crate::{ApiError, AppState};

pub use errors::{ErrorBody, ErrorCode};

/// Routes the document leaves out: the web view, a page for people that
/// uses the API like any other client. Every other route is documented
/// (`tests/tests/openapi.rs` checks both directions against the router).
pub const NOT_DOCUMENTED: &[&str] = &["/", "/web/app.js", "/web/app.css"];

/// Name of the bearer JWT security scheme.
pub const BEARER: &str = "bearer";
/// Name of the `?access_token=` scheme (the events route only).
pub const ACCESS_TOKEN: &str = "access_token";
/// Name of the metrics token scheme (`/metrics` only).
pub const METRICS_TOKEN: &str = "metrics_token";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Kiln API",
        description = "Run coding agents remotely: submit a run against a repository, follow its events over \
            Server-Sent Events, steer it, approve its tool calls.\n\nEvery error answers \
            `{\"error\": {\"code\", \"message\"}}` (schema `Error`). Authenticate with \
            `Authorization: Bearer <JWT>`; the token's `sub` owns the runs it creates.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        runs::create,
        runs::list,
        runs::get,
        runs::cancel,
        attempts::select,
        changes::patch,
        changes::changes,
        environments::create,
        environments::list,
        environments::get,
        environments::update,
        environments::delete,
        environments::reset_cache,
        deliver::deliver,
        events_route::events,
        stream_token::mint,
        callback_key::callback_key,
        control::send_message,
        control::decide,
        webhooks::github,
        health::healthz,
        health::readyz,
        crate::metrics::scrape,
        serve,
    ),
    components(
        schemas(kiln_protocol::StoredEvent),
        responses(
            errors::BadRequest,
            errors::Unauthorized,
            errors::NotFound,
            errors::Conflict,
            errors::PayloadTooLarge,
            errors::UnsupportedMediaType,
            errors::Unprocessable,
            errors::TooManyRequests,
            errors::Unavailable,
            errors::Internal,
        )
    ),
    modifiers(&Security),
    security(("bearer" = [])),
    tags(
        (name = "runs", description = "Create, list, read and cancel runs."),
        (name = "environments", description = "How runs' sandboxes are prepared: image, setup, variables, secrets; \
            the prepared sandbox is cached."),
        (name = "events", description = "A run's events: Server-Sent Events, or pages of JSON."),
        (name = "control", description = "Steer a run and approve its tool calls."),
        (name = "github", description = "GitHub webhooks and reporting results on GitHub."),
        (name = "meta", description = "Health and this document."),
    )
)]
struct ApiDoc;

struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some(
                        "A JWT (HS256 with the server's secret, or RS256/ES256 with a configured public key; \
                         `kiln token` mints one). Its `sub` is the caller: runs are visible to their owner only.",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            METRICS_TOKEN,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The deployment's metrics token (`KILN_METRICS_TOKEN`), for `/metrics` on the API's \
                         listener; not a user's JWT.",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            ACCESS_TOKEN,
            SecurityScheme::ApiKey(ApiKey::Query(ApiKeyValue::with_description(
                "access_token",
                "A stream token (`POST /v1/runs/{id}/stream-token`: short-lived, for one run) as a query \
                 parameter, for browsers' EventSource, which cannot set headers. Accepted on that run's events \
                 route only; long-lived bearer tokens are refused here.",
            ))),
        );
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    #[error("serializing the OpenAPI document: {0}")]
    Serialize(#[from] serde_json::Error),
    #[error(transparent)]
    Shape(#[from] events::ShapeError),
    #[error(transparent)]
    Constraint(#[from] constraints::MissingTarget),
}

/// The document as JSON. Built from the derive, then refined where a derive
/// cannot say enough: the event kinds ([`events`]) and the rules every input
/// is checked with ([`constraints`]).
pub fn document() -> Result<Value, DocumentError> {
    let mut doc = serde_json::to_value(ApiDoc::openapi())?;
    events::refine(&mut doc)?;
    constraints::apply(&mut doc)?;
    Ok(doc)
}

/// The document built once: it cannot change while the process runs.
fn cached() -> Result<&'static Value, ApiError> {
    static DOCUMENT: OnceLock<Result<Value, String>> = OnceLock::new();
    DOCUMENT
        .get_or_init(|| document().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| ApiError::Internal(format!("building the OpenAPI document failed: {e}")))
}

/// This document.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    operation_id = "openapi",
    tag = "meta",
    security(()),
    responses(
        (status = 200, description = "The OpenAPI 3.1 document of this API.", content_type = "application/json",
            body = Object),
        (status = 500, response = errors::Internal),
    )
)]
pub async fn serve(State(state): State<AppState>) -> Result<Response, ApiError> {
    let mut doc = cached()?.clone();
    deployment::Deployment::of(&state).tailor(&mut doc);
    let body = serde_json::to_vec(&doc)
        .map_err(|e| ApiError::Internal(format!("serializing the OpenAPI document failed: {e}")))?;
    Ok(([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response())
}
