//! MCP servers inside the sandbox (stdio): a server the repository ships
//! (`tests/mcp/stdio_server.py`, Python standard library only), started by
//! the worker in the session's container as the sandbox user. What the
//! tests check about the process they check from outside, through Docker,
//! not by asking the worker.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_protocol::{CreateRun, EventBody, RepoSpec, RunStatus};
use kiln_scripted_model::Reply;
use kiln_tests::git_repo::repo_with;
use kiln_tests::{Event, Options, TestApp, docker_exec, kinds, outcome, pick, worker_config};
use kiln_worker::ProviderKind;
use kiln_worker::mcp::{MAX_RESPONSE_BYTES, McpConfig};
use serde_json::{Value, json};

const SERVER: &str = include_str!("../mcp/stdio_server.py");
/// Where the repository has it, and so the workspace.
const SERVER_FILE: &str = "mcp_server.py";

/// An app whose worker has the MCP servers `servers` (a JSON object). The
/// session's container outlives a run (as it does in a deployment), so
/// what is left running in it after the run can be seen; the app removes
/// it when dropped.
async fn app_with(script: Vec<Reply>, servers: Value) -> TestApp {
    let app = TestApp::spawn(Options { script, worker: false, ..Default::default() }).await;
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    config.sandbox_idle = Duration::from_secs(600);
    config.mcp = Arc::new(McpConfig::parse(&json!({ "servers": servers }).to_string()).unwrap());
    app.start_worker(config).await;
    app
}

/// The repository's server, as the operator configures it.
fn local_server() -> Value {
    json!({"command": "python3", "args": [SERVER_FILE], "timeout_s": 300})
}

/// The results of calls to `name`: (output, is_error).
fn results(events: &[Event], name: &str) -> Vec<(String, bool)> {
    pick!(events, EventBody::ToolResult { name: n, output, is_error, .. } => (n, output.clone(), *is_error))
        .filter(|(n, ..)| *n == name)
        .map(|(_, output, is_error)| (output, is_error))
        .collect()
}

/// The repository's server processes in `container`: (pid, uid), from `ps`.
async fn server_processes(container: &str) -> Vec<(u32, u32)> {
    let (code, out) = docker_exec(container, &["ps", "-eo", "pid=,uid=,args="]).await;
    assert_eq!(code, 0, "{out}");
    out.lines()
        .filter(|l| l.contains(SERVER_FILE) && !l.contains("ps -eo"))
        .map(|l| {
            let mut fields = l.split_whitespace();
            (fields.next().unwrap().parse().unwrap(), fields.next().unwrap().parse().unwrap())
        })
        .collect()
}

/// Polls `check` until it gives a value, for at most a minute.
async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, mut check: impl FnMut() -> F) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_server_the_repository_ships_runs_in_the_sandbox_as_its_user_and_comes_back_after_a_kill() {
    let (_repo, url) = repo_with(&[(SERVER_FILE, SERVER)]);
    let script = vec![
        Reply::tool("mcp__local__add", json!({"a": 2, "b": 3})),
        Reply::tool("mcp__local__sleep", json!({"seconds": 600})),
        Reply::tool("mcp__local__add", json!({"a": 4, "b": 5})),
        Reply::tool("mcp__local__whoami", json!({})),
        Reply::text("done"),
    ];
    let app = app_with(script, json!({"local": local_server()})).await;
    let spec = CreateRun { repo: Some(RepoSpec { url, git_ref: None }), ..CreateRun::new("use the local server") };
    let id = app.submit("alice", spec).await.id;

    // Mid-call: the server is in its sleep.
    let seen = app
        .events_until("alice", id, None, |e| {
            matches!(&e.body, EventBody::ToolCallReady { name, .. } if name == "mcp__local__sleep")
                || e.body.terminal_status().is_some()
        })
        .await;
    assert_eq!(seen.last().unwrap().kind(), "tool_call.ready", "{:?}", kinds(&seen));
    let containers = app.containers_of(id).await;
    assert_eq!(containers.len(), 1, "{containers:?}");
    let container = &containers[0];
    let sleeping: u32 = eventually("the server to sleep", || async {
        let (code, out) = docker_exec(container, &["cat", "/tmp/mcp-sleeping"]).await;
        (code == 0).then(|| out.trim().parse().ok()).flatten()
    })
    .await;

    // It runs in the container, as the sandbox user, with no capabilities.
    let processes = server_processes(container).await;
    assert_eq!(processes, [(sleeping, 1000)], "one server, the one sleeping, as uid 1000");
    let (_, status) = docker_exec(container, &["cat", &format!("/proc/{sleeping}/status")]).await;
    for line in
        status.lines().filter(|l| l.starts_with("Uid:") || l.starts_with("CapEff:") || l.starts_with("NoNewPrivs:"))
    {
        let value = line.split_once(':').unwrap().1.trim();
        match line.split_once(':').unwrap().0 {
            "Uid" => assert!(value.split_whitespace().all(|u| u == "1000"), "{line}"),
            "CapEff" => assert_eq!(value, "0000000000000000", "{line}"),
            _ => assert_eq!(value, "1", "{line}"),
        }
    }

    // Killed mid-call (by root in the container: not the worker's doing).
    let (code, out) = docker_exec(container, &["kill", "-9", &sleeping.to_string()]).await;
    assert_eq!(code, 0, "{out}");

    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    assert_eq!(results(&events, "mcp__local__add"), [("5".to_owned(), false), ("9".to_owned(), false)]);
    // The kill is a tool error the model sees, saying what happened.
    let slept = results(&events, "mcp__local__sleep");
    assert!(slept.len() == 1 && slept[0].1, "{slept:?}");
    assert!(slept[0].0.contains("ended during the call") && slept[0].0.contains("137"), "{slept:?}");
    // The next call started it again: another process, the same user.
    let who = results(&events, "mcp__local__whoami");
    assert!(who.len() == 1 && !who[0].1 && who[0].0.starts_with("uid=1000 pid="), "{who:?}");
    assert_ne!(who[0].0, format!("uid=1000 pid={sleeping}"));

    // The run's end stops it; the container stays for the session.
    eventually("the server to stop with the run", || async {
        server_processes(container).await.is_empty().then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_missing_command_is_told_to_the_model_and_an_oversize_message_is_a_tool_error() {
    let (_repo, url) = repo_with(&[(SERVER_FILE, SERVER)]);
    let over = MAX_RESPONSE_BYTES + 1024;
    let script = vec![
        Reply::tool("mcp__missing__anything", json!({})),
        Reply::tool("mcp__local__flood", json!({"size": over})),
        Reply::tool("mcp__local__add", json!({"a": 1, "b": 1})),
        Reply::text("done"),
    ];
    let servers = json!({"local": local_server(), "missing": {"command": "no-such-mcp-server"}});
    let app = app_with(script, servers).await;
    let spec = CreateRun { repo: Some(RepoSpec { url, git_ref: None }), ..CreateRun::new("try things") };
    let id = app.submit("alice", spec).await.id;
    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));

    // The server that does not start is told to the model, with why, and
    // its tools are not offered: calling one is a tool error.
    let first = &app.model.requests()[0].body;
    let said = first.to_string();
    assert!(said.contains("- missing:") && said.contains("not found"), "{said}");
    let offered: Vec<&str> =
        first["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert!(offered.contains(&"mcp__local__add"), "{offered:?}");
    assert!(!offered.iter().any(|t| t.starts_with("mcp__missing")), "{offered:?}");
    let missing = results(&events, "mcp__missing__anything");
    assert!(missing.len() == 1 && missing[0].1, "{missing:?}");

    // A message over the cap stops the server: a tool error that says so.
    let flood = results(&events, "mcp__local__flood");
    assert!(flood.len() == 1 && flood[0].1, "{flood:?}");
    assert!(flood[0].0.contains(&format!("more than {MAX_RESPONSE_BYTES} bytes")), "{flood:?}");
    assert!(flood[0].0.len() < 4096, "{}", flood[0].0.len());
    // And the next call starts it again.
    assert_eq!(results(&events, "mcp__local__add"), [("2".to_owned(), false)]);
}

#[tokio::test]
async fn a_server_restarted_with_other_tools_is_listed_again_before_the_next_step() {
    let (_repo, url) = repo_with(&[(SERVER_FILE, SERVER)]);
    let script = vec![
        // The agent changes what the server lists when it starts...
        Reply::tool("bash", json!({"command": "echo echo > mcp-extra-tools"})),
        // ...and the server dies under a call (the test kills it).
        Reply::tool("mcp__local__sleep", json!({"seconds": 600})),
        // This call starts it again: it now lists `echo` too.
        Reply::tool("mcp__local__add", json!({"a": 4, "b": 5})),
        Reply::tool("mcp__local__echo", json!({"text": "hello"})),
        Reply::text("done"),
    ];
    let app = app_with(script, json!({"local": local_server()})).await;
    let spec = CreateRun { repo: Some(RepoSpec { url, git_ref: None }), ..CreateRun::new("restart the server") };
    let id = app.submit("alice", spec).await.id;
    let seen = app
        .events_until("alice", id, None, |e| {
            matches!(&e.body, EventBody::ToolCallReady { name, .. } if name == "mcp__local__sleep")
                || e.body.terminal_status().is_some()
        })
        .await;
    assert_eq!(seen.last().unwrap().kind(), "tool_call.ready", "{:?}", kinds(&seen));
    let container = app.containers_of(id).await.remove(0);
    let sleeping: u32 = eventually("the server to sleep", || async {
        let (code, out) = docker_exec(&container, &["cat", "/tmp/mcp-sleeping"]).await;
        (code == 0).then(|| out.trim().parse().ok()).flatten()
    })
    .await;
    let (code, out) = docker_exec(&container, &["kill", "-9", &sleeping.to_string()]).await;
    assert_eq!(code, 0, "{out}");

    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    assert_eq!(results(&events, "mcp__local__add"), [("9".to_owned(), false)]);
    assert_eq!(results(&events, "mcp__local__echo"), [("hello".to_owned(), false)]);
    // Offered from the step after the restart on, not before.
    let offers_echo: Vec<bool> = app
        .model
        .requests()
        .iter()
        .map(|r| r.body["tools"].as_array().unwrap().iter().any(|t| t["function"]["name"] == "mcp__local__echo"))
        .collect();
    assert_eq!(offers_echo, [false, false, false, true, true]);
}

#[tokio::test]
async fn a_repository_server_whose_name_holds_a_separator_fails_the_run_and_its_tools_never_run() {
    // `github__x`'s tool `add` would be `mcp__github__x__add`: the
    // deployment's `github` server's tool `x__add` to `mcp__github__*`.
    let file = "[mcp_servers.github__x]\ncommand = \"python3\"\nargs = [\"mcp_server.py\"]\n";
    let (_repo, url) = repo_with(&[(SERVER_FILE, SERVER), (".kiln/environment.toml", file)]);
    let script = vec![Reply::tool("mcp__github__x__add", json!({"a": 2, "b": 3})), Reply::text("done")];
    let app = app_with(script, json!({"github": local_server()})).await;
    let spec = CreateRun {
        repo: Some(RepoSpec { url, git_ref: None }),
        allowed_tools: Some(vec!["mcp__github__*".into()]),
        ..CreateRun::new("use github's tools")
    };
    let id = app.submit("alice", spec).await.id;
    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Failed), "{:?}", kinds(&events));
    let error = pick!(events, EventBody::RunFailed { error } => error.clone()).next().unwrap();
    assert!(error.contains("\"github__x\"") && error.contains("no \"__\""), "{error}");
    assert!(results(&events, "mcp__github__x__add").is_empty(), "the tool ran");
}

#[tokio::test]
async fn an_approval_request_names_the_mcp_server_and_its_tool_apart() {
    let (_repo, url) = repo_with(&[(SERVER_FILE, SERVER)]);
    let script = vec![
        Reply::tool("bash", json!({"command": "true"})),
        Reply::tool("mcp__my_tools__add", json!({"a": 2, "b": 3})),
        Reply::text("done"),
    ];
    let app = app_with(script, json!({"my_tools": local_server()})).await;
    let spec = CreateRun {
        repo: Some(RepoSpec { url, git_ref: None }),
        approval: Some(kiln_protocol::ApprovalMode::Mutating),
        allowed_tools: Some(vec!["bash".into(), "mcp__my_tools__*".into()]),
        ..CreateRun::new("add")
    };
    let id = app.submit("alice", spec).await.id;
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
        let EventBody::ApprovalRequested { call_id, name, mcp_server, mcp_tool, .. } = &last.body else { break };
        asked.push((name.clone(), mcp_server.clone(), mcp_tool.clone()));
        let path = format!("/v1/runs/{id}/approvals/{call_id}");
        let (status, body) = app.post_json("alice", &path, json!({"decision": "approve"})).await;
        assert!(status < 300, "{status} {body}");
    }
    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let mcp = |s: &str| Some(s.to_owned());
    assert_eq!(
        asked,
        [("bash".to_owned(), None, None), ("mcp__my_tools__add".to_owned(), mcp("my_tools"), mcp("add"))],
        "a built-in tool names no server; the MCP tool names its own"
    );
    assert_eq!(results(&events, "mcp__my_tools__add"), [("5".to_owned(), false)]);
    // As stored and served: the JSON has the fields for the MCP tool only.
    let stored = app.stored_events(id).await;
    let requested: Vec<Value> = stored
        .iter()
        .filter(|e| e.kind() == "approval.requested")
        .map(|e| serde_json::to_value(&e.body).unwrap()["payload"].clone())
        .collect();
    assert!(requested[0].get("mcp_server").is_none(), "{requested:?}");
    assert_eq!(requested[1]["mcp_server"], "my_tools", "{requested:?}");
    assert_eq!(requested[1]["mcp_tool"], "add", "{requested:?}");
}
