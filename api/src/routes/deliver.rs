//! `POST /v1/runs/{id}/deliver`: report a GitHub-triggered run on GitHub
//! again, after an earlier delivery failed.
//!
//! The API cannot push (it has no git and no GitHub credentials), so this
//! records a request in `github_runs.delivery_requested_at` and answers 202;
//! a worker with GitHub configured picks it up within seconds and appends a
//! `delivery.succeeded` or `delivery.failed` event to the run.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use kiln_store::DeliveryRequest;
use serde_json::{Value, json};

use crate::auth::Subject;
use crate::extract::RunIdPath;
use crate::{ApiError, AppState};

/// Deliver a run's result on GitHub again
///
/// For a finished, GitHub-triggered run whose delivery failed: a worker
/// with GitHub configured retries it and appends `delivery.succeeded` or
/// `delivery.failed` to the run's events.
#[utoipa::path(
    post,
    path = "/v1/runs/{id}/deliver",
    operation_id = "deliver_run",
    tag = "github",
    params(("id" = uuid::Uuid, Path, description = "The run's id.")),
    responses(
        (status = 202, description = "Delivery was requested.", body = crate::openapi::bodies::DeliveryRequested),
        (status = 400, response = crate::openapi::errors::BadRequest),
        (status = 404, response = crate::openapi::errors::NotFound),
        (status = 409, response = crate::openapi::errors::Conflict),
        (status = 401, response = crate::openapi::errors::Unauthorized),
        (status = 500, response = crate::openapi::errors::Internal),
        (status = 503, response = crate::openapi::errors::Unavailable),
    )
)]
pub async fn deliver(
    State(state): State<AppState>,
    Subject(owner): Subject,
    RunIdPath(id): RunIdPath,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    match state.store.request_github_delivery(&owner, id).await? {
        DeliveryRequest::Requested => Ok((StatusCode::ACCEPTED, Json(json!({ "delivery": "requested" })))),
        DeliveryRequest::NotFound => Err(ApiError::run_not_found()),
        DeliveryRequest::NotGithub => Err(ApiError::Conflict("the run was not triggered from GitHub".into())),
        DeliveryRequest::NotFinished => {
            Err(ApiError::Conflict("the run has not finished; it is delivered when it does".into()))
        }
        DeliveryRequest::AlreadyDelivered => Err(ApiError::Conflict("the run's result is already on GitHub".into())),
    }
}
