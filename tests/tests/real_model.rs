//! The `real-model` tier: end-to-end runs (real Postgres, real Docker)
//! against a real inference server, llama.cpp serving SmolLM2-135M with
//! Kiln's tool-calling template (`kiln_cli::local_model`), through both its
//! OpenAI and its Anthropic endpoint.
//!
//! A real model's wording is not ours to assert: these tests check
//! structure. The model's tool call is executed with arguments valid for the
//! tool's schema (or answered with a tool error), its result goes back to
//! the model (a later step starts), the run ends within its step budget,
//! event ids are dense, and a cancel lands while the model streams.
//!
//! Needs the local model installed (`scripts/test` and `.ci/run` install it
//! and set `KILN_REQUIRE_REAL_MODEL=1`). Without it and without
//! `KILN_REQUIRE_REAL_MODEL`, each test says so and passes without running.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_cli::local_model::{self, LocalModel};
use kiln_protocol::agents::AgentKinds;
use kiln_protocol::{CreateRun, EventBody, Limits, ModelSpec, RepoSpec, RunStatus};
use kiln_tests::{Event, Options, TestApp, assert_dense, kinds, outcome, worker_config};
use kiln_worker::providers::pricing::PriceTable;
use kiln_worker::tools::Registry;
use kiln_worker::{ProviderEndpoints, ProviderKind};
use serde_json::{Value, json};
use uuid::Uuid;

const PROMPT: &str = "Run `cat README.md` with bash, then reply with one sentence.";
const MAX_STEPS: u32 = 4;

/// Where `scripts/test` installs the local model: `.kiln/local-model` of the
/// checkout (or of `KILN_STATE_DIR`).
fn install_dir() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    // Relative to the checkout, as in scripts/test.
    let state = std::env::var_os("KILN_STATE_DIR").map_or_else(|| root.join(".kiln"), |dir| root.join(dir));
    state.join("local-model")
}

/// Starts a local model server of its own for this test, or `None` (with a
/// message) when the model is not installed and not required.
async fn local_model(test: &str) -> Option<(Turn, LocalModel)> {
    local_model_for(test, Arc::new(AgentKinds::builtin())).await
}

/// As [`local_model`], for a deployment whose sub-agent kinds are `kinds`
/// (the warm-up's `task` tool offers them).
async fn local_model_for(test: &str, kinds: Arc<AgentKinds>) -> Option<(Turn, LocalModel)> {
    let dir = install_dir();
    let required = std::env::var_os("KILN_REQUIRE_REAL_MODEL").is_some_and(|v| !v.is_empty() && v != "0");
    if !local_model::is_installed(&dir) {
        if !required {
            eprintln!(
                "SKIPPED {test}: the local model is not installed in {} (scripts/test installs it; \
                 set KILN_REQUIRE_REAL_MODEL=1 to install it here and run this test)",
                dir.display()
            );
            return None;
        }
        local_model::ensure_installed(&dir).await.expect("install the local model");
    }
    let turn = take_turn();
    let log = std::env::temp_dir().join(format!("kiln-real-model-{test}-{}.log", std::process::id()));
    let options = local_model::Options { log: Some(log), kinds, ..local_model::Options::new(dir.parent().unwrap()) };
    let started = Instant::now();
    let server = LocalModel::start_installed(options).await.expect("start the local model server");
    eprintln!("{test}: local model server up in {:?} (log {})", started.elapsed(), server.log_path().display());
    Some((turn, server))
}

/// Real-model tests take turns (nextest runs each test in its own process):
/// on two cores, several llama.cpp servers at once only slow each other down.
struct Turn(#[allow(dead_code, reason = "held for its lock")] std::fs::File);

fn take_turn() -> Turn {
    let dir = install_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let file = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("tests.lock")).unwrap();
    file.lock().expect("lock the real-model test lock");
    Turn(file)
}

/// Follows a run's events to the end through the JSON pages of the events
/// route (a real model on a busy CPU can take minutes; the harness's SSE
/// follower gives up after two).
async fn events_to_end(app: &TestApp, id: Uuid, limit: Duration) -> Vec<Event> {
    let deadline = Instant::now() + limit;
    let mut out: Vec<Event> = Vec::new();
    loop {
        let after = out.last().map_or(0, |e| e.seq);
        out.extend(app.events_page("alice", id, after).await);
        if outcome(&out).is_some() {
            return out;
        }
        assert!(Instant::now() < deadline, "run {id} did not end within {limit:?}: {:?}", kinds(&out));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The error of the run whose events these are; the last must be `run.failed`.
fn failure(events: &[Event]) -> &str {
    match events.last().map(|e| &e.body) {
        Some(EventBody::RunFailed { error }) => error,
        _ => panic!("{:?}", kinds(events)),
    }
}

fn max_steps(n: u32) -> Limits {
    Limits { max_steps: Some(n), ..Default::default() }
}

/// An app whose worker talks to `server`, with `provider` as the default.
async fn app_for(server: &LocalModel, provider: ProviderKind) -> TestApp {
    app_with_endpoints(server, provider, server.endpoints()).await
}

async fn app_with_endpoints(server: &LocalModel, provider: ProviderKind, endpoints: ProviderEndpoints) -> TestApp {
    app_with(server, provider, endpoints, Arc::new(AgentKinds::builtin())).await
}

/// As [`app_with_endpoints`], for a deployment whose sub-agent kinds are `kinds`.
async fn app_with(
    server: &LocalModel,
    provider: ProviderKind,
    endpoints: ProviderEndpoints,
    kinds: Arc<AgentKinds>,
) -> TestApp {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let mut config = worker_config(provider, Duration::from_secs(10));
    config.subagents.kinds = kinds;
    config.default_model = server.model_name().to_owned();
    config.default_max_tokens = local_model::DEFAULT_MAX_TOKENS;
    let parts = kiln_cli::app::WorkerParts { config, endpoints, prices: PriceTable::empty() };
    kiln_cli::app::Kiln::new(app.store.clone()).worker(parts).start(app.shutdown.clone()).await.expect("start worker");
    app
}

/// A small git repository (the demo's) in a fresh directory.
/// Returns the directory (to remove) and the repository's URL.
async fn demo_repo() -> (PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("kiln-real-model-repo-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let repo = kiln_cli::local::ensure_demo_repo(&dir).await.expect("demo repo");
    (dir, format!("file://{}", repo.display()))
}

/// A minimal JSON-schema check, enough for the tools' argument schemas:
/// an object, required keys present, known keys of the declared types, no
/// others when `additionalProperties` is false.
fn schema_errors(schema: &Value, args: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    let Some(obj) = args.as_object() else {
        return vec![format!("arguments are not an object: {args}")];
    };
    let props = schema["properties"].as_object().cloned().unwrap_or_default();
    for key in schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        if !obj.contains_key(key) {
            errors.push(format!("missing required {key:?}"));
        }
    }
    for (key, value) in obj {
        let Some(prop) = props.get(key) else {
            if schema["additionalProperties"] == json!(false) {
                errors.push(format!("unknown key {key:?}"));
            }
            continue;
        };
        let types: Vec<&str> = match &prop["type"] {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => continue,
        };
        let ok = types.iter().any(|t| match *t {
            "string" => value.is_string(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            "boolean" => value.is_boolean(),
            "null" => value.is_null(),
            "array" => value.is_array(),
            "object" => value.is_object(),
            _ => true,
        });
        if !ok {
            errors.push(format!("{key:?} should be {types:?}, is {value}"));
        }
    }
    errors
}

/// The result of the tool call `call_id` among `events`: its index, output
/// and whether it is an error.
fn result_of<'a>(events: &'a [Event], call_id: &str) -> Option<(usize, &'a str, bool)> {
    events.iter().enumerate().find_map(|(j, e)| match &e.body {
        EventBody::ToolResult { call_id: c, output, is_error, .. } if c == call_id => {
            Some((j, output.as_str(), *is_error))
        }
        _ => None,
    })
}

/// The structural contract of a finished run driven by a real model.
fn assert_structure(events: &[Event]) {
    let k = kinds(events);
    assert_dense(events, 1);
    assert!(outcome(events).is_some(), "ends terminal: {k:?}");
    let is_step = |e: &Event| matches!(e.body, EventBody::StepStarted { .. });
    let steps = events.iter().filter(|e| is_step(e)).count() as u32;
    assert!((1..=MAX_STEPS).contains(&steps), "{steps} steps within max_steps {MAX_STEPS}: {k:?}");

    let specs = Registry::standard().specs().to_vec();
    let mut calls = 0;
    for (i, e) in events.iter().enumerate() {
        let EventBody::ToolCallReady { call_id: id, name, arguments } = &e.body else { continue };
        calls += 1;
        let (result, output, is_error) = result_of(&events[i + 1..], id)
            .map(|(j, output, is_error)| (i + 1 + j, output, is_error))
            .unwrap_or_else(|| panic!("tool call {id} has a result: {k:?}"));
        match specs.iter().find(|s| s.name == *name) {
            Some(spec) => {
                let errors = schema_errors(&spec.input_schema, arguments);
                if errors.is_empty() {
                    eprintln!("tool call {name} {arguments} → is_error {is_error}");
                } else {
                    // Invalid arguments must come back as a clear tool error.
                    assert!(is_error, "{errors:?} answered with an error");
                    assert!(!output.trim().is_empty(), "the tool error says why");
                }
            }
            None => {
                assert!(is_error, "unknown tool {name:?} answered with an error");
                assert!(output.contains(name.as_str()), "the error names the tool: {output}");
            }
        }
        // The result went back to the model: another step started after it,
        // unless the step budget ended the run right there.
        let next_step = events[result..].iter().any(is_step);
        assert!(next_step || steps == MAX_STEPS, "the result went back to the model: {k:?}");
    }
    assert!(calls > 0, "the model called a tool: {k:?}");
    // Every step that finished says why: a `step.finished` without a
    // string `finish_reason` does not decode as an `Event`, which fails the
    // test where the events are read.
}

async fn full_run(test: &str, provider: ProviderKind) {
    let Some((_turn, server)) = local_model(test).await else { return };
    let app = app_for(&server, provider).await;
    let (repo_dir, repo_url) = demo_repo().await;
    let spec = CreateRun {
        repo: Some(RepoSpec { url: repo_url, git_ref: None }),
        limits: Some(Limits { max_steps: Some(MAX_STEPS), timeout_s: Some(600), ..Default::default() }),
        model: Some(ModelSpec { temperature: Some(0.0), ..Default::default() }),
        ..CreateRun::new(PROMPT)
    };
    let server_log = server.log_path().to_owned();
    let started = Instant::now();
    let id = app.submit("alice", spec).await.id;
    let events = events_to_end(&app, id, Duration::from_secs(600)).await;
    eprintln!("{test}: run took {:?}: {:?}", started.elapsed(), kinds(&events));
    assert_structure(&events);
    let status = app.run("alice", id).await.status;
    let ended = [RunStatus::Succeeded, RunStatus::Failed, RunStatus::TimedOut];
    assert!(ended.contains(&status), "terminal status {status}");
    assert!(app.containers_of(id).await.is_empty(), "sandbox removed");
    server.stop().await;
    let _ = std::fs::remove_dir_all(repo_dir);
    let _ = std::fs::remove_file(server_log);
}

/// Prompt tokens the server has processed (read, not found in its cache)
/// since it started, by its own count (`llamacpp:prompt_tokens_total`).
async fn prompt_tokens_processed(server: &LocalModel) -> f64 {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let text = http.get(format!("{}/metrics", server.base_url())).send().await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix("llamacpp:prompt_tokens_total "))
        .unwrap_or_else(|| panic!("no prompt_tokens_total in {text}"))
        .trim()
        .parse()
        .unwrap()
}

/// The server `kiln up` starts reads the start every run shares (system
/// prompt and tools) before the first run; the demo run's first step then
/// costs it fewer than 300 prompt tokens, not the whole prompt.
#[tokio::test]
async fn a_warm_server_reads_only_the_new_part_of_a_runs_first_step() {
    warm_first_step("warm", Arc::new(AgentKinds::builtin())).await;
}

/// The same with an operator's kinds (`KILN_AGENT_KINDS`): they change the
/// `task` tool's description, which the warm-up must send as runs do, or the
/// warm prefix ends before `task` and the first step reads the rest again.
#[tokio::test]
async fn a_warm_server_reads_only_the_new_part_of_a_runs_first_step_with_operator_kinds() {
    let kinds = AgentKinds::from_toml(
        "[kinds.reviewer]\n\
         description = \"reviews the change it is given and reports problems; never edits\"\n\
         prompt = \"You are a code reviewer started by another agent.\"\n\
         read_only = true\n",
    )
    .unwrap();
    warm_first_step("warm-kinds", Arc::new(kinds)).await;
}

/// Starts a warmed server for a deployment of `kinds`, runs one step, and
/// checks the step read only what follows the warm prefix.
async fn warm_first_step(test: &str, agent_kinds: Arc<AgentKinds>) {
    let Some((_turn, server)) = local_model_for(test, agent_kinds.clone()).await else { return };
    let warmed = prompt_tokens_processed(&server).await;
    assert!(warmed > 1000.0, "the warm-up read the system prompt and tools: {warmed} tokens");
    let app = app_with(&server, ProviderKind::OpenAi, server.endpoints(), agent_kinds).await;
    let (repo_dir, repo_url) = demo_repo().await;
    let spec = CreateRun {
        repo: Some(RepoSpec { url: repo_url, git_ref: None }),
        limits: Some(Limits { max_steps: Some(1), timeout_s: Some(600), ..Default::default() }),
        model: Some(ModelSpec { temperature: Some(0.0), ..Default::default() }),
        ..CreateRun::new(PROMPT)
    };
    let id = app.submit("alice", spec).await.id;
    let events = events_to_end(&app, id, Duration::from_secs(600)).await;
    let steps = events.iter().filter(|e| matches!(e.body, EventBody::StepFinished { .. })).count();
    assert_eq!(steps, 1, "{:?}", kinds(&events));
    let first_step = prompt_tokens_processed(&server).await - warmed;
    eprintln!("{test}: the warm-up processed {warmed} prompt tokens; the run's first step {first_step}");
    assert!(first_step < 300.0, "the first step processed {first_step} prompt tokens");
    server.stop().await;
    let _ = std::fs::remove_dir_all(repo_dir);
}

#[tokio::test]
async fn a_real_model_runs_a_tool_through_the_openai_endpoint() {
    full_run("openai", ProviderKind::OpenAi).await;
}

#[tokio::test]
async fn a_real_model_runs_a_tool_through_the_anthropic_endpoint() {
    full_run("anthropic", ProviderKind::Anthropic).await;
}

/// Cut mid-stream: no `step.finished`. The bound only catches a cancel that
/// waited for the stream or hung: llama.cpp may have both cores, and how
/// fast a cancel lands is not asserted (speed belongs in bench/; no
/// benchmark measures it yet).
#[tokio::test]
async fn cancelling_while_the_real_model_streams_stops_the_run_mid_stream() {
    let Some((_turn, server)) = local_model("cancel").await else { return };
    let app = app_for(&server, ProviderKind::OpenAi).await;
    // A long answer: up to 2048 tokens, tens of seconds on a CPU.
    let spec = CreateRun {
        model: Some(ModelSpec { max_tokens: Some(2048), temperature: Some(0.0), ..Default::default() }),
        limits: Some(max_steps(2)),
        ..CreateRun::new("Count from 1 to 1000, one number a line. Do not use tools.")
    };
    let id = app.submit("alice", spec).await.id;
    let streaming = |e: &Event| matches!(e.body, EventBody::TextDelta { .. } | EventBody::ToolCallDelta { .. });
    let before = app.events_until("alice", id, None, streaming).await;
    assert!(streaming(before.last().unwrap()), "the model streams: {:?}", kinds(&before));
    let started = Instant::now();
    let r = app
        .http
        .post(app.url(&format!("/v1/runs/{id}/cancel")))
        .bearer_auth(kiln_tests::token("alice"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let rest = app.events_after("alice", id, Some(before.last().unwrap().seq)).await;
    let elapsed = started.elapsed();
    let all: Vec<Event> = before.iter().chain(rest.iter()).cloned().collect();
    assert_dense(&all, 1);
    assert_eq!(outcome(&rest), Some(RunStatus::Cancelled), "{:?}", kinds(&rest));
    assert!(elapsed < Duration::from_secs(30), "cancel took {elapsed:?}");
    // The cancel cut the stream: the step never finished.
    let finished = all.iter().any(|e| matches!(e.body, EventBody::StepFinished { .. }));
    assert!(!finished, "cancelled mid-stream: {:?}", kinds(&all));
    assert_eq!(app.run("alice", id).await.status, RunStatus::Cancelled);
    server.stop().await;
}

#[tokio::test]
async fn the_supervisor_restarts_a_local_model_server_that_dies() {
    let Some((_turn, server)) = local_model("restart").await else { return };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let first = server.pid();
    assert!(first > 0);
    std::process::Command::new("kill").args(["-9", &first.to_string()]).status().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.restarts() == 0 {
        assert!(Instant::now() < deadline, "no restart within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_ne!(server.pid(), first);
    let health = http.get(format!("{}/health", server.base_url())).send().await.unwrap();
    assert!(health.status().is_success());
    // Stopping it leaves nothing behind.
    let pid = server.pid();
    server.stop().await;
    let alive = std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z ");
    assert!(!alive, "the server process {pid} is gone after stop");
}

#[test]
fn schema_check_catches_bad_arguments() {
    let spec = Registry::standard().specs().iter().find(|s| s.name == "bash").unwrap().clone();
    assert!(schema_errors(&spec.input_schema, &json!({"command": "ls"})).is_empty());
    assert!(!schema_errors(&spec.input_schema, &json!({})).is_empty());
    assert!(!schema_errors(&spec.input_schema, &json!({"command": 3})).is_empty());
    assert!(!schema_errors(&spec.input_schema, &json!("ls")).is_empty());
}

/// A model request that exceeds its timeout is retried, each retry an
/// event, and then fails the run with a clear reason. The tiny model needs
/// well over 50 ms to read Kiln's system prompt before its first byte.
#[tokio::test]
async fn a_model_request_over_its_timeout_is_retried_then_fails_the_run_clearly() {
    let Some((_turn, server)) = local_model("timeout").await else { return };
    let endpoints = ProviderEndpoints { read_timeout: Some(Duration::from_millis(50)), ..server.endpoints() };
    let app = app_with_endpoints(&server, ProviderKind::OpenAi, endpoints).await;
    let id = app.submit("alice", CreateRun { limits: Some(max_steps(2)), ..CreateRun::new(PROMPT) }).await.id;
    let events = events_to_end(&app, id, Duration::from_secs(120)).await;
    assert_dense(&events, 1);
    let retries = events.iter().filter(|e| matches!(e.body, EventBody::ModelRetry { .. })).count();
    assert!(retries >= 1, "retried: {:?}", kinds(&events));
    let error = failure(&events);
    assert!(error.contains("model call failed"), "a clear reason: {error}");
    assert!(error.to_lowercase().contains("timed out") || error.contains("timeout"), "names the timeout: {error}");
}

/// A model server that goes away: its failed requests are retried (each
/// retry an event) and then fail the run with a clear reason.
#[tokio::test]
async fn a_model_server_that_goes_away_is_retried_then_fails_the_run_clearly() {
    let Some((_turn, server)) = local_model("gone").await else { return };
    let app = app_for(&server, ProviderKind::OpenAi).await;
    // Gone before the first model call.
    server.stop().await;
    let id = app.submit("alice", CreateRun { limits: Some(max_steps(2)), ..CreateRun::new(PROMPT) }).await.id;
    let events = events_to_end(&app, id, Duration::from_secs(120)).await;
    assert_dense(&events, 1);
    let retries = events.iter().filter(|e| matches!(e.body, EventBody::ModelRetry { .. })).count();
    assert!(retries > 0, "retried: {:?}", kinds(&events));
    let error = failure(&events);
    assert!(error.contains("connection to the model provider failed"), "a clear reason: {error}");
    assert_eq!(app.run("alice", id).await.status, RunStatus::Failed);
}
