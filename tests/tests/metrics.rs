//! `GET /metrics`: valid Prometheus text whose counters move with a
//! scripted run, and queue gauges an autoscaler can use; on the API's
//! listener only with `KILN_METRICS_TOKEN`, or without a token on a
//! listener of its own (`KILN_API_METRICS_LISTEN`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use kiln_protocol::{CreateRun, RunStatus};
use kiln_scripted_model::Reply;
use kiln_tests::{Options, TestApp, outcome};
use std::collections::HashMap;

use prometheus_parse::{Scrape, Value};
use serde_json::json;

/// The scraper's token (`KILN_METRICS_TOKEN`).
const METRICS_TOKEN: &str = "metrics-token-0123456789abcdef";

/// Database gauges re-read on every scrape, so a test sees its own runs;
/// `/metrics` served to [`METRICS_TOKEN`].
fn options(script: Vec<Reply>, worker: bool) -> Options {
    let mut options = Options { script, worker, ..Default::default() };
    options.api.metrics_refresh = Duration::ZERO;
    options.api.metrics_token = Some(METRICS_TOKEN.into());
    options
}

/// One scrape: the text as `prometheus-parse` reads it (types, histogram
/// buckets) and every sample line as read by the exposition grammar.
struct Metrics {
    parsed: Scrape,
    samples: Vec<(String, HashMap<String, String>, f64)>,
}

async fn scrape(app: &TestApp) -> Metrics {
    let response = app.http.get(app.url("/metrics")).bearer_auth(METRICS_TOKEN).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
    let body = response.text().await.unwrap();
    let parsed = Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).expect("Prometheus text");
    // prometheus-parse skips lines it cannot read (and unlabelled histogram
    // sums and counts), so each sample line is also read here, strictly.
    let samples = body.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).map(sample_line).collect();
    Metrics { parsed, samples }
}

/// `name{label="value",...} value [timestamp]` per the text exposition format.
fn sample_line(line: &str) -> (String, HashMap<String, String>, f64) {
    let is_name = |s: &str| {
        !s.is_empty()
            && s.chars()
                .enumerate()
                .all(|(i, c)| c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit()))
    };
    let name_end = line.find(['{', ' ']).unwrap_or_else(|| panic!("no value: {line}"));
    let name = &line[..name_end];
    assert!(is_name(name), "bad metric name in {line}");
    let mut labels = HashMap::new();
    let mut rest = &line[name_end..];
    if let Some(mut list) = rest.strip_prefix('{') {
        loop {
            if let Some(after) = list.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = list.find('=').unwrap_or_else(|| panic!("label without value: {line}"));
            let label = &list[..eq];
            assert!(is_name(label), "bad label name {label:?} in {line}");
            let quoted = list[eq + 1..].strip_prefix('"').unwrap_or_else(|| panic!("label value not quoted: {line}"));
            let (mut value, mut escaped, mut end) = (String::new(), false, None);
            for (i, c) in quoted.char_indices() {
                match (escaped, c) {
                    (true, 'n') => value.push('\n'),
                    (true, c) => value.push(c),
                    (false, '\\') => {}
                    (false, '"') => {
                        end = Some(i);
                        break;
                    }
                    (false, c) => value.push(c),
                }
                escaped = !escaped && c == '\\';
            }
            let end = end.unwrap_or_else(|| panic!("unterminated label value: {line}"));
            labels.insert(label.to_owned(), value);
            list = &quoted[end + 1..];
            list = list.strip_prefix(',').unwrap_or(list);
        }
    }
    finish(name, labels, rest)
}

fn finish(name: &str, labels: HashMap<String, String>, rest: &str) -> (String, HashMap<String, String>, f64) {
    let mut fields = rest.split_whitespace();
    let raw = fields.next().unwrap_or_else(|| panic!("no value for {name}"));
    let value = match raw {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v.parse().unwrap_or_else(|_| panic!("bad value {v:?} for {name}")),
    };
    if let Some(ts) = fields.next() {
        ts.parse::<i64>().unwrap_or_else(|_| panic!("bad timestamp {ts:?} for {name}"));
    }
    assert!(fields.next().is_none(), "trailing text after {name}");
    (name.to_owned(), labels, value)
}

/// The value of the series `name` whose labels include `labels` (summed over
/// the rest), 0 when there is none yet.
fn value(metrics: &Metrics, name: &str, labels: &[(&str, &str)]) -> f64 {
    metrics
        .samples
        .iter()
        .filter(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
        .map(|(_, _, v)| v)
        .sum()
}

#[tokio::test]
async fn counters_move_with_a_scripted_run() {
    let script = vec![Reply::tool("bash", json!({"command": "echo hi"})), Reply::text("done")];
    let app = TestApp::spawn(options(script, true)).await;
    let before = scrape(&app).await;

    let run = app.submit("alice", CreateRun::new("say hi")).await;
    let id = run.id.to_string();
    let events = app.events("alice", run.id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded));
    let after = scrape(&app).await;
    let delta = |name: &str, labels: &[(&str, &str)]| value(&after, name, labels) - value(&before, name, labels);

    // From the database: this test's database holds this one run.
    assert_eq!(value(&after, "kiln_runs", &[("status", "succeeded")]), 1.0);
    assert_eq!(value(&after, "kiln_runs", &[("status", "queued")]), 0.0, "every status is exported");
    assert_eq!(value(&after, "kiln_queue_depth", &[]), 0.0);

    // From the worker.
    assert_eq!(delta("kiln_runs_claimed_total", &[]), 1.0);
    assert_eq!(delta("kiln_claim_latency_seconds_count", &[]), 1.0);
    assert_eq!(delta("kiln_runs_finished_total", &[("status", "succeeded")]), 1.0);
    assert_eq!(delta("kiln_steps_total", &[]), 2.0);
    assert_eq!(delta("kiln_step_duration_seconds_count", &[]), 2.0);
    assert_eq!(delta("kiln_tool_calls_total", &[("tool", "bash"), ("outcome", "ok")]), 1.0);
    assert_eq!(delta("kiln_tool_call_duration_seconds_count", &[("tool", "bash"), ("outcome", "ok")]), 1.0);
    let model = [("provider", "openai"), ("model", "scripted"), ("outcome", "ok")];
    assert_eq!(delta("kiln_model_call_duration_seconds_count", &model), 2.0);
    assert!(delta("kiln_model_tokens_total", &[("model", "scripted"), ("kind", "output")]) > 0.0);
    assert_eq!(value(&after, "kiln_sandboxes_active", &[]), 0.0, "the run's sandbox was counted back");

    // Durations are histograms with buckets (not summaries).
    let histogram = after
        .parsed
        .samples
        .iter()
        .find(|s| s.metric == "kiln_tool_call_duration_seconds" && s.labels.get("tool") == Some("bash"))
        .expect("tool duration histogram");
    assert!(matches!(&histogram.value, Value::Histogram(b) if b.len() > 5), "{:?}", histogram.value);

    // HTTP requests by route template, not by raw path.
    assert_eq!(delta("kiln_http_requests_total", &[("method", "POST"), ("route", "/v1/runs"), ("status", "201")]), 1.0);
    assert_eq!(
        delta("kiln_http_requests_total", &[("method", "GET"), ("route", "/v1/runs/{id}/events"), ("status", "200")]),
        1.0
    );
    assert!(
        !after.samples.iter().any(|(_, l, _)| l.get("route").is_some_and(|r| r.contains(&id))),
        "no series names a run id"
    );
    assert!(
        value(&after, "kiln_http_requests_total", &[("route", "/metrics"), ("status", "200")]) >= 1.0,
        "the first scrape is counted by the second"
    );
}

/// An operator's cache hit rate: the Anthropic steps' cache reads and
/// writes (the scripted model computes them as Anthropic's cache would)
/// are counted apart from the uncached input, by provider and model, and
/// add up to what the steps reported.
#[tokio::test]
async fn cached_input_is_counted_apart_from_input() {
    let script = vec![
        Reply::tool("bash", json!({"command": "echo one"})),
        Reply::tool("bash", json!({"command": "echo two"})),
        Reply::text("done"),
    ];
    let mut options = options(script, false);
    options.provider = kiln_worker::config::ProviderKind::Anthropic;
    let app = TestApp::spawn(options).await;
    app.model.simulate_prompt_cache();
    app.start_worker(kiln_tests::worker_config(kiln_worker::config::ProviderKind::Anthropic, Duration::from_secs(10)))
        .await;
    let before = scrape(&app).await;
    let run = app.submit("alice", CreateRun::new("go")).await;
    let events = app.events("alice", run.id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded));
    let after = scrape(&app).await;
    let delta = |kind: &str| {
        let labels = [("provider", "anthropic"), ("model", "scripted"), ("kind", kind)];
        value(&after, "kiln_model_tokens_total", &labels) - value(&before, "kiln_model_tokens_total", &labels)
    };
    let steps: Vec<kiln_protocol::Usage> =
        kiln_tests::pick!(events, kiln_protocol::EventBody::StepFinished { usage, .. } => *usage).collect();
    let sum = |f: fn(&kiln_protocol::Usage) -> u64| steps.iter().map(f).sum::<u64>() as f64;
    assert!(sum(|u| u.cache_read_tokens) > 0.0, "{steps:?}");
    assert_eq!(delta("cache_read"), sum(|u| u.cache_read_tokens));
    assert_eq!(delta("cache_write"), sum(|u| u.cache_write_tokens));
    assert_eq!(delta("input"), sum(|u| u.input_tokens));
    // Most of the prompt came from the cache after the first step.
    assert!(delta("cache_read") > delta("input") + delta("cache_write"), "{steps:?}");
}

#[tokio::test]
async fn queue_gauges_show_waiting_runs_and_their_age() {
    let app = TestApp::spawn(options(Vec::new(), false)).await;
    let empty = scrape(&app).await;
    assert_eq!(value(&empty, "kiln_queue_depth", &[]), 0.0);
    assert_eq!(value(&empty, "kiln_queue_oldest_age_seconds", &[]), 0.0);

    let first = app.submit("alice", CreateRun::new("one")).await;
    app.submit("bob", CreateRun::new("two")).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let queued = scrape(&app).await;
    assert_eq!(value(&queued, "kiln_queue_depth", &[]), 2.0);
    assert_eq!(value(&queued, "kiln_runs", &[("status", "queued")]), 2.0);
    let age = value(&queued, "kiln_queue_oldest_age_seconds", &[]);
    assert!((1.0..60.0).contains(&age), "oldest queued run waited {age} s");
    assert_eq!(value(&queued, "kiln_metrics_db_up", &[]), 1.0);

    // An open event stream is counted while it is open.
    let stream = app
        .http
        .get(app.url(&format!("/v1/runs/{}/events", first.id)))
        .bearer_auth(kiln_tests::token("alice"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    assert_eq!(value(&scrape(&app).await, "kiln_sse_connections", &[]), 1.0);
    drop(stream);
    // The server notices the closed connection at its next write (the
    // harness's keep-alive is 1 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while value(&scrape(&app).await, "kiln_sse_connections", &[]) != 0.0 {
        assert!(std::time::Instant::now() < deadline, "the closed stream is still counted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_worker_serves_its_own_metrics_listener() {
    let shutdown = tokio_util::sync::CancellationToken::new();
    let addr = kiln_cli::telemetry::serve_metrics("127.0.0.1:0".parse().unwrap(), shutdown.clone()).await.unwrap();
    // The worker records into the recorder the listener renders.
    kiln_worker::metrics::warm_pool_size(3);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let body = http.get(format!("http://{addr}/metrics")).send().await.unwrap().text().await.unwrap();
    let samples: Vec<_> =
        body.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).map(sample_line).collect();
    assert!(samples.iter().any(|(n, _, v)| n == "kiln_warm_pool_size" && *v == 3.0), "{body}");
    shutdown.cancel();
}

/// `GET /metrics` on the API's listener as `auth` has it: status and body.
async fn metrics_as(app: &TestApp, auth: Option<&str>) -> (u16, String) {
    let mut request = app.http.get(app.url("/metrics"));
    if let Some(auth) = auth {
        request = request.header("authorization", auth);
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

fn assert_json_error(status: u16, body: &str, expected: u16, what: &str) {
    assert_eq!(status, expected, "{what}: {body}");
    let body: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("{what}: not JSON: {body}"));
    assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {body}");
}

#[tokio::test]
async fn the_api_listener_serves_metrics_only_to_the_metrics_token() {
    let app = TestApp::spawn(options(Vec::new(), false)).await;
    let (status, body) = metrics_as(&app, None).await;
    assert_json_error(status, &body, 401, "no token");
    let (status, body) = metrics_as(&app, Some("Bearer not-the-metrics-token")).await;
    assert_json_error(status, &body, 401, "a wrong token");
    // A user's API token is not the metrics token.
    let (status, body) = metrics_as(&app, Some(&format!("Bearer {}", kiln_tests::token("alice")))).await;
    assert_json_error(status, &body, 401, "a user's token");
    let (status, body) = metrics_as(&app, Some(&format!("Bearer {METRICS_TOKEN}"))).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("kiln_queue_depth"), "{body}");
}

#[tokio::test]
async fn without_a_metrics_token_the_api_listener_serves_no_metrics() {
    let mut options = options(Vec::new(), false);
    options.api.metrics_token = None;
    let app = TestApp::spawn(options).await;
    let (status, body) = metrics_as(&app, None).await;
    assert_json_error(status, &body, 404, "metrics off on the API listener");
    assert!(body.contains("KILN_METRICS_TOKEN") && body.contains("KILN_API_METRICS_LISTEN"), "says how: {body}");
}

#[tokio::test]
async fn the_api_metrics_listener_serves_metrics_without_a_token_and_nothing_else() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let db = kiln_tests::fresh_database().await;
    let store = kiln_cli::app::open_store(&db, 4).await.unwrap();
    let parts = kiln_cli::app::ApiParts {
        auth: kiln_tests::authenticator(),
        settings: kiln_api::ApiSettings { metrics_refresh: Duration::ZERO, ..Default::default() },
        github: None,
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = kiln_cli::app::Kiln::new(store).api(parts).start(shutdown.clone()).await.unwrap();
    let (api, metrics) = (running.api_addr().unwrap(), running.api_metrics_addr().unwrap());
    let http = reqwest::Client::builder().no_proxy().build().unwrap();

    let r = http.get(format!("http://{metrics}/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("kiln_queue_depth"));
    // Only metrics there: not the API.
    let r = http.get(format!("http://{metrics}/v1/runs")).bearer_auth(kiln_tests::token("alice")).send().await;
    assert_eq!(r.unwrap().status(), 404);
    // And the API's own listener (no metrics token) serves none.
    let r = http.get(format!("http://{api}/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    shutdown.cancel();
}
