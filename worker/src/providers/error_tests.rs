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

    let rate =
        br#"{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#;
    assert!(ProviderError::from_http_parts(429, rate, None, None).is_retryable());
}

#[test]
fn status_decides_when_the_body_does_not() {
    for status in [408, 409, 429, 500, 502, 503, 504, 529] {
        assert!(ProviderError::from_http_parts(status, b"<html>oops</html>", None, None).is_retryable(), "{status}");
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
    let body = format!(r#"{{"error":{{"message":"Incorrect API key provided: {secret}. Also sk-proj-abc***xyz."}}}}"#);
    let err = ProviderError::from_http_parts(401, body.as_bytes(), None, Some(secret));
    let shown = err.to_string();
    assert!(!shown.contains("SECRET"), "{shown}");
    assert!(!shown.contains("abc***xyz"), "{shown}");
    assert!(!err.is_retryable());

    let custom = "my-local-proxy-token-123";
    let err = ProviderError::from_http_parts(401, format!("token {custom} rejected").as_bytes(), None, Some(custom));
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
        serde_json::from_str(r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#).unwrap();
    let err = ProviderError::from_stream_error(&overloaded);
    assert_eq!(
        err,
        ProviderError::Stream { kind: "overloaded_error".into(), message: "overloaded_error: Overloaded".into() }
    );
    assert!(err.is_retryable());
    let invalid: serde_json::Value =
        serde_json::from_str(r#"{"error":{"type":"invalid_request_error","message":"prompt is too long"}}"#).unwrap();
    assert!(!ProviderError::from_stream_error(&invalid).is_retryable());
    assert!(ProviderError::Truncated.is_retryable());
    assert!(ProviderError::Connection("reset".into()).is_retryable());
    assert!(!ProviderError::Decode("x".into()).is_retryable());
}
