//! `POST /v1/runs/{id}/stream-token`: a short-lived token for one run's
//! event stream, for clients that must put a credential in the URL
//! (browsers' EventSource). See `crate::stream_token`.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::auth::Subject;
use crate::extract::RunIdPath;
use crate::{ApiError, AppState};

/// A stream token and when it stops working.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StreamToken {
    /// Pass as `?access_token=` to `GET /v1/runs/{id}/events` of this run;
    /// accepted nowhere else, and not as a bearer token.
    pub token: String,
    /// After this instant the token is refused (401); mint another.
    pub expires_at: DateTime<Utc>,
}

/// Mint a stream token for a run's events
///
/// A short-lived token (minutes) that reads this run's events, passed as
/// `?access_token=` where a client cannot set `Authorization` (browsers'
/// EventSource). It is accepted on this run's events route only; long-lived
/// tokens are not accepted in the query string, where proxies log them.
/// Mint a fresh one to reconnect after it expires.
#[utoipa::path(
    post,
    path = "/v1/runs/{id}/stream-token",
    operation_id = "mint_stream_token",
    tag = "events",
    params(("id" = uuid::Uuid, Path, description = "The run's id.")),
    responses(
        (status = 201, description = "The token.", body = StreamToken),
        (status = 400, response = crate::openapi::errors::BadRequest),
        (status = 404, response = crate::openapi::errors::NotFound),
        (status = 401, response = crate::openapi::errors::Unauthorized),
        (status = 500, response = crate::openapi::errors::Internal),
        (status = 503, response = crate::openapi::errors::Unavailable),
    )
)]
pub async fn mint(
    State(state): State<AppState>,
    Subject(owner): Subject,
    RunIdPath(id): RunIdPath,
) -> Result<(StatusCode, Json<StreamToken>), ApiError> {
    if state.store.get_run(&owner, id).await?.is_none() {
        return Err(ApiError::run_not_found());
    }
    let ttl = chrono::Duration::from_std(state.settings.stream_token_ttl)
        .map_err(|_| ApiError::Internal("stream token lifetime out of range".into()))?;
    let expires_at = Utc::now() + ttl;
    let token = state.auth.stream_tokens().mint(id, &owner, expires_at);
    Ok((StatusCode::CREATED, Json(StreamToken { token, expires_at })))
}
