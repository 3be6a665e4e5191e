//! Provider errors, typed so the agent loop can decide whether a retry can
//! help and how long to wait before it.
//!
//! Every message here may end up in a run's event log, so nothing that could
//! hold a credential is ever copied in verbatim: error bodies are redacted
//! (the configured key, anything shaped like `sk-…`) and truncated.

use std::error::Error as StdError;
use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::header::HeaderMap;

/// The most of an error body we read: any provider's error JSON fits, and a
/// misbehaving proxy cannot make us buffer megabytes of HTML.
const MAX_ERROR_BODY_BYTES: usize = 16 * 1024;
/// The most of a provider message we keep; enough to diagnose, short enough
/// for an event line.
const MAX_MESSAGE_CHARS: usize = 500;

/// Error kinds (Anthropic `error.type`, OpenAI `error.code`/`error.type`)
/// that no retry can fix, whatever the status or position in the stream.
const PERMANENT_KINDS: &[&str] = &[
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "billing_error",
    "insufficient_quota",
    "invalid_api_key",
    "context_length_exceeded",
];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// The provider answered with an error status instead of a stream.
    #[error("model provider returned HTTP {status}: {message}")]
    Http {
        status: u16,
        /// The provider's error kind (`overloaded_error`, `rate_limit_exceeded`,
        /// `insufficient_quota`, …) when its body said.
        kind: Option<String>,
        /// The provider's own message when its body had one, else the start of
        /// the body; redacted.
        message: String,
        /// How long the provider asked us to wait (`retry-after-ms`,
        /// `retry-after` seconds or HTTP-date).
        retry_after: Option<Duration>,
    },
    /// The request never got an answer, or the connection broke mid-stream.
    #[error("connection to the model provider failed: {0}")]
    Connection(String),
    /// The stream ended without its finish event: the answer is incomplete.
    #[error("the model's response stream ended before the response was complete")]
    Truncated,
    /// The provider sent an error event in the middle of the stream.
    #[error("the model provider reported an error mid-stream ({kind}): {message}")]
    Stream { kind: String, message: String },
    /// The stream carried something that is not the provider's format.
    #[error("could not decode the model provider's response: {0}")]
    Decode(String),
    /// The request could not be built (bad base URL, unserialisable body).
    #[error("invalid model request: {0}")]
    InvalidRequest(String),
}

impl ProviderError {
    /// Whether the same request may succeed if sent again later: rate
    /// limits, overload, server errors and lost connections are; bad
    /// requests, bad credentials and undecodable answers are not.
    pub fn is_retryable(&self) -> bool {
        match self {
            ProviderError::Http { status, kind, .. } => {
                if kind.as_deref().is_some_and(is_permanent_kind) {
                    return false;
                }
                matches!(status, 408 | 409 | 429) || (500..=599).contains(status)
            }
            ProviderError::Connection(_) | ProviderError::Truncated => true,
            // Mid-stream errors are the server failing after it accepted the
            // request (overloaded_error, api_error, server_error); only the
            // kinds that describe the request itself are final.
            ProviderError::Stream { kind, .. } => !is_permanent_kind(kind),
            ProviderError::Decode(_) | ProviderError::InvalidRequest(_) => false,
        }
    }

    /// The wait the provider asked for, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ProviderError::Http { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Turns a non-success response into an error, reading (a bounded
    /// prefix of) its body for the provider's message. `secret` is the API
    /// key in use, scrubbed from anything the body echoes back.
    pub(crate) async fn from_response(mut response: reqwest::Response, secret: Option<&str>) -> Self {
        let status = response.status().as_u16();
        let retry_after = retry_after_from_headers(response.headers(), Utc::now());
        let mut body = Vec::new();
        // A body that breaks off is still worth quoting as far as it got.
        while let Ok(Some(chunk)) = response.chunk().await {
            body.extend_from_slice(&chunk);
            if body.len() >= MAX_ERROR_BODY_BYTES {
                body.truncate(MAX_ERROR_BODY_BYTES);
                break;
            }
        }
        Self::from_http_parts(status, &body, retry_after, secret)
    }

    /// The pure part of [`Self::from_response`].
    pub(crate) fn from_http_parts(
        status: u16,
        body: &[u8],
        retry_after: Option<Duration>,
        secret: Option<&str>,
    ) -> Self {
        let text = String::from_utf8_lossy(body);
        let (kind, message) = match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(json) => error_details(&json),
            Err(_) => (None, None),
        };
        let message = match message {
            Some(m) => m,
            None if text.trim().is_empty() => "(empty body)".to_owned(),
            None => text.trim().to_owned(),
        };
        ProviderError::Http { status, kind, message: clean_message(&message, secret), retry_after }
    }

    /// An error object found inside the stream (`{"error": {...}}` data or an
    /// Anthropic `error` event).
    pub(crate) fn from_stream_error(json: &serde_json::Value) -> Self {
        let (kind, message) = error_details(json);
        ProviderError::Stream {
            kind: kind.unwrap_or_else(|| "unknown_error".to_owned()),
            message: clean_message(message.as_deref().unwrap_or("(no message)"), None),
        }
    }

    /// A stream payload that is not what the provider's format promises. The
    /// payload is model output, so it is quoted only briefly.
    pub(crate) fn decode(what: &str, payload: &str) -> Self {
        ProviderError::Decode(format!("{what}: {}", clean_message(payload, None)))
    }
}

impl From<reqwest::Error> for ProviderError {
    fn from(err: reqwest::Error) -> Self {
        let description = describe_chain(&err);
        if err.is_builder() {
            ProviderError::InvalidRequest(description)
        } else {
            ProviderError::Connection(description)
        }
    }
}

impl From<std::io::Error> for ProviderError {
    fn from(err: std::io::Error) -> Self {
        ProviderError::Connection(describe_chain(&err))
    }
}

fn is_permanent_kind(kind: &str) -> bool {
    PERMANENT_KINDS.contains(&kind)
}

/// reqwest's own message is terse ("error sending request"); the cause
/// (connection refused, reset, timed out) is in its sources.
fn describe_chain(err: &dyn StdError) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Pulls the error kind and message out of the shapes providers use:
/// Anthropic `{"type":"error","error":{"type","message"}}`, OpenAI
/// `{"error":{"message","type","code"}}`, vLLM `{"object":"error",
/// "message","type","code":400}`, Ollama `{"error":"..."}`, FastAPI
/// `{"detail":"..."}`.
fn error_details(json: &serde_json::Value) -> (Option<String>, Option<String>) {
    let str_at = |v: &serde_json::Value, key: &str| v.get(key).and_then(|s| s.as_str()).map(str::to_owned);
    let object = match json.get("error") {
        Some(serde_json::Value::String(message)) => return (None, Some(message.clone())),
        Some(inner) if inner.is_object() => inner,
        _ => json,
    };
    // OpenAI's `code` is the specific one (`insufficient_quota` under type
    // `insufficient_quota`, `rate_limit_exceeded` under type `requests`).
    let kind = str_at(object, "code").or_else(|| str_at(object, "type")).filter(|k| k != "error");
    let message = str_at(object, "message").or_else(|| str_at(object, "detail"));
    let message = match (&kind, message) {
        (Some(kind), Some(message)) => Some(format!("{kind}: {message}")),
        (_, message) => message,
    };
    (kind, message)
}

/// Redacts credentials and bounds the length of text that came from outside.
fn clean_message(text: &str, secret: Option<&str>) -> String {
    let mut text = text.to_owned();
    // Only a real key is worth scrubbing; replacing a 2-character "secret"
    // would mangle the message.
    if let Some(secret) = secret.filter(|s| s.len() >= 8) {
        text = text.replace(secret, "[redacted]");
    }
    let text = mask_key_like_words(&text);
    truncate_chars(&text, MAX_MESSAGE_CHARS)
}

/// Masks words that look like API keys (`sk-…`, `sk-ant-…`): OpenAI echoes a
/// partly masked key in its 401 message, and a proxy may echo the whole one.
fn mask_key_like_words(text: &str) -> String {
    let is_separator = |c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ',' | '(' | ')' | '`');
    let mut out = String::with_capacity(text.len());
    for piece in text.split_inclusive(is_separator) {
        let (word, separator) = match piece.char_indices().last() {
            Some((at, c)) if is_separator(c) => piece.split_at(at),
            _ => (piece, ""),
        };
        if word.starts_with("sk-") && word.len() > 3 {
            out.push_str("sk-[redacted]");
        } else {
            out.push_str(word);
        }
        out.push_str(separator);
    }
    out
}

fn truncate_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// Reads how long to wait from `retry-after-ms` (OpenAI, most precise) or
/// `retry-after` (seconds, or an HTTP-date relative to `now`).
pub(crate) fn retry_after_from_headers(headers: &HeaderMap, now: DateTime<Utc>) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let from_ms =
        header("retry-after-ms").and_then(|v| v.parse::<f64>().ok()).and_then(|ms| non_negative_duration(ms / 1000.0));
    if from_ms.is_some() {
        return from_ms;
    }
    let value = header("retry-after")?;
    if let Ok(seconds) = value.parse::<f64>() {
        return non_negative_duration(seconds);
    }
    // IMF-fixdate ("Wed, 21 Oct 2015 07:28:00 GMT") is valid RFC 2822.
    let at = DateTime::parse_from_rfc2822(value).ok()?.with_timezone(&Utc);
    // A date already past means "now".
    Some((at - now).to_std().unwrap_or(Duration::ZERO))
}

/// `Duration::from_secs_f64` panics on negative, NaN and huge values, all of
/// which a header can carry.
fn non_negative_duration(seconds: f64) -> Option<Duration> {
    if seconds < 0.0 {
        return None;
    }
    Duration::try_from_secs_f64(seconds).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
#[path = "error_tests.rs"]
mod tests;
