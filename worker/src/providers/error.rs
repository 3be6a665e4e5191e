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
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2015-10-21T07:27:00Z").unwrap().with_timezone(&Utc)
    }

    #[test]
    fn retry_after_seconds_date_and_ms() {
        assert_eq!(retry_after_from_headers(&headers(&[("retry-after", "20")]), now()), Some(Duration::from_secs(20)));
        assert_eq!(
            retry_after_from_headers(&headers(&[("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")]), now()),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            retry_after_from_headers(&headers(&[("retry-after", "Wed, 21 Oct 2015 07:00:00 GMT")]), now()),
            Some(Duration::ZERO),
            "a date in the past means retry now"
        );
        assert_eq!(
            retry_after_from_headers(&headers(&[("retry-after", "20"), ("retry-after-ms", "1500")]), now()),
            Some(Duration::from_millis(1500)),
            "the millisecond header is more precise and wins"
        );
        assert_eq!(
            retry_after_from_headers(&headers(&[("retry-after-ms", "soon"), ("retry-after", "3")]), now()),
            Some(Duration::from_secs(3))
        );
    }

    #[test]
    fn retry_after_garbage_never_panics() {
        for value in ["-5", "NaN", "inf", "1e400", "tomorrow", "", "99999999999999999999999"] {
            let parsed = retry_after_from_headers(&headers(&[("retry-after", value)]), now());
            assert!(parsed.is_none() || parsed.is_some_and(|d| d >= Duration::ZERO), "{value}");
        }
        assert_eq!(retry_after_from_headers(&HeaderMap::new(), now()), None);
    }

    #[test]
    fn anthropic_error_body() {
        let body = br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        let err = ProviderError::from_http_parts(529, body, None, None);
        assert_eq!(
            err,
            ProviderError::Http {
                status: 529,
                kind: Some("overloaded_error".into()),
                message: "overloaded_error: Overloaded".into(),
                retry_after: None
            }
        );
        assert!(err.is_retryable());
    }

    #[test]
    fn openai_error_bodies() {
        let quota = br#"{"error":{"message":"You exceeded your current quota.","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#;
        let err = ProviderError::from_http_parts(429, quota, Some(Duration::from_secs(1)), None);
        assert!(!err.is_retryable(), "an exhausted quota does not come back by retrying");
        assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));

        let rate = br#"{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
        assert!(ProviderError::from_http_parts(429, rate, None, None).is_retryable());
    }

    #[test]
    fn status_decides_when_the_body_does_not() {
        for status in [408, 409, 429, 500, 502, 503, 504, 529] {
            assert!(
                ProviderError::from_http_parts(status, b"<html>oops</html>", None, None).is_retryable(),
                "{status}"
            );
        }
        for status in [400, 401, 403, 404, 413, 422] {
            assert!(!ProviderError::from_http_parts(status, b"", None, None).is_retryable(), "{status}");
        }
    }

    #[test]
    fn other_shapes_and_plain_text() {
        let ollama = ProviderError::from_http_parts(404, br#"{"error":"model 'x' not found"}"#, None, None);
        assert!(ollama.to_string().contains("model 'x' not found"), "{ollama}");
        let vllm = br#"{"object":"error","message":"bad","type":"BadRequestError","code":400}"#;
        let vllm = ProviderError::from_http_parts(400, vllm, None, None);
        assert!(matches!(&vllm, ProviderError::Http { kind: Some(k), .. } if k == "BadRequestError"), "{vllm:?}");
        let html = ProviderError::from_http_parts(502, "<h1>Bad gateway</h1>".as_bytes(), None, None);
        assert!(html.to_string().contains("Bad gateway"));
        let empty = ProviderError::from_http_parts(503, b"", None, None);
        assert!(empty.to_string().contains("(empty body)"));
    }

    #[test]
    fn messages_never_carry_keys() {
        let secret = "sk-ant-api03-SECRETSECRETSECRET";
        let body =
            format!(r#"{{"error":{{"message":"Incorrect API key provided: {secret}. Also sk-proj-abc***xyz."}}}}"#);
        let err = ProviderError::from_http_parts(401, body.as_bytes(), None, Some(secret));
        let shown = err.to_string();
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(!shown.contains("abc***xyz"), "{shown}");
        assert!(!err.is_retryable());

        let custom = "my-local-proxy-token-123";
        let err =
            ProviderError::from_http_parts(401, format!("token {custom} rejected").as_bytes(), None, Some(custom));
        assert!(!err.to_string().contains(custom), "{err}");
    }

    #[test]
    fn long_messages_are_bounded() {
        let body = "é".repeat(10_000);
        let err = ProviderError::from_http_parts(500, body.as_bytes(), None, None);
        assert!(err.to_string().chars().count() < MAX_MESSAGE_CHARS + 100);
    }

    #[test]
    fn stream_errors() {
        let overloaded: serde_json::Value =
            serde_json::from_str(r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#)
                .unwrap();
        let err = ProviderError::from_stream_error(&overloaded);
        assert_eq!(
            err,
            ProviderError::Stream { kind: "overloaded_error".into(), message: "overloaded_error: Overloaded".into() }
        );
        assert!(err.is_retryable());
        let invalid: serde_json::Value =
            serde_json::from_str(r#"{"error":{"type":"invalid_request_error","message":"prompt is too long"}}"#)
                .unwrap();
        assert!(!ProviderError::from_stream_error(&invalid).is_retryable());
        assert!(ProviderError::Truncated.is_retryable());
        assert!(ProviderError::Connection("reset".into()).is_retryable());
        assert!(!ProviderError::Decode("x".into()).is_retryable());
    }
}
