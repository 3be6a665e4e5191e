//! One error type for every route, mapped to a status and the JSON body
//! `{"error": {"code": "...", "message": "..."}}` in one place.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kiln_store::{QuotaRefusal, StoreError};
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Validation(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    RequestTimeout(String),
    #[error("{message}")]
    TooManyRequests { message: String, retry_after_s: u64 },
    #[error("the database is unavailable; try again shortly")]
    Unavailable,
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ApiError::Validation(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request"),
            ApiError::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::UnsupportedMediaType(_) => (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            ApiError::MethodNotAllowed(_) => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::RequestTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "request_timeout"),
            ApiError::TooManyRequests { .. } => (StatusCode::TOO_MANY_REQUESTS, "too_many_requests"),
            ApiError::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }

    pub fn run_not_found() -> Self {
        ApiError::NotFound("no run with this id".into())
    }
}

impl From<QuotaRefusal> for ApiError {
    fn from(refusal: QuotaRefusal) -> Self {
        match refusal {
            QuotaRefusal::TooManyActive { limit } => ApiError::TooManyRequests {
                message: format!("you have {limit} active runs, the most allowed; wait for one to finish"),
                retry_after_s: 10,
            },
            QuotaRefusal::TooFast { limit, retry_after_s } => ApiError::TooManyRequests {
                message: format!("at most {limit} runs may be created per minute"),
                retry_after_s,
            },
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        if e.is_unavailable() {
            tracing::warn!(error = %e, "database unavailable");
            ApiError::Unavailable
        } else {
            ApiError::Internal(e.to_string())
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        if let ApiError::Internal(detail) = &self {
            // The detail may name tables or queries: log it, don't send it.
            tracing::error!(%detail, "internal error");
        }
        let body = Json(json!({ "error": { "code": code, "message": self.to_string() } }));
        let mut response = (status, body).into_response();
        match &self {
            ApiError::Unauthorized(_) => {
                response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            ApiError::Unavailable => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
            }
            ApiError::TooManyRequests { retry_after_s, .. } => {
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_s));
            }
            ApiError::RequestTimeout(_) => {
                // The rest of the body may still be on its way: this
                // connection cannot carry another request.
                response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            _ => {}
        }
        response
    }
}
