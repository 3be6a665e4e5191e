pub mod attempts;
pub mod callback_key;
pub mod changes;
pub mod control;
pub mod deliver;
pub mod environments;
pub mod events;
pub mod health;
pub mod runs;
pub mod stream_token;
pub mod webhooks;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use crate::{ApiError, AppState};

pub fn v1() -> Router<AppState> {
    Router::new()
        .route("/runs", post(runs::create).get(runs::list))
        .route("/runs/{id}", get(runs::get))
        .route("/runs/{id}/cancel", post(runs::cancel))
        .route("/runs/{id}/deliver", post(deliver::deliver))
        .route("/runs/{id}/select", post(attempts::select))
        .route("/runs/{id}/patch", get(changes::patch))
        .route("/runs/{id}/changes", get(changes::changes))
        .route("/runs/{id}/events", get(events::events))
        .route("/runs/{id}/stream-token", post(stream_token::mint))
        .route("/environments", post(environments::create).get(environments::list))
        .route("/environments/{name}", get(environments::get).put(environments::update).delete(environments::delete))
        .route("/environments/{name}/reset-cache", post(environments::reset_cache))
        .route("/callback-key", get(callback_key::callback_key))
        .route("/runs/{id}/messages", post(control::send_message))
        .route("/runs/{id}/approvals/{call_id}", post(control::decide))
        .route(
            "/webhooks/github",
            post(webhooks::github).layer(DefaultBodyLimit::max(webhooks::MAX_WEBHOOK_BODY_BYTES)),
        )
}

pub async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".into())
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed("this route does not accept that method".into())
}
