//! Prompt caching end to end: the prefix a provider caches (tools and
//! system prompt) is the same bytes in every step, run and worker; cache
//! reads and writes reported by the provider reach `step.finished`, the
//! run's totals and its cost; and against the scripted model's computed
//! Anthropic cache, each step reads the previous step's prompt.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kiln_cli::app::open_store;
use kiln_protocol::{CreateRun, EventBody, ModelSpec, RepoSpec, RunStatus, Usage};
use kiln_scripted_model::{RecordedRequest, Reply};
use kiln_tests::{Event, Options, TestApp, assert_dense, kinds, outcome, pick, worker_config};
use kiln_worker::config::ProviderKind;
use serde::de::IgnoredAny;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

async fn run_to_end(app: &TestApp, spec: CreateRun) -> (Uuid, Vec<Event>) {
    let id = app.submit("alice", spec).await.id;
    let events = app.events("alice", id).await;
    assert_dense(&events, 1);
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    (id, events)
}

/// A git repository with an `AGENTS.md`, as a `file://` URL.
fn repo() -> (tempfile::TempDir, String) {
    kiln_tests::git_repo::repo_with(&[("AGENTS.md", "Run `make check` before you finish.\n"), ("a.txt", "x\n")])
}

/// The top-level fields of a compact JSON object, each value as the exact
/// bytes sent.
fn fields(json: &[u8]) -> Vec<(String, &[u8])> {
    assert_eq!(json.first(), Some(&b'{'), "an object");
    let mut out = Vec::new();
    let mut at = 1;
    while json.get(at) != Some(&b'}') {
        let mut keys = serde_json::Deserializer::from_slice(&json[at..]).into_iter::<String>();
        let key = keys.next().unwrap().unwrap();
        at += keys.byte_offset();
        assert_eq!(json[at], b':', "compact JSON");
        at += 1;
        let value = one_value(&json[at..]);
        out.push((key, value));
        at += value.len();
        if json[at] == b',' {
            at += 1;
        }
    }
    out
}

/// The first JSON value at the start of `json`, as bytes.
fn one_value(json: &[u8]) -> &[u8] {
    let mut values = serde_json::Deserializer::from_slice(json).into_iter::<IgnoredAny>();
    values.next().unwrap().unwrap();
    &json[..values.byte_offset()]
}

fn field<'a>(json: &'a [u8], name: &str) -> &'a [u8] {
    fields(json).into_iter().find(|(key, _)| key == name).unwrap_or_else(|| panic!("no {name}")).1
}

/// What a provider caches first, as sent: the tools and the system prompt
/// (Anthropic's top-level `system`; OpenAI's first message).
fn prefix(provider: ProviderKind, request: &RecordedRequest) -> Vec<u8> {
    let body = &request.bytes[..];
    let system = match provider {
        ProviderKind::Anthropic => field(body, "system"),
        _ => {
            let messages = field(body, "messages");
            assert_eq!(messages[0], b'[');
            one_value(&messages[1..])
        }
    };
    let system_text = String::from_utf8_lossy(system);
    assert!(system_text.contains("Run `make check` before you finish."), "AGENTS.md is in the system: {system_text}");
    [field(body, "tools"), b"\n", system].concat()
}

/// Two runs on the same repository, one on each of two workers (each with
/// its own connection pool), two steps each: the four requests' tools and
/// system prompt are the same bytes.
#[tokio::test]
async fn the_cached_prefix_is_the_same_bytes_across_steps_runs_and_workers() {
    for provider in [ProviderKind::Anthropic, ProviderKind::OpenAi] {
        let (_repo, url) = repo();
        let script = vec![
            Reply::tool("bash", json!({"command": "echo one"})),
            Reply::text("done"),
            Reply::tool("bash", json!({"command": "echo two"})),
            Reply::text("done"),
        ];
        let app = TestApp::spawn(Options { script, provider, worker: false, ..Default::default() }).await;
        let spec = || CreateRun { repo: Some(RepoSpec { url: url.clone(), git_ref: None }), ..CreateRun::new("go") };
        for _worker in 0..2 {
            let store = open_store(&app.db_url, 4).await.unwrap();
            let stop = CancellationToken::new();
            let worker = app
                .start_worker_on(store, worker_config(provider, std::time::Duration::from_secs(10)), stop.clone())
                .await;
            run_to_end(&app, spec()).await;
            stop.cancel();
            worker.await.unwrap();
        }
        let requests = app.model.requests();
        assert_eq!(requests.len(), 4, "{provider:?}");
        let first = prefix(provider, &requests[0]);
        for (i, request) in requests.iter().enumerate().skip(1) {
            let other = prefix(provider, request);
            assert!(
                first == other,
                "{provider:?}: request {i}'s prefix differs:\n{}\n---\n{}",
                String::from_utf8_lossy(&first),
                String::from_utf8_lossy(&other)
            );
        }
    }
}

/// A recorded stream with its usage's cache fields set: every recorded
/// stream in the fixtures reports zero cached tokens.
fn fixture(path: &str, edits: &[(&str, &str)]) -> Reply {
    let full = format!("{}/../worker/tests/fixtures/{path}", env!("CARGO_MANIFEST_DIR"));
    let mut text = std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{full}: {e}"));
    for (from, to) in edits {
        assert!(text.contains(from), "{path} has no {from}");
        text = text.replace(from, to);
    }
    Reply::raw(text)
}

fn usage(input: u64, output: u64, cache_read: u64, cache_write: u64) -> Usage {
    Usage { input_tokens: input, output_tokens: output, cache_read_tokens: cache_read, cache_write_tokens: cache_write }
}

/// Claude Sonnet's prices per million tokens, as the harness prices
/// [`kiln_tests::CACHE_PRICED_MODEL`].
fn sonnet_cost(u: &Usage) -> f64 {
    (u.input_tokens as f64 * 3.0
        + u.output_tokens as f64 * 15.0
        + u.cache_read_tokens as f64 * 0.3
        + u.cache_write_tokens as f64 * 3.75)
        / 1e6
}

/// For each provider, two recorded answers (a tool call, then text) whose
/// usage reports cache reads (and, on Anthropic, writes): each step's
/// `step.finished` carries them, the run's stored totals add them up, and
/// the cost prices them at the cache prices.
#[tokio::test]
async fn cache_reads_and_writes_from_recorded_streams_reach_steps_totals_and_cost() {
    let cases = [
        (
            ProviderKind::Anthropic,
            vec![
                fixture(
                    "anthropic/vercel_tool_use.sse",
                    &[
                        ("\"cache_creation_input_tokens\":0", "\"cache_creation_input_tokens\":1200"),
                        ("\"cache_read_input_tokens\":0", "\"cache_read_input_tokens\":3400"),
                    ],
                ),
                fixture(
                    "anthropic/vercel_text.sse",
                    &[("\"cache_read_input_tokens\":0", "\"cache_read_input_tokens\":4600")],
                ),
            ],
            [usage(849, 47, 3400, 1200), usage(12, 30, 4600, 0)],
        ),
        (
            ProviderKind::OpenAi,
            vec![
                fixture(
                    "openai_chat/openai_python_tool_call.sse",
                    &[(
                        "\"total_tokens\":100,",
                        "\"total_tokens\":100,\"prompt_tokens_details\":{\"cached_tokens\":64},",
                    )],
                ),
                fixture(
                    "openai_chat/vercel_text_with_usage_obfuscation.sse",
                    &[("\"cached_tokens\":0", "\"cached_tokens\":10")],
                ),
            ],
            // Chat Completions counts cached tokens inside prompt_tokens.
            [usage(76 - 64, 24, 64, 0), usage(16 - 10, 300, 10, 0)],
        ),
        (
            ProviderKind::OpenAiResponses,
            vec![
                fixture(
                    "openai_responses/vercel_function_call_step2.sse",
                    &[("\"cached_tokens\":0", "\"cached_tokens\":200")],
                ),
                fixture(
                    "openai_responses/vercel_text_message.sse",
                    &[("\"cached_tokens\":0", "\"cached_tokens\":256")],
                ),
            ],
            [usage(221 - 200, 26, 200, 0), usage(299 - 256, 12, 256, 0)],
        ),
    ];
    for (provider, script, expected) in cases {
        let app = TestApp::spawn(Options { script, provider, ..Default::default() }).await;
        let model = ModelSpec { name: Some(kiln_tests::CACHE_PRICED_MODEL.into()), ..Default::default() };
        let (id, events) = run_to_end(&app, CreateRun { model: Some(model), ..CreateRun::new("go") }).await;
        let steps: Vec<(Usage, Option<f64>)> =
            pick!(events, EventBody::StepFinished { usage, cost_usd, .. } => (*usage, *cost_usd)).collect();
        let usages: Vec<Usage> = steps.iter().map(|(u, _)| *u).collect();
        assert_eq!(usages, expected, "{provider:?}: step.finished");
        for (u, cost) in &steps {
            let cost = cost.expect("a priced model");
            assert!((cost - sonnet_cost(u)).abs() < 1e-12, "{provider:?}: {cost} for {u:?}");
        }
        let total = app.store.run_usage(id).await.unwrap();
        let sum = expected.iter().fold(Usage::default(), |mut t, u| {
            t.input_tokens += u.input_tokens;
            t.output_tokens += u.output_tokens;
            t.cache_read_tokens += u.cache_read_tokens;
            t.cache_write_tokens += u.cache_write_tokens;
            t
        });
        assert_eq!(total, sum, "{provider:?}: the run's totals");
    }
}

/// With the scripted model computing Anthropic's cache from the requests,
/// every step after the first reads the whole previous prompt from the
/// cache and writes only what is new: the breakpoints slide with the
/// conversation.
#[tokio::test]
async fn each_anthropic_step_reads_the_previous_steps_prompt_from_the_cache() {
    let script: Vec<Reply> = (1..=5)
        .map(|n| Reply::tool("bash", json!({"command": format!("echo step {n}")})))
        .chain([Reply::text("done")])
        .collect();
    let app = TestApp::spawn(Options { script, provider: ProviderKind::Anthropic, ..Default::default() }).await;
    app.model.simulate_prompt_cache();
    let (_, events) = run_to_end(&app, CreateRun::new("go")).await;
    let usages: Vec<Usage> = pick!(events, EventBody::StepFinished { usage, .. } => *usage).collect();
    assert_eq!(usages.len(), 6);
    assert_eq!(usages[0].cache_read_tokens, 0, "{usages:?}");
    assert!(usages[0].cache_write_tokens > 1024, "the first step writes the prefix: {usages:?}");
    for pair in usages.windows(2) {
        let (before, after) = (pair[0], pair[1]);
        let prompt = |u: Usage| u.input_tokens + u.cache_read_tokens + u.cache_write_tokens;
        assert_eq!(after.cache_read_tokens, prompt(before), "reads all of the previous prompt: {usages:?}");
        assert_eq!(after.input_tokens, 0, "{usages:?}");
    }
}
