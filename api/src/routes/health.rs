use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::get;
use serde_json::json;

use crate::{ApiError, AppState};

pub fn routes() -> Router<AppState> {
    Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz))
}

/// The process is up.
async fn healthz() -> impl IntoResponse {
    Json(json!({ "status": "ok" }))
}

/// The process can serve: the database answers.
async fn readyz(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    match tokio::time::timeout(std::time::Duration::from_secs(3), state.store.ping()).await {
        Ok(Ok(())) => Ok(Json(json!({ "status": "ready" }))),
        _ => Err(ApiError::Unavailable),
    }
}
