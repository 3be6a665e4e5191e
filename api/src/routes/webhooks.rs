//! `POST /v1/webhooks/github`: GitHub's deliveries.
//!
//! Authenticated by the payload's HMAC signature, not a bearer token (this
//! handler takes no `Subject`). In order: refuse if webhooks are not
//! configured; read the raw body (at most [`MAX_WEBHOOK_BODY_BYTES`]); check
//! the signature over exactly those bytes; answer a delivery id seen before
//! from the table; only then parse and decide. Every verified delivery is
//! recorded, pings and ignored ones included, so redeliveries are one
//! lookup and the table is a full log of what GitHub sent.
//!
//! Answers: 201 `{"run_id"}` (a run, or a group of attempts, was queued),
//! 200 `{"selected", "run_id"}` (`/kiln select K` chose attempt K of the
//! group), 200 `{"ok": true}` (ping),
//! 202 `{"ignored": "<reason>"}` (also when the repository or sender is over
//! its quota), 200 `{"duplicate": true, "run_id"}` (seen before, under this
//! delivery id or, for the same signed event, another; nothing created). GitHub shows these in the hook's delivery log.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kiln_protocol::CreateRun;
use kiln_protocol::rules::{PRINTABLE_ASCII, Text};
use kiln_store::{Delivery, GithubSelection, NewGithubRun, PastDelivery, Recorded};
use serde_json::json;

use crate::github::events::{self, Decision, Payload, RunRequest, SelectRequest};
use crate::github::{GithubWebhookConfig, prompt};
use crate::{ApiError, AppState};

/// Largest delivery accepted. GitHub's payloads are far smaller in practice
/// (it caps them at 25 MB, but issue bodies and comments at 64 K characters).
pub const MAX_WEBHOOK_BODY_BYTES: usize = 1024 * 1024;

const SIGNATURE_HEADER: &str = "x-hub-signature-256";
const DELIVERY_HEADER: &str = "x-github-delivery";
const EVENT_HEADER: &str = "x-github-event";
/// `X-GitHub-Delivery`: a GUID in practice; kept as sent.
pub(crate) static DELIVERY_ID: Text = Text::new(1, 128, PRINTABLE_ASCII);
/// `X-GitHub-Event`: an event name such as `issue_comment`.
pub(crate) static EVENT_NAME: Text = Text::new(1, 64, "^[a-z_]*$");

/// Receive a GitHub webhook delivery
///
/// Authenticated by `X-Hub-Signature-256` (HMAC-SHA256 of the body with the
/// hook's secret), not by a bearer token. A mention of the bot in an issue
/// or comment, or the trigger label, queues a run (`/kiln --attempts N`: a
/// group of N attempts; `/kiln select K`: chooses attempt K of the issue's
/// latest group); other deliveries are recorded and ignored; a redelivery
/// answers what the first one did.
#[utoipa::path(
    post,
    path = "/v1/webhooks/github",
    operation_id = "github_webhook",
    tag = "github",
    security(()),
    params(
        ("X-Hub-Signature-256" = String, Header, description = "`sha256=` and the hex HMAC-SHA256 of the body."),
        ("X-GitHub-Delivery" = String, Header, description = "The delivery's GUID; the same on redelivery."),
        ("X-GitHub-Event" = String, Header, description = "The event's name, e.g. `issue_comment`."),
    ),
    request_body(content = Object, content_type = "application/json",
        description = "GitHub's event payload, at most 1 MiB."),
    responses(
        (status = 201, description = "A run was queued.", body = crate::openapi::bodies::WebhookRun),
        (status = 200, description = "A ping, a delivery seen before (nothing was created), or a `/kiln select K` comment that chose attempt K of the issue's latest group of attempts.",
            body = crate::openapi::bodies::WebhookAnswered),
        (status = 202, description = "Recorded and ignored, with the reason.", body = crate::openapi::bodies::WebhookIgnored),
        (status = 400, response = crate::openapi::errors::BadRequest),
        (status = 401, response = crate::openapi::errors::Unauthorized),
        (status = 404, description = "GitHub webhooks are not enabled on this server.", body = crate::openapi::errors::ErrorBody),
        (status = 413, response = crate::openapi::errors::PayloadTooLarge),
        (status = 415, response = crate::openapi::errors::UnsupportedMediaType),
        (status = 500, response = crate::openapi::errors::Internal),
        (status = 503, response = crate::openapi::errors::Unavailable),
    )
)]
pub async fn github(State(state): State<AppState>, request: Request) -> Result<Response, ApiError> {
    let Some(config) = state.github.clone() else {
        return Err(ApiError::NotFound(
            "GitHub webhooks are disabled on this server: set KILN_GITHUB_WEBHOOK_SECRET to enable them".into(),
        ));
    };
    let headers = request.headers().clone();
    let body = read_body(request).await?;
    let signature = headers.get(SIGNATURE_HEADER).map(|v| v.as_bytes());
    config.secret.verify(signature, &body).map_err(|e| ApiError::Unauthorized(e.to_string()))?;

    let delivery_id = delivery_id(&headers)?;
    let event = event_name(&headers)?;
    if let Some(past) = state.store.past_delivery(&delivery_id).await? {
        return Ok(duplicate(past));
    }
    refuse_form_encoding(&headers)?;
    let payload = Payload::parse(&body).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let delivery = Delivery { id: delivery_id, event, action: payload.action(), repo: payload.repo() };
    let decision =
        events::decide(&delivery.event, &payload, &config.rules).map_err(|e| ApiError::BadRequest(e.to_string()))?;

    let response = match decision {
        // `record_delivery` applies no quota: never `Refused`.
        Decision::Ping => match state.store.record_delivery(&delivery, "ping").await? {
            Recorded::New { .. } | Recorded::Refused { .. } => {
                (StatusCode::OK, Json(json!({ "ok": true }))).into_response()
            }
            Recorded::Duplicate(past) => duplicate(past),
        },
        Decision::Ignore(reason) => {
            match state.store.record_delivery(&delivery, &format!("ignored: {reason}")).await? {
                Recorded::New { .. } | Recorded::Refused { .. } => {
                    (StatusCode::ACCEPTED, Json(json!({ "ignored": reason }))).into_response()
                }
                Recorded::Duplicate(past) => duplicate(past),
            }
        }
        Decision::Select(request) => select(&state, &config, &delivery, &request).await?,
        Decision::Run(request) => {
            let new = new_run(*request, &config, state.settings.max_attempts)?;
            // Every webhook run belongs to one subject, so the per-subject
            // quota applies per repository and per sender instead.
            match state.store.create_github_run(&delivery, &new, Some(&state.settings.quota)).await? {
                Recorded::New { run_id } => (StatusCode::CREATED, Json(json!({ "run_id": run_id }))).into_response(),
                Recorded::Duplicate(past) => duplicate(past),
                Recorded::Refused { reason } => {
                    (StatusCode::ACCEPTED, Json(json!({ "ignored": reason }))).into_response()
                }
            }
        }
    };
    tracing::info!(delivery = %delivery.id, event = %delivery.event, status = %response.status(), "GitHub delivery");
    Ok(response)
}

/// The raw body, under the route's body limit.
async fn read_body(request: Request) -> Result<Bytes, ApiError> {
    Bytes::from_request(request, &()).await.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge(format!("webhook body is larger than {MAX_WEBHOOK_BODY_BYTES} bytes"))
        } else {
            ApiError::BadRequest(format!("could not read the request body: {}", e.body_text()))
        }
    })
}

/// `X-GitHub-Delivery`: a GUID per delivery, the same on redelivery.
fn delivery_id(headers: &HeaderMap) -> Result<String, ApiError> {
    let value =
        headers.get(DELIVERY_HEADER).ok_or_else(|| ApiError::BadRequest("missing X-GitHub-Delivery header".into()))?;
    value.to_str().ok().filter(|id| DELIVERY_ID.accepts(id)).map(str::to_owned).ok_or_else(|| {
        ApiError::BadRequest(format!(
            "X-GitHub-Delivery must be {} to {} printable ASCII characters",
            DELIVERY_ID.min_chars, DELIVERY_ID.max_chars
        ))
    })
}

/// `X-GitHub-Event`, e.g. `issue_comment`.
fn event_name(headers: &HeaderMap) -> Result<String, ApiError> {
    let value =
        headers.get(EVENT_HEADER).ok_or_else(|| ApiError::BadRequest("missing X-GitHub-Event header".into()))?;
    value
        .to_str()
        .ok()
        .filter(|e| EVENT_NAME.accepts(e))
        .map(str::to_owned)
        .ok_or_else(|| ApiError::BadRequest("X-GitHub-Event must be an event name like issue_comment".into()))
}

/// A hook set to GitHub's other content type sends `payload=<urlencoded
/// JSON>`; say how to fix the hook rather than "malformed JSON".
fn refuse_form_encoding(headers: &HeaderMap) -> Result<(), ApiError> {
    let form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with("application/x-www-form-urlencoded"));
    if form {
        return Err(ApiError::UnsupportedMediaType(
            "set the webhook's content type to application/json in GitHub's hook settings".into(),
        ));
    }
    Ok(())
}

/// The run for a request, checked like an API-submitted run. Attempts
/// out of range (or not a number) make a run that fails at once with the
/// reason, which its report on GitHub gives the person who asked.
fn new_run(request: RunRequest, config: &GithubWebhookConfig, max_attempts: u32) -> Result<NewGithubRun, ApiError> {
    let spec =
        CreateRun { prompt: prompt::build(&request.task), repo: Some(request.repo.clone()), ..Default::default() };
    spec.validate().map_err(|e| ApiError::BadRequest(format!("cannot make a run from this delivery: {e}")))?;
    let environment = config.environments.of(&request.origin.repo_full_name).map(str::to_owned);
    let (attempts, refusal) = match request.attempts {
        None | Some(Ok(1)) => (None, None),
        Some(Ok(n)) if (2..=max_attempts).contains(&n) => (Some(n), None),
        Some(Ok(n)) => (
            None,
            Some(format!(
                "`--attempts {n}` is out of range: this deployment runs 1 to {max_attempts} attempts of a task                  (KILN_MAX_ATTEMPTS)"
            )),
        ),
        Some(Err(reason)) => (None, Some(reason)),
    };
    Ok(NewGithubRun {
        owner: config.owner.clone(),
        environment,
        prompt: spec.prompt,
        repo: request.repo,
        origin: request.origin,
        trigger_key: request.trigger_key,
        attempts,
        take_first_success: config.take_first_success,
        refusal,
    })
}

/// `/kiln select K`: attempt K of the latest group becomes its
/// choice (200 `{"selected", "run_id"}`: its pull request is owed), or 202
/// with the reason it could not.
async fn select(
    state: &AppState,
    config: &GithubWebhookConfig,
    delivery: &Delivery,
    request: &SelectRequest,
) -> Result<Response, ApiError> {
    let selection = state.store.select_from_github(delivery, &config.owner, &request.origin, request.attempt).await?;
    Ok(match selection {
        GithubSelection::Selected { group, attempt } => {
            (StatusCode::OK, Json(json!({ "selected": attempt, "run_id": group }))).into_response()
        }
        GithubSelection::Refused(reason) => (StatusCode::ACCEPTED, Json(json!({ "ignored": reason }))).into_response(),
        GithubSelection::Duplicate(past) => duplicate(past),
    })
}

fn duplicate(past: PastDelivery) -> Response {
    (StatusCode::OK, Json(json!({ "duplicate": true, "run_id": past.run_id }))).into_response()
}
