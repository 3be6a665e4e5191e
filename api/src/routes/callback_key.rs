//! `GET /v1/callback-key`: the key the caller's callbacks are signed with.
//!
//! Each subject's key is derived from the deployment's callback secret
//! (`kiln_protocol::callback::subject_key`); a subject gets only its own, so
//! one tenant cannot verify, let alone forge, another's callbacks.

use axum::Json;
use axum::extract::State;
use kiln_protocol::callback::{KEY_ID, subject_key};
use secrecy::ExposeSecret;
use serde::Serialize;

use crate::auth::Subject;
use crate::{ApiError, AppState};

/// The caller's callback key.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CallbackKey {
    /// The subject the key belongs to: the caller (callback bodies name it
    /// as `owner`).
    pub subject: String,
    /// The key scheme, also sent as `X-Kiln-Signature-Key` with every callback.
    #[schema(example = "v1")]
    pub key_id: &'static str,
    /// Always `hmac-sha256`: `X-Kiln-Signature-256` is `sha256=` and the hex
    /// HMAC-SHA256 of the raw body under this key.
    #[schema(example = "hmac-sha256")]
    pub algorithm: &'static str,
    /// The key, 32 bytes as 64 hex digits. Keep it secret: it verifies
    /// (and could sign) this subject's callbacks.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub key: String,
}

/// The key your callbacks are signed with
///
/// Completion callbacks of your runs carry `X-Kiln-Signature-256:
/// sha256=<hex HMAC-SHA256 of the raw body>` under this key, and name you as
/// `owner` in the body. The key is derived from the deployment's secret and
/// your subject: it is the same on every call (and changes only when the
/// operator changes `KILN_CALLBACK_SECRET`), and no other subject's key
/// verifies your callbacks. 404 when the deployment has no callback secret
/// (callbacks are off).
#[utoipa::path(
    get,
    path = "/v1/callback-key",
    operation_id = "callback_key",
    tag = "runs",
    responses(
        (status = 200, description = "The caller's callback key.", body = CallbackKey),
        (status = 404, response = crate::openapi::errors::NotFound),
        (status = 401, response = crate::openapi::errors::Unauthorized),
    )
)]
pub async fn callback_key(
    State(state): State<AppState>,
    Subject(subject): Subject,
) -> Result<Json<CallbackKey>, ApiError> {
    let Some(secret) = &state.settings.callback_secret else {
        return Err(ApiError::NotFound(
            "callbacks are not enabled on this deployment (no KILN_CALLBACK_SECRET)".into(),
        ));
    };
    let key = hex::encode(subject_key(secret.expose_secret(), &subject));
    Ok(Json(CallbackKey { subject, key_id: KEY_ID, algorithm: "hmac-sha256", key }))
}
