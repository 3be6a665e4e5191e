//! `POST /v1/runs`, `GET /v1/runs`, `GET /v1/runs/{id}`, `POST /v1/runs/{id}/cancel`.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use kiln_protocol::rules::{PRINTABLE_ASCII, Range, Text};
use kiln_protocol::{CreateRun, Run, RunStatus, Trigger};
use kiln_store::{CancelOutcome, Cursor, NewRun};
use serde::{Deserialize, Serialize};

use crate::auth::Subject;
use crate::extract::{ApiJson, ApiQuery, RunIdPath};
use crate::{ApiError, AppState};

const IDEMPOTENCY_HEADER: &str = "idempotency-key";
/// `Idempotency-Key`: a header value as it is, without space.
pub(crate) static IDEMPOTENCY_KEY: Text = Text::new(1, 255, PRINTABLE_ASCII);
/// `limit` of a page of runs.
pub(crate) static PAGE: Range<u32> = Range::new(1, 200);
const DEFAULT_PAGE: u32 = 50;
/// `cursor`: a `next_cursor` ([`Cursor::encode`]: microseconds since 1970,
/// `_`, the run's id). The digits are bounded so that every cursor of this
/// shape is a time Postgres can hold (years 1653 to 5138); an empty one is
/// refused, not read as "no cursor".
pub(crate) static CURSOR: Text = Text::new(1, 64, r"^(?:[0-9]{1,17}|-[0-9]{1,16})_[0-9a-f]{32}$");

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
            description = "Printable ASCII; the same key answers the same run."),
    ),
    responses(
        (status = 201, description = "The run was queued.", body = Run),
        (status = 200, description = "A run with this `Idempotency-Key` already exists; this is it.", body = Run),
        (status = 400, response = crate::openapi::errors::BadRequest),
        (status = 413, response = crate::openapi::errors::PayloadTooLarge),
        (status = 415, response = crate::openapi::errors::UnsupportedMediaType),
        (status = 404, response = crate::openapi::errors::NotFound),
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
    if spec.callback_url.is_some() && state.settings.callback_secret.is_none() {
        return Err(ApiError::Validation(
            "callback_url cannot be used here: this deployment has no KILN_CALLBACK_SECRET to sign callbacks with"
                .into(),
        ));
    }
    // The kinds are the deployment's: a name it does not know would leave
    // the run's `task` tool offering less than was asked for.
    if let Some(agents) = &spec.agents {
        state.settings.agent_kinds.check_run(agents).map_err(ApiError::Validation)?;
    }
    // What can be told without DNS (the protocol, a literal address); the
    // worker checks the resolved addresses again before it connects.
    if let Some(repo) = &spec.repo {
        kiln_protocol::repo_url::parse_repo_url(&repo.url)
            .and_then(|url| state.settings.repo_rules.check(&url))
            .map_err(|e| ApiError::Validation(e.to_string()))?;
    }
    // The same for the remote a `deliver.git` pushes to (the worker checks
    // its credentials file and the resolved addresses before it connects).
    if let Some(git) = spec.deliver.as_ref().and_then(|d| d.git.as_ref()) {
        check_git_remote(&state, &git.url)?;
    }
    check_attempts(&state, &spec)?;
    // Named environments are the caller's own: another subject's is as
    // unknown as one that does not exist.
    if let Some(name) = &spec.environment
        && state.store.environment(&owner, name).await?.is_none()
    {
        // 404, as for a run id: an answer about what exists, not about the
        // request's shape.
        return Err(ApiError::NotFound(format!("environment: you have no environment named {name:?}")));
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

/// What can be told of a `deliver.git` remote before any DNS: its URL, the
/// address rules, and, when this API was given the credentials file
/// (`KILN_GIT_CREDENTIALS`), whether its host is listed there.
fn check_git_remote(state: &AppState, remote: &str) -> Result<(), ApiError> {
    let url = kiln_protocol::deliver::remote_url(remote).map_err(|e| ApiError::Validation(e.to_string()))?;
    state.settings.repo_rules.check(&url).map_err(|e| ApiError::Validation(format!("deliver.git.url: {e}")))?;
    let key = kiln_protocol::deliver::credentials_key(&url).to_ascii_lowercase();
    match &state.settings.git_hosts {
        Some(hosts) if !hosts.contains(&key) => Err(ApiError::Validation(format!(
            "deliver.git.url: this deployment has no credentials for {key} (KILN_GIT_CREDENTIALS)"
        ))),
        _ => Ok(()),
    }
}

/// What the deployment allows of a group of attempts.
fn check_attempts(state: &AppState, spec: &CreateRun) -> Result<(), ApiError> {
    let Some(n) = spec.attempts else { return Ok(()) };
    let max = state.settings.max_attempts;
    if n > max {
        return Err(ApiError::Validation(format!(
            "attempts must be at most {max} on this deployment (KILN_MAX_ATTEMPTS)"
        )));
    }
    Ok(())
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(IDEMPOTENCY_HEADER) else {
        return Ok(None);
    };
    let key = value.to_str().ok().filter(|k| IDEMPOTENCY_KEY.accepts(k)).ok_or_else(|| {
        ApiError::BadRequest(format!(
            "Idempotency-Key must be {} to {} printable ASCII characters",
            IDEMPOTENCY_KEY.min_chars, IDEMPOTENCY_KEY.max_chars
        ))
    })?;
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
    let mut run = state.store.get_run(&owner, id).await?.ok_or_else(ApiError::run_not_found)?;
    with_change_totals(&state, std::slice::from_mut(&mut run)).await?;
    Ok(Json(run))
}

/// Adds each ended run's change totals (files, lines) to its object.
async fn with_change_totals(state: &AppState, runs: &mut [Run]) -> Result<(), ApiError> {
    let ended: Vec<uuid::Uuid> = runs.iter().filter(|r| r.status.is_terminal()).map(|r| r.id).collect();
    if ended.is_empty() {
        return Ok(());
    }
    let totals = state.store.change_totals(&ended).await?;
    for run in runs {
        run.changes = totals.get(&run.id).copied();
    }
    Ok(())
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only runs with this status.
    #[param(value_type = Option<RunStatus>)]
    status: Option<String>,
    /// Runs per page (default 50).
    limit: Option<u32>,
    /// `next_cursor` of the previous page (never empty: leave it out for
    /// the first page).
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
    if !PAGE.contains(limit) {
        return Err(ApiError::BadRequest(format!("limit must be between {} and {}", PAGE.min, PAGE.max)));
    }
    let cursor = q
        .cursor
        .as_deref()
        .map(|c| {
            Some(c)
                .filter(|c| CURSOR.accepts(c))
                .and_then(Cursor::decode)
                .ok_or_else(|| ApiError::BadRequest("cursor is not one this API issued".into()))
        })
        .transpose()?;
    let mut page = state.store.list_runs(&owner, status, limit, cursor.as_ref()).await?;
    with_change_totals(&state, &mut page.runs).await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cursors_the_store_issues_are_cursors_the_rule_accepts() {
        let now = Cursor { created_at: chrono::Utc::now(), id: uuid::Uuid::now_v7() };
        assert!(CURSOR.accepts(&now.encode()), "{}", now.encode());
        // Every cursor of the rule's shape decodes (the bounds of its digits).
        let id = "0".repeat(32);
        for micros in ["99999999999999999", "-9999999999999999", "0"] {
            let cursor = format!("{micros}_{id}");
            assert!(CURSOR.accepts(&cursor) && Cursor::decode(&cursor).is_some(), "{cursor}");
        }
        for bad in ["", "_", "1_", "123_notauuid", &format!("999999999999999999_{id}")] {
            assert!(!CURSOR.accepts(bad), "{bad}");
        }
    }
}
