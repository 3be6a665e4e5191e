//! `POST /v1/runs/{id}/select`: choose one attempt of a group as its result.

use axum::Json;
use axum::extract::State;
use kiln_protocol::{Run, SelectAttempt};
use kiln_store::SelectOutcome;

use crate::auth::Subject;
use crate::extract::{ApiJson, RunIdPath};
use crate::{ApiError, AppState};

/// Choose an attempt
///
/// For a group of attempts (a run created with `attempts`): makes attempt
/// `attempt` (1 for the first) the group's result, so the group's `patch`
/// and `changes` are that attempt's, and `attempt.selected` joins the
/// group's events. Choosing again replaces the choice, until the group's
/// result has been delivered (409 then). The attempt must have ended. A
/// group with `deliver.git` pushes the chosen attempt's change once the
/// group has ended; from when a worker starts that push, the choice stands.
#[utoipa::path(
    post,
    path = "/v1/runs/{id}/select",
    operation_id = "select_attempt",
    tag = "runs",
    params(("id" = uuid::Uuid, Path, description = "The group's run id.")),
    request_body = SelectAttempt,
    responses(
        (status = 200, description = "The attempt is the group's result; the group as it is now.", body = Run),
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
pub async fn select(
    State(state): State<AppState>,
    Subject(owner): Subject,
    RunIdPath(id): RunIdPath,
    ApiJson(body): ApiJson<SelectAttempt>,
) -> Result<Json<Run>, ApiError> {
    let range = &kiln_protocol::input::ATTEMPTS;
    if !range.contains(body.attempt) {
        return Err(ApiError::Validation(format!("attempt must be between {} and {}", range.min, range.max)));
    }
    match state.store.select_attempt(&owner, id, body.attempt).await? {
        SelectOutcome::Selected(run) => Ok(Json(*run)),
        SelectOutcome::NotFound => Err(ApiError::run_not_found()),
        SelectOutcome::NotAGroup => {
            Err(ApiError::Conflict("this run is not a group of attempts (it was not created with attempts)".into()))
        }
        // The group's size is state, not the request's shape: 409, as for
        // an attempt that has not ended.
        SelectOutcome::NoSuchAttempt(count) => {
            Err(ApiError::Conflict(format!("the group has {count} attempts: attempt must be between 1 and {count}")))
        }
        SelectOutcome::NotEnded => Err(ApiError::Conflict(format!(
            "attempt {} has not ended yet; choose it once it has (its change is captured at its end)",
            body.attempt
        ))),
        SelectOutcome::Delivered => Err(ApiError::Conflict(
            "the group's result was already delivered (or is being pushed); the choice can no longer change".into(),
        )),
    }
}
