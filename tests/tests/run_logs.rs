//! JSON logs (`KILN_LOG_FORMAT=json`): every line the worker logs while
//! working on a run names the run, its session and the step, through the
//! spans the line was logged in. The subscriber is the one `kiln` installs
//! (`kiln_cli::telemetry::subscriber`), writing to a buffer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use kiln_protocol::{CreateRun, RunStatus};
use kiln_scripted_model::Reply;
use kiln_tests::logs::Logs;
use kiln_tests::{Options, TestApp, outcome};
use kiln_worker::config::ProviderKind;
use serde_json::{Value, json};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::util::SubscriberInitExt;

/// Installs the subscriber `kiln` installs, at info, writing JSON lines
/// into what it returns.
fn capture_json_logs() -> Logs {
    let captured = Logs::default();
    let writer = captured.clone();
    let (subscriber, _telemetry) = kiln_cli::telemetry::subscriber(
        EnvFilter::new("info"),
        kiln_cli::telemetry::LogFormat::Json,
        move || writer.clone(),
        None,
    )
    .unwrap();
    subscriber.try_init().unwrap();
    captured
}

/// Installs the subscriber `kiln` installs, at info, writing plain text
/// lines (no colour) into what it returns.
fn capture_text_logs() -> Logs {
    let captured = Logs::default();
    let writer = captured.clone();
    let (subscriber, _telemetry) = kiln_cli::telemetry::subscriber(
        EnvFilter::new("info"),
        kiln_cli::telemetry::LogFormat::Text { colour: false },
        move || writer.clone(),
        None,
    )
    .unwrap();
    subscriber.try_init().unwrap();
    captured
}

/// The value of `field` in the innermost span of the line that has it.
fn from_spans<'a>(line: &'a Value, field: &str) -> Option<&'a Value> {
    line["spans"].as_array()?.iter().rev().find_map(|span| span.get(field))
}

#[tokio::test]
async fn every_line_of_a_run_carries_run_session_and_step() {
    let captured = capture_json_logs();

    let script = vec![Reply::tool("bash", json!({"command": "echo hi"})), Reply::text("done")];
    let app = TestApp::spawn(Options { script, ..Default::default() }).await;
    let run = app.submit("alice", CreateRun::new("say hi")).await;
    let (id, session) = (run.id.to_string(), run.session_id.to_string());
    let events = app.events("alice", run.id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded));
    // "run finished" is logged before the terminal event is written.
    let text = captured.text();
    let lines: Vec<Value> =
        text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect();

    // The worker's lines while it worked on the run: from its claim to its
    // end. Only this run was queued, so each of them is about it — and
    // must say so (a filter on the run's id would hide the lines without).
    let worker_lines: Vec<&Value> =
        lines.iter().filter(|l| l["target"].as_str().is_some_and(|t| t.starts_with("kiln_worker"))).collect();
    let message = |l: &Value| l["fields"]["message"].as_str().map(str::to_owned);
    let claimed = worker_lines.iter().position(|l| message(l).as_deref() == Some("claimed run")).expect("claimed run");
    let ended = worker_lines.iter().position(|l| message(l).as_deref() == Some("run finished")).expect("run finished");
    let of_run = &worker_lines[claimed..=ended];
    let messages: Vec<&str> = of_run.iter().filter_map(|l| l["fields"]["message"].as_str()).collect();
    assert!(messages.contains(&"claimed run"), "{messages:?}");
    assert!(messages.contains(&"run finished"), "{messages:?}");
    for line in of_run {
        assert_eq!(from_spans(line, "run_id"), Some(&json!(id)), "run_id on {line}");
        assert_eq!(from_spans(line, "session_id"), Some(&json!(session)), "session_id on {line}");
        assert!(from_spans(line, "step").is_some_and(Value::is_u64), "step on {line}");
    }
    // The step follows the loop: the run ended in its second step.
    let finished = of_run.iter().find(|l| l["fields"]["message"] == "run finished").unwrap();
    assert_eq!(from_spans(finished, "step"), Some(&json!(2)), "{finished}");
    assert_eq!(finished["span"]["name"], "run", "the current span is named: {finished}");
}

/// The access log: one line per request at info, with its method, path and
/// status, and never the query string (it may carry a stream token).
#[tokio::test]
async fn each_request_is_logged_with_its_status_and_without_its_query() {
    let captured = capture_json_logs();
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let refused = app.http.get(app.url("/v1/runs")).bearer_auth("not-a-token").send().await.unwrap();
    assert_eq!(refused.status(), 401);
    let query = app
        .http
        .get(app.url("/v1/runs/0199a000-0000-7000-8000-000000000001/events?access_token=SECRET-IN-QUERY"))
        .send()
        .await
        .unwrap();
    assert_eq!(query.status(), 401);

    let text = captured.text();
    assert!(!text.contains("SECRET-IN-QUERY"), "the query string is never logged");
    let responses: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["fields"]["message"] == "finished processing request")
        .collect();
    let logged: Vec<(String, u64)> = responses
        .iter()
        .map(|l| (l["span"]["path"].as_str().unwrap().to_owned(), l["fields"]["status"].as_u64().unwrap()))
        .collect();
    assert!(logged.contains(&("/v1/runs".to_owned(), 401)), "{logged:?}");
    assert!(logged.contains(&("/v1/runs/0199a000-0000-7000-8000-000000000001/events".to_owned(), 401)), "{logged:?}");
    assert!(responses.iter().all(|l| l["level"] == "INFO"), "{responses:?}");
}

/// Text logs: the run span's `step`, recorded again at every step, shows
/// its latest value once (the text format used to append each value:
/// `step=0 step=1 step=2`).
#[tokio::test]
async fn text_lines_show_the_runs_step_once_and_current() {
    let captured = capture_text_logs();
    let script = vec![
        Reply::tool("bash", json!({"command": "echo one"})),
        Reply::tool("bash", json!({"command": "echo two"})),
        Reply::text("done"),
    ];
    let app = TestApp::spawn(Options { script, ..Default::default() }).await;
    let run = app.submit("alice", CreateRun::new("count")).await;
    assert_eq!(outcome(&app.events("alice", run.id).await), Some(RunStatus::Succeeded));
    let text = captured.text();
    let run_spans: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(&run.id.to_string()))
        .filter_map(|l| l.find("run{").map(|at| &l[at..]))
        .map(|s| s.split_once("}:").map_or(s, |(span, _)| span))
        .collect();
    assert!(!run_spans.is_empty(), "no line in the run's span:\n{text}");
    for span in &run_spans {
        assert_eq!(span.matches(" step=").count(), 1, "the run's step once: {span}");
    }
    let finished = text.lines().find(|l| l.contains("run finished")).expect("a run finished line");
    assert!(finished.contains(" step=3"), "the step the run ended in: {finished}");
}

/// A run whose checkout fails removes its container there and then; the
/// end of the run must not then warn about a container that is gone.
#[tokio::test]
async fn a_failed_checkout_logs_no_warning_about_its_removed_sandbox() {
    let captured = capture_json_logs();
    let app = TestApp::spawn(Options { worker: false, ..Options::default() }).await;
    // Sessions keep their container between runs, as `kiln up`'s do.
    let mut config = kiln_tests::worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    config.sandbox_idle = Duration::from_secs(600);
    app.start_worker(config).await;
    let missing = tempfile::tempdir().unwrap();
    let url = format!("file://{}/no-such-repo", missing.path().display());
    let spec = CreateRun { repo: Some(kiln_protocol::RepoSpec { url, git_ref: None }), ..CreateRun::new("look") };
    let run = app.submit("alice", spec).await;
    let events = app.events("alice", run.id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Failed));
    let text = captured.text();
    let warnings: Vec<String> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["level"] == "WARN")
        .map(|l| l["fields"]["message"].as_str().unwrap_or_default().to_owned())
        .collect();
    // The clone's own failure is worth a warning (what git said is only
    // in the log); the sandbox's removal is not.
    assert!(warnings.iter().any(|m| m == "git clone failed"), "the clone's failure is logged: {warnings:?}");
    let about_sandbox: Vec<&String> =
        warnings.iter().filter(|m| m.contains("sandbox") || m.contains("container")).collect();
    assert!(about_sandbox.is_empty(), "{about_sandbox:#?}");
}
