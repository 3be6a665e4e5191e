//! MCP tools from a remote server: a server the test runs on loopback,
//! written with the official MCP Python SDK (`tests/mcp/demo_server.py`,
//! the SDK pinned in `tests/tools/mcp.txt` and installed by `scripts/test`
//! into `.kiln/tools/mcp`). Without the SDK these tests say so and pass,
//! unless `KILN_REQUIRE_MCP_TOOLS` is set (`scripts/test` sets it unless `=0`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use kiln_protocol::{ApprovalMode, CreateRun, EventBody, RunStatus};
use kiln_scripted_model::{Reply, ScriptedCall};
use kiln_tests::logs::Logs;
use kiln_tests::mcp_demo::{DemoServer, sdk_python};
use kiln_tests::{Event, Options, TestApp, kinds, outcome, pick, worker_config};
use kiln_worker::ProviderKind;
use kiln_worker::mcp::McpConfig;
use kiln_worker::mcp::names::{MAX_NAME_CHARS, Namer};
use serde_json::{Value, json};

/// The key the server requires in `X-Api-Key`; it must reach the server and
/// nothing else.
const SECRET: &str = "kiln-mcp-secret-7f3a9c41d2";
/// A server name that makes `mcp__<server>__<tool>` too long for the tool
/// with the long name.
const LONG_SERVER: &str = "a_server_with_a_name_long_enough_for_the_cut";
/// `LONG_TOOL` of demo_server.py.
const LONG_TOOL: &str = "a_tool_whose_name_is_long_enough_to_need_cutting";

/// A server entry of the worker's configuration for `server`.
fn entry(server: &DemoServer, extra: Value) -> Value {
    let mut entry = json!({"url": server.url, "headers": {"X-Api-Key": SECRET}});
    entry.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    entry
}

/// An app whose worker has the MCP servers `servers` (a JSON object).
async fn app_with(script: Vec<Reply>, servers: Value) -> TestApp {
    let app = TestApp::spawn(Options { script, worker: false, ..Default::default() }).await;
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    config.mcp = Arc::new(McpConfig::parse(&json!({ "servers": servers }).to_string()).unwrap());
    app.start_worker(config).await;
    app
}

/// The names of the tools a model request offered.
fn offered(body: &Value) -> Vec<String> {
    let mut names: Vec<String> =
        body["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap().to_owned()).collect();
    names.sort();
    names
}

/// The results of calls to `name`: (output, is_error).
fn results(events: &[Event], name: &str) -> Vec<(String, bool)> {
    pick!(events, EventBody::ToolResult { name: n, output, is_error, .. } => (n, output.clone(), *is_error))
        .filter(|(n, ..)| *n == name)
        .map(|(_, output, is_error)| (output, is_error))
        .collect()
}

#[tokio::test]
async fn a_remote_tool_works_and_its_secret_header_reaches_only_the_server() {
    let Some(python) = sdk_python() else { return };
    let logs = Logs::capture(tracing_subscriber::filter::LevelFilter::TRACE);
    let server = DemoServer::start(&python, SECRET).await;
    let script = vec![
        Reply::tool("mcp__demo__add", json!({"a": 2, "b": 3})),
        Reply::tool("bash", json!({"command": "env"})),
        Reply::text("done"),
    ];
    let app = app_with(script, json!({"demo": entry(&server, json!({}))})).await;
    let id = app.submit("alice", CreateRun::new("add two and three")).await.id;
    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));

    assert_eq!(results(&events, "mcp__demo__add"), [("5".to_owned(), false)]);
    let requests = app.model.requests();
    assert_eq!(requests.len(), 3);
    let tools = offered(&requests[0].body);
    for name in ["mcp__demo__add", "mcp__demo__shout", "mcp__demo__huge", "bash", "view"] {
        assert!(tools.contains(&name.to_owned()), "{name} not in {tools:?}");
    }
    // The model was given the server's schema and the result.
    let add = requests[0].body["tools"].as_array().unwrap().iter().find(|t| t["function"]["name"] == "mcp__demo__add");
    assert_eq!(add.unwrap()["function"]["parameters"]["required"], json!(["a", "b"]));
    let answer = requests[1].body["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(answer["content"], "5");

    // The server got the key with every request, so it was the worker that
    // sent it...
    let seen = server.keys_seen();
    assert!(!seen.is_empty() && seen.iter().all(|k| k == SECRET), "{seen:?}");
    // ...and nothing else ever held it: not the events (the sandbox's
    // environment, printed by the bash call, is among them), not what the
    // model was sent, not the logs.
    let env = results(&events, "bash");
    assert!(env.len() == 1 && !env[0].1 && env[0].0.contains("PATH="), "{env:?}");
    let stored = serde_json::to_string(&app.stored_events(id).await.iter().map(|e| &e.body).collect::<Vec<_>>());
    assert!(!stored.unwrap().contains(SECRET), "an event holds the secret");
    for request in &requests {
        assert!(!String::from_utf8_lossy(&request.bytes).contains(SECRET), "a model request holds the secret");
    }
    let log = logs.text();
    assert!(log.contains("MCP server connected"), "the logs were captured");
    assert!(!log.contains(SECRET), "a log line holds the secret");
}

#[tokio::test]
async fn long_names_are_cut_and_callable_and_allowed_tools_patterns_pick_mcp_tools() {
    let Some(python) = sdk_python() else { return };
    let server = DemoServer::start(&python, SECRET).await;
    // What the worker calls the long tool: cut to 64 with a hash suffix.
    let cut = Namer::default().name(LONG_SERVER, LONG_TOOL);
    let (head, hash) = cut.rsplit_once('_').unwrap();
    assert_eq!(cut.len(), MAX_NAME_CHARS);
    assert!(head.starts_with(&format!("mcp__{LONG_SERVER}__a_to")), "{cut}");
    assert!(hash.len() == 8 && hash.chars().all(|c| c.is_ascii_hexdigit()), "{cut}");
    let script = vec![
        Reply::tools(vec![
            ScriptedCall::new(cut.clone(), json!({"a": 6, "b": 7})),
            ScriptedCall::new("mcp__demo__shout", json!({"text": "hi"})),
        ]),
        Reply::text("done"),
    ];
    let servers = json!({"demo": entry(&server, json!({})), LONG_SERVER: entry(&server, json!({}))});
    let app = app_with(script, servers).await;
    let spec = CreateRun {
        allowed_tools: Some(vec!["view".into(), "mcp__demo__ad*".into(), "mcp__a_server_*__a*".into()]),
        ..CreateRun::new("multiply")
    };
    let id = app.submit("alice", spec).await.id;
    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let mut want =
        vec!["view".to_owned(), "mcp__demo__add".to_owned(), format!("mcp__{LONG_SERVER}__add"), cut.clone()];
    want.sort();
    assert_eq!(offered(&app.model.requests()[0].body), want);
    assert_eq!(results(&events, &cut), [("42".to_owned(), false)]);
    let refused = results(&events, "mcp__demo__shout");
    assert!(refused.len() == 1 && refused[0].1 && refused[0].0.contains("not available"), "{refused:?}");
}

#[tokio::test]
async fn mcp_tools_wait_for_approval_unless_a_trusted_server_marks_them_read_only() {
    let Some(python) = sdk_python() else { return };
    let server = DemoServer::start(&python, SECRET).await;
    let script = vec![
        Reply::tool("mcp__demo__shout", json!({"text": "hi"})),
        Reply::tool("mcp__demo__add", json!({"a": 1, "b": 2})),
        Reply::tool("mcp__untrusted__shout", json!({"text": "yo"})),
        Reply::text("done"),
    ];
    let servers = json!({
        "demo": entry(&server, json!({"trust_read_only_hints": true})),
        "untrusted": entry(&server, json!({})),
        "other": entry(&server, json!({})),
    });
    let app = app_with(script, servers).await;
    let spec = CreateRun {
        approval: Some(ApprovalMode::Mutating),
        mcp: Some(vec!["demo".into(), "untrusted".into()]),
        ..CreateRun::new("work")
    };
    let id = app.submit("alice", spec).await.id;
    // Approve whatever asks, noting what asked.
    let mut asked = Vec::new();
    let mut after = None;
    loop {
        let seen = app
            .events_until("alice", id, after, |e| {
                e.kind() == "approval.requested" || e.body.terminal_status().is_some()
            })
            .await;
        let last = seen.last().unwrap();
        after = Some(last.seq);
        match &last.body {
            EventBody::ApprovalRequested { call_id, name, .. } => {
                asked.push(name.clone());
                let path = format!("/v1/runs/{id}/approvals/{call_id}");
                let (status, body) = app.post_json("alice", &path, json!({"decision": "approve"})).await;
                assert!(status < 300, "{status} {body}");
            }
            _ => break,
        }
    }
    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    assert_eq!(asked, ["mcp__demo__add", "mcp__untrusted__shout"]);
    // The run's `mcp` left the third server out.
    let tools = offered(&app.model.requests()[0].body);
    assert!(tools.contains(&"mcp__untrusted__add".to_owned()), "{tools:?}");
    assert!(!tools.iter().any(|t| t.starts_with("mcp__other__")), "{tools:?}");
    assert_eq!(results(&events, "mcp__demo__shout"), [("HI".to_owned(), false)]);
    assert_eq!(results(&events, "mcp__demo__add"), [("3".to_owned(), false)]);
    assert_eq!(results(&events, "mcp__untrusted__shout"), [("YO".to_owned(), false)]);
}

#[tokio::test]
async fn server_failures_are_tool_errors_and_huge_results_are_capped() {
    let Some(python) = sdk_python() else { return };
    let server = DemoServer::start(&python, SECRET).await;
    // A port nothing listens on: the server that is down.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let script = vec![
        Reply::tool("mcp__demo__huge", json!({"size": 300_000})),
        Reply::tool("mcp__demo__boom", json!({})),
        Reply::tool("mcp__demo__slow", json!({"seconds": 30})),
        Reply::tool("mcp__demo__add", json!({"a": 1, "b": 1})),
        Reply::text("done"),
    ];
    let servers = json!({
        "demo": entry(&server, json!({"timeout_s": 2})),
        "gone": {"url": format!("http://127.0.0.1:{closed}/mcp"), "timeout_s": 2},
    });
    let app = app_with(script, servers).await;
    let id = app.submit("alice", CreateRun::new("try things")).await.id;
    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));

    // The missing server is told to the model, not a failed run.
    let first = app.model.requests()[0].body.to_string();
    assert!(first.contains("unavailable") && first.contains("- gone:"), "{first}");
    assert!(!offered(&app.model.requests()[0].body).iter().any(|t| t.starts_with("mcp__gone")));

    let huge = results(&events, "mcp__demo__huge");
    assert_eq!(huge.len(), 1);
    assert!(!huge[0].1 && huge[0].0.len() < 110 * 1024, "{}", huge[0].0.len());
    assert!(huge[0].0.contains("the MCP server's result was 300000 bytes"), "{}", &huge[0].0[huge[0].0.len() - 200..]);

    let boom = results(&events, "mcp__demo__boom");
    assert!(boom.len() == 1 && boom[0].1 && boom[0].0.contains("Error executing tool boom"), "{boom:?}");
    let slow = results(&events, "mcp__demo__slow");
    assert!(slow.len() == 1 && slow[0].1 && slow[0].0.contains("did not answer within 2 s"), "{slow:?}");
    // After the timeout the next call connects again and works.
    assert_eq!(results(&events, "mcp__demo__add"), [("2".to_owned(), false)]);
}

/// The `tools` array of a request exactly as its bytes went out.
fn tools_bytes(request: &kiln_scripted_model::RecordedRequest) -> String {
    let text = String::from_utf8_lossy(&request.bytes).into_owned();
    let start = text.find("\"tools\":[").expect("a tools array") + "\"tools\":".len();
    // To the bracket that closes it (brackets inside strings do not count).
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (i, c) in text[start..].char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_string => escaped = true,
            '"' => in_string = !in_string,
            '[' | '{' if !in_string => depth += 1,
            ']' | '}' if !in_string => {
                depth -= 1;
                if depth == 0 {
                    return text[start..=start + i].to_owned();
                }
            }
            _ => {}
        }
    }
    panic!("the tools array does not end")
}

#[tokio::test]
async fn a_changed_tool_list_is_offered_from_the_next_step_and_an_unchanged_one_keeps_its_bytes() {
    let Some(python) = sdk_python() else { return };
    let server = DemoServer::start(&python, SECRET).await;
    let script = vec![
        Reply::tool("mcp__demo__add", json!({"a": 1, "b": 2})),
        // Adds `double` and sends `notifications/tools/list_changed`.
        Reply::tool("mcp__demo__grow", json!({})),
        Reply::tool("mcp__demo__double", json!({"x": 21})),
        Reply::text("done"),
    ];
    let app = app_with(script, json!({"demo": entry(&server, json!({}))})).await;
    let id = app.submit("alice", CreateRun::new("grow")).await.id;
    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let requests = app.model.requests();
    assert_eq!(requests.len(), 4);

    // Nothing changed between the first two steps: the same bytes.
    assert_eq!(tools_bytes(&requests[0]), tools_bytes(&requests[1]));
    let before = offered(&requests[1].body);
    assert!(!before.contains(&"mcp__demo__double".to_owned()), "{before:?}");
    // The step after `grow` offers the new tool, and every other tool as
    // it was (the same names).
    let after = offered(&requests[2].body);
    let mut want = before.clone();
    want.push("mcp__demo__double".to_owned());
    want.sort();
    assert_eq!(after, want);
    assert_eq!(results(&events, "mcp__demo__grow"), [("grown".to_owned(), false)]);
    assert_eq!(results(&events, "mcp__demo__double"), [("42".to_owned(), false)]);
    // No change since: the same bytes again.
    assert_eq!(tools_bytes(&requests[2]), tools_bytes(&requests[3]));
    // One connection all along: the list was asked for again on it.
    assert_eq!(server.initializations(), 1);
}

#[tokio::test]
async fn allowed_tools_and_the_approval_gate_apply_to_a_tool_that_appears_later() {
    let Some(python) = sdk_python() else { return };
    let server = DemoServer::start(&python, SECRET).await;
    let script = vec![
        Reply::tool("mcp__demo__grow", json!({})),
        Reply::tool("mcp__demo__double", json!({"x": 4})),
        Reply::text("done"),
    ];
    let app = app_with(script, json!({"demo": entry(&server, json!({}))})).await;
    // A pattern that leaves `double` out, though it did not exist yet.
    let spec = CreateRun {
        allowed_tools: Some(vec!["mcp__demo__g*".into()]),
        approval: Some(ApprovalMode::Mutating),
        ..CreateRun::new("grow")
    };
    let id = app.submit("alice", spec).await.id;
    let seen = app
        .events_until("alice", id, None, |e| e.kind() == "approval.requested" || e.body.terminal_status().is_some())
        .await;
    // `grow` changes things (no trusted hint): it waits for a person.
    let EventBody::ApprovalRequested { call_id, name, .. } = &seen.last().unwrap().body else {
        panic!("no approval asked: {:?}", kinds(&seen))
    };
    assert_eq!(name, "mcp__demo__grow");
    let (status, body) =
        app.post_json("alice", &format!("/v1/runs/{id}/approvals/{call_id}"), json!({"decision": "approve"})).await;
    assert!(status < 300, "{status} {body}");
    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    assert_eq!(results(&events, "mcp__demo__grow"), [("grown".to_owned(), false)]);
    // The new tool is not offered, and calling it is refused.
    let requests = app.model.requests();
    assert_eq!(offered(&requests[1].body), ["mcp__demo__grow"]);
    let refused = results(&events, "mcp__demo__double");
    assert!(refused.len() == 1 && refused[0].1 && refused[0].0.contains("not available"), "{refused:?}");
}

#[tokio::test]
async fn sub_agents_use_the_parents_mcp_tools_and_connections_and_explore_gets_only_read_only_ones() {
    let Some(python) = sdk_python() else { return };
    let server = DemoServer::start(&python, SECRET).await;
    let task = |marker: &str, agent: &str| {
        ScriptedCall::new("task", json!({"description": marker, "prompt": format!("{marker}: do it"), "agent": agent}))
    };
    let script = vec![Reply::tools(vec![task("GEN", "general"), task("EXP", "explore")]), Reply::text("parent done")];
    let app = app_with(script, json!({"demo": entry(&server, json!({"trust_read_only_hints": true}))})).await;
    app.model.script_thread(
        "GEN",
        vec![Reply::tool("mcp__demo__add", json!({"a": 20, "b": 22})), Reply::text("GEN says 42")],
    );
    app.model.script_thread(
        "EXP",
        vec![Reply::tool("mcp__demo__shout", json!({"text": "hi"})), Reply::text("EXP heard HI")],
    );
    let id = app.submit("alice", CreateRun::new("delegate")).await.id;
    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));

    // The children's answers are the parent's results.
    let answers: Vec<String> = results(&events, "task").into_iter().map(|(output, _)| output).collect();
    assert!(
        answers.iter().any(|a| a.contains("GEN says 42")) && answers.iter().any(|a| a.contains("EXP heard HI")),
        "{answers:?}"
    );

    let requests = app.model.requests();
    let of = |marker: &str| -> Vec<&kiln_scripted_model::RecordedRequest> {
        // A child's conversation starts with its prompt (the parent's
        // later requests hold it too, as the `task` call's arguments).
        let first_user = |r: &&kiln_scripted_model::RecordedRequest| {
            r.body["messages"].as_array().unwrap().iter().find(|m| m["role"] == "user").cloned().unwrap_or_default()
        };
        requests.iter().filter(|r| first_user(r)["content"].to_string().contains(&format!("{marker}: do it"))).collect()
    };
    let (general, explore) = (of("GEN"), of("EXP"));
    assert_eq!((general.len(), explore.len()), (2, 2));
    // The general child has every MCP tool; its call worked.
    let tools = offered(&general[0].body);
    assert!(
        tools.contains(&"mcp__demo__add".to_owned()) && tools.contains(&"mcp__demo__shout".to_owned()),
        "{tools:?}"
    );
    let answer = general[1].body["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(answer["content"], "42");
    // The explore child: the tool the trusted server marks read-only, not
    // the ones that may change things.
    let tools = offered(&explore[0].body);
    assert!(tools.contains(&"mcp__demo__shout".to_owned()), "{tools:?}");
    assert!(!tools.contains(&"mcp__demo__add".to_owned()) && !tools.contains(&"bash".to_owned()), "{tools:?}");
    let answer = explore[1].body["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(answer["content"], "HI");

    // Their rows say what they got.
    for (call_id, run_id) in
        pick!(events, EventBody::SubagentStarted { call_id, run_id, .. } => (call_id.clone(), *run_id))
    {
        let child = app.run("alice", run_id).await;
        let allowed = child.allowed_tools.clone();
        match child.agent_path.as_deref().is_some_and(|p| p.contains("/explore[")) {
            true => {
                let allowed = allowed.unwrap();
                assert!(allowed.contains(&"mcp__demo__shout".to_owned()), "{call_id}: {allowed:?}");
                assert!(!allowed.contains(&"mcp__demo__add".to_owned()), "{call_id}: {allowed:?}");
            }
            _ => assert_eq!(allowed, None, "{call_id}"),
        }
    }
    // One connection to the server for the parent and both children.
    let sessions = server.sessions_seen();
    assert_eq!(server.initializations(), 1, "{sessions}");
}
