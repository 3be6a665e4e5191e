//! Loop controls, end to end: budgets, the loop guard, retries, parallel
//! read-only tools.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kiln_protocol::{CreateRun, EventBody, Limits, ModelSpec, RepoSpec, RunStatus, TodoItem, TodoStatus};
use kiln_scripted_model::{Reply, ScriptedCall};
use kiln_tests::git_repo::repo_with;
use kiln_tests::{Event, Options, TestApp, assert_dense, kinds, outcome, pick, worker_config};
use kiln_worker::config::{ProviderKind, WorkerConfig};
use serde_json::json;
use uuid::Uuid;

/// An app with the harness's worker, its model playing `script`.
async fn scripted(script: Vec<Reply>) -> TestApp {
    TestApp::spawn(Options { script, ..Default::default() }).await
}

async fn run_to_end(app: &TestApp, spec: CreateRun) -> (Uuid, Vec<Event>) {
    let id = app.submit("alice", spec).await.id;
    let events = app.events("alice", id).await;
    assert_dense(&events, 1);
    (id, events)
}

fn limited(prompt: &str, limits: Limits) -> CreateRun {
    CreateRun { limits: Some(limits), ..CreateRun::new(prompt) }
}

/// The error of the run's `run.failed`, which must be its last event.
fn failure(events: &[Event]) -> &str {
    match events.last().map(|e| &e.body) {
        Some(EventBody::RunFailed { error }) => error,
        _ => panic!("the run did not fail: {:?}", kinds(events)),
    }
}

fn echo(n: u32) -> Reply {
    Reply::tool("bash", json!({"command": format!("echo step {n}")}))
}

#[tokio::test]
async fn the_step_budget_stops_the_run_before_the_next_model_call() {
    let app = scripted((1..=6).map(echo).collect()).await;
    let (id, events) = run_to_end(&app, limited("loop", Limits { max_steps: Some(2), ..Default::default() })).await;
    let error = failure(&events);
    assert!(error.contains("step budget exhausted: 2 of 2"), "{error}");
    assert_eq!(pick!(events, EventBody::StepStarted { .. } => ()).count(), 2);
    assert_eq!(app.model.requests().len(), 2);
    assert_eq!(app.run("alice", id).await.status, RunStatus::Failed);
    // The last step's tool message, held for a model call that never came,
    // is stored all the same: the conversation stays whole.
    let (messages, _) = writers(&app, id).await;
    let roles: Vec<&str> = messages.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant", "tool"]);
}

#[tokio::test]
async fn the_token_budget_stops_the_run_and_names_itself() {
    let app = scripted((1..=6).map(echo).collect()).await;
    // The scripted model reports ~1 input token per 4 request bytes: one
    // request with the system prompt and tool schemas is well over 100.
    let (_, events) = run_to_end(&app, limited("loop", Limits { max_tokens: Some(100), ..Default::default() })).await;
    let error = failure(&events);
    assert!(error.contains("token budget exhausted"), "{error}");
    assert_eq!(app.model.requests().len(), 1, "stops before the second model call");
}

#[tokio::test]
async fn at_eighty_percent_of_a_budget_the_model_is_told() {
    let app = scripted((1..=6).map(echo).collect()).await;
    let (_, events) = run_to_end(&app, limited("loop", Limits { max_steps: Some(5), ..Default::default() })).await;
    assert_eq!(outcome(&events), Some(RunStatus::Failed));
    let requests = app.model.requests();
    assert_eq!(requests.len(), 5);
    let body = |i: usize| requests[i].body.to_string();
    assert!(!body(3).contains("Budget note"), "step 4 of 5 is below 80 %");
    assert!(body(4).contains("Budget note") && body(4).contains("1 of 5 steps left"), "{}", body(4));
}

#[tokio::test]
async fn the_wall_clock_limit_ends_the_run_timed_out() {
    let app = TestApp::spawn(Options {
        script: vec![Reply::tool("bash", json!({"command": "sleep 30"}))],
        ..Default::default()
    })
    .await;
    let started = std::time::Instant::now();
    let (id, events) = run_to_end(&app, limited("wait", Limits { timeout_s: Some(2), ..Default::default() })).await;
    assert_eq!(events.last().unwrap().body, EventBody::RunTimedOut { limit_s: 2 });
    // Well before the command's 30 s: the limit ended it (the 2 s, a
    // sandbox's start and removal, a loaded machine's slack).
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "{:?}", started.elapsed());
    assert_eq!(app.run("alice", id).await.status, RunStatus::TimedOut);
    assert!(app.containers_of(id).await.is_empty());
}

#[tokio::test]
async fn the_loop_guard_nudges_then_stops_a_repeating_model() {
    let same = || Reply::tool("bash", json!({"command": "ls"}));
    let app = scripted((0..8).map(|_| same()).collect()).await;
    let (_, events) = run_to_end(&app, CreateRun::new("loop")).await;
    let error = failure(&events);
    assert!(error.contains("loop guard"), "{error}");
    let requests = app.model.requests();
    assert_eq!(requests.len(), 5, "stopped at the fifth identical call");
    assert!(!requests[2].body.to_string().contains("same tool call with the same arguments"));
    assert!(requests[3].body.to_string().contains("same tool call with the same arguments 3 times"));
}

#[tokio::test]
async fn an_overloaded_provider_is_retried_and_the_retry_is_an_event() {
    let app = scripted(vec![Reply::error(529), Reply::text("fine")]).await;
    let (_, events) = run_to_end(&app, CreateRun::new("hi")).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let retry = pick!(events, EventBody::ModelRetry { attempt, error, .. } => (*attempt, error)).next();
    let (attempt, error) = retry.expect("model.retry event");
    assert_eq!(attempt, 1);
    assert!(error.contains("529"));
    assert_eq!(app.model.requests().len(), 2);
}

#[tokio::test]
async fn a_permanent_provider_error_fails_the_run_clearly() {
    let app = scripted(vec![Reply::error(400)]).await;
    let (_, events) = run_to_end(&app, CreateRun::new("hi")).await;
    let error = failure(&events);
    assert!(error.contains("400"), "{error}");
    assert_eq!(pick!(events, EventBody::ModelRetry { .. } => ()).count(), 0);
}

#[tokio::test]
async fn read_only_calls_run_together_and_results_keep_the_models_order() {
    let app = scripted(vec![
        Reply::tool("write", json!({"path": "a.txt", "content": "alpha\n"})),
        Reply::tools(vec![
            ScriptedCall::new("view", json!({"path": "a.txt"})),
            ScriptedCall::new("view", json!({"path": "missing.txt"})),
            ScriptedCall::new("bash", json!({"command": "echo after"})),
            ScriptedCall::new("view", json!({"file_path": "a.txt"})),
        ]),
        Reply::text("done"),
    ])
    .await;
    let (_, events) = run_to_end(&app, CreateRun::new("read")).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded));
    // The second step's tool events: both views are announced before either
    // result (one batch), the bash call runs alone, then the last view.
    let step: Vec<(&str, &str)> = events
        .iter()
        .skip_while(|e| e.body != EventBody::StepStarted { step: 2 })
        .filter_map(|e| match &e.body {
            EventBody::ToolCallReady { name, .. } | EventBody::ToolResult { name, .. } => {
                Some((e.kind(), name.as_str()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        step,
        [
            ("tool_call.ready", "view"),
            ("tool_call.ready", "view"),
            ("tool.result", "view"),
            ("tool.result", "view"),
            ("tool_call.ready", "bash"),
            ("tool.result", "bash"),
            ("tool_call.ready", "view"),
            ("tool.result", "view"),
        ]
    );
    // Results go back to the model in the order it made the calls.
    let requests = app.model.requests();
    let messages = requests[2].body["messages"].as_array().unwrap();
    let tool_outputs: Vec<&str> =
        messages.iter().filter(|m| m["role"] == "tool").map(|m| m["content"].as_str().unwrap()).collect();
    assert_eq!(tool_outputs.len(), 5);
    assert!(tool_outputs[1].contains("alpha"));
    assert!(tool_outputs[2].contains("no such file"));
    assert!(tool_outputs[3].contains("after"));
    assert!(tool_outputs[4].contains("alpha"), "file_path is accepted as an alias of path");
}

#[tokio::test]
async fn the_cost_budget_stops_the_run_and_each_step_reports_its_cost() {
    let app = scripted((1..=20).map(echo).collect()).await;
    // The harness prices the scripted model at $1 per million tokens.
    let spec = limited("loop", Limits { max_cost_usd: Some(0.001), ..Default::default() });
    let (_, events) = run_to_end(&app, spec).await;
    let error = failure(&events);
    assert!(error.contains("cost budget exhausted"), "{error}");
    let costs: Vec<f64> = pick!(events, EventBody::StepFinished { cost_usd, .. } => cost_usd.unwrap()).collect();
    assert!(!costs.is_empty() && costs.iter().all(|c| *c > 0.0), "{costs:?}");
    let total: f64 = costs.iter().sum();
    let last_step = costs.last().unwrap();
    // Never overshoots by more than one step's spend.
    assert!(total >= 0.001 && total - last_step < 0.001, "total {total}, last step {last_step}");
    assert!(app.model.requests().len() < 20);
}

#[tokio::test]
async fn a_tool_call_cut_off_mid_stream_is_never_run() {
    let app = scripted(vec![
        Reply::cut_mid_tool("bash", json!({"command": "echo SHOULD-NOT-RUN"})),
        Reply::tool("bash", json!({"command": "echo second"})),
        Reply::text("done"),
    ])
    .await;
    let (_, events) = run_to_end(&app, CreateRun::new("go")).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let error = pick!(events, EventBody::ModelRetry { error, .. } => error).next().expect("the cut stream is retried");
    assert!(error.contains("ended before"), "{error}");
    let ran: Vec<&str> =
        pick!(events, EventBody::ToolCallReady { arguments, .. } => arguments["command"].as_str().unwrap()).collect();
    assert_eq!(ran, ["echo second"]);
    // Nowhere in any event, as the API serves it.
    assert!(!events.iter().any(|e| serde_json::to_string(&e.body).unwrap().contains("SHOULD-NOT-RUN\\n")));
}

#[tokio::test]
async fn the_repositorys_agents_md_joins_the_system_prompt_and_the_plan_is_an_event() {
    let (_repo, url) = repo_with(&[("AGENTS.md", "Always run `make lint` before you finish.\n"), ("a.txt", "x\n")]);
    let plan = json!({"items": [
        {"text": "read the code", "status": "done"},
        {"content": "fix the bug", "status": "in_progress"},
        {"text": "run make lint"},
    ]});
    let app = scripted(vec![Reply::tool("todo", plan), Reply::text("done")]).await;
    let spec = CreateRun { repo: Some(RepoSpec { url, git_ref: None }), ..CreateRun::new("fix it") };
    let (_, events) = run_to_end(&app, spec).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let todo: Vec<&Vec<TodoItem>> = pick!(events, EventBody::Todo { items } => items).collect();
    assert_eq!(todo.len(), 1);
    let item = |text: &str, status| TodoItem { text: text.into(), status };
    assert_eq!(
        *todo[0],
        [
            item("read the code", TodoStatus::Done),
            item("fix the bug", TodoStatus::InProgress),
            item("run make lint", TodoStatus::Pending),
        ]
    );
    let requests = app.model.requests();
    let system = requests[0].body["messages"][0].clone();
    assert_eq!(system["role"], "system");
    let system = system["content"].to_string();
    assert!(system.contains("Always run `make lint` before you finish."), "{system}");
    assert!(system.contains("Instructions from the repository (AGENTS.md)"));
    // The model sees its plan back as the tool's result.
    let output = pick!(events, EventBody::ToolResult { output, .. } => output).next().unwrap();
    assert!(output.starts_with("Plan updated (1/3 done)"), "{output}");
}

fn compacting_script() -> Vec<Reply> {
    vec![
        Reply::tool("bash", json!({"command": "seq 1 3000"})),
        Reply::tool("bash", json!({"command": "echo after-the-big-output"})),
        Reply::text("SUMMARY: printed 1..3000, then echoed a marker."),
        Reply::text("done"),
    ]
}

/// The run of [`compacting_script`]: 3,000 tokens of context window at 0.8,
/// so the second step's input (the seq output) is over and compacts.
fn compacting_run(limits: Option<Limits>) -> CreateRun {
    let model = ModelSpec { context_window: Some(3000), ..Default::default() };
    CreateRun { model: Some(model), limits, ..CreateRun::new("count, then mark") }
}

/// What the compacting run spends without a budget: each step's tokens
/// (input and output) and the compaction's.
async fn compacting_spend() -> (Vec<u64>, u64) {
    let app = scripted(compacting_script()).await;
    let (_, events) = run_to_end(&app, compacting_run(None)).await;
    let steps: Vec<u64> =
        pick!(events, EventBody::StepFinished { usage, .. } => usage.input_tokens + usage.output_tokens).collect();
    let compacted: u64 =
        pick!(events, EventBody::Compaction { usage, .. } => usage.input_tokens + usage.output_tokens).sum();
    (steps, compacted)
}

/// Compacting is a model call that spends tokens: the budget is checked
/// after it, so the step after a compaction that spent the budget is not
/// taken (at most that one call's overshoot).
#[tokio::test]
async fn a_compaction_that_spends_the_budget_stops_the_run_before_the_next_step() {
    // Measured first without a budget: what two steps and the compaction spend.
    let (steps, compacted) = compacting_spend().await;
    assert!(steps.len() == 3 && compacted > 100, "{steps:?} {compacted}");
    let two_steps = steps[0] + steps[1];

    // A budget the two steps stay under and the compaction goes over.
    let budget = two_steps + compacted / 2;
    let app = scripted(compacting_script()).await;
    let limits = Limits { max_tokens: Some(budget), ..Default::default() };
    let (_, events) = run_to_end(&app, compacting_run(Some(limits))).await;
    let error = failure(&events);
    assert!(error.contains("token budget exhausted"), "{error}");
    assert_eq!(pick!(events, EventBody::Compaction { .. } => ()).count(), 1, "{:?}", kinds(&events));
    assert_eq!(app.model.requests().len(), 3, "two steps and the compaction; no step after it");
    assert_eq!(pick!(events, EventBody::StepFinished { .. } => ()).count(), 2);
}

/// A summarising call whose summary is empty is of no use, but it was paid
/// for: the budget counts it, so the step after it is not taken when it
/// spent the budget (it was once counted only for a summary that was used).
#[tokio::test]
async fn a_compaction_with_an_empty_summary_still_counts_against_the_budget() {
    // What the two steps spend, measured as in the test above.
    let (steps, _) = compacting_spend().await;
    let two_steps = steps[0] + steps[1];

    // The same run, its summary empty, with a budget the two steps stay
    // under and any summarising call goes over.
    let mut script = compacting_script();
    script[2] = Reply::text("");
    let app = scripted(script).await;
    let limits = Limits { max_tokens: Some(two_steps + 1), ..Default::default() };
    let (_, events) = run_to_end(&app, compacting_run(Some(limits))).await;
    let error = failure(&events);
    assert!(error.contains("token budget exhausted"), "{error}");
    assert_eq!(pick!(events, EventBody::Compaction { .. } => ()).count(), 0, "nothing was compacted");
    assert_eq!(app.model.requests().len(), 3, "two steps and the summarising call; no step after it");
    assert_eq!(pick!(events, EventBody::StepFinished { .. } => ()).count(), 2);
}

#[tokio::test]
async fn a_step_near_the_context_window_compacts_the_older_conversation_into_a_summary() {
    let app = scripted(compacting_script()).await;
    let (id, events) = run_to_end(&app, compacting_run(None)).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let compactions: Vec<(u32, u32, u64)> = pick!(events,
        EventBody::Compaction { summarized_messages, kept_messages, input_tokens, .. } =>
            (*summarized_messages, *kept_messages, *input_tokens))
    .collect();
    assert_eq!(compactions.len(), 1, "{:?}", kinds(&events));
    let (summarized, kept, input_tokens) = compactions[0];
    assert_eq!(summarized, 3, "{compactions:?}");
    assert_eq!(kept, 2);
    assert!(input_tokens > 2_400);
    let streamed: String = pick!(events, EventBody::TextDelta { text } => text.as_str()).collect();
    assert!(!streamed.contains("SUMMARY"), "the summary is not the agent talking: {streamed}");

    let requests = app.model.requests();
    assert_eq!(requests.len(), 4);
    let summarising = requests[2].body["messages"].to_string();
    assert!(summarising.contains("You are compacting the transcript"), "{summarising}");
    assert!(summarising.contains("count, then mark") && summarising.contains("[called bash"), "{summarising}");
    assert!(requests[2].body.get("tools").is_none_or(|t| t.as_array().is_some_and(Vec::is_empty)));
    // The next step starts from the summary and the recent messages only.
    let next = requests[3].body["messages"].as_array().unwrap();
    assert_eq!(next[0]["role"], "system");
    assert_eq!(next[1]["role"], "user");
    let first = next[1]["content"].to_string();
    assert!(first.contains("compacted") && first.contains("SUMMARY: printed 1..3000"), "{first}");
    let rest = serde_json::to_string(&next[2..]).unwrap();
    assert!(rest.contains("after-the-big-output"), "{rest}");
    assert!(!rest.contains("2999") && !first.contains("2999"), "the big output is gone from the context");

    // The full history stays in the database.
    let rows = app
        .sql()
        .await
        .query(
            "SELECT m.role, m.summary_keeps FROM messages m JOIN runs r ON r.session_id = m.session_id \
             WHERE r.id = $1 ORDER BY m.seq",
            &[&id],
        )
        .await
        .unwrap();
    let stored: Vec<(String, Option<i32>)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let roles: Vec<&str> = stored.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant", "tool", "user", "assistant"]);
    assert_eq!(stored[5].1, Some(2));
}

/// The transaction that wrote each row (Postgres' `xmin`): rows with the same
/// one were committed together.
async fn writers(app: &TestApp, run: Uuid) -> (Vec<(String, i64)>, Vec<(String, i64)>) {
    let sql = app.sql().await;
    let messages = sql
        .query("SELECT role, xmin::text::bigint FROM messages WHERE run_id = $1 ORDER BY seq", &[&run])
        .await
        .unwrap();
    let events =
        sql.query("SELECT kind, xmin::text::bigint FROM events WHERE run_id = $1 ORDER BY seq", &[&run]).await.unwrap();
    let pairs = |rows: Vec<tokio_postgres::Row>| rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    (pairs(messages), pairs(events))
}

#[tokio::test]
async fn a_step_with_a_tool_call_commits_twice_its_message_with_its_events() {
    let app = scripted(vec![echo(1), Reply::text("done")]).await;
    let (id, events) = run_to_end(&app, CreateRun::new("one tool call")).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let (messages, rows) = writers(&app, id).await;
    let roles: Vec<&str> = messages.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"]);
    let tx_of = |kind: &str, nth: usize| rows.iter().filter(|(k, _)| k == kind).nth(nth).unwrap().1;

    // Step 1: the model's message with the step's end and the call being
    // ready: one commit, before the tool ran. (What it streamed joins too
    // unless the stream took longer than the 50 ms an event may wait.)
    let model_message = messages[1].1;
    for kind in ["step.finished", "tool_call.ready"] {
        assert_eq!(tx_of(kind, 0), model_message, "{kind} shares the assistant message's commit: {rows:?}");
    }
    // Then the tool message with the tool's result: the second commit.
    let tool_message = messages[2].1;
    assert_ne!(tool_message, model_message);
    assert_eq!(tx_of("tool.result", 0), tool_message, "{rows:?}");
    // Step 2 (no tool call): its message with its end.
    assert_eq!(tx_of("step.finished", 1), messages[3].1, "{rows:?}");
}

/// A step's tool message is committed while the next model request goes
/// out, not waited for before it (the loop's overhead per step is mostly
/// commits). With every insert into `messages` held back by a lock, step
/// 2's request still reaches the model, carrying the tool's result; once
/// the lock goes the run ends with its conversation stored in order.
#[tokio::test]
async fn the_next_model_request_goes_out_while_the_tool_message_commits() {
    const GO: &str = "/tmp/kiln-test-go";
    let app = scripted(vec![
        Reply::tool("bash", json!({"command": format!("until [ -e {GO} ]; do sleep 0.02; done; echo went-on")})),
        Reply::text("done"),
    ])
    .await;
    let id = app.submit("alice", CreateRun::new("wait for the signal")).await.id;
    // The model's message is stored (it shares this event's commit) and
    // the tool waits for the signal.
    app.events_until("alice", id, None, |e| e.kind() == "tool_call.ready").await;
    let mut blocker = app.sql().await;
    let lock = blocker.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE messages IN SHARE MODE").await.unwrap();
    let container = app.containers_of(id).await.pop().expect("the session's container");
    let (code, out) = kiln_tests::docker_exec(&container, &["touch", GO]).await;
    assert_eq!(code, 0, "{out}");
    // The tool message's commit waits for the lock…
    app.until_waiting_on_locks(1).await;
    // …and the next request goes out meanwhile.
    let requests = app
        .model
        .wait_for_requests(2, std::time::Duration::from_secs(30))
        .await
        .expect("step 2's request went out while the tool message could not commit");
    assert!(requests[1].body.to_string().contains("went-on"), "the request carries the tool's result");
    let stored: i64 = lock
        .query_one("SELECT count(*) FROM messages WHERE run_id = $1 AND role = 'tool'", &[&id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 0, "the tool message is not committed yet");
    lock.rollback().await.unwrap();

    let events = app.events("alice", id).await;
    assert_dense(&events, 1);
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let (messages, rows) = writers(&app, id).await;
    let roles: Vec<&str> = messages.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"]);
    // Step 2's start went out in the tool message's commit.
    let step_started: Vec<i64> = rows.iter().filter(|(k, _)| k == "step.started").map(|(_, tx)| *tx).collect();
    assert_eq!(step_started.get(1), Some(&messages[2].1), "{rows:?}");
}

/// An app whose worker runs with `tune` applied to the harness's config.
async fn app_with_worker(script: Vec<Reply>, tune: impl FnOnce(&mut WorkerConfig)) -> TestApp {
    let app = TestApp::spawn(Options { script, worker: false, ..Default::default() }).await;
    let mut config = worker_config(ProviderKind::OpenAi, std::time::Duration::from_secs(10));
    tune(&mut config);
    app.start_worker(config).await;
    app
}

#[tokio::test]
async fn tool_calls_past_the_per_step_limit_are_answered_with_an_error_and_never_run() {
    let write = |name: &str| ScriptedCall::new("write", json!({"path": format!("{name}.txt"), "content": name}));
    let app = app_with_worker(
        vec![
            Reply::tools(vec![write("a"), write("b"), write("c"), write("d")]),
            Reply::tool("bash", json!({"command": "ls *.txt"})),
            Reply::text("done"),
        ],
        |c| c.max_tool_calls_per_step = 2,
    )
    .await;
    let (_, events) = run_to_end(&app, CreateRun::new("write four files")).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    // Only the first two calls went to the gate and ran.
    let ready: Vec<&str> = pick!(events, EventBody::ToolCallReady { name, .. } => name.as_str()).collect();
    assert_eq!(ready, ["write", "write", "bash"]);
    let results: Vec<(bool, &str)> =
        pick!(events, EventBody::ToolResult { is_error, output, .. } => (*is_error, output.as_str())).collect();
    assert_eq!(results.len(), 5, "every call is answered: {results:?}");
    for (is_error, output) in &results[2..4] {
        assert!(is_error, "{output}");
        assert!(output.contains("at most 2 tool calls") && output.contains("KILN_MAX_TOOL_CALLS_PER_STEP"), "{output}");
    }
    // The sandbox has the two files the calls that ran wrote, and no more.
    let listing = results[4].1;
    assert!(listing.contains("a.txt") && listing.contains("b.txt"), "{listing}");
    assert!(!listing.contains("c.txt") && !listing.contains("d.txt"), "{listing}");
    // The model is told why, in the results of its calls.
    let second = app.model.requests()[1].body.to_string();
    assert!(second.contains("KILN_MAX_TOOL_CALLS_PER_STEP"), "{second}");
}

/// A run's events as the API serves them, in bytes: each one's kind and
/// its payload as compact JSON.
async fn stored_event_bytes(app: &TestApp, run: Uuid) -> (usize, usize) {
    let events = app.store.events_after(run, 0, 100_000).await.unwrap();
    let sizes: Vec<usize> = events.iter().map(|e| e.kind.len() + e.payload.to_string().len()).collect();
    (sizes.iter().sum(), sizes.iter().copied().max().unwrap_or(0))
}

/// Step `step` prints 30 KB, which is ~30 KB in events twice over
/// (`tool.output` as it streams, `tool.result` at the end). The step number
/// keeps the loop guard from stopping the run.
fn print_30k(step: u32) -> Reply {
    Reply::tool("bash", json!({"command": format!("echo {step}; head -c 30000 /dev/zero | tr '\\0' x")}))
}

#[tokio::test]
async fn a_run_that_spends_its_event_bytes_fails_naming_the_limit_and_stores_no_more() {
    const CAP: u64 = 150_000;
    let script = (0..8).map(print_30k).chain([Reply::text("done")]).collect();
    let app = app_with_worker(script, |c| c.max_event_bytes_per_run = CAP).await;
    let (id, events) = run_to_end(&app, CreateRun::new("print a lot")).await;
    let error = failure(&events);
    assert!(error.contains("event budget") && error.contains("KILN_MAX_EVENT_BYTES_PER_RUN"), "{error}");
    assert!(app.model.requests().len() < 8, "stopped before running out of script");
    // No model call went out once its step's events could no longer be
    // stored: every request has its `step.started`. (A step's results wait
    // for the next model call's commit; the check before the call counts
    // them.)
    let started = pick!(events, EventBody::StepStarted { .. } => ()).count();
    assert_eq!(app.model.requests().len(), started, "{:?}", kinds(&events));
    // What was stored stays within the budget, but for the terminal event
    // (written after it ran out, so the run's end is never lost).
    let (total, largest) = stored_event_bytes(&app, id).await;
    assert!(total as u64 <= CAP + largest as u64, "{total} bytes stored, cap {CAP}, largest event {largest}");
    assert_eq!(app.run("alice", id).await.status, RunStatus::Failed);
}

/// A step's results wait for the next model call to commit them: the check
/// before that call counts them, so a step whose results the budget cannot
/// hold ends the run there instead of paying for a call none of whose
/// events could be stored.
#[tokio::test]
async fn a_step_whose_results_spend_the_event_bytes_makes_no_further_model_call() {
    const CAP: u64 = 45_000;
    let app = app_with_worker(vec![print_30k(1), Reply::text("done")], |c| c.max_event_bytes_per_run = CAP).await;
    let (_, events) = run_to_end(&app, CreateRun::new("print a lot")).await;
    let error = failure(&events);
    assert!(error.contains("event budget"), "{error}");
    assert_eq!(app.model.requests().len(), 1, "{:?}", kinds(&events));
}

#[tokio::test]
async fn a_takeover_counts_the_event_bytes_earlier_attempts_stored() {
    const CAP: u64 = 150_000;
    let script = vec![
        print_30k(1),
        print_30k(2),
        Reply::tool("bash", json!({"command": "sleep 30"})),
        print_30k(3),
        print_30k(4),
        Reply::text("done"),
    ];
    let app = TestApp::spawn(Options { script, worker: false, ..Default::default() }).await;
    // The first worker, with room to spare, stores ~120 KB and is stopped
    // in the third step; it hands the run back.
    let mut first = worker_config(ProviderKind::OpenAi, std::time::Duration::from_secs(30));
    first.shutdown_grace = std::time::Duration::from_secs(1);
    let stop_first = tokio_util::sync::CancellationToken::new();
    let first_done = app.start_worker_until(first, stop_first.clone()).await;
    let id = app.submit("alice", CreateRun::new("print a lot")).await.id;
    app.events_until(
        "alice",
        id,
        None,
        |e| matches!(&e.body, EventBody::ToolCallReady { arguments, .. } if arguments["command"] == "sleep 30"),
    )
    .await;
    stop_first.cancel();
    first_done.await.unwrap();
    // The second has a budget the first attempt already spent most of:
    // one more step of output is too much.
    let mut second = worker_config(ProviderKind::OpenAi, std::time::Duration::from_secs(30));
    second.max_event_bytes_per_run = CAP;
    app.start_worker(second).await;
    let events = app.events("alice", id).await;
    let attempts: Vec<i32> = pick!(events, EventBody::RunStarted { attempt, .. } => *attempt).collect();
    assert_eq!(attempts, [1, 2]);
    let error = failure(&events);
    assert!(error.contains("KILN_MAX_EVENT_BYTES_PER_RUN"), "{error}");
    let (total, largest) = stored_event_bytes(&app, id).await;
    assert!(total as u64 <= CAP + largest as u64, "{total} bytes stored, cap {CAP}, largest event {largest}");
}

/// Each step asks the provider to cache the stable prefix: OpenAI gets the
/// session id as `prompt_cache_key`; Anthropic gets breakpoints on the
/// tools, the system prompt and the latest messages, at most four.
#[tokio::test]
async fn every_step_marks_the_prompt_for_the_providers_cache() {
    for provider in [ProviderKind::OpenAi, ProviderKind::OpenAiResponses, ProviderKind::Anthropic] {
        let app = TestApp::spawn(Options {
            script: vec![echo(1), echo(2), Reply::text("done")],
            provider,
            ..Default::default()
        })
        .await;
        let run = app.submit("alice", CreateRun::new("go")).await;
        let events = app.events("alice", run.id).await;
        assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{provider:?}: {:?}", kinds(&events));
        let requests = app.model.requests();
        assert_eq!(requests.len(), 3, "{provider:?}");
        for (step, request) in requests.iter().enumerate() {
            let body = &request.body;
            match provider {
                ProviderKind::Anthropic => {
                    let marked = body.to_string().matches("\"cache_control\"").count();
                    assert!((3..=4).contains(&marked), "step {step}: {marked} breakpoints in {body}");
                    let tools = body["tools"].as_array().unwrap();
                    assert_eq!(tools.last().unwrap()["cache_control"]["type"], "ephemeral", "step {step}");
                    assert_eq!(body["system"][0]["cache_control"]["type"], "ephemeral", "step {step}");
                    let last = body["messages"].as_array().unwrap().last().unwrap().clone();
                    let last_block = last["content"].as_array().unwrap().last().unwrap().clone();
                    assert_eq!(last_block["cache_control"]["type"], "ephemeral", "step {step}");
                }
                _ => assert_eq!(body["prompt_cache_key"], run.session_id.to_string(), "{provider:?} step {step}"),
            }
        }
    }
}

#[tokio::test]
async fn with_prompt_caching_off_no_caching_field_is_sent() {
    for provider in [ProviderKind::OpenAi, ProviderKind::Anthropic] {
        let app = TestApp::spawn(Options {
            script: vec![echo(1), Reply::text("done")],
            provider,
            worker: false,
            ..Default::default()
        })
        .await;
        let mut config = worker_config(provider, std::time::Duration::from_secs(10));
        config.prompt_cache = false;
        app.start_worker(config).await;
        let run = app.submit("alice", CreateRun::new("go")).await;
        app.events("alice", run.id).await;
        for request in app.model.requests() {
            let text = request.body.to_string();
            assert!(!text.contains("cache_control") && !text.contains("prompt_cache_key"), "{provider:?}: {text}");
        }
    }
}

/// A run cancelled while the model streams still paid for what the provider
/// reported of that call (Anthropic reports the input in `message_start`):
/// a `step.finished` saying why the step ended carries it, so the run's
/// totals are not 0 beside the text it streamed.
#[tokio::test]
async fn a_run_cancelled_mid_step_keeps_the_usage_the_provider_reported() {
    let app = TestApp::spawn(Options {
        script: vec![Reply::hang().with_text("Thinking about it").with_cached_input(1_500)],
        provider: ProviderKind::Anthropic,
        ..Default::default()
    })
    .await;
    let run = app.submit("alice", CreateRun::new("go")).await;
    app.wait_for_event(run.id, "text.delta").await;
    let r = app
        .http
        .post(app.url(&format!("/v1/runs/{}/cancel", run.id)))
        .bearer_auth(kiln_tests::token("alice"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202, "a running run is asked to stop");
    let events = app.events("alice", run.id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Cancelled), "{:?}", kinds(&events));
    let finished: Vec<_> = pick!(events, EventBody::StepFinished { step, finish_reason, usage, .. } => (*step, finish_reason.clone(), *usage)).collect();
    assert_eq!(finished.len(), 1, "{:?}", kinds(&events));
    let (step, reason, usage) = &finished[0];
    assert_eq!((*step, reason.as_str()), (1, "cancelled"));
    assert!(usage.input_tokens > 0, "the reported input is counted: {usage:?}");
    assert_eq!(usage.cache_read_tokens, 1_500, "{usage:?}");
    // The step's end comes after its text and before the run's.
    let at = |kind: &str| events.iter().position(|e| e.kind() == kind).unwrap();
    assert!(at("text.delta") < at("step.finished") && at("step.finished") < at("run.cancelled"));
}
