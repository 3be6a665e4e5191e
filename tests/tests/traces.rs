//! Traces: with an OTLP endpoint, a run's spans (the run, each step, each
//! model call and tool call) reach an OTLP/HTTP receiver on loopback, with
//! their attributes and parent/child relations. The subscriber is the one
//! `kiln` installs when `OTEL_EXPORTER_OTLP_ENDPOINT` is set
//! (`kiln_cli::telemetry::subscriber`), pointed at the test's receiver.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use kiln_protocol::{CreateRun, RunStatus};
use kiln_scripted_model::Reply;
use kiln_tests::{Options, TestApp, outcome};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::json;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::util::SubscriberInitExt;

type Received = Arc<Mutex<Vec<Span>>>;

/// A minimal OTLP/HTTP collector: `POST /v1/traces`, protobuf.
async fn start_receiver() -> (String, Received) {
    async fn traces(State(received): State<Received>, body: Bytes) -> &'static [u8] {
        let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
        let spans = request.resource_spans.into_iter().flat_map(|r| r.scope_spans).flat_map(|s| s.spans);
        received.lock().unwrap().extend(spans);
        // An empty ExportTraceServiceResponse: full success.
        b""
    }
    let received = Received::default();
    let app = Router::new().route("/v1/traces", post(traces)).with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

/// The attribute's value. The SDK appends when a span records a field again
/// (the run's `step`), and the last value is the one that counts.
fn attr(span: &Span, key: &str) -> Option<String> {
    let value = span.attributes.iter().rev().find(|kv| kv.key == key)?.value.as_ref()?.value.as_ref()?;
    Some(match value {
        any_value::Value::StringValue(s) => s.clone(),
        any_value::Value::IntValue(i) => i.to_string(),
        any_value::Value::BoolValue(b) => b.to_string(),
        any_value::Value::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    })
}

// Several threads, as in `kiln`: the exporter's batches run beside the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_exports_spans_for_itself_its_steps_and_its_calls() {
    let (url, received) = start_receiver().await;
    let (subscriber, telemetry) = kiln_cli::telemetry::subscriber(
        EnvFilter::new("info"),
        kiln_cli::telemetry::LogFormat::Text { colour: false },
        std::io::sink,
        Some(&url),
    )
    .unwrap();
    subscriber.try_init().unwrap();

    let script = vec![Reply::tool("bash", json!({"command": "echo hi"})), Reply::text("done")];
    let app = TestApp::spawn(Options { script, ..Default::default() }).await;
    let run = app.submit("alice", CreateRun::new("say hi")).await;
    let id = run.id.to_string();
    let events = app.events("alice", run.id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded));
    // The run span closes when the run task returns, just after the
    // terminal event, and its children before it: once the exporter's
    // batches (every few seconds) have brought it, everything of the run
    // has been sent.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let is_this_run = |s: &Span| s.name == "run" && attr(s, "run_id").as_deref() == Some(id.as_str());
    while !received.lock().unwrap().iter().any(is_this_run) {
        assert!(std::time::Instant::now() < deadline, "the run's span was never exported");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    telemetry.shutdown().await;

    let spans = received.lock().unwrap().clone();
    let named = |name: &str| spans.iter().filter(|s| s.name == name).collect::<Vec<_>>();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();

    let runs: Vec<&Span> = named("run").into_iter().filter(|s| attr(s, "run_id").as_deref() == Some(&id)).collect();
    assert_eq!(runs.len(), 1, "one run span: {names:?}");
    let run_span = runs[0];
    assert!(run_span.parent_span_id.is_empty(), "the run is a trace's root");
    assert_eq!(attr(run_span, "session_id"), Some(run.session_id.to_string()));
    assert_eq!(attr(run_span, "outcome").as_deref(), Some("succeeded"));
    assert_eq!(attr(run_span, "step").as_deref(), Some("2"), "the run's last step");
    let in_trace = |s: &&Span| s.trace_id == run_span.trace_id;

    let mut steps: Vec<&Span> = named("step").into_iter().filter(in_trace).collect();
    steps.sort_by_key(|s| attr(s, "step"));
    assert_eq!(steps.len(), 2, "a span per step: {names:?}");
    for (n, step) in steps.iter().enumerate() {
        assert_eq!(step.parent_span_id, run_span.span_id, "steps are children of the run");
        assert_eq!(attr(step, "step"), Some((n + 1).to_string()));
        assert_eq!(attr(step, "run_id").as_deref(), Some(id.as_str()));
    }
    assert_eq!(attr(steps[0], "tool_calls").as_deref(), Some("1"));
    assert_eq!(attr(steps[1], "finish_reason").as_deref(), Some("end_turn"));

    let calls: Vec<&Span> = named("model_call").into_iter().filter(in_trace).collect();
    assert_eq!(calls.len(), 2, "a span per model call: {names:?}");
    for call in &calls {
        assert!(steps.iter().any(|s| s.span_id == call.parent_span_id), "model calls are children of a step");
        assert_eq!(attr(call, "provider").as_deref(), Some("openai"));
        assert_eq!(attr(call, "model").as_deref(), Some("scripted"));
        assert_eq!(attr(call, "outcome").as_deref(), Some("ok"));
        assert!(attr(call, "output_tokens").is_some_and(|t| t.parse::<u64>().unwrap() > 0));
    }

    let tools: Vec<&Span> = named("tool_call").into_iter().filter(in_trace).collect();
    assert_eq!(tools.len(), 1, "a span per tool call: {names:?}");
    assert_eq!(tools[0].parent_span_id, steps[0].span_id, "the call is a child of the step that made it");
    assert_eq!(attr(tools[0], "tool").as_deref(), Some("bash"));
    assert_eq!(attr(tools[0], "outcome").as_deref(), Some("ok"));
    assert!(attr(tools[0], "duration_ms").is_some());
}
