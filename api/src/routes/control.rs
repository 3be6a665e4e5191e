//! Talking to a run: `POST /v1/runs/{id}/messages` (steering and follow-ups)
//! and `POST /v1/runs/{id}/approvals/{call_id}`.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use kiln_protocol::Run;
use kiln_store::{DecideOutcome, Decision, MessageOutcome};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::auth::Subject;
use crate::extract::{ApiJson, RunIdPath};
use crate::{ApiError, AppState};

/// Longest steering message, in bytes (the prompt's limit).
const MAX_MESSAGE_BYTES: usize = kiln_protocol::run::MAX_PROMPT_BYTES;
const MAX_REASON_BYTES: usize = 4096;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendMessage {
    text: String,
}

#[derive(Debug, Serialize)]
pub struct MessageAccepted {
    /// `queued` (joins the active run) or `follow_up` (a new run in the session).
    disposition: &'static str,
    run: Run,
}

pub async fn send_message(
    State(state): State<AppState>,
    Subject(owner): Subject,
    RunIdPath(id): RunIdPath,
    ApiJson(body): ApiJson<SendMessage>,
) -> Result<(StatusCode, Json<MessageAccepted>), ApiError> {
    let text = body.text;
    if text.trim().is_empty() {
        return Err(ApiError::Validation("text must not be empty".into()));
    }
    if text.len() > MAX_MESSAGE_BYTES || text.contains('\0') {
        return Err(ApiError::Validation(format!("text must be at most {MAX_MESSAGE_BYTES} bytes without NUL")));
    }
    match state.store.send_message(&owner, id, &text).await? {
        MessageOutcome::Queued(run) => Ok((StatusCode::ACCEPTED, Json(MessageAccepted { disposition: "queued", run }))),
        MessageOutcome::FollowUp(run) => {
            Ok((StatusCode::CREATED, Json(MessageAccepted { disposition: "follow_up", run })))
        }
        MessageOutcome::SessionBusy { active_run } => Err(ApiError::Conflict(format!(
            "this run has finished and its session is busy with run {active_run}; send the message to that run"
        ))),
        MessageOutcome::NotFound => Err(ApiError::run_not_found()),
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum DecisionKind {
    Approve,
    Deny,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decide {
    decision: DecisionKind,
    #[serde(default)]
    reason: Option<String>,
}

pub async fn decide(
    State(state): State<AppState>,
    Subject(owner): Subject,
    Path((run, call_id)): Path<(String, String)>,
    ApiJson(body): ApiJson<Decide>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let id = Uuid::parse_str(&run).map_err(|_| ApiError::BadRequest("run id must be a UUID".into()))?;
    if call_id.is_empty() || call_id.len() > 256 {
        return Err(ApiError::BadRequest("call id must be 1 to 256 bytes".into()));
    }
    if body.reason.as_ref().is_some_and(|r| r.len() > MAX_REASON_BYTES || r.contains('\0')) {
        return Err(ApiError::Validation(format!("reason must be at most {MAX_REASON_BYTES} bytes without NUL")));
    }
    let decision = Decision { approved: matches!(body.decision, DecisionKind::Approve), reason: body.reason };
    match state.store.decide_approval(&owner, id, &call_id, &decision).await? {
        DecideOutcome::Decided => Ok(Json(serde_json::json!({ "call_id": call_id, "approved": decision.approved }))),
        DecideOutcome::AlreadyDecided => Err(ApiError::Conflict("this call was already decided".into())),
        DecideOutcome::NotFound => Err(ApiError::NotFound("no approval request for this run and call".into())),
    }
}
