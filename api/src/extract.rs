//! Extractors whose rejections are [`ApiError`]s, so malformed input gets
//! the same JSON error shape as everything else.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use crate::ApiError;

/// JSON body.
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(ApiJson(v)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

fn json_rejection(rejection: JsonRejection) -> ApiError {
    match rejection {
        JsonRejection::MissingJsonContentType(_) => {
            ApiError::UnsupportedMediaType("expected a request body with Content-Type: application/json".into())
        }
        JsonRejection::JsonSyntaxError(e) => ApiError::BadRequest(format!("malformed JSON: {}", e.body_text())),
        // Wrong types, missing or unknown fields: serde's message names the field.
        JsonRejection::JsonDataError(e) => ApiError::Validation(e.body_text()),
        JsonRejection::BytesRejection(e) => {
            if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge("request body is larger than the limit".into())
            } else {
                ApiError::BadRequest(format!("could not read the request body: {}", e.body_text()))
            }
        }
        other => ApiError::BadRequest(other.body_text()),
    }
}

/// The `{id}` path segment as a run id.
pub struct RunIdPath(pub Uuid);

impl<S: Send + Sync> FromRequestParts<S> for RunIdPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(raw) = axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e: PathRejection| ApiError::BadRequest(e.body_text()))?;
        Uuid::parse_str(&raw)
            .map(RunIdPath)
            .map_err(|_| ApiError::BadRequest(format!("run id must be a UUID, got {:?}", truncate(&raw))))
    }
}

/// Query string.
pub struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| ApiQuery(q.0))
            .map_err(|e: QueryRejection| ApiError::BadRequest(e.body_text()))
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}
