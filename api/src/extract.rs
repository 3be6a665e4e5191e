//! Extractors whose rejections are [`ApiError`]s, so malformed input gets
//! the same JSON error shape as everything else.

use axum::body::Bytes;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::{Number, Value};
use uuid::Uuid;

use crate::ApiError;

/// JSON body, read as the OpenAPI document (JSON Schema) reads it: an
/// object at the top, and a number without a fraction (`5.0`) an integer.
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !has_json_content_type(req.headers()) {
            return Err(ApiError::UnsupportedMediaType(
                "expected a request body with Content-Type: application/json".into(),
            ));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge("request body is larger than the limit".into())
            } else {
                ApiError::BadRequest(format!("could not read the request body: {}", e.body_text()))
            }
        })?;
        let axum::Json(mut value) = axum::Json::<Value>::from_bytes(&bytes).map_err(json_rejection)?;
        // serde also reads a struct from a JSON array; a body is an object.
        if !value.is_object() {
            return Err(ApiError::Validation("request body must be a JSON object".into()));
        }
        integral_as_integer(&mut value);
        // Wrong types, missing or unknown fields: the message names the field.
        let parsed = serde_path_to_error::deserialize(value).map_err(|e| {
            ApiError::Validation(format!("the JSON body does not fit its schema: {}", in_json_terms(&e.to_string())))
        })?;
        Ok(ApiJson(parsed))
    }
}

/// serde's words for what it expected, in JSON's: `expected struct
/// RepoSpec` names a Rust type the client has never heard of; "an object"
/// is what it should send.
fn in_json_terms(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find("expected ") {
        let (before, after) = rest.split_at(at + "expected ".len());
        out.push_str(before);
        let (said, consumed) = json_phrase(after).unwrap_or(("", 0));
        out.push_str(said);
        rest = &after[consumed..];
    }
    out.push_str(rest);
    out
}

/// The JSON words for the serde phrase `after` starts with, and the
/// phrase's length; `None`: a phrase that is fine as it is.
fn json_phrase(after: &str) -> Option<(&'static str, usize)> {
    const WORDS: [(&str, &str); 14] = [
        ("a sequence", "an array"),
        ("a boolean", "true or false"),
        ("u8", "a non-negative whole number"),
        ("u16", "a non-negative whole number"),
        ("u32", "a non-negative whole number"),
        ("u64", "a non-negative whole number"),
        ("usize", "a non-negative whole number"),
        ("i8", "a whole number"),
        ("i16", "a whole number"),
        ("i32", "a whole number"),
        ("i64", "a whole number"),
        ("isize", "a whole number"),
        ("f32", "a number"),
        ("f64", "a number"),
    ];
    let ident = |s: &str| s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
    if let Some(name) = after.strip_prefix("struct ") {
        return Some(("an object", "struct ".len() + ident(name)));
    }
    if let Some(name) = after.strip_prefix("enum ") {
        return Some(("one of the documented values", "enum ".len() + ident(name)));
    }
    let word = &after[..ident(after)];
    WORDS
        .iter()
        .find(|(serde, _)| if serde.contains(' ') { after.starts_with(serde) } else { *serde == word })
        .map(|(serde, json)| (*json, serde.len()))
}

/// JSON Schema's `integer` is any number without a fraction, `5.0` too;
/// serde's integers refuse `5.0`. So such a number is made an integer
/// first, within an `i64` (every integer field's range is inside it; a
/// float field takes an integer as well).
fn integral_as_integer(value: &mut Value) {
    const LIMIT: f64 = 9_223_372_036_854_775_808.0; // 2^63
    match value {
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|f| n.is_f64() && f.fract() == 0.0 && f.abs() < LIMIT) {
                *n = Number::from(f as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_as_integer),
        Value::Object(fields) => fields.values_mut().for_each(integral_as_integer),
        _ => {}
    }
}

/// `application/json` or any `application/*+json`, parameters ignored.
fn has_json_content_type(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

fn json_rejection(rejection: JsonRejection) -> ApiError {
    match rejection {
        JsonRejection::JsonSyntaxError(e) => ApiError::BadRequest(format!("malformed JSON: {}", e.body_text())),
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
        run_id(&raw)
            .map(RunIdPath)
            .ok_or_else(|| ApiError::BadRequest(format!("run id must be a UUID, got {:?}", truncate(&raw))))
    }
}

/// A run id as the document's `format: uuid` says: the hyphenated form
/// only (the `uuid` crate also reads braced, URN and unhyphenated ones).
pub fn run_id(raw: &str) -> Option<Uuid> {
    (raw.len() == 36).then(|| Uuid::try_parse(raw).ok()).flatten()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_type_names_become_json_words() {
        assert_eq!(
            in_json_terms("repo: invalid type: string \"x\", expected struct RepoSpec"),
            "repo: invalid type: string \"x\", expected an object"
        );
        assert_eq!(
            in_json_terms("limits.max_steps: invalid type: string \"3\", expected u32"),
            "limits.max_steps: invalid type: string \"3\", expected a non-negative whole number"
        );
        assert_eq!(
            in_json_terms("x: invalid type: map, expected a sequence"),
            "x: invalid type: map, expected an array"
        );
        assert_eq!(
            in_json_terms("approval: unknown variant `x`, expected one of `never`, `mutating`"),
            "approval: unknown variant `x`, expected one of `never`, `mutating`"
        );
        assert_eq!(in_json_terms("missing field `prompt`"), "missing field `prompt`");
    }

    #[test]
    fn json_content_types_are_recognised() {
        let ok = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(CONTENT_TYPE, v.parse().unwrap());
            has_json_content_type(&h)
        };
        assert!(ok("application/json"));
        assert!(ok("Application/JSON; charset=utf-8"));
        assert!(ok("application/merge-patch+json"));
        assert!(!ok("text/plain"));
        assert!(!ok("application/jsonp"));
        assert!(!has_json_content_type(&HeaderMap::new()));
    }

    #[test]
    fn a_run_id_is_a_hyphenated_uuid() {
        let id = Uuid::now_v7();
        assert_eq!(run_id(&id.to_string()), Some(id));
        assert_eq!(run_id(&id.to_string().to_uppercase()), Some(id));
        for other in [id.simple().to_string(), id.braced().to_string(), id.urn().to_string(), "x".into()] {
            assert_eq!(run_id(&other), None, "{other}");
        }
    }

    #[test]
    fn integral_numbers_are_integers_anywhere() {
        let mut value = serde_json::json!({"a": 5.0, "b": [1.5, -2.0], "c": {"d": 1e300, "e": 0.0}});
        integral_as_integer(&mut value);
        assert_eq!(value, serde_json::json!({"a": 5, "b": [1.5, -2], "c": {"d": 1e300, "e": 0}}));
    }
}
