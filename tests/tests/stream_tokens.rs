//! Stream tokens: `POST /v1/runs/{id}/stream-token` mints a short-lived
//! token for one run's event stream, the only thing `?access_token=`
//! accepts. It reads its own run's events, and nothing else: not another
//! run's events, not any route as a bearer token, not after it expires. A
//! long-lived bearer token in the query string (where proxies log it) is
//! refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use kiln_tests::{Options, TestApp, token};
use serde_json::{Value, json};

const SUB: &str = "alice";

async fn app(ttl: Option<Duration>) -> TestApp {
    let mut options = Options { worker: false, ..Default::default() };
    if let Some(ttl) = ttl {
        options.api.stream_token_ttl = ttl;
    }
    TestApp::spawn(options).await
}

/// A queued run of `sub` (no worker: it stays queued, with its first event).
async fn run_of(app: &TestApp, sub: &str) -> String {
    let run = app.create_run(sub, json!({"prompt": "wait"})).await;
    run["id"].as_str().unwrap().to_owned()
}

/// Mints a stream token for `run` as `sub`: the status and the answer.
async fn mint(app: &TestApp, sub: &str, run: &str) -> (u16, Value) {
    app.post_json(sub, &format!("/v1/runs/{run}/stream-token"), json!({})).await
}

/// `GET /v1/runs/{run}/events?access_token=…` as a JSON page.
async fn events_with_query_token(app: &TestApp, run: &str, token: &str) -> (u16, Value) {
    // Tokens are URL-safe (hex, a UUID, a JWT's base64url and dots).
    let url = app.url(&format!("/v1/runs/{run}/events?access_token={token}"));
    let r = app.http.get(url).header("accept", "application/json").send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn assert_refused(status: u16, body: &Value, what: &str) {
    assert!(status == 401 || status == 403, "{what}: {status} {body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: a JSON error: {body}");
}

#[tokio::test]
async fn a_stream_token_reads_its_runs_events_and_nothing_else() {
    let app = app(None).await;
    let run = run_of(&app, SUB).await;
    let other = run_of(&app, SUB).await;

    let (status, minted) = mint(&app, SUB, &run).await;
    assert_eq!(status, 201, "{minted}");
    let stream_token = minted["token"].as_str().unwrap().to_owned();
    let expires_at = chrono::DateTime::parse_from_rfc3339(minted["expires_at"].as_str().unwrap()).unwrap();
    let left = expires_at.signed_duration_since(chrono::Utc::now());
    assert!(left > chrono::Duration::seconds(60) && left <= chrono::Duration::seconds(600), "{left}");

    // Its own run's events, in the query string.
    let (status, page) = events_with_query_token(&app, &run, &stream_token).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["events"][0]["kind"], "run.queued", "{page}");
    // And as SSE, as EventSource asks.
    let url = app.url(&format!("/v1/runs/{run}/events?access_token={stream_token}"));
    let r = app.http.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    drop(r);

    // Another run of the same subject: refused.
    let (status, body) = events_with_query_token(&app, &other, &stream_token).await;
    assert_refused(status, &body, "another run's events");

    // Edited to name the other run (the tag kept): refused.
    assert!(stream_token.contains(&run), "the token names its run");
    let forged = stream_token.replacen(&run, &other, 1);
    let (status, body) = events_with_query_token(&app, &other, &forged).await;
    assert_refused(status, &body, "a stream token edited to name another run");

    // As a bearer token, anywhere (its own run's events included).
    let bearer = |method: reqwest::Method, path: String| {
        app.http.request(method, app.url(&path)).bearer_auth(&stream_token).header("accept", "application/json")
    };
    for (method, path) in [
        (reqwest::Method::GET, format!("/v1/runs/{run}")),
        (reqwest::Method::GET, "/v1/runs".to_owned()),
        (reqwest::Method::GET, format!("/v1/runs/{run}/events")),
        (reqwest::Method::POST, format!("/v1/runs/{run}/cancel")),
        (reqwest::Method::POST, format!("/v1/runs/{run}/stream-token")),
        (reqwest::Method::GET, "/v1/callback-key".to_owned()),
    ] {
        let r = bearer(method.clone(), path.clone()).json(&json!({})).send().await.unwrap();
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        assert_refused(status, &body, &format!("{method} {path} with a stream token as bearer"));
    }
    // In the query string of any other route.
    let r = app.http.get(app.url(&format!("/v1/runs/{run}?access_token={stream_token}"))).send().await.unwrap();
    assert_eq!(r.status(), 401);

    // The run is still queued: the cancel above did nothing.
    assert_eq!(app.get_run(SUB, &run).await["status"], "queued");
}

#[tokio::test]
async fn a_long_lived_token_in_the_query_string_is_refused() {
    let app = app(None).await;
    let run = run_of(&app, SUB).await;
    let (status, body) = events_with_query_token(&app, &run, &token(SUB)).await;
    assert_refused(status, &body, "a bearer token in ?access_token=");
    assert!(body["error"]["message"].as_str().unwrap().contains("stream-token"), "says what to use: {body}");
    // The header still works.
    let r = app
        .http
        .get(app.url(&format!("/v1/runs/{run}/events")))
        .bearer_auth(token(SUB))
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn only_the_runs_owner_mints_and_a_stream_token_expires() {
    let app = app(Some(Duration::from_secs(1))).await;
    let run = run_of(&app, SUB).await;
    // Someone else's run is not there for them.
    let (status, body) = mint(&app, "mallory", &run).await;
    assert_eq!(status, 404, "{body}");

    let (status, minted) = mint(&app, SUB, &run).await;
    assert_eq!(status, 201, "{minted}");
    let stream_token = minted["token"].as_str().unwrap().to_owned();
    let (status, body) = events_with_query_token(&app, &run, &stream_token).await;
    assert_eq!(status, 200, "{body}");
    // No leeway: a second after its expiry it is refused.
    let expires_at = chrono::DateTime::parse_from_rfc3339(minted["expires_at"].as_str().unwrap()).unwrap();
    let wait = expires_at.signed_duration_since(chrono::Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(50)).await;
    let (status, body) = events_with_query_token(&app, &run, &stream_token).await;
    assert_refused(status, &body, "an expired stream token");
    assert!(body["error"]["message"].as_str().unwrap().contains("expired"), "{body}");
}
