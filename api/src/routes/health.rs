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
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "meta",
    security(()),
    responses((status = 200, description = "Always, while the process serves.", body = crate::openapi::bodies::Health,
        example = json!({"status": "ok"})))
)]
pub(crate) async fn healthz() -> impl IntoResponse {
    Json(json!({ "status": "ok" }))
}

/// The process can serve: the database answers.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "meta",
    security(()),
    responses(
        (status = 200, description = "The database answered.", body = crate::openapi::bodies::Health,
            example = json!({"status": "ready"})),
        (status = 503, response = crate::openapi::errors::Unavailable),
    )
)]
pub(crate) async fn readyz(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    match tokio::time::timeout(std::time::Duration::from_secs(3), state.store.ping()).await {
        Ok(Ok(())) => Ok(Json(json!({ "status": "ready" }))),
        _ => Err(ApiError::Unavailable),
    }
}
