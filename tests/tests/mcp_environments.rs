//! MCP servers a tenant declares: in an environment through the API
//! (remote ones with secret headers, sealed like the environment's
//! secrets) and in `.kiln/environment.toml` (servers in the sandbox only).
//! The remote server is the official Python SDK's (`tests/mcp/demo_server.py`,
//! as in `mcp.rs`) on loopback, which a tenant's server may reach only
//! when the deployment sets `KILN_MCP_ALLOW_PRIVATE`. Without the SDK the
//! remote tests say so and pass, unless `KILN_REQUIRE_MCP_TOOLS` is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use kiln_protocol::{CreateRun, EventBody, RepoSpec, RunStatus};
use kiln_scripted_model::Reply;
use kiln_store::secrets::SecretsKey;
use kiln_tests::git_repo::repo_with;
use kiln_tests::logs::Logs;
use kiln_tests::mcp_demo::{DemoServer, sdk_python};
use kiln_tests::{Event, Options, TestApp, kinds, outcome, pick, token, worker_config};
use kiln_worker::ProviderKind;
use serde_json::{Value, json};
use uuid::Uuid;

const KEY_HEX: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
/// The key the demo server requires in `X-Api-Key`: it must reach the
/// server and nothing else.
const SECRET: &str = "kiln-env-mcp-secret-51c0ffee";
const STDIO_SERVER: &str = include_str!("../mcp/stdio_server.py");

/// An app whose API and worker share the secrets key; the worker lets
/// tenants' servers be private when `allow_private`.
async fn app(script: Vec<Reply>, allow_private: bool) -> TestApp {
    let key = || Some(Arc::new(SecretsKey::from_hex(KEY_HEX).unwrap()));
    let mut options = Options { script, worker: false, ..Default::default() };
    options.api.secrets_key = key();
    let app = TestApp::spawn(options).await;
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    config.secrets_key = key();
    config.mcp = Arc::new(kiln_worker::mcp::McpConfig { allow_private, ..Default::default() });
    app.start_worker(config).await;
    app
}

async fn request(app: &TestApp, sub: &str, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut r = app.http.request(method, app.url(path)).bearer_auth(token(sub));
    if let Some(body) = body {
        r = r.json(&body);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn run_in(app: &TestApp, sub: &str, url: &str, environment: Option<&str>) -> (Uuid, Vec<Event>) {
    let spec = CreateRun {
        repo: Some(RepoSpec { url: url.to_owned(), git_ref: None }),
        environment: environment.map(str::to_owned),
        ..CreateRun::new("use the tools")
    };
    let id = app.submit(sub, spec).await.id;
    (id, app.events(sub, id).await)
}

/// The names of the tools a model request offered (none: no `tools`).
fn offered(body: &Value) -> Vec<String> {
    let tools = body["tools"].as_array().map(Vec::as_slice).unwrap_or_default();
    tools.iter().map(|t| t["function"]["name"].as_str().unwrap().to_owned()).collect()
}

/// The results of calls to `name`: (output, is_error).
fn results(events: &[Event], name: &str) -> Vec<(String, bool)> {
    pick!(events, EventBody::ToolResult { name: n, output, is_error, .. } => (n, output.clone(), *is_error))
        .filter(|(n, ..)| *n == name)
        .map(|(_, output, is_error)| (output, is_error))
        .collect()
}

/// The text of every message of a model request.
fn request_text(body: &Value) -> String {
    body["messages"].as_array().unwrap().iter().map(|m| m["content"].to_string()).collect::<Vec<_>>().join("\n")
}

/// The prepared images the runs made (the engine is shared).
async fn remove_images(events: &[&[Event]]) {
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    for events in events {
        for key in pick!(events, EventBody::EnvironmentStarted { cache_key, .. } => cache_key.clone()) {
            let options = bollard::query_parameters::RemoveImageOptionsBuilder::new().force(true).build();
            let _ = docker.remove_image(&format!("kiln-env:{key}"), Some(options), None).await;
        }
    }
}

#[tokio::test]
async fn an_environments_remote_server_works_its_header_stays_sealed_and_put_without_headers_keeps_it() {
    let Some(python) = sdk_python() else { return };
    let logs = Logs::capture(tracing_subscriber::filter::LevelFilter::TRACE);
    let server = DemoServer::start(&python, SECRET).await;
    let (_repo, url) = repo_with(&[("README", "hello\n")]);
    let script = vec![
        Reply::tool("mcp__demo__add", json!({"a": 2, "b": 3})),
        Reply::tool("bash", json!({"command": "env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'"})),
        Reply::text("first done"),
        Reply::tool("mcp__demo__add", json!({"a": 20, "b": 22})),
        Reply::text("second done"),
        Reply::text("bob's done"),
    ];
    let app = app(script, true).await;
    let body = json!({
        "name": "tools",
        "setup_script": "true",
        "mcp_servers": {"demo": {"url": server.url, "headers": {"X-Api-Key": SECRET}, "timeout_s": 30}}
    });
    let (status, created) = app.post_json("alice", "/v1/environments", body).await;
    assert_eq!(status, 201, "{created}");
    assert!(!created.to_string().contains(SECRET), "{created}");
    let (status, got) = request(&app, "alice", reqwest::Method::GET, "/v1/environments/tools", None).await;
    assert_eq!(status, 200);
    assert_eq!(got["mcp_servers"]["demo"]["header_names"], json!(["X-Api-Key"]), "{got}");
    assert_eq!(got["mcp_servers"]["demo"]["url"], json!(server.url), "{got}");
    assert!(!got.to_string().contains(SECRET), "{got}");

    let (id, first) = run_in(&app, "alice", &url, Some("tools")).await;
    assert_eq!(outcome(&first), Some(RunStatus::Succeeded), "{:?}", kinds(&first));
    assert_eq!(results(&first, "mcp__demo__add"), [("5".to_owned(), false)]);
    let seen = server.keys_seen();
    assert!(!seen.is_empty() && seen.iter().all(|k| k == SECRET), "the server saw {seen:?}");
    // The sandbox's environment (every process's, printed by bash) is in
    // the events; neither they, the model's requests, the logs nor the
    // stored row hold the value.
    let env = results(&first, "bash");
    assert!(env.len() == 1 && env[0].0.contains("PATH="), "{env:?}");
    let stored = serde_json::to_string(&app.stored_events(id).await.iter().map(|e| &e.body).collect::<Vec<_>>());
    assert!(!stored.unwrap().contains(SECRET), "an event holds the secret");
    let requests = app.model.requests();
    assert!(offered(&requests[0].body).contains(&"mcp__demo__add".to_owned()));
    for request in &requests {
        assert!(!String::from_utf8_lossy(&request.bytes).contains(SECRET), "a model request holds the secret");
    }
    let row = app.sql().await.query_one("SELECT e::text FROM environments e WHERE name = 'tools'", &[]).await.unwrap();
    let row: String = row.get(0);
    assert!(row.contains("X-Api-Key"), "{row}");
    assert!(!row.contains(SECRET) && !row.contains(&hex::encode(SECRET)), "the row holds the secret: {row}");

    // A PUT without headers keeps them: the next run's server still gets the key.
    let put = json!({"name": "tools", "setup_script": "true", "mcp_servers": {"demo": {"url": server.url}}});
    let (status, replaced) = request(&app, "alice", reqwest::Method::PUT, "/v1/environments/tools", Some(put)).await;
    assert_eq!(status, 200, "{replaced}");
    assert_eq!(replaced["mcp_servers"]["demo"]["header_names"], json!(["X-Api-Key"]), "{replaced}");
    let before = server.keys_seen().len();
    let (_, second) = run_in(&app, "alice", &url, Some("tools")).await;
    assert_eq!(outcome(&second), Some(RunStatus::Succeeded), "{:?}", kinds(&second));
    assert_eq!(results(&second, "mcp__demo__add"), [("42".to_owned(), false)]);
    let seen = server.keys_seen();
    assert!(seen.len() > before && seen.iter().all(|k| k == SECRET), "the server saw {seen:?}");

    // Another subject neither sees the environment nor gets its tools.
    let (status, _) = request(&app, "bob", reqwest::Method::GET, "/v1/environments/tools", None).await;
    assert_eq!(status, 404);
    let seen_before = server.keys_seen().len();
    let (_, bobs) = run_in(&app, "bob", &url, None).await;
    assert_eq!(outcome(&bobs), Some(RunStatus::Succeeded), "{:?}", kinds(&bobs));
    let last = app.model.requests().last().unwrap().body.clone();
    assert!(!offered(&last).iter().any(|t| t.starts_with("mcp__")), "{:?}", offered(&last));
    assert_eq!(server.keys_seen().len(), seen_before, "bob's run reached the server");

    let log = logs.text();
    assert!(log.contains("MCP server connected"), "the logs were captured");
    assert!(!log.contains(SECRET), "a log line holds the secret");
    remove_images(&[&first, &second]).await;
}

/// The stored row's sealed headers, by server name (hex).
async fn sealed_headers(app: &TestApp, name: &str) -> Value {
    let row = app
        .sql()
        .await
        .query_one("SELECT mcp_headers_sealed FROM environments WHERE name = $1", &[&name])
        .await
        .unwrap();
    row.get(0)
}

#[tokio::test]
async fn a_put_that_changes_a_servers_url_or_kind_drops_its_stored_headers() {
    let Some(python) = sdk_python() else { return };
    // The server the headers were given for, and a host the caller points
    // the stored server at afterwards (it logs whatever key it is sent).
    let trusted = DemoServer::start(&python, SECRET).await;
    let elsewhere = DemoServer::start(&python, "not-the-secret").await;
    let (_repo, url) = repo_with(&[("README", "hello\n")]);
    let app = app(vec![Reply::tool("mcp__demo__add", json!({"a": 1, "b": 1})), Reply::text("done")], true).await;
    let put = |body: Value| request(&app, "alice", reqwest::Method::PUT, "/v1/environments/tools", Some(body));
    let with_url = |url: &str| json!({"name": "tools", "setup_script": "true", "mcp_servers": {"demo": {"url": url}}});
    let body = json!({
        "name": "tools",
        "setup_script": "true",
        "mcp_servers": {"demo": {"url": trusted.url, "headers": {"X-Api-Key": SECRET}}}
    });
    let (status, created) = app.post_json("alice", "/v1/environments", body).await;
    assert_eq!(status, 201, "{created}");
    // The control: the same url without headers keeps them.
    let (status, kept) = put(with_url(&trusted.url)).await;
    assert_eq!(status, 200, "{kept}");
    assert_eq!(kept["mcp_servers"]["demo"]["header_names"], json!(["X-Api-Key"]), "{kept}");
    assert!(sealed_headers(&app, "tools").await.get("demo").is_some());

    // Only the url changes: the headers go.
    let (status, moved) = put(with_url(&elsewhere.url)).await;
    assert_eq!(status, 200, "{moved}");
    assert!(moved["mcp_servers"]["demo"].get("header_names").is_none(), "{moved}");
    assert_eq!(sealed_headers(&app, "tools").await, json!({}));
    let (_, events) = run_in(&app, "alice", &url, Some("tools")).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let seen = elsewhere.keys_seen();
    assert!(!seen.is_empty(), "the run never reached the new url");
    assert!(seen.iter().all(String::is_empty), "the new url was sent a key: {seen:?}");
    // Back at the first url, nothing comes back: they were dropped, not hidden.
    let (status, back) = put(with_url(&trusted.url)).await;
    assert_eq!(status, 200, "{back}");
    assert!(back["mcp_servers"]["demo"].get("header_names").is_none(), "{back}");

    // Turned into a server in the sandbox and back: no headers either.
    let body = json!({
        "name": "tools",
        "mcp_servers": {"demo": {"url": trusted.url, "headers": {"X-Api-Key": SECRET}}}
    });
    assert_eq!(put(body).await.0, 200);
    let sandboxed = json!({"name": "tools", "mcp_servers": {"demo": {"command": "python3"}}});
    assert_eq!(put(sandboxed).await.0, 200);
    assert_eq!(sealed_headers(&app, "tools").await, json!({}));
    let (status, back) = put(with_url(&trusted.url)).await;
    assert_eq!(status, 200, "{back}");
    assert!(back["mcp_servers"]["demo"].get("header_names").is_none(), "{back}");
    remove_images(&[&events]).await;
}

/// A stored row's server renamed behind the API's back, as a row stored
/// before the rule on server names could hold it.
async fn rename_stored_server(app: &TestApp, environment: &str, from: &str, to: &str) {
    let sql = app.sql().await;
    let updated = sql
        .execute(
            "UPDATE environments SET mcp_servers = (mcp_servers - $2::text) || jsonb_build_object($3::text, mcp_servers -> $2::text)
             WHERE name = $1",
            &[&environment, &from, &to],
        )
        .await
        .unwrap();
    assert_eq!(updated, 1);
}

#[tokio::test]
async fn a_stored_server_whose_name_holds_a_separator_is_unusable_and_its_tools_never_run() {
    let (_repo, url) = repo_with(&[("README", "hello\n"), ("mcp_server.py", STDIO_SERVER)]);
    let script = vec![Reply::tool("mcp__github__x__add", json!({"a": 2, "b": 3})), Reply::text("done")];
    let app = app(script, false).await;
    let body = json!({"name": "old", "mcp_servers": {"tools": {"command": "python3", "args": ["mcp_server.py"]}}});
    let (status, created) = app.post_json("alice", "/v1/environments", body).await;
    assert_eq!(status, 201, "{created}");
    // The API refuses the name itself.
    let body = json!({"name": "new", "mcp_servers": {"github__x": {"command": "python3"}}});
    let (status, refused) = app.post_json("alice", "/v1/environments", body).await;
    assert_eq!(status, 422, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("github__x"), "{refused}");
    rename_stored_server(&app, "old", "tools", "github__x").await;

    let spec = CreateRun {
        repo: Some(RepoSpec { url: url.clone(), git_ref: None }),
        environment: Some("old".into()),
        allowed_tools: Some(vec!["mcp__github__*".into()]),
        ..CreateRun::new("use the tools")
    };
    let id = app.submit("alice", spec).await.id;
    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let first = app.model.requests()[0].body.clone();
    assert!(!offered(&first).iter().any(|t| t.starts_with("mcp__")), "{:?}", offered(&first));
    let text = request_text(&first);
    assert!(text.contains("github__x") && text.contains("no \\\"__\\\""), "{text}");
    let called = results(&events, "mcp__github__x__add");
    assert!(called.len() == 1 && called[0].1 && !called[0].0.contains('5'), "{called:?}");
    remove_images(&[&events]).await;
}

#[tokio::test]
async fn a_tenants_loopback_server_is_refused_without_allow_private_and_the_model_is_told() {
    let Some(python) = sdk_python() else { return };
    let server = DemoServer::start(&python, SECRET).await;
    let (_repo, url) = repo_with(&[("README", "hello\n")]);
    let app = app(vec![Reply::text("done")], false).await;
    let body = json!({
        "name": "private",
        "mcp_servers": {"demo": {"url": server.url, "headers": {"X-Api-Key": SECRET}}}
    });
    let (status, created) = app.post_json("alice", "/v1/environments", body).await;
    assert_eq!(status, 201, "{created}");
    let (_, events) = run_in(&app, "alice", &url, Some("private")).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let first = app.model.requests()[0].body.clone();
    assert!(!offered(&first).iter().any(|t| t.starts_with("mcp__")), "{:?}", offered(&first));
    let text = request_text(&first);
    assert!(text.contains("demo") && text.contains("loopback address"), "{text}");
    assert!(!text.contains("127.0.0.1"), "the notice names the address: {text}");
    assert!(server.keys_seen().is_empty(), "the server got a request: {:?}", server.keys_seen());
    remove_images(&[&events]).await;
}

#[tokio::test]
async fn a_repository_file_gives_a_server_in_the_sandbox_and_a_url_in_it_fails_the_run() {
    let file = "setup_script = \"true\"\n[mcp_servers.local]\ncommand = \"python3\"\nargs = [\"mcp_server.py\"]\n";
    let (_repo, url) = repo_with(&[("mcp_server.py", STDIO_SERVER), (".kiln/environment.toml", file)]);
    let script = vec![Reply::tool("mcp__local__add", json!({"a": 2, "b": 3})), Reply::text("done")];
    let app = app(script, false).await;
    let (_, events) = run_in(&app, "alice", &url, None).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    assert_eq!(results(&events, "mcp__local__add"), [("5".to_owned(), false)]);

    let remote = "[mcp_servers.remote]\nurl = \"http://127.0.0.1:9/mcp\"\n";
    let (_bad, bad_url) = repo_with(&[(".kiln/environment.toml", remote)]);
    let (_, failed) = run_in(&app, "alice", &bad_url, None).await;
    assert_eq!(outcome(&failed), Some(RunStatus::Failed), "{:?}", kinds(&failed));
    let error = pick!(failed, EventBody::RunFailed { error } => error.clone()).next().unwrap();
    assert!(error.contains("\"remote\"") && error.contains("only servers that run in the sandbox"), "{error}");
    remove_images(&[&events]).await;
}

#[tokio::test]
async fn bad_mcp_servers_are_refused_with_a_message_and_headers_need_the_key() {
    let app = TestApp::spawn(Options { script: vec![], worker: false, ..Default::default() }).await;
    let server = |s: Value| json!({"name": "e", "mcp_servers": s});
    let many: serde_json::Map<String, Value> = (0..65).map(|i| (format!("s{i}"), json!({"command": "srv"}))).collect();
    for (body, expect) in [
        (server(json!({"a b": {"command": "x"}})), "server name"),
        (server(json!({"a": {"url": "http://user:pw@mcp.example/"}})), "credentials"),
        (server(json!({"a": {"url": "https://mcp.example/", "command": "x"}})), "either url"),
        (server(json!({"a": {"url": "ftp://mcp.example/"}})), "http(s)"),
        (server(Value::Object(many)), "at most 64 servers"),
        (server(json!({"a": {"url": "https://mcp.example/", "headers": {"X-Key": "v"}}})), "KILN_SECRETS_KEY"),
    ] {
        let (status, answer) = app.post_json("alice", "/v1/environments", body.clone()).await;
        assert_eq!(status, 422, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(expect), "{body}: {message}");
    }
    let (status, answer) =
        app.post_json("alice", "/v1/environments", server(json!({"a": {"url": "https://x/", "tls": 1}}))).await;
    assert!(status == 400 || status == 422, "{status}: {answer}");
    assert!(answer["error"]["message"].as_str().is_some_and(|m| m.contains("tls")), "{answer}");
    // Without headers a remote server needs no key.
    let (status, answer) =
        app.post_json("alice", "/v1/environments", server(json!({"a": {"url": "https://mcp.example/mcp"}}))).await;
    assert_eq!(status, 201, "{answer}");
}
