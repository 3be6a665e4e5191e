//! The error shape every route answers with, and the error responses the
//! operations share, for the OpenAPI document.
//!
//! These types only describe what [`crate::ApiError`] writes; the test below
//! keeps the two in step.

use serde::Serialize;
use utoipa::{ToResponse, ToSchema};

/// Every error: `{"error": {"code": "...", "message": "..."}}`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Error)]
pub struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    code: ErrorCode,
    /// Says what was wrong and, where it can, how to fix it. For people,
    /// not for parsing: match on `code`.
    message: String,
}

/// Stable, machine-readable kind of error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    Unauthorized,
    NotFound,
    BadRequest,
    InvalidRequest,
    PayloadTooLarge,
    UnsupportedMediaType,
    Conflict,
    MethodNotAllowed,
    TooManyRequests,
    Unavailable,
    Internal,
}

/// `bad_request`: malformed JSON, a bad query parameter or header, or a path
/// id that is not a UUID.
#[derive(ToResponse)]
pub struct BadRequest(#[allow(dead_code)] ErrorBody);

/// `unauthorized`: the bearer token is missing, malformed, expired or not
/// signed by a trusted key (for the GitHub webhook: the payload signature
/// does not match).
#[derive(ToResponse)]
#[response(headers(("WWW-Authenticate" = String, description = "`Bearer`")))]
pub struct Unauthorized(#[allow(dead_code)] ErrorBody);

/// `not_found`: no run with this id belongs to the caller (or no such thing
/// at all: the message says which).
#[derive(ToResponse)]
pub struct NotFound(#[allow(dead_code)] ErrorBody);

/// `conflict`: the run is not in a state that allows this; the message says
/// why.
#[derive(ToResponse)]
pub struct Conflict(#[allow(dead_code)] ErrorBody);

/// `payload_too_large`: the body is larger than the server's limit.
#[derive(ToResponse)]
pub struct PayloadTooLarge(#[allow(dead_code)] ErrorBody);

/// `unsupported_media_type`: the body is not sent as `application/json`.
#[derive(ToResponse)]
pub struct UnsupportedMediaType(#[allow(dead_code)] ErrorBody);

/// `invalid_request`: the body is JSON of the wrong shape (a missing,
/// unknown or mistyped field) or a value is out of range.
#[derive(ToResponse)]
pub struct Unprocessable(#[allow(dead_code)] ErrorBody);

/// `too_many_requests`: a per-subject quota is spent (active runs, runs per
/// minute, open event streams). Try again after `Retry-After` seconds.
#[derive(ToResponse)]
#[response(headers(("Retry-After" = u64, description = "Seconds to wait before trying again.")))]
pub struct TooManyRequests(#[allow(dead_code)] ErrorBody);

/// `unavailable`: the database does not answer. Try again after
/// `Retry-After` seconds.
#[derive(ToResponse)]
#[response(headers(("Retry-After" = u64, description = "Seconds to wait before trying again.")))]
pub struct Unavailable(#[allow(dead_code)] ErrorBody);

/// `internal`: a fault on the server; the details are in its log, not here.
#[derive(ToResponse)]
pub struct Internal(#[allow(dead_code)] ErrorBody);

#[cfg(test)]
mod tests {
    use axum::response::IntoResponse;

    use super::*;
    use crate::ApiError;

    /// Every error the API can send has a code the document lists.
    #[tokio::test]
    async fn every_api_error_code_is_in_the_schema() {
        let listed: Vec<String> = [
            ErrorCode::Unauthorized,
            ErrorCode::NotFound,
            ErrorCode::BadRequest,
            ErrorCode::InvalidRequest,
            ErrorCode::PayloadTooLarge,
            ErrorCode::UnsupportedMediaType,
            ErrorCode::Conflict,
            ErrorCode::MethodNotAllowed,
            ErrorCode::TooManyRequests,
            ErrorCode::Unavailable,
            ErrorCode::Internal,
        ]
        .iter()
        .map(|c| serde_json::to_value(c).unwrap().as_str().unwrap().to_owned())
        .collect();
        let errors = [
            ApiError::Unauthorized(String::new()),
            ApiError::NotFound(String::new()),
            ApiError::BadRequest(String::new()),
            ApiError::Validation(String::new()),
            ApiError::PayloadTooLarge(String::new()),
            ApiError::UnsupportedMediaType(String::new()),
            ApiError::Conflict(String::new()),
            ApiError::MethodNotAllowed(String::new()),
            ApiError::TooManyRequests { message: String::new(), retry_after_s: 1 },
            ApiError::Unavailable,
            ApiError::Internal(String::new()),
        ];
        for error in errors {
            let body = axum::body::to_bytes(error.into_response().into_body(), 4096).await.unwrap();
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
            let code = body["error"]["code"].as_str().unwrap();
            assert!(listed.iter().any(|c| c == code), "{code} is not in ErrorCode");
        }
    }
}
