//! `POST /v1/runs`, `GET /v1/runs`, `GET /v1/runs/{id}`, `POST /v1/runs/{id}/cancel`.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use kiln_protocol::{CreateRun, Run, RunStatus, Trigger};
use kiln_store::{CancelOutcome, Cursor, NewRun};
use serde::{Deserialize, Serialize};

use crate::auth::Subject;
use crate::extract::{ApiJson, ApiQuery, RunIdPath};
use crate::{ApiError, AppState};

const IDEMPOTENCY_HEADER: &str = "idempotency-key";
const MAX_PAGE: u32 = 200;
const DEFAULT_PAGE: u32 = 50;

/// Create a run
///
/// Queues a run of `prompt` against `repo`. With an `Idempotency-Key`, a
/// retry of the same request answers the run it created (200) instead of
/// creating another.
#[utoipa::path(
    post,
    path = "/v1/runs",
    operation_id = "create_run",
    tag = "runs",
    request_body = CreateRun,
    params(
        ("Idempotency-Key" = Option<String>, Header,
            description = "1 to 255 printable ASCII characters; the same key answers the same run."),
    ),
    responses(
        (status = 201, description = "The run was queued.", body = Run),
        (status = 200, description = "A run with this `Idempotency-Key` already exists; this is it.", body = Run),
        (status = 400, response = crate::openapi::errors::BadRequest),
        (status = 413, response = crate::openapi::errors::PayloadTooLarge),
        (status = 415, response = crate::openapi::errors::UnsupportedMediaType),
        (status = 422, response = crate::openapi::errors::Unprocessable),
        (status = 429, response = crate::openapi::errors::TooManyRequests),
        (status = 401, response = crate::openapi::errors::Unauthorized),
        (status = 500, response = crate::openapi::errors::Internal),
        (status = 503, response = crate::openapi::errors::Unavailable),
    )
)]
pub async fn create(
    State(state): State<AppState>,
    Subject(owner): Subject,
    headers: HeaderMap,
    ApiJson(spec): ApiJson<CreateRun>,
) -> Result<(StatusCode, Json<Run>), ApiError> {
    spec.validate().map_err(|e| ApiError::Validation(e.to_string()))?;
    // Refused here rather than accepted and never sent: an unsigned callback
    // could not be told from a forged one.
    if spec.callback_url.is_some() && !state.settings.callbacks_enabled {
        return Err(ApiError::Validation(
            "callback_url cannot be used here: this deployment has no KILN_CALLBACK_SECRET to sign callbacks with"
                .into(),
        ));
    }
    let idempotency_key = idempotency_key(&headers)?;
    let new = NewRun { owner, spec, trigger: Trigger::Api, idempotency_key };
    let (run, created) = match state.store.create_run_within(new, Some(&state.settings.quota)).await? {
        Ok(created) => created,
        Err(refusal) => return Err(refusal.into()),
    };
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(run)))
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(IDEMPOTENCY_HEADER) else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= 255 && k.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| ApiError::BadRequest("Idempotency-Key must be 1 to 255 printable ASCII characters".into()))?;
    Ok(Some(key.to_owned()))
}

/// Get a run
#[utoipa::path(
    get,
    path = "/v1/runs/{id}",
    operation_id = "get_run",
    tag = "runs",
    params(("id" = uuid::Uuid, Path, description = "The run's id.")),
    responses(
        (status = 200, description = "The run.", body = Run),
        (status = 400, response = crate::openapi::errors::BadRequest),
        (status = 404, response = crate::openapi::errors::NotFound),
        (status = 401, response = crate::openapi::errors::Unauthorized),
        (status = 500, response = crate::openapi::errors::Internal),
        (status = 503, response = crate::openapi::errors::Unavailable),
    )
)]
pub async fn get(
    State(state): State<AppState>,
    Subject(owner): Subject,
    RunIdPath(id): RunIdPath,
) -> Result<Json<Run>, ApiError> {
    let run = state.store.get_run(&owner, id).await?.ok_or_else(ApiError::run_not_found)?;
    Ok(Json(run))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only runs with this status.
    #[param(value_type = Option<RunStatus>)]
    status: Option<String>,
    /// Runs per page, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<u32>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// A page of runs, newest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RunList {
    runs: Vec<Run>,
    /// Pass as `cursor` for the next page; absent (null) on the last page.
    next_cursor: Option<String>,
}

/// List runs
///
/// The caller's runs, newest first, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/runs",
    operation_id = "list_runs",
    tag = "runs",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of runs.", body = RunList),
        (status = 400, response = crate::openapi::errors::BadRequest),
        (status = 401, response = crate::openapi::errors::Unauthorized),
        (status = 500, response = crate::openapi::errors::Internal),
        (status = 503, response = crate::openapi::errors::Unavailable),
    )
)]
pub async fn list(
    State(state): State<AppState>,
    Subject(owner): Subject,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<RunList>, ApiError> {
    let status = q
        .status
        .as_deref()
        .map(str::parse::<RunStatus>)
        .transpose()
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::BadRequest(format!("limit must be between 1 and {MAX_PAGE}")));
    }
    let cursor = q
        .cursor
        .as_deref()
        .map(|c| Cursor::decode(c).ok_or_else(|| ApiError::BadRequest("cursor is not one this API issued".into())))
        .transpose()?;
    let page = state.store.list_runs(&owner, status, limit, cursor.as_ref()).await?;
    Ok(Json(RunList { runs: page.runs, next_cursor: page.next_cursor }))
}

/// Cancel a run
///
/// A queued run is cancelled at once (200); an active one is asked to stop
/// (202), and its worker ends it with `run.cancelled` within seconds.
#[utoipa::path(
    post,
    path = "/v1/runs/{id}/cancel",
    operation_id = "cancel_run",
    tag = "runs",
    params(("id" = uuid::Uuid, Path, description = "The run's id.")),
    responses(
        (status = 200, description = "The run was cancelled.", body = Run),
        (status = 202, description = "The run's worker was asked to stop it; follow its events.", body = Run),
        (status = 400, response = crate::openapi::errors::BadRequest),
        (status = 404, response = crate::openapi::errors::NotFound),
        (status = 409, response = crate::openapi::errors::Conflict),
        (status = 401, response = crate::openapi::errors::Unauthorized),
        (status = 500, response = crate::openapi::errors::Internal),
        (status = 503, response = crate::openapi::errors::Unavailable),
    )
)]
pub async fn cancel(
    State(state): State<AppState>,
    Subject(owner): Subject,
    RunIdPath(id): RunIdPath,
) -> Result<(StatusCode, Json<Run>), ApiError> {
    match state.store.cancel_run(&owner, id).await? {
        CancelOutcome::Cancelled(run) => Ok((StatusCode::OK, Json(run))),
        // The worker stops the run and writes `run.cancelled`; follow the events.
        CancelOutcome::Requested(run) => Ok((StatusCode::ACCEPTED, Json(run))),
        CancelOutcome::AlreadyFinished(run) => {
            Err(ApiError::Conflict(format!("run already finished with status {}", run.status)))
        }
        CancelOutcome::NotFound => Err(ApiError::run_not_found()),
    }
}
