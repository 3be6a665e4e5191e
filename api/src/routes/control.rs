//! Talking to a run: `POST /v1/runs/{id}/messages` (steering and follow-ups)
//! and `POST /v1/runs/{id}/approvals/{call_id}`.

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use kiln_protocol::Run;
use kiln_protocol::input::{CALL_ID, DECISION_REASON, PROMPT};
use kiln_store::{DecideOutcome, Decision, MessageOutcome};
use serde::{Deserialize, Serialize};

use crate::auth::Subject;
use crate::extract::{ApiJson, RunIdPath};
use crate::{ApiError, AppState};

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SendMessage {
    /// Not blank, without NUL; as long as a prompt may be.
    text: String,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct MessageAccepted {
    /// `queued` (joins the active run) or `follow_up` (a new run in the session).
    #[schema(value_type = String, pattern = "^(queued|follow_up)$")]
    disposition: &'static str,
    run: Run,
}

/// Send a message to a run
///
/// To an active run, the message joins the conversation before the next
/// model call (202, `queued`); to a finished run, it starts a follow-up run
/// in the same session, with its workspace (201, `follow_up`).
#[utoipa::path(
    post,
    path = "/v1/runs/{id}/messages",
    operation_id = "send_message",
    tag = "control",
    params(("id" = uuid::Uuid, Path, description = "The run's id.")),
    request_body = SendMessage,
    responses(
        (status = 202, description = "Queued for the active run.", body = MessageAccepted),
        (status = 201, description = "A follow-up run was created in the session.", body = MessageAccepted),
        (status = 400, response = crate::openapi::errors::BadRequest),
        (status = 404, response = crate::openapi::errors::NotFound),
        (status = 409, response = crate::openapi::errors::Conflict),
        (status = 413, response = crate::openapi::errors::PayloadTooLarge),
        (status = 415, response = crate::openapi::errors::UnsupportedMediaType),
        (status = 422, response = crate::openapi::errors::Unprocessable),
        (status = 429, response = crate::openapi::errors::TooManyRequests),
        (status = 401, response = crate::openapi::errors::Unauthorized),
        (status = 500, response = crate::openapi::errors::Internal),
        (status = 503, response = crate::openapi::errors::Unavailable),
    )
)]
pub async fn send_message(
    State(state): State<AppState>,
    Subject(owner): Subject,
    RunIdPath(id): RunIdPath,
    ApiJson(body): ApiJson<SendMessage>,
) -> Result<(StatusCode, Json<MessageAccepted>), ApiError> {
    // A message is a prompt too: the same rule.
    let text = body.text;
    if !PROMPT.accepts(&text) {
        if text.trim().is_empty() {
            return Err(ApiError::Validation("text must not be empty".into()));
        }
        return Err(ApiError::Validation(format!("text must be at most {} characters without NUL", PROMPT.max_chars)));
    }
    // A group runs no conversation of its own: a message to it would wait
    // for a model call that never comes (or follow up in a session no agent
    // worked in).
    if state.store.get_run(&owner, id).await?.is_some_and(|run| run.attempts.is_some()) {
        return Err(ApiError::Conflict(
            "this run is a group of attempts, which takes no messages; send it to one of its attempts".into(),
        ));
    }
    match state.store.send_message(&owner, id, &text, Some(&state.settings.quota)).await? {
        MessageOutcome::Queued(run) => Ok((StatusCode::ACCEPTED, Json(MessageAccepted { disposition: "queued", run }))),
        MessageOutcome::FollowUp(run) => {
            Ok((StatusCode::CREATED, Json(MessageAccepted { disposition: "follow_up", run })))
        }
        MessageOutcome::SessionBusy { active_run } => Err(ApiError::Conflict(format!(
            "this run has finished and its session is busy with run {active_run}; send the message to that run"
        ))),
        MessageOutcome::OverQuota(refusal) => Err(refusal.into()),
        MessageOutcome::NotFound => Err(ApiError::run_not_found()),
    }
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
enum DecisionKind {
    Approve,
    Deny,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Decide {
    decision: DecisionKind,
    /// Passed to the model with a denial; without NUL.
    #[serde(default)]
    reason: Option<String>,
}

/// Approve or deny a tool call
///
/// Resolves an `approval.requested` event. A denial reaches the model as the
/// tool's result, with `reason`.
#[utoipa::path(
    post,
    path = "/v1/runs/{id}/approvals/{call_id}",
    operation_id = "decide_approval",
    tag = "control",
    params(("id" = uuid::Uuid, Path, description = "The run's id."), ("call_id" = String, Path, description = "The `call_id` of the `approval.requested` event: Kiln's id for the call, unique within the run.")),
    request_body = Decide,
    responses(
        (status = 200, description = "The call was decided.", body = crate::openapi::bodies::Decided),
        (status = 400, response = crate::openapi::errors::BadRequest),
        (status = 404, response = crate::openapi::errors::NotFound),
        (status = 409, response = crate::openapi::errors::Conflict),
        (status = 413, response = crate::openapi::errors::PayloadTooLarge),
        (status = 415, response = crate::openapi::errors::UnsupportedMediaType),
        (status = 422, response = crate::openapi::errors::Unprocessable),
        (status = 401, response = crate::openapi::errors::Unauthorized),
        (status = 500, response = crate::openapi::errors::Internal),
        (status = 503, response = crate::openapi::errors::Unavailable),
    )
)]
pub async fn decide(
    State(state): State<AppState>,
    Subject(owner): Subject,
    path: Result<Path<(String, String)>, PathRejection>,
    ApiJson(body): ApiJson<Decide>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Path((run, call_id)) = path.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let id = crate::extract::run_id(&run).ok_or_else(|| ApiError::BadRequest("run id must be a UUID".into()))?;
    if !CALL_ID.accepts(&call_id) {
        return Err(ApiError::BadRequest(format!(
            "call id must be {} to {} characters without control characters",
            CALL_ID.min_chars, CALL_ID.max_chars
        )));
    }
    if body.reason.as_deref().is_some_and(|r| !DECISION_REASON.accepts(r)) {
        return Err(ApiError::Validation(format!(
            "reason must be at most {} characters without NUL",
            DECISION_REASON.max_chars
        )));
    }
    let decision = Decision { approved: matches!(body.decision, DecisionKind::Approve), reason: body.reason };
    match state.store.decide_approval(&owner, id, &call_id, &decision).await? {
        DecideOutcome::Decided => Ok(Json(serde_json::json!({ "call_id": call_id, "approved": decision.approved }))),
        DecideOutcome::AlreadyDecided => Err(ApiError::Conflict("this call was already decided".into())),
        DecideOutcome::RunEnded => Err(ApiError::Conflict("the run has ended; nothing waits for this decision".into())),
        DecideOutcome::NotFound => Err(ApiError::NotFound("no approval request for this run and call".into())),
    }
}
