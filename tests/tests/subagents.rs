//! Sub-agents end to end (issue 18): the `task` tool starts child runs in
//! the parent's session and sandbox; they run at once, stream into their
//! own runs and, tagged, into the parent's; their answers are the parent's
//! tool results; their spending is the parent's; they end with it and
//! survive a lost worker with it. Real Postgres and Docker; the model is the
//! scripted server, with a script per child (`script_thread`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_protocol::agents::AgentKinds;
use kiln_protocol::{CreateRun, EventBody, Limits, RunStatus};
use kiln_scripted_model::{Reply, ScriptedCall};
use kiln_tests::worker_process::WorkerProcess;
use kiln_tests::{Event, Options, TestApp, assert_dense, kinds, outcome, pick, token, worker_config};
use kiln_worker::ProviderKind;
use serde_json::{Value, json};
use uuid::Uuid;

/// A `task` call whose prompt carries `marker` (which picks the child's script).
fn task(marker: &str, agent: &str) -> ScriptedCall {
    ScriptedCall::new(
        "task",
        json!({"description": format!("look into {marker}"), "prompt": format!("{marker}: find it"), "agent": agent}),
    )
}

/// The children the parent's stream announced, in order: (call id, run id).
fn started(events: &[Event]) -> Vec<(String, Uuid)> {
    pick!(events, EventBody::SubagentStarted { call_id, run_id, .. } => (call_id.clone(), *run_id)).collect()
}

/// Spend of the parent's own steps plus its children's, from its stream
/// alone (as `kiln follow` and the web view add it up).
fn total_tokens(events: &[Event]) -> u64 {
    let own: u64 =
        pick!(events, EventBody::StepFinished { usage, .. } => usage.input_tokens + usage.output_tokens).sum();
    let children: u64 =
        pick!(events, EventBody::SubagentFinished { usage, .. } => usage.input_tokens + usage.output_tokens).sum();
    own + children
}

fn tokens_of(events: &[Event]) -> u64 {
    pick!(events, EventBody::StepFinished { usage, .. } => usage.input_tokens + usage.output_tokens).sum()
}

async fn child_count(app: &TestApp, parent: Uuid) -> i64 {
    let sql = app.sql().await;
    sql.query_one("SELECT count(*) FROM runs WHERE parent_run_id = $1", &[&parent]).await.unwrap().get(0)
}

#[tokio::test]
async fn two_task_calls_run_two_children_at_once_and_their_answers_come_back() {
    let script = vec![
        Reply::tools(vec![task("ALPHA", "explore"), task("BETA", "explore")]).with_usage(100, 10),
        Reply::text("parent done").with_usage(100, 10),
    ];
    let app = TestApp::spawn(Options { script, ..Default::default() }).await;
    // Each child waits a while on each of its model calls: run one after
    // the other, their spans could not overlap; and a child's last step
    // cannot finish within 1.5 s of its first step's events.
    let slow = Duration::from_millis(1500);
    for marker in ["ALPHA", "BETA"] {
        app.model.script_thread(
            marker,
            vec![
                Reply::tool("ls", json!({"path": "."})).with_delay(slow).with_usage(40, 5),
                Reply::text(format!("answer from {marker}")).with_delay(slow).with_usage(40, 5),
            ],
        );
    }
    let parent = app.submit("alice", CreateRun::new("split the work")).await.id;
    // Live: the parent's stream, read as it is written, carries a child's
    // event while that child is still at work, not copied once its loop is
    // done (its last step finished) nor once it has ended.
    let first = app.events_until("alice", parent, None, |e| matches!(e.body, EventBody::SubagentEvent { .. })).await;
    let Some(EventBody::SubagentEvent { run_id: child, .. }) = first.last().map(|e| &e.body) else {
        panic!("the parent's stream ended with no child event: {:?}", kinds(&first))
    };
    let own_then = app.stored_events(*child).await;
    let status = app.run("alice", *child).await.status;
    let steps_done = own_then.iter().filter(|e| e.kind() == "step.finished").count();
    assert!(
        steps_done < 2,
        "the child's event reached its parent's stream only after its last step: {:?}",
        kinds(&own_then)
    );
    assert_eq!(status, RunStatus::Running, "the child's event reached its parent's stream only once it had ended");
    let events = app.events("alice", parent).await;
    assert_dense(&events, 1);
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));

    // In call order (they start at once, in either order).
    let mut children = started(&events);
    children.sort();
    assert_eq!(children.len(), 2, "{:?}", kinds(&events));
    let a = app.run("alice", children[0].1).await;
    let b = app.run("alice", children[1].1).await;
    assert_eq!((a.status, b.status), (RunStatus::Succeeded, RunStatus::Succeeded));
    assert_eq!(a.parent_run_id, Some(parent));
    assert_eq!(a.session_id, app.run("alice", parent).await.session_id, "same session");
    // The spans overlap: each started before the other finished.
    let (a_start, a_end) = (a.started_at.unwrap(), a.finished_at.unwrap());
    let (b_start, b_end) = (b.started_at.unwrap(), b.finished_at.unwrap());
    assert!(a_start < b_end && b_start < a_end, "a {a_start}..{a_end}, b {b_start}..{b_end}");

    // The parent's tool results are the children's final answers, in the
    // model's order, and the model saw them.
    let results: Vec<(&str, &str, bool)> = pick!(events, EventBody::ToolResult { call_id, output, is_error, .. } =>
        (call_id.as_str(), output.as_str(), *is_error))
    .collect();
    assert_eq!(
        results,
        [(children[0].0.as_str(), "answer from ALPHA", false), (children[1].0.as_str(), "answer from BETA", false)]
    );
    let last = app.model.requests().into_iter().filter(|r| r.body["messages"][1]["content"] == "split the work").last();
    let last = last.map(|r| r.body.to_string()).unwrap_or_default();
    assert!(last.contains("answer from ALPHA") && last.contains("answer from BETA"), "{last}");

    // Each child's stream is its own, dense, and holds the whole of it; the
    // parent's holds its step- and tool-level events, tagged, in order.
    for (call_id, child) in &children {
        let own = app.events("alice", *child).await;
        assert_dense(&own, 1);
        assert_eq!(outcome(&own), Some(RunStatus::Succeeded));
        assert!(own.iter().any(|e| matches!(e.body, EventBody::TextDelta { .. })), "{:?}", kinds(&own));
        let tagged: Vec<(i64, String)> = events
            .iter()
            .filter_map(|e| match &e.body {
                EventBody::SubagentEvent { run_id, seq, event, call_id: c, agent_path } if run_id == child => {
                    assert_eq!(c, call_id);
                    assert!(agent_path.starts_with("main/explore["), "{agent_path}");
                    Some((*seq, event["kind"].as_str().unwrap().to_owned()))
                }
                _ => None,
            })
            .collect();
        let copied: Vec<(i64, String)> = own
            .iter()
            .filter(|e| ["step.started", "step.finished", "tool_call.ready", "tool.result"].contains(&e.kind()))
            .map(|e| (e.seq, e.kind().to_owned()))
            .collect();
        assert_eq!(tagged, copied, "the child's step and tool events, in its order, with its seqs");
        assert!(!tagged.iter().any(|(_, kind)| kind == "text.delta"), "streamed text stays in the child's stream");
    }

    // The parent's totals include its children's tokens: 2 x 110 of its
    // own, 2 x 90 for each child.
    let usages: Vec<_> = pick!(events, EventBody::StepFinished { usage, step, .. } => (*step, *usage)).collect();
    assert_eq!(tokens_of(&events), 220, "{usages:?}");
    assert_eq!(total_tokens(&events), 220 + 2 * 90);
    let finished: Vec<(u32, &str)> =
        pick!(events, EventBody::SubagentFinished { steps, status, .. } => (*steps, status.as_str())).collect();
    assert_eq!(finished, [(2, "succeeded"), (2, "succeeded")]);
}

#[tokio::test]
async fn a_child_at_the_depth_limit_has_no_task_tool() {
    let script = vec![Reply::tools(vec![task("DEEP", "general")]), Reply::text("parent done")];
    let app = TestApp::spawn(Options { script, ..Default::default() }).await;
    // The child tries anyway.
    app.model.script_thread("DEEP", vec![Reply::tools(vec![task("DEEPER", "general")]), Reply::text("child done")]);
    let parent = app.submit("alice", CreateRun::new("go deep")).await.id;
    let events = app.events("alice", parent).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let children = started(&events);
    assert_eq!(children.len(), 1);
    let child = children[0].1;
    let own = app.events("alice", child).await;
    let results: Vec<(&str, bool)> =
        pick!(own, EventBody::ToolResult { output, is_error, .. } => (output.as_str(), *is_error)).collect();
    assert_eq!(results.len(), 1);
    assert!(results[0].1 && results[0].0.contains("not available"), "{results:?}");
    assert_eq!(child_count(&app, child).await, 0, "no grandchild was started");
    // The model was shown `task` in the parent's requests, never in the child's.
    let tool_names = |body: &Value| -> Vec<String> {
        body["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap().to_owned()).collect()
    };
    let requests = app.model.requests();
    let (childs, parents): (Vec<_>, Vec<_>) =
        requests.iter().partition(|r| r.body["messages"][1]["content"].to_string().contains("DEEP: find it"));
    assert!(!childs.is_empty() && !parents.is_empty());
    assert!(parents.iter().all(|r| tool_names(&r.body).contains(&"task".to_owned())));
    assert!(childs.iter().all(|r| !tool_names(&r.body).contains(&"task".to_owned())));
    assert!(childs[0].body["messages"][0]["content"].as_str().unwrap().contains("sub-agent"), "its own system prompt");
}

#[tokio::test]
async fn a_child_stops_at_its_share_and_the_parent_never_overspends() {
    // 100 tokens a call; the parent may spend 1000 in all.
    let script = vec![Reply::tools(vec![task("THRIFTY", "explore")]).with_usage(90, 10), Reply::text("never")];
    let app = TestApp::spawn(Options { script, ..Default::default() }).await;
    let busy: Vec<Reply> =
        (0..30).map(|i| Reply::tool("glob", json!({"pattern": format!("*{i}")})).with_usage(90, 10)).collect();
    app.model.script_thread("THRIFTY", busy);
    let limits = Limits { max_tokens: Some(1000), ..Limits::default() };
    let parent = app.submit("alice", CreateRun { limits: Some(limits), ..CreateRun::new("spend") }).await.id;
    let events = app.events("alice", parent).await;
    let child = started(&events)[0].1;
    let own = app.events("alice", child).await;
    // The child had the 900 the parent had left after its first step.
    match &own.last().unwrap().body {
        EventBody::RunFailed { error } => assert!(error.contains("token budget exhausted: 900 of 900"), "{error}"),
        other => panic!("the child did not stop at its budget: {other:?}"),
    }
    // Its failure is a tool error for the parent, whose budget (its own
    // spend plus the child's) is then spent: it stops before another call.
    let results: Vec<bool> = pick!(events, EventBody::ToolResult { is_error, .. } => *is_error).collect();
    assert_eq!(results, [true]);
    match &events.last().unwrap().body {
        EventBody::RunFailed { error } => assert!(error.contains("token budget exhausted: 1000 of 1000"), "{error}"),
        other => panic!("{other:?}: {:?}", kinds(&events)),
    }
    let spent = tokens_of(&events) + tokens_of(&own);
    assert_eq!(spent, 1000, "never more than the parent's budget");
    assert_eq!(total_tokens(&events), 1000);
    assert_eq!(app.model.requests().len(), 10);
}

#[tokio::test]
async fn a_parent_with_no_step_left_for_a_child_gets_a_tool_error() {
    let script = vec![Reply::tools(vec![task("NONE", "explore")]), Reply::text("fine")];
    let app = TestApp::spawn(Options { script, ..Default::default() }).await;
    let limits = Limits { max_steps: Some(2), ..Limits::default() };
    let parent = app.submit("alice", CreateRun { limits: Some(limits), ..CreateRun::new("x") }).await.id;
    let events = app.events("alice", parent).await;
    let results: Vec<(&str, bool)> =
        pick!(events, EventBody::ToolResult { output, is_error, .. } => (output.as_str(), *is_error)).collect();
    assert!(results[0].1 && results[0].0.contains("no step budget left"), "{results:?}");
    assert_eq!(child_count(&app, parent).await, 0);
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded));
}

#[tokio::test]
async fn cancelling_the_parent_cancels_its_children() {
    let script = vec![Reply::tools(vec![task("SLOW1", "explore"), task("SLOW2", "explore")])];
    let app = TestApp::spawn(Options { script, ..Default::default() }).await;
    app.model.script_thread("SLOW1", vec![Reply::hang()]);
    app.model.script_thread("SLOW2", vec![Reply::hang()]);
    let parent = app.submit("alice", CreateRun::new("wait forever")).await.id;
    // Both children are in their model calls (three requests: parent, two children).
    app.model.wait_for_requests(3, Duration::from_secs(60)).await.unwrap();
    let seen = app.wait_for_event(parent, "subagent.started").await;
    let r =
        app.http.post(app.url(&format!("/v1/runs/{parent}/cancel"))).bearer_auth(token("alice")).send().await.unwrap();
    assert_eq!(r.status(), 202);
    let asked = Instant::now();
    let events = app.events_after("alice", parent, seen.last().map(|e| e.seq)).await;
    assert_eq!(outcome(&events), Some(RunStatus::Cancelled), "{:?}", kinds(&events));
    let children: Vec<Uuid> = {
        let sql = app.sql().await;
        sql.query("SELECT id FROM runs WHERE parent_run_id = $1", &[&parent])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    assert_eq!(children.len(), 2);
    for child in children {
        let own = app.events("alice", child).await;
        assert_dense(&own, 1);
        assert_eq!(outcome(&own), Some(RunStatus::Cancelled), "{:?}", kinds(&own));
    }
    let took = asked.elapsed();
    eprintln!("parent and children cancelled {took:?} after the request");
    // A generous bound: the figure itself is printed above.
    assert!(took < Duration::from_secs(20), "took {took:?}");
}

#[tokio::test]
async fn a_child_survives_its_workers_death_with_its_parent() {
    let script = vec![Reply::tools(vec![task("ORPHAN", "explore")]), Reply::text("parent recovered")];
    let app = TestApp::spawn(Options { script, worker: false, ..Default::default() }).await;
    // The first model call of the child never answers: the worker dies in it.
    app.model.script_thread("ORPHAN", vec![Reply::hang(), Reply::text("child recovered")]);
    let doomed = WorkerProcess::start(&app, 30, &[]).await;
    let parent = app.submit("alice", CreateRun::new("work")).await.id;
    app.model.wait_for_requests(2, Duration::from_secs(60)).await.unwrap();
    let child = app.wait_for_event(parent, "subagent.started").await;
    let child = started(&child)[0].1;
    app.wait_for_event(child, "step.started").await;
    app.start_worker(worker_config(ProviderKind::OpenAi, Duration::from_secs(30))).await;
    doomed.kill().await;

    let events = app.events("alice", parent).await;
    assert_dense(&events, 1);
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let attempts: Vec<i32> = pick!(events, EventBody::RunStarted { attempt, .. } => *attempt).collect();
    assert_eq!(attempts, [1, 2], "the parent was taken over");
    let own = app.events("alice", child).await;
    assert_dense(&own, 1);
    assert_eq!(outcome(&own), Some(RunStatus::Succeeded), "{:?}", kinds(&own));
    let attempts: Vec<i32> = pick!(own, EventBody::RunStarted { attempt, .. } => *attempt).collect();
    assert_eq!(attempts, [1, 2], "the child was taken over, not started again");

    // Nothing twice: one child, one prompt in its conversation, one answer
    // to the parent's call, one end.
    assert_eq!(child_count(&app, parent).await, 1);
    let sql = app.sql().await;
    let prompts: i64 = sql
        .query_one("SELECT count(*) FROM messages WHERE run_id = $1 AND role = 'user'", &[&child])
        .await
        .unwrap()
        .get(0);
    assert_eq!(prompts, 1);
    let results: Vec<&str> = pick!(events, EventBody::ToolResult { output, .. } => output.as_str()).collect();
    assert_eq!(results, ["child recovered"]);
    assert_eq!(pick!(events, EventBody::SubagentFinished { .. } => ()).count(), 1);
    let parent_results: i64 = sql
        .query_one(
            "SELECT count(*) FROM messages, jsonb_array_elements(parts) p
             WHERE run_id = $1 AND role = 'tool' AND p->>'type' = 'tool_result'",
            &[&parent],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(parent_results, 1);
    // The parent's conversation does not hold the child's messages.
    let session = app.run("alice", parent).await.session_id;
    let conversation = app.store.load_messages(session).await.unwrap();
    assert!(
        !conversation.iter().any(|m| m.text().contains("child recovered") && m.role == kiln_protocol::Role::Assistant)
    );
}

/// The operator's kinds of the tests below: `lister` may call `ls` and
/// nothing else.
const KINDS_FILE: &str = r#"
[kinds.lister]
description = "lists directories and nothing else"
prompt = "You are LISTER, a sub-agent that lists directories."
tools = ["ls"]
"#;

fn operator_kinds() -> Arc<AgentKinds> {
    Arc::new(AgentKinds::from_toml(KINDS_FILE).unwrap())
}

/// An app whose API and worker know the operator's kinds.
async fn app_with_kinds(script: Vec<Reply>) -> TestApp {
    let kinds = operator_kinds();
    let api = kiln_api::ApiSettings { agent_kinds: kinds.clone(), ..Options::default().api };
    let app = TestApp::spawn(Options { script, api, worker: false, ..Default::default() }).await;
    app.start_worker(worker_config_with(kinds)).await;
    app
}

fn worker_config_with(kinds: Arc<AgentKinds>) -> kiln_worker::WorkerConfig {
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    config.subagents.kinds = kinds;
    config
}

/// The `task` tool of a model request (OpenAI Chat format), if it has one.
fn task_tool(body: &Value) -> Option<Value> {
    body["tools"].as_array()?.iter().find(|t| t["function"]["name"] == "task").map(|t| t["function"].clone())
}

fn tool_names(body: &Value) -> Vec<String> {
    body["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test]
async fn an_operator_kind_gives_its_child_only_its_tools_and_its_prompt() {
    let script = vec![Reply::tools(vec![task("LIST", "lister")]), Reply::text("parent done")];
    let app = app_with_kinds(script).await;
    // The child tries a tool outside its kind's set, then one inside it.
    app.model.script_thread(
        "LIST",
        vec![
            Reply::tool("view", json!({"path": "README.md"})),
            Reply::tool("ls", json!({"path": "."})),
            Reply::text("listed it"),
        ],
    );
    let parent = app.submit("alice", CreateRun::new("list things")).await.id;
    let events = app.events("alice", parent).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let results: Vec<&str> = pick!(events, EventBody::ToolResult { output, .. } => output.as_str()).collect();
    assert_eq!(results, ["listed it"]);

    let child = started(&events)[0].1;
    assert!(app.run("alice", child).await.agent_path.unwrap().starts_with("main/lister["));
    let own = app.events("alice", child).await;
    let results: Vec<(&str, bool, &str)> = pick!(own, EventBody::ToolResult { name, is_error, output, .. } =>
        (name.as_str(), *is_error, output.as_str()))
    .collect();
    assert_eq!(results.len(), 2, "{results:?}");
    assert_eq!((results[0].0, results[0].1), ("view", true), "{results:?}");
    assert!(results[0].2.contains("not available"), "{results:?}");
    assert_eq!((results[1].0, results[1].1), ("ls", false), "{results:?}");

    // The model was shown the kind in the parent's `task` tool, and the
    // child its tools and its prompt.
    let requests = app.model.requests();
    let (childs, parents): (Vec<_>, Vec<_>) =
        requests.iter().partition(|r| r.body["messages"][1]["content"].to_string().contains("LIST: find it"));
    let task = task_tool(&parents[0].body).expect("the parent has the task tool");
    assert_eq!(task["parameters"]["properties"]["agent"]["enum"], json!(["explore", "general", "lister"]));
    assert!(task["description"].as_str().unwrap().contains("`lister`: lists directories and nothing else"));
    assert_eq!(childs.len(), 3);
    for request in childs {
        assert_eq!(tool_names(&request.body), ["ls"]);
        let system = request.body["messages"][0]["content"].as_str().unwrap();
        assert!(system.contains("You are LISTER"), "{system}");
    }
}

#[tokio::test]
async fn a_run_narrowed_to_one_kind_offers_only_that_kind() {
    let script = vec![Reply::tools(vec![task("OTHER", "general")]), Reply::text("parent done")];
    let app = app_with_kinds(script).await;

    // A kind the deployment does not have is refused, and nothing stored.
    let (status, body) =
        app.post_json("alice", "/v1/runs", json!({"prompt": "x", "agents": ["explore", "nope"]})).await;
    assert_eq!(status, 422, "{body}");
    assert!(body.to_string().contains("\\\"nope\\\""), "{body}");
    let sql = app.sql().await;
    let runs: i64 = sql.query_one("SELECT count(*) FROM runs", &[]).await.unwrap().get(0);
    assert_eq!(runs, 0);

    let spec = CreateRun { agents: Some(vec!["explore".into()]), ..CreateRun::new("only explore") };
    let run = app.submit("alice", spec).await;
    assert_eq!(run.agents, Some(vec!["explore".to_owned()]));
    let events = app.events("alice", run.id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));

    // The model saw only `explore`, in the schema and in the description.
    let first = &app.model.requests()[0].body;
    let task = task_tool(first).expect("the task tool");
    assert_eq!(task["parameters"]["properties"]["agent"]["enum"], json!(["explore"]));
    let description = task["description"].as_str().unwrap();
    assert!(description.contains("`explore`") && !description.contains("`general`"), "{description}");
    // Naming another kind anyway is a tool error, and starts nothing.
    let results: Vec<(&str, bool)> =
        pick!(events, EventBody::ToolResult { output, is_error, .. } => (output.as_str(), *is_error)).collect();
    assert_eq!(results.len(), 1);
    assert!(results[0].1 && results[0].0.contains("not available to this run"), "{results:?}");
    assert_eq!(child_count(&app, run.id).await, 0);

    // No kind at all: no task tool.
    let spec = CreateRun { agents: Some(Vec::new()), ..CreateRun::new("no kinds") };
    app.model.script_thread("no kinds", vec![Reply::text("alone")]);
    let run = app.submit("alice", spec).await;
    app.events("alice", run.id).await;
    let request = app.model.requests().into_iter().find(|r| r.body.to_string().contains("no kinds")).unwrap();
    assert!(task_tool(&request.body).is_none());
}

#[tokio::test]
async fn a_runs_narrowing_survives_a_takeover() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kinds.toml");
    std::fs::write(&file, KINDS_FILE).unwrap();
    let operator = operator_kinds();
    let api = kiln_api::ApiSettings { agent_kinds: operator.clone(), ..Options::default().api };
    // The first model call never answers: the worker dies in it.
    let script = vec![Reply::hang(), Reply::text("recovered")];
    let app = TestApp::spawn(Options { script, api, worker: false, ..Default::default() }).await;
    let doomed = WorkerProcess::start(&app, 30, &[("KILN_AGENT_KINDS", file.to_str().unwrap())]).await;
    let spec = CreateRun { agents: Some(vec!["lister".into()]), ..CreateRun::new("narrow") };
    let run = app.submit("alice", spec).await.id;
    app.model.wait_for_requests(1, Duration::from_secs(60)).await.unwrap();
    app.start_worker(worker_config_with(operator)).await;
    doomed.kill().await;

    let events = app.events("alice", run).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let attempts: Vec<i32> = pick!(events, EventBody::RunStarted { attempt, .. } => *attempt).collect();
    assert_eq!(attempts, [1, 2], "taken over");
    let requests = app.model.requests();
    assert_eq!(requests.len(), 2);
    for request in requests {
        let task = task_tool(&request.body).expect("the task tool");
        assert_eq!(task["parameters"]["properties"]["agent"]["enum"], json!(["lister"]));
    }
}

#[tokio::test]
async fn an_invalid_kinds_file_stops_the_worker_from_starting() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kinds.toml");
    std::fs::write(&file, "[kinds.greedy]\ndescription = \"d\"\nprompt = \"p\"\nbudget_share = 2\n").unwrap();
    let out = tokio::process::Command::new(kiln_tests::kiln_bin::kiln_bin())
        .arg("worker")
        .env_clear()
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .env("KILN_AGENT_KINDS", &file)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out).await.unwrap().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("KILN_AGENT_KINDS") && stderr.contains("\"greedy\": budget_share"), "{stderr}");
}

/// A git repository holding `files`, as a `file://` URL (the test workers
/// allow those).
fn repo_with(files: &[(&str, &str)]) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    for (path, content) in files {
        std::fs::write(dir.path().join(path), content).unwrap();
    }
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    git(&["init", "-q", "-b", "main"]);
    git(&["add", "."]);
    git(&["commit", "-q", "-m", "init"]);
    let url = format!("file://{}", dir.path().display());
    (dir, url)
}

/// A child's system prompt has its parent's `AGENTS.md`, as the parent read
/// it at its start (children started together do not each read it again):
/// an edit the parent made meanwhile is in neither prompt.
#[tokio::test]
async fn a_child_gets_the_agents_md_its_parent_read() {
    let (_repo, url) = repo_with(&[("AGENTS.md", "Always ORIGINAL-RULE.\n")]);
    let script = vec![
        Reply::tool("bash", json!({"command": "echo 'Always EDITED-RULE.' > AGENTS.md"})),
        Reply::tools(vec![task("GAMMA", "explore")]),
        Reply::text("parent done"),
    ];
    let app = TestApp::spawn(Options { script, ..Default::default() }).await;
    app.model.script_thread("GAMMA", vec![Reply::text("answer from GAMMA")]);
    let spec = CreateRun {
        repo: Some(kiln_protocol::RepoSpec { url, git_ref: None }),
        ..CreateRun::new("edit the rules, then ask")
    };
    let parent = app.submit("alice", spec).await.id;
    let events = app.events("alice", parent).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    assert_eq!(started(&events).len(), 1, "{:?}", kinds(&events));
    let requests = app.model.requests();
    let child =
        requests.iter().find(|r| r.body["messages"][1]["content"] == "GAMMA: find it").expect("the child's call");
    let system = child.body["messages"][0]["content"].to_string();
    assert!(system.contains("Always ORIGINAL-RULE."), "{system}");
    assert!(!system.contains("EDITED-RULE"), "{system}");
}
