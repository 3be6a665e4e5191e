//! `GET /v1/runs/{id}/patch` and `GET /v1/runs/{id}/changes`: what a run
//! did to its workspace, as the worker captured it when the run ended.
//!
//! Both answer 404 until the run has ended (the change is captured right
//! before its terminal event) and for a run that is not the caller's. The
//! patch is served as the exact bytes kept, so `git apply` takes it as
//! the worker produced it; a change over `KILN_MAX_PATCH_MB` has only its
//! summary (`/changes`), and `/patch` answers 409.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use kiln_protocol::changes::{ChangeScope, RunChanges};
use serde::Deserialize;
use uuid::Uuid;

use crate::auth::Subject;
use crate::extract::{ApiQuery, RunIdPath};
use crate::{ApiError, AppState};

/// The media type of a patch (what `git diff` writes).
pub const PATCH_CONTENT_TYPE: &str = "text/x-diff";

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ScopeQuery {
    /// `run` (default): the run's own change, from where it started;
    /// `session`: its session's change so far, from the first run's base.
    #[param(value_type = Option<ChangeScope>)]
    scope: Option<ChangeScope>,
}

/// Get a run's patch
///
/// The run's change as a patch (`git diff --binary --full-index` against
/// its base): exactly what `git apply` takes. Empty when the run changed
/// nothing.
#[utoipa::path(
    get,
    path = "/v1/runs/{id}/patch",
    operation_id = "get_run_patch",
    tag = "runs",
    params(("id" = uuid::Uuid, Path, description = "The run's id."), ScopeQuery),
    responses(
        (status = 200, description = "The patch.", content_type = "text/x-diff", body = String),
        (status = 400, response = crate::openapi::errors::BadRequest),
        (status = 404, response = crate::openapi::errors::NotFound),
        (status = 409, response = crate::openapi::errors::Conflict),
        (status = 401, response = crate::openapi::errors::Unauthorized),
        (status = 500, response = crate::openapi::errors::Internal),
        (status = 503, response = crate::openapi::errors::Unavailable),
    )
)]
pub async fn patch(
    State(state): State<AppState>,
    Subject(owner): Subject,
    RunIdPath(id): RunIdPath,
    ApiQuery(q): ApiQuery<ScopeQuery>,
) -> Result<Response, ApiError> {
    ended_run(&state, &owner, id).await?;
    let scope = q.scope.unwrap_or_default();
    let row = state.store.run_patch(id, scope).await?.ok_or_else(|| no_change(scope))?;
    let Some(patch) = row.patch else {
        return Err(ApiError::Conflict(format!(
            "the run's change ({} bytes) was larger than this deployment keeps as a patch (KILN_MAX_PATCH_MB); \
             GET /v1/runs/{id}/changes has its files",
            row.patch_bytes
        )));
    };
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static(PATCH_CONTENT_TYPE)),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
    ];
    Ok((headers, patch).into_response())
}

/// Get a run's change
///
/// The run's change, file by file: each file's path (and old path for a
/// rename), status, lines added and removed, whether it is binary; the
/// totals; the base commit the patch applies to.
#[utoipa::path(
    get,
    path = "/v1/runs/{id}/changes",
    operation_id = "get_run_changes",
    tag = "runs",
    params(("id" = uuid::Uuid, Path, description = "The run's id."), ScopeQuery),
    responses(
        (status = 200, description = "The change.", body = RunChanges),
        (status = 400, response = crate::openapi::errors::BadRequest),
        (status = 404, response = crate::openapi::errors::NotFound),
        (status = 401, response = crate::openapi::errors::Unauthorized),
        (status = 500, response = crate::openapi::errors::Internal),
        (status = 503, response = crate::openapi::errors::Unavailable),
    )
)]
pub async fn changes(
    State(state): State<AppState>,
    Subject(owner): Subject,
    RunIdPath(id): RunIdPath,
    ApiQuery(q): ApiQuery<ScopeQuery>,
) -> Result<Json<RunChanges>, ApiError> {
    ended_run(&state, &owner, id).await?;
    let scope = q.scope.unwrap_or_default();
    let changes = state.store.run_changes(id, scope).await?.ok_or_else(|| no_change(scope))?;
    Ok(Json(changes))
}

/// The caller's run `id`, which must have ended: its change is complete
/// only then.
async fn ended_run(state: &AppState, owner: &str, id: Uuid) -> Result<(), ApiError> {
    let run = state.store.get_run(owner, id).await?.ok_or_else(ApiError::run_not_found)?;
    if !run.status.is_terminal() {
        return Err(ApiError::NotFound(format!("the run is {}: its change is captured when it ends", run.status)));
    }
    Ok(())
}

fn no_change(scope: ChangeScope) -> ApiError {
    let what = match scope {
        ChangeScope::Run => "the run",
        ChangeScope::Session => "the run's session",
    };
    ApiError::NotFound(format!("no change was captured for {what} (it had no workspace, or its capture failed)"))
}
