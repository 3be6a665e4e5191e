//! The HTTP API as a client sees it: authentication, tenancy, input
//! validation, idempotency, listing, cancelling and the SSE basics.
//!
//! No worker runs here, so every run stays `queued` until a client cancels
//! it: these tests pin down what the API alone promises.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::join_all;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use kiln_tests::{Options, SECRET, TestApp, token};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// The API on a fresh database, without a worker.
async fn api() -> TestApp {
    TestApp::spawn(Options { worker: false, ..Default::default() }).await
}

/// Rows in `runs`, `sessions` and `events`.
async fn count_rows(app: &TestApp) -> (i64, i64, i64) {
    let row = app
        .sql()
        .await
        .query_one(
            "SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM sessions), (SELECT count(*) FROM events)",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

/// Status, `error.code` and `error.message` of an error response, after
/// checking it has the JSON error shape.
async fn error_of(response: Response) -> (StatusCode, String, String) {
    let status = response.status();
    assert!(status.is_client_error() || status.is_server_error(), "expected an error, got {status}");
    let content_type = response.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(content_type.as_deref(), Some("application/json"), "{status}: error bodies are JSON");
    let body: Value = response.json().await.unwrap();
    let code = body["error"]["code"].as_str().unwrap_or_else(|| panic!("no error.code in {body}")).to_owned();
    let message = body["error"]["message"].as_str().unwrap_or_else(|| panic!("no error.message in {body}")).to_owned();
    assert!(!message.trim().is_empty(), "{status}: the message says why");
    (status, code, message)
}

/// Asserts a 4xx with `code`, whose message contains `why` (case-insensitive).
async fn assert_error(response: Response, status: u16, code: &str, why: &str) -> String {
    let (s, c, message) = error_of(response).await;
    assert_eq!(s.as_u16(), status, "{message}");
    assert_eq!(c, code, "{message}");
    assert!(message.to_lowercase().contains(&why.to_lowercase()), "message {message:?} should mention {why:?}");
    message
}

fn create(app: &TestApp, sub: &str) -> RequestBuilder {
    app.http.post(app.url("/v1/runs")).bearer_auth(token(sub))
}

async fn queued_run(app: &TestApp, sub: &str) -> String {
    let run = app.create_run(sub, json!({"prompt": "fix the bug"})).await;
    assert_eq!(run["status"], "queued");
    run["id"].as_str().unwrap().to_owned()
}

async fn events_json(app: &TestApp, sub: &str, id: &str) -> Value {
    let r = app
        .http
        .get(app.url(&format!("/v1/runs/{id}/events")))
        .bearer_auth(token(sub))
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

fn seqs_and_kinds(page: &Value) -> Vec<(i64, String)> {
    page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["seq"].as_i64().unwrap(), e["kind"].as_str().unwrap().to_owned()))
        .collect()
}

/// Every authenticated route, as requests without credentials. `POST
/// /v1/runs` carries a valid body so that credentials are its only problem.
fn authenticated_routes(app: &TestApp, run: &str) -> Vec<RequestBuilder> {
    vec![
        app.http.post(app.url("/v1/runs")).json(&json!({"prompt": "fix the bug"})),
        app.http.get(app.url("/v1/runs")),
        app.http.get(app.url(&format!("/v1/runs/{run}"))),
        app.http.post(app.url(&format!("/v1/runs/{run}/cancel"))),
        app.http.get(app.url(&format!("/v1/runs/{run}/events"))).header("accept", "text/event-stream"),
        app.http.get(app.url(&format!("/v1/runs/{run}/events"))).header("accept", "application/json"),
    ]
}

/// Sends every authenticated route with `authorization` (or none) and
/// asserts each is a 401 saying `why`, with `WWW-Authenticate: Bearer`,
/// and that nothing was written or cancelled.
async fn assert_every_route_refuses(authorization: Option<&str>, why: &[&str]) {
    let app = api().await;
    let run = queued_run(&app, "alice").await;
    let before = count_rows(&app).await;
    for request in authenticated_routes(&app, &run) {
        let request = match authorization {
            Some(value) => request.header("authorization", value),
            None => request,
        };
        let (method, url) = {
            let built = request.try_clone().unwrap().build().unwrap();
            (built.method().clone(), built.url().path().to_owned())
        };
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 401, "{method} {url}");
        let challenge = response.headers().get("www-authenticate").map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(challenge.as_deref(), Some("Bearer"), "{method} {url}");
        let (_, code, message) = error_of(response).await;
        assert_eq!(code, "unauthorized", "{method} {url}: {message}");
        let lower = message.to_lowercase();
        assert!(why.iter().any(|w| lower.contains(w)), "{method} {url}: {message:?} should mention one of {why:?}");
    }
    assert_eq!(count_rows(&app).await, before, "a refused request writes nothing");
    assert_eq!(app.get_run("alice", &run).await["status"], "queued", "a refused cancel cancels nothing");
}

fn now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

fn sign(alg: Algorithm, secret: &[u8], claims: &Value) -> String {
    jsonwebtoken::encode(&Header::new(alg), claims, &EncodingKey::from_secret(secret).unwrap()).unwrap()
}

/// Unpadded base64url (RFC 4648 §5), enough to hand-build a token.
fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// Reads raw SSE text until `done` accepts what arrived so far; panics if
/// that takes longer than `timeout` or the stream ends first.
async fn read_sse_until<B: AsRef<[u8]>>(
    stream: &mut (impl futures::Stream<Item = reqwest::Result<B>> + Unpin),
    text: &mut String,
    timeout: Duration,
    done: impl Fn(&str) -> bool,
) {
    let deadline = Instant::now() + timeout;
    while !done(text) {
        let chunk = tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), stream.next())
            .await
            .unwrap_or_else(|_| panic!("SSE stream stalled; read so far: {text:?}"))
            .unwrap_or_else(|| panic!("SSE stream ended early; read so far: {text:?}"))
            .unwrap();
        text.push_str(std::str::from_utf8(chunk.as_ref()).unwrap());
    }
}

fn sse_request(app: &TestApp, sub: &str, id: &str) -> RequestBuilder {
    app.http
        .get(app.url(&format!("/v1/runs/{id}/events")))
        .bearer_auth(token(sub))
        .header("accept", "text/event-stream")
}

// ---------------------------------------------------------------------------
// 1. Authentication
// ---------------------------------------------------------------------------

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[tokio::test]
async fn a_request_without_authorization_is_401() {
    assert_every_route_refuses(None, &["missing bearer token"]).await;
}

#[tokio::test]
async fn basic_auth_is_401() {
    assert_every_route_refuses(Some("Basic YWxpY2U6c2VjcmV0"), &["bearer"]).await;
}

#[tokio::test]
async fn a_token_signed_with_another_secret_is_401() {
    let claims = json!({"sub": "alice", "exp": now() + 3600});
    let forged = sign(Algorithm::HS256, b"another-secret-that-is-32-bytes-long!!", &claims);
    assert_every_route_refuses(Some(&bearer(&forged)), &["signature"]).await;
}

#[tokio::test]
async fn an_expired_token_is_401() {
    let claims = json!({"sub": "alice", "iat": now() - 7200, "exp": now() - 3600});
    let expired = sign(Algorithm::HS256, SECRET.as_bytes(), &claims);
    assert_every_route_refuses(Some(&bearer(&expired)), &["expired"]).await;
}

#[tokio::test]
async fn a_token_without_exp_is_401_saying_exp_is_required() {
    let eternal = sign(Algorithm::HS256, SECRET.as_bytes(), &json!({"sub": "alice"}));
    assert_every_route_refuses(Some(&bearer(&eternal)), &["exp"]).await;
}

#[tokio::test]
async fn a_token_without_sub_is_401_saying_sub_is_required() {
    let anonymous = sign(Algorithm::HS256, SECRET.as_bytes(), &json!({"exp": now() + 3600}));
    assert_every_route_refuses(Some(&bearer(&anonymous)), &["sub"]).await;
}

#[tokio::test]
async fn a_token_with_an_empty_oversized_or_control_character_subject_is_401() {
    for sub in [String::new(), "a".repeat(257), "al\u{0}ice".into(), "al\nice".into()] {
        let t = sign(Algorithm::HS256, SECRET.as_bytes(), &json!({"sub": sub, "exp": now() + 3600}));
        assert_every_route_refuses(Some(&bearer(&t)), &["subject"]).await;
    }
}

#[tokio::test]
async fn an_alg_none_token_is_401() {
    let header = base64url(br#"{"alg":"none","typ":"JWT"}"#);
    let claims = base64url(json!({"sub": "alice", "exp": now() + 3600}).to_string().as_bytes());
    let unsigned = format!("{header}.{claims}.");
    // jsonwebtoken cannot even parse `none`, so "malformed" is a fair reason.
    assert_every_route_refuses(Some(&bearer(&unsigned)), &["algorithm", "malformed"]).await;
}

#[tokio::test]
async fn an_hs384_token_signed_with_the_right_secret_is_401() {
    let claims = json!({"sub": "alice", "exp": now() + 3600});
    let confused = sign(Algorithm::HS384, SECRET.as_bytes(), &claims);
    assert_every_route_refuses(Some(&bearer(&confused)), &["algorithm"]).await;
}

#[tokio::test]
async fn a_garbage_token_is_401() {
    assert_every_route_refuses(Some("Bearer not.a.jwt"), &["malformed"]).await;
    assert_every_route_refuses(Some("Bearer "), &["bearer"]).await;
}

/// RFC 7519 §4.1.5: a JWT MUST NOT be accepted before its `nbf`.
#[tokio::test]
async fn a_token_not_yet_valid_is_401() {
    let claims = json!({"sub": "alice", "nbf": now() + 3600, "exp": now() + 7200});
    let early = sign(Algorithm::HS256, SECRET.as_bytes(), &claims);
    assert_every_route_refuses(Some(&bearer(&early)), &["token"]).await;
}

#[tokio::test]
async fn the_base64url_helper_matches_rfc_4648() {
    // RFC 4648 §10 vectors, unpadded, plus the two url-safe characters.
    for (input, encoded) in [
        ("", ""),
        ("f", "Zg"),
        ("fo", "Zm8"),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg"),
        ("fooba", "Zm9vYmE"),
        ("foobar", "Zm9vYmFy"),
    ] {
        assert_eq!(base64url(input.as_bytes()), encoded);
    }
    assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
}

#[tokio::test]
async fn health_and_readiness_need_no_token() {
    let app = api().await;
    for (path, status) in [("/healthz", "ok"), ("/readyz", "ready")] {
        let r = app.http.get(app.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["status"], status, "{path}");
    }
}

// ---------------------------------------------------------------------------
// 2. Tenancy
// ---------------------------------------------------------------------------

#[tokio::test]
async fn another_subject_cannot_see_touch_or_follow_a_run() {
    let app = api().await;
    let run = queued_run(&app, "alice").await;
    let bob = token("bob");
    let requests = [
        app.http.get(app.url(&format!("/v1/runs/{run}"))),
        app.http.post(app.url(&format!("/v1/runs/{run}/cancel"))),
        app.http.get(app.url(&format!("/v1/runs/{run}/events"))).header("accept", "text/event-stream"),
        app.http.get(app.url(&format!("/v1/runs/{run}/events"))).header("accept", "application/json"),
        app.http.post(app.url(&format!("/v1/runs/{run}/stream-token"))),
    ];
    for request in requests {
        let request = request.bearer_auth(&bob);
        let message = assert_error(request.send().await.unwrap(), 404, "not_found", "no run").await;
        assert!(!message.contains(&run), "a 404 does not echo the id back: {message}");
    }
    let alice_view = app.get_run("alice", &run).await;
    assert_eq!(alice_view["status"], "queued", "bob's cancel must not cancel alice's run");
    assert_eq!(alice_view["cancel_requested"], false);
    assert_eq!(seqs_and_kinds(&events_json(&app, "alice", &run).await), [(1, "run.queued".to_owned())]);
}

#[tokio::test]
async fn a_listing_shows_only_the_callers_runs() {
    let app = api().await;
    let alices = queued_run(&app, "alice").await;
    let bobs = queued_run(&app, "bob").await;
    for (sub, own) in [("alice", &alices), ("bob", &bobs)] {
        let r = app.http.get(app.url("/v1/runs")).bearer_auth(token(sub)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let list: Value = r.json().await.unwrap();
        let ids: Vec<&str> = list["runs"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
        assert_eq!(ids, [own.as_str()], "{sub} sees exactly their own run");
    }
}

#[tokio::test]
async fn a_stream_token_in_the_query_authenticates_the_events_route() {
    let app = api().await;
    let run = queued_run(&app, "alice").await;
    let (status, minted) = app.post_json("alice", &format!("/v1/runs/{run}/stream-token"), json!({})).await;
    assert_eq!(status, 201, "{minted}");
    let url = app.url(&format!("/v1/runs/{run}/events?access_token={}", minted["token"].as_str().unwrap()));
    let r = app.http.get(&url).header("accept", "application/json").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let page: Value = r.json().await.unwrap();
    assert_eq!(seqs_and_kinds(&page), [(1, "run.queued".to_owned())]);
    // EventSource's own request: SSE, token in the query.
    let r = app.http.get(&url).header("accept", "text/event-stream").send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
}

#[tokio::test]
async fn access_token_in_the_query_is_refused_on_every_other_route() {
    let app = api().await;
    let run = queued_run(&app, "alice").await;
    let before = count_rows(&app).await;
    let q = format!("access_token={}", token("alice"));
    let requests = [
        app.http.get(app.url(&format!("/v1/runs/{run}?{q}"))),
        app.http.post(app.url(&format!("/v1/runs/{run}/cancel?{q}"))),
        app.http.get(app.url(&format!("/v1/runs?{q}"))),
        app.http.post(app.url(&format!("/v1/runs?{q}"))).json(&json!({"prompt": "fix the bug"})),
    ];
    for request in requests {
        assert_error(request.send().await.unwrap(), 401, "unauthorized", "missing bearer token").await;
    }
    assert_eq!(count_rows(&app).await, before);
    assert_eq!(app.get_run("alice", &run).await["status"], "queued");
}

#[tokio::test]
async fn a_bad_authorization_header_is_not_rescued_by_a_good_access_token() {
    let app = api().await;
    let run = queued_run(&app, "alice").await;
    let url = app.url(&format!("/v1/runs/{run}/events?access_token={}", token("alice")));
    let r = app.http.get(&url).header("accept", "application/json").bearer_auth("garbage").send().await.unwrap();
    assert_error(r, 401, "unauthorized", "malformed").await;
}

// ---------------------------------------------------------------------------
// 3. Bad input: a clear 4xx, and nothing written
// ---------------------------------------------------------------------------

/// Sends a `POST /v1/runs` for alice built by `build`, asserts the error,
/// and asserts not a row was written.
async fn assert_create_refused(
    build: impl FnOnce(RequestBuilder) -> RequestBuilder,
    status: u16,
    code: &str,
    why: &str,
) -> String {
    let app = api().await;
    let before = count_rows(&app).await;
    let response = build(create(&app, "alice")).send().await.unwrap();
    let message = assert_error(response, status, code, why).await;
    assert_eq!(count_rows(&app).await, before, "a refused request writes nothing");
    message
}

fn json_body(body: impl Into<String>) -> impl FnOnce(RequestBuilder) -> RequestBuilder {
    let body = body.into();
    move |r| r.header("content-type", "application/json").body(body)
}

#[tokio::test]
async fn malformed_json_is_400() {
    assert_create_refused(json_body(r#"{"prompt": "fix"#), 400, "bad_request", "malformed JSON").await;
    assert_create_refused(json_body("{prompt: 'fix'}"), 400, "bad_request", "malformed JSON").await;
    assert_create_refused(json_body(""), 400, "bad_request", "malformed JSON").await;
}

#[tokio::test]
async fn a_missing_prompt_is_422() {
    assert_create_refused(|r| r.json(&json!({})), 422, "invalid_request", "missing field `prompt`").await;
}

#[tokio::test]
async fn an_empty_or_blank_prompt_is_422() {
    for prompt in ["", "   ", " \n\t "] {
        assert_create_refused(
            |r| r.json(&json!({"prompt": prompt})),
            422,
            "invalid_request",
            "prompt must not be empty",
        )
        .await;
    }
}

#[tokio::test]
async fn a_prompt_over_64_kib_is_422_and_one_of_exactly_64_kib_is_accepted() {
    let too_long = "a".repeat(64 * 1024 + 1);
    assert_create_refused(|r| r.json(&json!({"prompt": too_long})), 422, "invalid_request", "65537 bytes").await;
    let app = api().await;
    let r = create(&app, "alice").json(&json!({"prompt": "a".repeat(64 * 1024)})).send().await.unwrap();
    assert_eq!(r.status(), 201, "the limit itself is allowed");
}

#[tokio::test]
async fn a_prompt_of_the_wrong_type_is_422() {
    assert_create_refused(|r| r.json(&json!({"prompt": 5})), 422, "invalid_request", "prompt").await;
    assert_create_refused(|r| r.json(&json!({"prompt": null})), 422, "invalid_request", "prompt").await;
}

#[tokio::test]
async fn a_model_name_that_is_empty_too_long_or_has_control_characters_is_422() {
    let long = "m".repeat(201);
    for name in ["", "a\u{0}b", "gpt\n4", long.as_str()] {
        let body = json!({"prompt": "x", "model": {"name": name}});
        // A NUL reached Postgres's jsonb and came back as a 500.
        assert_create_refused(|r| r.json(&body), 422, "invalid_request", "model.name must be 1 to 200 characters")
            .await;
    }
    let app = api().await;
    let ok = app.create_run("alice", json!({"prompt": "x", "model": {"name": "m".repeat(200)}})).await;
    assert_eq!(ok["model"]["name"].as_str().map(str::len), Some(200));
}

#[tokio::test]
async fn a_listing_cursor_outside_the_databases_time_range_is_400() {
    let app = api().await;
    let id = "00000000000000000000000000000000";
    for micros in ["-300000000000000000", "300000000000000000"] {
        let q = format!("cursor={micros}_{id}");
        // Postgres could not bind the time: a 500.
        assert_error(list_error(&app, &q).await, 400, "bad_request", "cursor").await;
    }
}

/// serde lets a struct be read from an array of its fields in order, so
/// `["fix the bug"]` would otherwise pass as `{"prompt": "fix the bug"}`.
#[tokio::test]
async fn a_body_that_is_not_a_json_object_is_422() {
    for body in [json!(["fix the bug"]), json!("fix the bug"), json!(5), json!(null)] {
        assert_create_refused(|r| r.json(&body), 422, "invalid_request", "").await;
    }
}

#[tokio::test]
async fn an_unknown_field_is_422_naming_it() {
    let m = assert_create_refused(|r| r.json(&json!({"prompt": "x", "promt": "y"})), 422, "invalid_request", "`promt`")
        .await;
    assert!(m.contains("unknown field"), "{m}");
    assert_create_refused(
        |r| r.json(&json!({"prompt": "x", "limits": {"max_step": 3}})),
        422,
        "invalid_request",
        "`max_step`",
    )
    .await;
}

/// A field of the wrong JSON type is named with what to send in JSON's
/// words (`an object`, `a non-negative whole number`), not serde's Rust
/// ones (`struct RepoSpec`, `u32`), which a client has never seen.
#[tokio::test]
async fn a_field_of_the_wrong_type_is_422_in_json_terms() {
    let body = json!({"prompt": "x", "repo": "https://example.invalid/r.git"});
    let m = assert_create_refused(|r| r.json(&body), 422, "invalid_request", "repo").await;
    assert!(m.contains("expected a JSON object") || m.contains("expected an object"), "{m}");
    assert!(!m.contains("struct") && !m.contains("RepoSpec"), "{m}");
    let body = json!({"prompt": "x", "limits": {"max_steps": "3"}});
    let m = assert_create_refused(|r| r.json(&body), 422, "invalid_request", "limits.max_steps").await;
    assert!(m.contains("expected a non-negative whole number"), "{m}");
    assert!(!m.contains("u32"), "{m}");
}

#[tokio::test]
async fn a_body_without_json_content_type_is_415() {
    let why = "Content-Type: application/json";
    assert_create_refused(|r| r.body(r#"{"prompt":"fix"}"#), 415, "unsupported_media_type", why).await;
    assert_create_refused(
        |r| r.header("content-type", "text/plain").body(r#"{"prompt":"fix"}"#),
        415,
        "unsupported_media_type",
        why,
    )
    .await;
}

#[tokio::test]
async fn a_body_over_256_kib_is_413() {
    let huge = json!({"prompt": "a".repeat(256 * 1024)}).to_string();
    assert!(huge.len() > 256 * 1024);
    assert_create_refused(json_body(huge), 413, "payload_too_large", "larger than the limit").await;
}

#[tokio::test]
async fn out_of_range_limits_are_422() {
    for (limits, why) in [
        (json!({"max_steps": 0}), "limits.max_steps"),
        (json!({"max_steps": 501}), "limits.max_steps"),
        (json!({"timeout_s": 0}), "limits.timeout_s"),
        (json!({"max_steps": -1}), "max_steps"),
    ] {
        assert_create_refused(|r| r.json(&json!({"prompt": "x", "limits": limits})), 422, "invalid_request", why).await;
    }
}

#[tokio::test]
async fn a_repo_url_git_could_misread_is_422() {
    for url in ["ext::sh -c id", "-uevil", "--upload-pack=touch /tmp/pwned", "/etc/passwd", "https://a/b c"] {
        assert_create_refused(
            |r| r.json(&json!({"prompt": "x", "repo": {"url": url}})),
            422,
            "invalid_request",
            "repo.url",
        )
        .await;
    }
}

#[tokio::test]
async fn a_repo_ref_that_looks_like_an_option_is_422() {
    for git_ref in ["-uevil", "--upload-pack=touch /tmp/pwned", "main..evil", ""] {
        assert_create_refused(
            |r| r.json(&json!({"prompt": "x", "repo": {"url": "https://example.invalid/r.git", "ref": git_ref}})),
            422,
            "invalid_request",
            "repo.ref",
        )
        .await;
    }
}

#[tokio::test]
async fn an_invalid_idempotency_key_is_400() {
    for key in ["has space", &"k".repeat(256)] {
        assert_create_refused(
            |r| r.header("idempotency-key", key).json(&json!({"prompt": "x"})),
            400,
            "bad_request",
            "Idempotency-Key",
        )
        .await;
    }
}

#[tokio::test]
async fn a_run_id_that_is_not_a_uuid_is_400() {
    let app = api().await;
    let t = token("alice");
    for request in [
        app.http.get(app.url("/v1/runs/not-a-uuid")),
        app.http.post(app.url("/v1/runs/not-a-uuid/cancel")),
        app.http.get(app.url("/v1/runs/not-a-uuid/events")),
    ] {
        assert_error(request.bearer_auth(&t).send().await.unwrap(), 400, "bad_request", "run id must be a UUID").await;
    }
}

#[tokio::test]
async fn an_unknown_run_id_is_404() {
    let app = api().await;
    let t = token("alice");
    let id = uuid::Uuid::now_v7();
    for request in [
        app.http.get(app.url(&format!("/v1/runs/{id}"))),
        app.http.post(app.url(&format!("/v1/runs/{id}/cancel"))),
        app.http.get(app.url(&format!("/v1/runs/{id}/events"))),
        app.http.get(app.url(&format!("/v1/runs/{id}/events"))).header("accept", "application/json"),
    ] {
        assert_error(request.bearer_auth(&t).send().await.unwrap(), 404, "not_found", "no run with this id").await;
    }
    assert_eq!(count_rows(&app).await, (0, 0, 0));
}

async fn list_error(app: &TestApp, query: &str) -> Response {
    app.http.get(app.url(&format!("/v1/runs?{query}"))).bearer_auth(token("alice")).send().await.unwrap()
}

#[tokio::test]
async fn listing_by_an_unknown_status_is_400() {
    let app = api().await;
    assert_error(list_error(&app, "status=bogus").await, 400, "bad_request", "unknown run status \"bogus\"").await;
}

#[tokio::test]
async fn a_listing_limit_out_of_range_is_400() {
    let app = api().await;
    for q in ["limit=0", "limit=201", "limit=1000"] {
        assert_error(list_error(&app, q).await, 400, "bad_request", "limit must be between 1 and 200").await;
    }
    for q in ["limit=-1", "limit=ten"] {
        assert_error(list_error(&app, q).await, 400, "bad_request", "limit").await;
    }
}

#[tokio::test]
async fn a_listing_cursor_the_api_did_not_issue_is_400() {
    let app = api().await;
    for q in ["cursor=bogus", "cursor=123_notauuid", "cursor=_"] {
        assert_error(list_error(&app, q).await, 400, "bad_request", "cursor").await;
    }
}

#[tokio::test]
async fn an_unknown_listing_parameter_is_400() {
    let app = api().await;
    assert_error(list_error(&app, "stauts=queued").await, 400, "bad_request", "stauts").await;
}

#[tokio::test]
async fn a_non_numeric_or_negative_resume_point_is_400() {
    let app = api().await;
    let run = queued_run(&app, "alice").await;
    let url = app.url(&format!("/v1/runs/{run}/events"));
    for accept in ["text/event-stream", "application/json"] {
        for last in ["abc", "-1", "1.5"] {
            let r = app
                .http
                .get(&url)
                .bearer_auth(token("alice"))
                .header("accept", accept)
                .header("last-event-id", last)
                .send()
                .await
                .unwrap();
            assert_error(r, 400, "bad_request", "Last-Event-ID must be a non-negative integer").await;
        }
        let r = app
            .http
            .get(format!("{url}?after=-1"))
            .bearer_auth(token("alice"))
            .header("accept", accept)
            .send()
            .await
            .unwrap();
        assert_error(r, 400, "bad_request", "after").await;
    }
}

#[tokio::test]
async fn a_resume_point_past_the_last_event_is_409_and_one_after_the_end_is_204() {
    let app = api().await;
    let run = queued_run(&app, "alice").await; // run.queued is seq 1
    let url = app.url(&format!("/v1/runs/{run}/events"));
    let get = |accept: &'static str, last: String| {
        app.http.get(&url).bearer_auth(token("alice")).header("accept", accept).header("last-event-id", last).send()
    };
    for accept in ["text/event-stream", "application/json"] {
        for last in [2, i64::MAX] {
            // Without the check, the stream waited forever for seqs that never come.
            let r =
                tokio::time::timeout(Duration::from_secs(10), get(accept, last.to_string())).await.unwrap().unwrap();
            // Well formed (the document allows any seq), but not yet: 409.
            assert_error(r, 409, "conflict", "past this run's last event (1)").await;
        }
    }
    let r = app.http.post(app.url(&format!("/v1/runs/{run}/cancel"))).bearer_auth(token("alice")).send().await.unwrap();
    assert_eq!(r.status(), 200);

    // Resuming after the terminal event (seq 2): nothing to stream, and the
    // stream says so at once instead of staying open.
    let r = tokio::time::timeout(Duration::from_secs(10), get("text/event-stream", "2".into())).await.unwrap().unwrap();
    assert_eq!(r.status(), 204, "an EventSource stops reconnecting on 204");
    let page: Value = get("application/json", "2".into()).await.unwrap().json().await.unwrap();
    assert_eq!(page["events"], json!([]));
    assert_eq!(page["done"], true, "a client paging after the end is told it is done");
    // Resuming before it: the terminal event, then the stream ends.
    let r = get("text/event-stream", "1".into()).await.unwrap();
    assert_eq!(r.status(), 200);
    let body = tokio::time::timeout(Duration::from_secs(10), r.text()).await.unwrap().unwrap();
    assert!(body.contains("id: 2\nevent: run.cancelled"), "{body}");
}

/// A read of the events is bounded in bytes but always returns at least
/// one event: with a bound smaller than any event, the JSON form pages one
/// event at a time and the stream still sends every event, from its first
/// read (the one that also checks the run) on.
#[tokio::test]
async fn an_event_larger_than_the_page_bound_still_comes_one_per_read() {
    let api = kiln_api::ApiSettings { event_page_bytes: 1, ..Default::default() };
    let app = TestApp::spawn(Options { worker: false, api, ..Default::default() }).await;
    let run = queued_run(&app, "alice").await; // run.queued is seq 1
    let r = app.http.post(app.url(&format!("/v1/runs/{run}/cancel"))).bearer_auth(token("alice")).send().await.unwrap();
    assert_eq!(r.status(), 200); // run.cancelled is seq 2
    let url = app.url(&format!("/v1/runs/{run}/events"));
    let page = |after: i64| {
        app.http.get(format!("{url}?after={after}")).bearer_auth(token("alice")).header("accept", "application/json")
    };
    let first: Value = page(0).send().await.unwrap().json().await.unwrap();
    assert_eq!(seqs_and_kinds(&first), [(1, "run.queued".to_owned())], "{first}");
    assert_eq!((first["next_after"].as_i64(), first["done"].as_bool()), (Some(1), Some(false)));
    let second: Value = page(1).send().await.unwrap().json().await.unwrap();
    assert_eq!(seqs_and_kinds(&second), [(2, "run.cancelled".to_owned())], "{second}");
    assert_eq!(second["done"], true);

    let r = app.http.get(&url).bearer_auth(token("alice")).header("accept", "text/event-stream").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let body = tokio::time::timeout(Duration::from_secs(10), r.text()).await.unwrap().unwrap();
    assert!(body.contains("id: 1\nevent: run.queued") && body.contains("id: 2\nevent: run.cancelled"), "{body}");
}

#[tokio::test]
async fn an_unknown_route_is_404_json() {
    let app = api().await;
    for path in ["/nope", "/v1", "/v1/nope", "/v2/runs", "/v1/runs/x/y/z"] {
        let r = app.http.get(app.url(path)).bearer_auth(token("alice")).send().await.unwrap();
        assert_error(r, 404, "not_found", "no such route").await;
    }
}

#[tokio::test]
async fn a_wrong_method_is_405_json() {
    let app = api().await;
    let run = queued_run(&app, "alice").await;
    for (method, path) in [
        (Method::DELETE, "/v1/runs".to_owned()),
        (Method::PUT, format!("/v1/runs/{run}")),
        (Method::GET, format!("/v1/runs/{run}/cancel")),
        (Method::POST, format!("/v1/runs/{run}/events")),
    ] {
        let r = app.http.request(method.clone(), app.url(&path)).bearer_auth(token("alice")).send().await.unwrap();
        assert_eq!(r.status(), 405, "{method} {path}");
        let (_, code, _) = error_of(r).await;
        assert_eq!(code, "method_not_allowed", "{method} {path}");
    }
}

// ---------------------------------------------------------------------------
// 4. Idempotency
// ---------------------------------------------------------------------------

async fn create_with_key(app: &TestApp, sub: &str, key: &str) -> (StatusCode, String) {
    let r =
        create(app, sub).header("idempotency-key", key).json(&json!({"prompt": "fix the bug"})).send().await.unwrap();
    let status = r.status();
    let run: Value = r.json().await.unwrap();
    (status, run["id"].as_str().unwrap_or_else(|| panic!("no run in {run}")).to_owned())
}

#[tokio::test]
async fn a_repeated_idempotency_key_returns_the_first_run() {
    let app = api().await;
    let (first_status, first) = create_with_key(&app, "alice", "key-1").await;
    let (second_status, second) = create_with_key(&app, "alice", "key-1").await;
    assert_eq!(first_status, 201);
    assert_eq!(second_status, 200, "a replay is not a creation");
    assert_eq!(second, first);
    assert_eq!(count_rows(&app).await, (1, 1, 1), "one run, one session, one run.queued");
}

#[tokio::test]
async fn the_same_key_from_another_subject_is_another_run() {
    let app = api().await;
    let (_, alices) = create_with_key(&app, "alice", "shared-key").await;
    let (status, bobs) = create_with_key(&app, "bob", "shared-key").await;
    assert_eq!(status, 201);
    assert_ne!(bobs, alices);
    assert_eq!(count_rows(&app).await.0, 2);
}

#[tokio::test]
async fn a_different_key_is_another_run() {
    let app = api().await;
    let (_, a) = create_with_key(&app, "alice", "key-a").await;
    let (status, b) = create_with_key(&app, "alice", "key-b").await;
    assert_eq!(status, 201);
    assert_ne!(a, b);
    assert_eq!(count_rows(&app).await.0, 2);
}

#[tokio::test]
async fn concurrent_duplicates_create_exactly_one_run() {
    let app = api().await;
    let results = join_all((0..8).map(|_| create_with_key(&app, "alice", "same-key"))).await;
    let ids: Vec<&str> = results.iter().map(|(_, id)| id.as_str()).collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "every request gets the same run: {ids:?}");
    let created = results.iter().filter(|(s, _)| *s == 201).count();
    let replayed = results.iter().filter(|(s, _)| *s == 200).count();
    assert_eq!((created, replayed), (1, 7), "{results:?}");
    assert_eq!(count_rows(&app).await, (1, 1, 1), "no duplicate run, no orphaned session, one run.queued");
}

// ---------------------------------------------------------------------------
// 5. Listing and cancelling
// ---------------------------------------------------------------------------

async fn list(app: &TestApp, sub: &str, query: &str) -> Value {
    let r = app.http.get(app.url(&format!("/v1/runs?{query}"))).bearer_auth(token(sub)).send().await.unwrap();
    assert_eq!(r.status(), 200, "GET /v1/runs?{query}");
    r.json().await.unwrap()
}

fn ids_of(page: &Value) -> Vec<String> {
    page["runs"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test]
async fn a_listing_pages_newest_first_visiting_each_run_once() {
    let app = api().await;
    let mut created = Vec::new();
    for _ in 0..5 {
        created.push(queued_run(&app, "alice").await);
    }
    let mut seen = Vec::new();
    let mut pages = 0;
    let mut query = "limit=2".to_owned();
    loop {
        let page = list(&app, "alice", &query).await;
        pages += 1;
        let ids = ids_of(&page);
        assert!(!ids.is_empty() && ids.len() <= 2, "page {pages}: {ids:?}");
        seen.extend(ids);
        match page["next_cursor"].as_str() {
            Some(cursor) => query = format!("limit=2&cursor={cursor}"),
            None => break,
        }
        assert!(pages < 10, "paging does not terminate");
    }
    let newest_first: Vec<String> = created.iter().rev().cloned().collect();
    assert_eq!(seen, newest_first);
    assert_eq!(pages, 3);
}

#[tokio::test]
async fn a_listing_filters_by_status() {
    let app = api().await;
    let mut created = Vec::new();
    for _ in 0..5 {
        created.push(queued_run(&app, "alice").await);
    }
    let queued = ids_of(&list(&app, "alice", "status=queued").await);
    assert_eq!(queued, created.iter().rev().cloned().collect::<Vec<_>>());
    let succeeded = list(&app, "alice", "status=succeeded").await;
    assert_eq!(ids_of(&succeeded), Vec::<String>::new());
    assert_eq!(succeeded["next_cursor"], Value::Null);
}

#[tokio::test]
async fn cancelling_a_queued_run_ends_it_with_run_cancelled() {
    let app = api().await;
    let run = queued_run(&app, "alice").await;
    let r = app.http.post(app.url(&format!("/v1/runs/{run}/cancel"))).bearer_auth(token("alice")).send().await.unwrap();
    assert_eq!(r.status(), 200, "a queued run is cancelled at once");
    let cancelled: Value = r.json().await.unwrap();
    assert_eq!(cancelled["id"], run.as_str());
    assert_eq!(cancelled["status"], "cancelled");
    assert!(cancelled["finished_at"].is_string());
    assert_eq!(cancelled["last_event_seq"], 2);
    assert_eq!(app.get_run("alice", &run).await["status"], "cancelled");

    let page = events_json(&app, "alice", &run).await;
    assert_eq!(seqs_and_kinds(&page), [(1, "run.queued".to_owned()), (2, "run.cancelled".to_owned())]);
    assert_eq!(page["done"], true);
    assert_eq!(page["next_after"], 2);

    let listed = ids_of(&list(&app, "alice", "status=cancelled").await);
    assert_eq!(listed, [run.as_str()]);
    assert_eq!(ids_of(&list(&app, "alice", "status=queued").await), Vec::<String>::new());
}

#[tokio::test]
async fn cancelling_a_finished_run_is_409() {
    let app = api().await;
    let run = queued_run(&app, "alice").await;
    let url = app.url(&format!("/v1/runs/{run}/cancel"));
    assert_eq!(app.http.post(&url).bearer_auth(token("alice")).send().await.unwrap().status(), 200);
    let before = count_rows(&app).await;
    let r = app.http.post(&url).bearer_auth(token("alice")).send().await.unwrap();
    assert_error(r, 409, "conflict", "already finished with status cancelled").await;
    assert_eq!(count_rows(&app).await, before, "no second run.cancelled");
}

// ---------------------------------------------------------------------------
// 6. SSE with no worker
// ---------------------------------------------------------------------------

#[tokio::test]
async fn sse_for_a_queued_run_starts_with_run_queued() {
    let app = api().await;
    let run = queued_run(&app, "alice").await;
    let r = sse_request(&app, "alice", &run).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let mut stream = r.bytes_stream();
    let mut text = String::new();
    read_sse_until(&mut stream, &mut text, Duration::from_secs(5), |t| t.contains("\n\n")).await;
    let first = text.split("\n\n").next().unwrap();
    let lines: Vec<&str> = first.lines().filter(|l| !l.starts_with(':')).collect();
    assert!(lines.contains(&"id: 1"), "{first:?}");
    assert!(lines.contains(&"event: run.queued"), "{first:?}");
    let data = lines.iter().find_map(|l| l.strip_prefix("data: ")).unwrap_or_else(|| panic!("no data in {first:?}"));
    let payload: Value = serde_json::from_str(data).unwrap();
    assert_eq!(payload["prompt"], "fix the bug");
}

#[tokio::test]
async fn an_idle_sse_stream_gets_keep_alive_comments() {
    let app = api().await;
    let run = queued_run(&app, "alice").await;
    let r = sse_request(&app, "alice", &run).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let mut stream = r.bytes_stream();
    let mut text = String::new();
    // The harness sets the keep-alive interval to 1 s.
    read_sse_until(&mut stream, &mut text, Duration::from_secs(5), |t| t.lines().any(|l| l == ": keep-alive")).await;
    assert!(text.starts_with("id: 1\n"), "the backlog comes first: {text:?}");
    assert!(!text.contains("id: 2"), "nothing happens to a queued run without a worker: {text:?}");
}

#[tokio::test]
async fn an_open_sse_stream_receives_run_cancelled_and_then_ends() {
    let app = api().await;
    let run = queued_run(&app, "alice").await;
    let r = sse_request(&app, "alice", &run).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let mut stream = r.bytes_stream();
    let mut text = String::new();
    read_sse_until(&mut stream, &mut text, Duration::from_secs(5), |t| t.contains("event: run.queued\n")).await;

    let cancel = app.http.post(app.url(&format!("/v1/runs/{run}/cancel"))).bearer_auth(token("alice")).send().await;
    assert_eq!(cancel.unwrap().status(), 200);

    read_sse_until(&mut stream, &mut text, Duration::from_secs(5), |t| t.contains("event: run.cancelled\n")).await;
    assert!(text.contains("id: 2\nevent: run.cancelled\n"), "{text:?}");
    // After the terminal event the server closes the stream.
    let rest = tokio::time::timeout(Duration::from_secs(5), async {
        let mut rest = String::new();
        while let Some(chunk) = stream.next().await {
            rest.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        }
        rest
    })
    .await
    .expect("the stream ends after the terminal event");
    assert!(!rest.contains("id: "), "no event after the terminal one: {rest:?}");
}

// ---------------------------------------------------------------------------
// 7. Abuse limits
// ---------------------------------------------------------------------------

async fn limited(quota: kiln_store::Quota, max_sse: usize) -> TestApp {
    let api = kiln_api::ApiSettings {
        quota,
        max_sse_per_subject: max_sse,
        sse_keep_alive: std::time::Duration::from_millis(200),
        ..Default::default()
    };
    TestApp::spawn(Options { worker: false, api, ..Default::default() }).await
}

async fn try_create(app: &TestApp, sub: &str) -> Response {
    app.http.post(app.url("/v1/runs")).bearer_auth(token(sub)).json(&json!({"prompt": "p"})).send().await.unwrap()
}

#[tokio::test]
async fn a_subject_over_its_active_run_limit_gets_429_with_retry_after() {
    let app = limited(kiln_store::Quota { max_active_runs: 2, max_runs_per_minute: 100 }, 8).await;
    let first = try_create(&app, "alice").await.json::<Value>().await.unwrap();
    assert_eq!(try_create(&app, "alice").await.status(), 201);
    let refused = try_create(&app, "alice").await;
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().get("retry-after").is_some());
    let (_, code, message) = error_of(refused).await;
    assert_eq!(code, "too_many_requests");
    assert!(message.contains("active runs"), "{message}");
    assert_eq!(try_create(&app, "bob").await.status(), 201, "other subjects are not limited by alice");
    // Finishing one frees a slot.
    let id = first["id"].as_str().unwrap();
    app.http.post(app.url(&format!("/v1/runs/{id}/cancel"))).bearer_auth(token("alice")).send().await.unwrap();
    assert_eq!(try_create(&app, "alice").await.status(), 201);
}

#[tokio::test]
async fn a_subject_creating_runs_too_fast_gets_429_until_the_minute_passes() {
    let app = limited(kiln_store::Quota { max_active_runs: 100, max_runs_per_minute: 3 }, 8).await;
    for _ in 0..3 {
        assert_eq!(try_create(&app, "alice").await.status(), 201);
    }
    let refused = try_create(&app, "alice").await;
    assert_eq!(refused.status(), 429);
    let retry: u64 = refused.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    let (runs, _, _) = count_rows(&app).await;
    assert_eq!(runs, 3, "nothing written for the refused request");
}

/// One subject's submissions are no longer lined up behind a lock held
/// across a transaction's round trips (issue 33): each checks and inserts in
/// one statement. Sent all at once, they must still admit exactly the quota.
#[tokio::test]
async fn concurrent_submissions_by_one_subject_admit_exactly_its_quota() {
    const QUOTA: i64 = 5;
    const SENT: usize = 48;
    let app = limited(kiln_store::Quota { max_active_runs: QUOTA, max_runs_per_minute: 1000 }, 8).await;
    slow_run_inserts(&app).await;
    let statuses: Vec<u16> =
        join_all((0..SENT).map(|_| try_create(&app, "alice"))).await.iter().map(|r| r.status().as_u16()).collect();
    let admitted = statuses.iter().filter(|&&s| s == 201).count();
    let refused = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!((admitted, refused), (QUOTA as usize, SENT - QUOTA as usize), "{statuses:?}");
    assert_eq!(count_rows(&app).await, (QUOTA, QUOTA, QUOTA), "runs, sessions and events of the admitted only");

    // The same for the runs-per-minute limit, counted by another subject.
    let app = limited(kiln_store::Quota { max_active_runs: 1000, max_runs_per_minute: QUOTA }, 8).await;
    slow_run_inserts(&app).await;
    let statuses: Vec<u16> =
        join_all((0..SENT).map(|_| try_create(&app, "bob"))).await.iter().map(|r| r.status().as_u16()).collect();
    assert_eq!(statuses.iter().filter(|&&s| s == 201).count(), QUOTA as usize, "{statuses:?}");
    assert_eq!(count_rows(&app).await.0, QUOTA);
}

/// Makes every insert into `runs` of this test's database take 100 ms, so
/// that a submission's count and its insert are far apart: without the
/// per-subject lock around both, every submission in flight would count
/// the same runs and all would be admitted.
async fn slow_run_inserts(app: &TestApp) {
    app.sql()
        .await
        .batch_execute(
            "CREATE FUNCTION test_slow_insert() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN PERFORM pg_sleep(0.1); RETURN NEW; END $$;
             CREATE TRIGGER test_slow_insert BEFORE INSERT ON runs
                 FOR EACH ROW EXECUTE FUNCTION test_slow_insert();",
        )
        .await
        .unwrap();
}

/// A group of N attempts is N + 1 active runs (the group and its attempts),
/// checked under the same lock as single runs submitted beside it.
#[tokio::test]
async fn a_group_of_attempts_counts_as_its_runs_against_the_quota() {
    let app = limited(kiln_store::Quota { max_active_runs: 4, max_runs_per_minute: 1000 }, 8).await;
    let group = app
        .http
        .post(app.url("/v1/runs"))
        .bearer_auth(token("alice"))
        .json(&json!({"prompt": "p", "attempts": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(group.status(), 201, "{:?}", group.text().await);
    // Three active runs: one more single run fits, the next does not.
    let statuses: Vec<u16> =
        join_all((0..8).map(|_| try_create(&app, "alice"))).await.iter().map(|r| r.status().as_u16()).collect();
    assert_eq!(statuses.iter().filter(|&&s| s == 201).count(), 1, "{statuses:?}");
    assert_eq!(count_rows(&app).await.0, 4);
}

#[tokio::test]
async fn a_subject_may_hold_only_so_many_event_streams() {
    let app = limited(kiln_store::Quota { max_active_runs: 10, max_runs_per_minute: 100 }, 1).await;
    let run = app.create_run("alice", json!({"prompt": "p"})).await;
    let id = run["id"].as_str().unwrap();
    let open = || {
        app.http
            .get(app.url(&format!("/v1/runs/{id}/events")))
            .bearer_auth(token("alice"))
            .header("accept", "text/event-stream")
            .send()
    };
    let held = open().await.unwrap();
    assert_eq!(held.status(), 200);
    let refused = open().await.unwrap();
    assert_eq!(refused.status(), 429);
    drop(held);
    // The server notices the closed stream at its next keep-alive write.
    let mut status = 0;
    for _ in 0..50 {
        status = open().await.unwrap().status().as_u16();
        if status == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(status, 200, "the slot is given back when the stream closes");
}

#[tokio::test]
async fn shutting_down_the_api_ends_open_event_streams() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let run = app.create_run("alice", json!({"prompt": "p"})).await;
    let id = run["id"].as_str().unwrap();
    let response = app
        .http
        .get(app.url(&format!("/v1/runs/{id}/events")))
        .bearer_auth(token("alice"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let first = tokio::time::timeout(Duration::from_secs(5), body.next()).await.unwrap().unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("run.queued"));
    // The run is queued, so without a shutdown the stream would stay open.
    app.shutdown.cancel();
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(chunk) = body.next().await {
            if chunk.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the stream ends when the API shuts down");
}
