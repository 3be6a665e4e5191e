//! Completion callbacks end to end: a run naming a `callback_url` is POSTed
//! its final state when it ends, signed with HMAC-SHA256, to a receiver the
//! test runs on 127.0.0.1; a receiver answering 500 is retried (a 429 no
//! sooner than its Retry-After; a 4xx or a redirect not at all); a run
//! cancelled while queued or failed by the reaper calls back too, and so does
//! a follow-up; a callback a dead worker held is taken over once its lease
//! runs out; bad URLs and a deployment without a callback secret are refused
//! at submission; and a worker that does not allow private targets refuses a
//! loopback one without sending anything.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use hmac::{Hmac, KeyInit, Mac};
use kiln_protocol::{CreateRun, EventBody, Run};
use kiln_tests::kiln_scripted_model::Reply;
use kiln_tests::{Event, Options, TestApp, kinds, token, worker_config};
use kiln_worker::ProviderKind;
use kiln_worker::callbacks::{CallbackSecret, CallbackSettings};
use serde_json::{Value, json};
use sha2::Sha256;
use uuid::Uuid;

const CALLBACK_SECRET: &str = "callback-test-secret-0123456789";
const SUB: &str = "alice";

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Received {
    headers: HeaderMap,
    body: Bytes,
    at: Instant,
}

/// A webhook receiver on 127.0.0.1 that records what it gets and answers
/// with the planned statuses in turn (200 once they run out).
#[derive(Clone, Default)]
struct Receiver {
    received: Arc<Mutex<Vec<Received>>>,
    plan: Arc<Mutex<VecDeque<u16>>>,
}

impl Receiver {
    async fn start(plan: &[u16]) -> (Receiver, SocketAddr) {
        let receiver = Receiver::default();
        receiver.plan.lock().unwrap().extend(plan);
        let app = axum::Router::new().route("/hook", axum::routing::post(receive)).with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, addr)
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// A 429 asks for a second's wait; a 3xx points elsewhere on the receiver
/// (which records what arrives there too).
async fn receive(State(r): State<Receiver>, headers: HeaderMap, body: Bytes) -> (StatusCode, HeaderMap) {
    r.received.lock().unwrap().push(Received { headers, body, at: Instant::now() });
    let status = r.plan.lock().unwrap().pop_front().unwrap_or(200);
    let mut answer = HeaderMap::new();
    if status == 429 {
        answer.insert("retry-after", "1".parse().unwrap());
    }
    if (300..400).contains(&status) {
        answer.insert("location", "/hook".parse().unwrap());
    }
    (StatusCode::from_u16(status).unwrap(), answer)
}

/// What a receiver does first: check `X-Kiln-Signature-256` over the raw
/// body with its tenant key (from `GET /v1/callback-key`).
fn signature_verifies(r: &Received, key: &[u8]) -> bool {
    let Some(header) = r.headers.get("x-kiln-signature-256").and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let Some(hex_tag) = header.strip_prefix("sha256=") else { return false };
    let Ok(tag) = hex::decode(hex_tag) else { return false };
    let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
    mac.update(&r.body);
    mac.verify_slice(&tag).is_ok()
}

/// `sub`'s callback key, as the API hands it to `sub`.
async fn callback_key(app: &TestApp, sub: &str) -> Vec<u8> {
    let r = app.http.get(app.url("/v1/callback-key")).bearer_auth(token(sub)).send().await.unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["subject"], sub, "{body}");
    assert_eq!(body["algorithm"], "hmac-sha256", "{body}");
    hex::decode(body["key"].as_str().unwrap()).unwrap()
}

fn callback_settings(allow_private: bool) -> CallbackSettings {
    CallbackSettings {
        allow_private,
        max_attempts: 4,
        base_delay: Duration::from_millis(100),
        max_delay: Duration::from_secs(1),
        timeout: Duration::from_secs(5),
        poll: Duration::from_millis(200),
        lease: Duration::from_secs(6),
        ..CallbackSettings::new(CallbackSecret::new(CALLBACK_SECRET.as_bytes()).unwrap())
    }
}

/// Kiln with callbacks accepted by the API; no worker yet.
async fn app(script: Vec<Reply>) -> TestApp {
    let mut options = Options { script, worker: false, ..Default::default() };
    options.api.callback_secret = Some(CALLBACK_SECRET.as_bytes().to_vec().into());
    TestApp::spawn(options).await
}

async fn start_worker(app: &TestApp, allow_private: bool) {
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    config.callbacks = Some(callback_settings(allow_private));
    app.start_worker(config).await;
}

/// Submits a run as raw JSON, for the refusals (a run Kiln takes is
/// submitted with [`TestApp::submit`]).
async fn create(app: &TestApp, body: Value) -> reqwest::Response {
    app.http.post(app.url("/v1/runs")).bearer_auth(token(SUB)).json(&body).send().await.unwrap()
}

/// A run that calls back to `url` when it ends.
async fn submit(app: &TestApp, prompt: &str, url: &str) -> Run {
    app.submit(SUB, CreateRun { callback_url: Some(url.to_owned()), ..CreateRun::new(prompt) }).await
}

/// One callback attempt as the run's record shows it: a
/// `callback.succeeded` (`ok`) or `callback.failed` event.
#[derive(Debug)]
struct Attempt<'a> {
    ok: bool,
    attempt: u32,
    status: Option<u16>,
    error: Option<&'a str>,
    retry_in_ms: Option<u64>,
    delivery_id: &'a str,
}

fn callback_events(evs: &[Event]) -> Vec<Attempt<'_>> {
    evs.iter()
        .filter_map(|e| match &e.body {
            EventBody::CallbackSucceeded { attempt, status, delivery_id } => Some(Attempt {
                ok: true,
                attempt: *attempt,
                status: Some(*status),
                error: None,
                retry_in_ms: None,
                delivery_id,
            }),
            EventBody::CallbackFailed { attempt, status, error, delivery_id, retry_in_ms } => Some(Attempt {
                ok: false,
                attempt: *attempt,
                status: *status,
                error: Some(error),
                retry_in_ms: *retry_in_ms,
                delivery_id,
            }),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_finished_run_posts_its_final_state_signed() {
    let app = app(vec![Reply::text("all done")]).await;
    start_worker(&app, true).await;
    let (receiver, addr) = Receiver::start(&[]).await;
    let url = format!("http://{addr}/hook");
    let run = submit(&app, "say done", &url).await;
    assert_eq!(run.callback_url.as_deref(), Some(url.as_str()), "the run shows where it calls back");
    let id = run.id;

    let evs = app.wait_for_event(id, "callback.succeeded").await;
    let got = receiver.received();
    assert_eq!(got.len(), 1, "one request");
    let req = &got[0];
    assert!(signature_verifies(req, &callback_key(&app, SUB).await), "signature verifies with the owner's key");
    assert_eq!(req.headers["content-type"], "application/json");
    assert_eq!(req.headers["x-kiln-event"], "run.succeeded");
    let sent_at: i64 = req.headers["x-kiln-timestamp"].to_str().unwrap().parse().unwrap();
    assert!((chrono::Utc::now().timestamp() - sent_at).abs() < 120, "timestamp is now-ish");

    let body: Value = serde_json::from_slice(&req.body).unwrap();
    assert_eq!(body["event"], "run.succeeded");
    assert_eq!(body["delivery_id"], req.headers["x-kiln-delivery"].to_str().unwrap());
    // The run as the API shows it, but for the callback's own events since
    // (compared as JSON: the body is what the receiver got).
    let mut shown = app.get_run(SUB, &id.to_string()).await;
    let mut sent = body["run"].clone();
    assert_eq!(sent["status"], "succeeded");
    assert_eq!(sent["result"]["summary"], "all done");
    assert!(sent["last_event_seq"].as_i64().unwrap() < shown["last_event_seq"].as_i64().unwrap());
    sent.as_object_mut().unwrap().remove("last_event_seq");
    shown.as_object_mut().unwrap().remove("last_event_seq");
    assert_eq!(sent, shown);

    // The attempt is on the run's record, after the terminal event.
    let cb = callback_events(&evs);
    assert_eq!(cb.len(), 1, "{:?}", kinds(&evs));
    assert_eq!(cb[0].attempt, 1);
    assert_eq!(cb[0].status, Some(200));
    assert_eq!(body["delivery_id"], cb[0].delivery_id);
    let terminal = evs.iter().position(|e| matches!(e.body, EventBody::RunSucceeded { .. })).unwrap();
    let callback = evs.iter().position(|e| matches!(e.body, EventBody::CallbackSucceeded { .. })).unwrap();
    assert!(terminal < callback);
}

/// Tenants do not share a key: a callback for alice's run verifies with the
/// key alice gets from the API, not with bob's (nor with the deployment's
/// secret, which no tenant holds), and its signed body names alice.
#[tokio::test]
async fn a_callback_verifies_with_its_owners_key_only() {
    let app = app(vec![Reply::text("all done")]).await;
    start_worker(&app, true).await;
    let (receiver, addr) = Receiver::start(&[]).await;
    let run = submit(&app, "say done", &format!("http://{addr}/hook")).await;
    app.wait_for_event(run.id, "callback.succeeded").await;
    let got = receiver.received();
    assert_eq!(got.len(), 1);

    let alice = callback_key(&app, SUB).await;
    let bob = callback_key(&app, "bob").await;
    assert_eq!(alice.len(), 32);
    assert_ne!(alice, bob);
    assert!(signature_verifies(&got[0], &alice), "alice's key verifies her run's callback");
    assert!(!signature_verifies(&got[0], &bob), "bob's key does not");
    assert!(!signature_verifies(&got[0], CALLBACK_SECRET.as_bytes()), "nor the deployment secret itself");
    assert_eq!(got[0].headers["x-kiln-signature-key"], "v1", "the header names the key scheme");
    let body: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(body["owner"], SUB, "the signed body names the owner");

    // The key is handed out only to a caller with a token, and only its own.
    let r = app.http.get(app.url("/v1/callback-key")).send().await.unwrap();
    assert_eq!(r.status(), 401);
}

#[tokio::test]
async fn a_receiver_answering_500_is_retried_with_the_same_delivery_id() {
    let app = app(vec![Reply::text("done")]).await;
    start_worker(&app, true).await;
    let (receiver, addr) = Receiver::start(&[500]).await;
    let id = submit(&app, "p", &format!("http://{addr}/hook")).await.id;

    let evs = app.wait_for_event(id, "callback.succeeded").await;
    let cb = callback_events(&evs);
    assert_eq!(kinds(&evs).iter().filter(|k| k.starts_with("callback.")).count(), 2, "{:?}", kinds(&evs));
    assert!(!cb[0].ok, "{:?}", cb[0]);
    assert_eq!(cb[0].attempt, 1);
    assert_eq!(cb[0].status, Some(500));
    assert!(cb[0].error.unwrap().contains("500"), "{:?}", cb[0]);
    assert!(cb[0].retry_in_ms.is_some(), "a retry was announced: {:?}", cb[0]);
    assert!(cb[1].ok, "{:?}", cb[1]);
    assert_eq!(cb[1].attempt, 2);
    assert_eq!(cb[1].status, Some(200));

    let got = receiver.received();
    assert_eq!(got.len(), 2);
    let key = callback_key(&app, SUB).await;
    assert!(got.iter().all(|r| signature_verifies(r, &key)));
    assert_eq!(got[0].headers["x-kiln-delivery"], got[1].headers["x-kiln-delivery"], "receivers can dedupe");
    assert_eq!(cb[0].delivery_id, got[0].headers["x-kiln-delivery"].to_str().unwrap());
}

#[tokio::test]
async fn a_run_cancelled_while_queued_calls_back() {
    let app = app(Vec::new()).await;
    let (receiver, addr) = Receiver::start(&[]).await;
    let id = submit(&app, "never runs", &format!("http://{addr}/hook")).await.id;
    let cancel = app.http.post(app.url(&format!("/v1/runs/{id}/cancel"))).bearer_auth(token(SUB)).send().await.unwrap();
    assert_eq!(cancel.status(), 200);
    // No worker ever held the run; one started now owes it the callback.
    start_worker(&app, true).await;

    let evs = app.wait_for_event(id, "callback.succeeded").await;
    assert_eq!(kinds(&evs), ["run.queued", "run.cancelled", "callback.succeeded"]);
    let got = receiver.received();
    assert_eq!(got.len(), 1);
    assert!(signature_verifies(&got[0], &callback_key(&app, SUB).await));
    let body: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(body["event"], "run.cancelled");
    assert_eq!(body["run"]["status"], "cancelled");
    assert!(app.model.requests().is_empty(), "the model was asked for a cancelled run");
}

#[tokio::test]
async fn bad_callback_urls_and_a_missing_secret_are_refused_at_submission() {
    let app = app(Vec::new()).await;
    for (url, says) in [
        ("ftp://hooks.example.com/x", "http or https"),
        ("https://user:pw@hooks.example.com/x", "credentials"),
        ("not a url", "callback_url"),
    ] {
        let r = create(&app, json!({"prompt": "p", "callback_url": url})).await;
        assert_eq!(r.status(), 422, "{url}");
        let body: Value = r.json().await.unwrap();
        assert!(body["error"]["message"].as_str().unwrap().contains(says), "{url}: {body}");
    }
    let long = format!("https://hooks.example.com/{}", "a".repeat(3000));
    assert_eq!(create(&app, json!({"prompt": "p", "callback_url": long})).await.status(), 422);

    // A deployment without KILN_CALLBACK_SECRET cannot sign: refused, saying so.
    let unsigned = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let r = create(&unsigned, json!({"prompt": "p", "callback_url": "https://hooks.example.com/x"})).await;
    assert_eq!(r.status(), 422);
    let body: Value = r.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("KILN_CALLBACK_SECRET"), "{body}");
    // Nor is there a callback key to hand out.
    let r = unsigned.http.get(unsigned.url("/v1/callback-key")).bearer_auth(token(SUB)).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let body: Value = r.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("KILN_CALLBACK_SECRET"), "{body}");
    // Nothing was queued by either refusal.
    let n: i64 = unsigned.sql().await.query_one("SELECT count(*) FROM runs", &[]).await.unwrap().get(0);
    assert_eq!(n, 0);
    let n: i64 = app.sql().await.query_one("SELECT count(*) FROM runs", &[]).await.unwrap().get(0);
    assert_eq!(n, 0);
}

/// Waits until the run's callback is settled (delivered, or given up on):
/// from then on no worker claims it again, so what was sent and recorded
/// is final. Its attempts and whether it was delivered.
async fn settled(app: &TestApp, id: Uuid) -> (i32, bool) {
    let sql = app.sql().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let row = sql
            .query_opt(
                "SELECT attempts, delivered FROM run_callbacks WHERE run_id = $1 AND settled_at IS NOT NULL",
                &[&id],
            )
            .await
            .unwrap();
        if let Some(row) = row {
            return (row.get(0), row.get(1));
        }
        assert!(Instant::now() < deadline, "the callback was never settled (still owed: a retry is due)");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_loopback_target_is_refused_when_private_targets_are_not_allowed() {
    let app = app(vec![Reply::text("done")]).await;
    start_worker(&app, false).await;
    let (receiver, addr) = Receiver::start(&[]).await;
    // By name as well as by address: the check comes after resolving.
    let url = format!("http://localhost:{}/hook", addr.port());
    let id = submit(&app, "p", &url).await.id;

    let evs = app.wait_for_event(id, "callback.failed").await;
    assert!(kinds(&evs).contains(&"run.succeeded"), "the run's own result stands: {:?}", kinds(&evs));
    let cb = callback_events(&evs);
    assert_eq!(cb.len(), 1, "refused once, not retried: {:?}", kinds(&evs));
    let error = cb[0].error.unwrap();
    assert!(error.contains("loopback") && error.contains("KILN_CALLBACK_ALLOW_PRIVATE"), "{error}");
    assert!(cb[0].retry_in_ms.is_none(), "{:?}", cb[0]);
    assert!(cb[0].status.is_none(), "no request, so no status: {:?}", cb[0]);
    // Settled (given up on): no worker makes a later attempt.
    assert_eq!(settled(&app, id).await, (1, false));
    assert_eq!(callback_events(&app.stored_events(id).await).len(), 1);
    assert!(receiver.received().is_empty(), "a request reached the loopback receiver");
}

#[tokio::test]
async fn a_follow_up_run_calls_back_to_the_same_url() {
    let app = app(vec![Reply::text("first"), Reply::text("second")]).await;
    start_worker(&app, true).await;
    let (receiver, addr) = Receiver::start(&[]).await;
    let url = format!("http://{addr}/hook");
    let id = submit(&app, "p", &url).await.id;
    app.wait_for_event(id, "callback.succeeded").await;

    let r = app
        .http
        .post(app.url(&format!("/v1/runs/{id}/messages")))
        .bearer_auth(token(SUB))
        .json(&json!({"text": "and now?"}))
        .send()
        .await
        .unwrap();
    let accepted: Value = r.json().await.unwrap();
    assert_eq!(accepted["disposition"], "follow_up", "{accepted}");
    let follow_up: Run = serde_json::from_value(accepted["run"].clone()).unwrap();
    assert_eq!(follow_up.callback_url.as_deref(), Some(url.as_str()), "the follow-up inherits the callback");
    let follow_up = follow_up.id;
    app.wait_for_event(follow_up, "callback.succeeded").await;

    let got = receiver.received();
    assert_eq!(got.len(), 2);
    let bodies: Vec<Value> = got.iter().map(|r| serde_json::from_slice(&r.body).unwrap()).collect();
    assert_eq!(bodies[0]["run"]["id"], id.to_string());
    assert_eq!(bodies[1]["run"]["id"], follow_up.to_string());
    assert_eq!(bodies[1]["run"]["result"]["summary"], "second");
    assert_ne!(bodies[0]["delivery_id"], bodies[1]["delivery_id"], "each run's callback is its own delivery");
}

/// A run cancelled while queued (no sandbox, no model): the cheapest way
/// to a run that owes a callback.
async fn cancelled_run(app: &TestApp, url: &str) -> Uuid {
    let id = submit(app, "never runs", url).await.id;
    let r = app.http.post(app.url(&format!("/v1/runs/{id}/cancel"))).bearer_auth(token(SUB)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    id
}

#[tokio::test]
async fn a_run_the_reaper_fails_calls_back() {
    let app = app(Vec::new()).await;
    let (receiver, addr) = Receiver::start(&[]).await;
    let id = submit(&app, "p", &format!("http://{addr}/hook")).await.id;
    // Workers that claim the run and die, until the reaper gives up on it.
    for _ in 0..3 {
        app.store.claim_run("dying", Duration::from_millis(100)).await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        app.store.reap_expired_leases().await.unwrap();
    }
    start_worker(&app, true).await;

    app.wait_for_event(id, "callback.succeeded").await;
    let got = receiver.received();
    assert_eq!(got.len(), 1);
    let body: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(body["event"], "run.failed");
    assert!(body["run"]["error"].as_str().unwrap().contains("lost 3 times"), "{body}");
}

#[tokio::test]
async fn a_callback_held_by_a_dead_worker_is_taken_over_when_its_lease_runs_out() {
    let app = app(Vec::new()).await;
    let (receiver, addr) = Receiver::start(&[]).await;
    let id = cancelled_run(&app, &format!("http://{addr}/hook")).await;
    // A worker claims the callback and dies at once (never extends, never sends).
    let lease = Duration::from_secs(3);
    let ghost = app.store.claim_callback(lease).await.unwrap().expect("the callback is owed");
    assert_eq!(ghost.run.id, id);
    let claimed = Instant::now();
    start_worker(&app, true).await;

    // While the lease holds, the live worker leaves it alone: its one
    // request comes after the lease ran out.
    app.wait_for_event(id, "callback.succeeded").await;
    assert_eq!(receiver.received().len(), 1);
    assert!(receiver.received()[0].at >= claimed + lease, "a callback held by another worker was sent");
    assert_eq!(receiver.received()[0].headers["x-kiln-delivery"], ghost.delivery_id.to_string().as_str());
    // The dead worker's late record is refused: the callback is not its own any more.
    let late = kiln_protocol::EventBody::CallbackFailed {
        attempt: 1,
        status: None,
        error: "late".into(),
        delivery_id: ghost.delivery_id.to_string(),
        retry_in_ms: None,
    };
    assert!(!app.store.record_callback_attempt(&ghost, kiln_store::CallbackAttempt::GaveUp, &late).await.unwrap());
}

#[tokio::test]
async fn a_receiver_answering_a_client_error_is_not_retried() {
    let app = app(Vec::new()).await;
    let (receiver, addr) = Receiver::start(&[404]).await;
    let id = cancelled_run(&app, &format!("http://{addr}/hook")).await;
    start_worker(&app, true).await;

    let evs = app.wait_for_event(id, "callback.failed").await;
    let cb = callback_events(&evs);
    assert_eq!(cb[0].status, Some(404));
    assert!(cb[0].retry_in_ms.is_none(), "{:?}", cb[0]);
    assert_eq!(settled(&app, id).await, (1, false));
    assert_eq!(callback_events(&app.stored_events(id).await).len(), 1);
    assert_eq!(receiver.received().len(), 1);
}

#[tokio::test]
async fn a_429_is_retried_no_sooner_than_its_retry_after() {
    let app = app(Vec::new()).await;
    let (receiver, addr) = Receiver::start(&[429]).await;
    let id = cancelled_run(&app, &format!("http://{addr}/hook")).await;
    start_worker(&app, true).await;

    let evs = app.wait_for_event(id, "callback.succeeded").await;
    let cb = callback_events(&evs);
    assert_eq!(cb[0].status, Some(429));
    // The backoff alone would be 50 to 100 ms; the receiver asked for 1 s.
    assert!(cb[0].retry_in_ms.unwrap() >= 1000, "{:?}", cb[0]);
    let got = receiver.received();
    assert_eq!(got.len(), 2);
    assert!(got[1].at - got[0].at >= Duration::from_millis(950), "retried after {:?}", got[1].at - got[0].at);
}

#[tokio::test]
async fn a_redirect_is_not_followed() {
    let app = app(Vec::new()).await;
    let (receiver, addr) = Receiver::start(&[302]).await;
    let id = cancelled_run(&app, &format!("http://{addr}/hook")).await;
    start_worker(&app, true).await;

    let evs = app.wait_for_event(id, "callback.failed").await;
    let cb = callback_events(&evs);
    assert_eq!(cb[0].status, Some(302));
    assert!(cb[0].error.unwrap().contains("redirects are not followed"), "{:?}", cb[0]);
    assert!(cb[0].retry_in_ms.is_none());
    assert_eq!(settled(&app, id).await, (1, false));
    assert_eq!(receiver.received().len(), 1, "the Location was followed");
}
