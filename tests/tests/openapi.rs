//! The OpenAPI document (`GET /v1/openapi.json`, api/src/openapi.rs): it is
//! valid OpenAPI 3.1, it names exactly the routes the router serves, what
//! the API really sends matches the schemas it gives, and what a client
//! sends is accepted exactly when the document says it is valid.
//!
//! The document is checked by `openapi-spec-validator`, and the server
//! against it by the fuzzer `schemathesis` (both PyPI, installed by
//! `scripts/test` into `.kiln/tools`); without them those checks say so and
//! skip, unless `KILN_REQUIRE_OPENAPI_TOOLS` is set (`.ci/run` sets it).
//! The checks in Rust always run.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use kiln_scripted_model::Reply;
use kiln_tests::{Options, TestApp, token};
use reqwest::Method;
use serde_json::{Value, json};
use uuid::Uuid;

const WEBHOOK_SECRET: &str = "openapi-test-secret";
/// Methods probed on every path; HEAD and OPTIONS follow from these in axum.
const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

/// A deployment with every feature switched on, so that its document is the
/// whole document: GitHub webhooks, signed callbacks, environment secrets
/// and `/metrics` on the API's listener.
fn every_feature(api: kiln_api::ApiSettings) -> kiln_api::ApiSettings {
    kiln_api::ApiSettings {
        callback_secret: Some(b"openapi-callback-secret".to_vec().into()),
        secrets_key: Some(std::sync::Arc::new(
            kiln_store::secrets::SecretsKey::from_hex(&"ab".repeat(32)).expect("a key"),
        )),
        metrics_token: Some("openapi-metrics-token".to_owned().into()),
        repo_rules: kiln_protocol::repo_url::RepoRules { allow_git_protocols: true, ..api.repo_rules },
        ..api
    }
}

async fn app(script: Vec<Reply>, worker: bool) -> TestApp {
    TestApp::spawn(Options {
        script,
        worker,
        github_secret: Some(WEBHOOK_SECRET.into()),
        api: every_feature(Options::default().api),
        ..Default::default()
    })
    .await
}

/// The document as served, without credentials.
async fn served_document(app: &TestApp) -> Value {
    let response = app.http.get(app.url("/v1/openapi.json")).send().await.unwrap();
    assert_eq!(response.status(), 200, "the document needs no token");
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("application/json"));
    response.json().await.unwrap()
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap()
}

fn tools_required() -> bool {
    std::env::var_os("KILN_REQUIRE_OPENAPI_TOOLS").is_some_and(|v| !v.is_empty() && v != "0")
}

/// The command `name` of the venv `scripts/ensure-pip-tool.sh` made for it.
fn tool_bin(name: &str) -> Option<PathBuf> {
    let state = std::env::var_os("KILN_STATE_DIR").map(PathBuf::from).unwrap_or_else(|| root().join(".kiln"));
    let bin = state.join(format!("tools/{name}/bin/{name}"));
    bin.is_file().then_some(bin)
}

/// Runs `openapi-spec-validator` on `doc`: Ok, or its complaint.
fn spec_validator(bin: &PathBuf, doc: &Value) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, serde_json::to_vec_pretty(doc).unwrap()).unwrap();
    let out = Command::new(bin).args(["--schema", "3.1", "--validation-errors", "all"]).arg(&file).output().unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    }
}

/// Every `$ref` in `value`, with where it was found.
fn refs<'a>(value: &'a Value, at: &str, out: &mut Vec<(String, &'a str)>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => out.push((at.to_owned(), r)),
                    _ => refs(v, &format!("{at}/{k}"), out),
                }
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                refs(v, &format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

#[tokio::test]
async fn the_document_is_valid_openapi_3_1() {
    let app = app(Vec::new(), false).await;
    let doc = served_document(&app).await;
    assert_eq!(doc["openapi"], "3.1.0");
    // As built, with the deployment's agent kinds (here the built-in ones)
    // as the names a run's `agents` may hold.
    let mut built = kiln_api::openapi::document().unwrap();
    built["components"]["schemas"]["CreateRun"]["properties"]["agents"]["items"]["enum"] =
        json!(["explore", "general"]);
    assert_eq!(doc, built, "served as built");

    // Every reference resolves inside the document.
    let mut found = Vec::new();
    refs(&doc, "", &mut found);
    assert!(found.len() > 50, "the document uses references: {}", found.len());
    for (at, r) in &found {
        let pointer = r.strip_prefix('#').unwrap_or_else(|| panic!("{at}: external reference {r}"));
        assert!(doc.pointer(pointer).is_some(), "{at}: {r} does not resolve");
    }
    // Every schema is a valid JSON Schema 2020-12 (OpenAPI 3.1's dialect).
    for (name, schema) in doc["components"]["schemas"].as_object().unwrap() {
        if let Err(e) = jsonschema::draft202012::meta::validate(schema) {
            panic!("components.schemas.{name} is not a valid JSON Schema: {e}");
        }
    }
    // Bearer JWT is the default; the spec itself, health and GitHub's
    // webhook (signed, not authenticated) say they need no token.
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["bearerFormat"], "JWT");
    assert_eq!(doc["security"], json!([{ "bearer": [] }]));
    for (path, method) in
        [("/v1/openapi.json", "get"), ("/healthz", "get"), ("/readyz", "get"), ("/v1/webhooks/github", "post")]
    {
        assert_eq!(doc["paths"][path][method]["security"], json!([{}]), "{method} {path}");
    }

    let Some(bin) = tool_bin("openapi-spec-validator") else {
        assert!(!tools_required(), "KILN_REQUIRE_OPENAPI_TOOLS is set but openapi-spec-validator is missing");
        eprintln!("\n!!!!!!!!\nSKIPPED openapi-spec-validator: missing (scripts/test installs it)\n!!!!!!!!\n");
        return;
    };
    spec_validator(&bin, &doc).unwrap_or_else(|e| panic!("openapi-spec-validator refused the document:\n{e}"));
    // The validator does refuse a broken document (a response without its
    // required description; a path parameter no operation declares), so the
    // pass above means something. (Dangling references it lets through in
    // places: the loop over `$ref`s above covers those.)
    let mut broken = doc.clone();
    broken["paths"]["/v1/runs/{id}"]["get"]["responses"]["200"] = json!({ "content": {} });
    assert!(spec_validator(&bin, &broken).is_err(), "a response without a description must be refused");
    let mut broken = doc.clone();
    broken["paths"]["/v1/runs/{id}"]["get"]["parameters"] = json!([]);
    assert!(spec_validator(&bin, &broken).is_err(), "an undeclared path parameter must be refused");
}

/// The paths of the router's route table, read from its `Debug` output
/// (axum has no public way to list routes). The test fails loudly if that
/// output changes shape, rather than comparing against nothing.
fn router_paths(app: &TestApp) -> BTreeSet<String> {
    let state = kiln_api::AppState::new(
        app.store.clone(),
        kiln_api::Authenticator::new(&kiln_api::AuthConfig::Hs256 { secret: b"x".repeat(32).into() }, None, None)
            .unwrap(),
        kiln_api::ApiSettings::default(),
        Some(kiln_api::GithubWebhookConfig::new(WEBHOOK_SECRET.as_bytes(), "kiln", "kiln", "github").unwrap()),
        app.shutdown.clone(),
    );
    let debug = format!("{:?}", kiln_api::router(state));
    let table = debug
        .split_once("path_router: PathRouter")
        .and_then(|(_, rest)| rest.split_once("fallback_router:"))
        .map(|(table, _)| table)
        .expect("axum's Router Debug output changed shape: update router_paths");
    let mut paths = BTreeSet::new();
    for piece in table.split("): \"").skip(1) {
        let path = piece.split('"').next().unwrap();
        if !path.contains("__private__axum") {
            paths.insert(path.to_owned());
        }
    }
    assert!(
        paths.contains("/healthz") && paths.contains("/v1/runs/{id}/events"),
        "axum's Router Debug output changed shape (found {paths:?}): update router_paths"
    );
    paths
}

/// Whether the app routes `method path`: anything but the router's own
/// 404 ("no such route") and 405 means a handler answered.
async fn routed(app: &TestApp, method: &str, path: &str) -> bool {
    let concrete = path.replace("{id}", &Uuid::new_v4().to_string()).replace("{call_id}", "call_1");
    let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes()).unwrap();
    let response = app.http.request(method, app.url(&concrete)).send().await.unwrap();
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    !(status == 405 || status == 404 && body["error"]["message"] == "no such route")
}

#[tokio::test]
async fn every_route_is_in_the_document_and_every_operation_is_routed() {
    let app = app(Vec::new(), false).await;
    let doc = served_document(&app).await;
    let documented: BTreeSet<String> = doc["paths"].as_object().unwrap().keys().cloned().collect();
    let routes = router_paths(&app);

    for path in kiln_api::openapi::NOT_DOCUMENTED {
        assert!(routes.contains(*path), "{path} is listed as undocumented but is not routed");
        assert!(!documented.contains(*path), "{path} is listed as undocumented but is documented");
    }
    let api_routes: BTreeSet<String> =
        routes.iter().filter(|p| !kiln_api::openapi::NOT_DOCUMENTED.contains(&p.as_str())).cloned().collect();
    assert_eq!(
        api_routes, documented,
        "the router and the document must name the same paths (left: router, right: document); \
         add #[utoipa::path] to the new handler and list it in api/src/openapi.rs"
    );

    // Per path, the methods the app answers are the methods documented.
    for path in &documented {
        for method in METHODS {
            let in_doc = doc["paths"][path].get(method).is_some();
            assert_eq!(routed(&app, method, path).await, in_doc, "{} {path}", method.to_uppercase());
        }
    }
    // The probe itself tells a route from a non-route.
    assert!(!routed(&app, "get", "/v1/no-such-route").await);
    assert!(!routed(&app, "delete", "/v1/runs").await);
}

/// The document as a JSON Schema whose root is a reference to `pointer`:
/// the document's own references then resolve as they are.
fn with_root_ref(doc: &Value, pointer: &str) -> Value {
    let mut schema = doc.clone();
    // A URI fragment: the braces of path templates must be escaped.
    schema["$ref"] = json!(format!("#{}", pointer.replace('{', "%7B").replace('}', "%7D")));
    schema
}

/// Validates `instance` against the schema at `pointer` in `doc` (with
/// formats checked: uuid, date-time, int32, …).
fn check(doc: &Value, pointer: &str, instance: &Value) {
    let schema = with_root_ref(doc, pointer);
    let validator = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .should_validate_formats(true)
        .build(&schema)
        .unwrap_or_else(|e| panic!("{pointer} is not a usable schema: {e}"));
    let errors: Vec<String> =
        validator.iter_errors(instance).map(|e| format!("{} at {}", e, e.instance_path())).collect();
    assert!(errors.is_empty(), "{instance} does not match {pointer}:\n{}", errors.join("\n"));
}

/// The schema pointer of `method path`'s `status` answer as `content_type`,
/// following a reference to a shared response.
fn response_schema(doc: &Value, method: &str, path: &str, status: u16, content_type: &str) -> String {
    let escaped = path.replace('~', "~0").replace('/', "~1");
    let mut response = format!("/paths/{escaped}/{method}/responses/{status}");
    let target = doc.pointer(&response).unwrap_or_else(|| panic!("{method} {path} documents no {status}"));
    if let Some(r) = target.get("$ref").and_then(Value::as_str) {
        response = r.trim_start_matches('#').to_owned();
    }
    let schema = format!("{response}/content/{}/schema", content_type.replace('/', "~1"));
    assert!(doc.pointer(&schema).is_some(), "{method} {path} {status} documents no {content_type} body");
    schema
}

/// Sends a request and checks the answer against what the document says
/// `method path` answers with that status.
async fn exchange(
    app: &TestApp,
    doc: &Value,
    (method, path): (&str, &str),
    concrete: &str,
    sub: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let m = Method::from_bytes(method.to_ascii_uppercase().as_bytes()).unwrap();
    let mut request = app.http.request(m, app.url(concrete)).header("accept", "application/json");
    if let Some(sub) = sub {
        request = request.bearer_auth(token(sub));
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    if status == 429 || status == 503 {
        assert!(response.headers().contains_key("retry-after"));
    }
    let value: Value = response.json().await.unwrap();
    check(doc, &response_schema(doc, method, path, status, "application/json"), &value);
    (status, value)
}

#[tokio::test]
async fn a_real_run_its_events_and_its_errors_match_their_schemas() {
    let plan = json!({"items": [{"text": "look around", "status": "in_progress"}, {"text": "report"}]});
    let app = app(
        vec![
            Reply::tool("todo", plan),
            Reply::tool("bash", json!({"command": "echo hello from the sandbox"})),
            Reply::text("all done"),
        ],
        true,
    )
    .await;
    let doc = served_document(&app).await;
    let runs = ("post", "/v1/runs");
    let run_path = ("get", "/v1/runs/{id}");

    // Requests the document describes are accepted.
    let create = json!({"prompt": "say hello", "approval": "mutating", "limits": {"max_steps": 5}});
    check(&doc, "/components/schemas/CreateRun", &create);
    let (status, run) = exchange(&app, &doc, runs, "/v1/runs", Some("alice"), Some(create)).await;
    assert_eq!(status, 201);
    let id = run["id"].as_str().unwrap().to_owned();

    // Follow over SSE until the bash call waits for approval: every SSE
    // event is one the document names, with the payload its kind's schema.
    let response = app
        .http
        .get(app.url(&format!("/v1/runs/{id}/events")))
        .bearer_auth(token("alice"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let sse_schema = response_schema(&doc, "get", "/v1/runs/{id}/events", 200, "text/event-stream");
    let mut stream = response.bytes_stream().eventsource();
    let mut streamed: Vec<(String, Value)> = Vec::new();
    while let Some(event) = tokio::time::timeout(std::time::Duration::from_secs(120), stream.next()).await.unwrap() {
        let event = event.unwrap();
        check(&doc, &sse_schema, &json!({ "id": event.id, "event": event.event, "data": event.data }));
        let payload: Value = serde_json::from_str(&event.data).unwrap();
        let body = json!({ "kind": event.event, "payload": payload });
        check(&doc, "/components/schemas/EventBody", &body);
        // The kind's own component (what a generated client would use).
        let name = doc["components"]["schemas"]["EventBody"]["discriminator"]["mapping"][&event.event]
            .as_str()
            .unwrap_or_else(|| panic!("{} is not in the discriminator's mapping", event.event));
        check(&doc, name.trim_start_matches('#'), &body);
        streamed.push((event.event.clone(), payload));
        if event.event == "approval.requested" {
            break;
        }
    }
    let call = streamed.last().unwrap().1["call_id"].as_str().unwrap().to_owned();

    // Steering while it waits, then the approval, each as documented.
    let messages = ("post", "/v1/runs/{id}/messages");
    let (status, _) = exchange(
        &app,
        &doc,
        messages,
        &format!("/v1/runs/{id}/messages"),
        Some("alice"),
        Some(json!({"text": "and be brief"})),
    )
    .await;
    assert_eq!(status, 202);
    let approvals = ("post", "/v1/runs/{id}/approvals/{call_id}");
    let decision = json!({"decision": "approve", "reason": "fine"});
    check(&doc, "/components/schemas/Decide", &decision);
    let path = format!("/v1/runs/{id}/approvals/{call}");
    let (status, _) = exchange(&app, &doc, approvals, &path, Some("alice"), Some(decision.clone())).await;
    assert_eq!(status, 200);
    let (status, conflict) = exchange(&app, &doc, approvals, &path, Some("alice"), Some(decision)).await;
    assert_eq!((status, conflict["error"]["code"].as_str()), (409, Some("conflict")));

    // The whole run as JSON pages: each event matches StoredEvent.
    let events = app.events_to_end("alice", &id).await;
    assert_eq!(events.last().unwrap().kind, "run.succeeded");
    let (status, page) = exchange(
        &app,
        &doc,
        ("get", "/v1/runs/{id}/events"),
        &format!("/v1/runs/{id}/events?after=0&limit=1000"),
        Some("alice"),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(page["done"], true);
    let kinds: BTreeSet<&str> =
        page["events"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    for kind in [
        "run.queued",
        "run.started",
        "sandbox.ready",
        "step.started",
        "todo",
        "tool_call.ready",
        "approval.requested",
        "approval.resolved",
        "message.queued",
        "tool.result",
        "step.finished",
        "text.delta",
        "run.succeeded",
    ] {
        assert!(kinds.contains(kind), "the run should show {kind}: {kinds:?}");
    }

    // The finished run, the list, and the errors.
    let (status, finished) = exchange(&app, &doc, run_path, &format!("/v1/runs/{id}"), Some("alice"), None).await;
    assert_eq!((status, finished["status"].as_str()), (200, Some("succeeded")));
    let (status, list) = exchange(&app, &doc, ("get", "/v1/runs"), "/v1/runs?limit=10", Some("alice"), None).await;
    assert_eq!((status, list["runs"].as_array().unwrap().len()), (200, 1));
    // Its change, as the document describes both routes.
    let changes = ("get", "/v1/runs/{id}/changes");
    let (status, _) = exchange(&app, &doc, changes, &format!("/v1/runs/{id}/changes"), Some("alice"), None).await;
    assert_eq!(status, 200);
    let patch =
        app.http.get(app.url(&format!("/v1/runs/{id}/patch"))).bearer_auth(token("alice")).send().await.unwrap();
    assert_eq!(patch.status(), 200);
    let content_type = patch.headers()["content-type"].to_str().unwrap().to_owned();
    response_schema(&doc, "get", "/v1/runs/{id}/patch", 200, &content_type);
    let unknown_patch = format!("/v1/runs/{}/patch", Uuid::new_v4());
    let patch_route = ("get", "/v1/runs/{id}/patch");
    assert_eq!(exchange(&app, &doc, patch_route, &unknown_patch, Some("alice"), None).await.0, 404);
    let cancel = ("post", "/v1/runs/{id}/cancel");
    let (status, _) = exchange(&app, &doc, cancel, &format!("/v1/runs/{id}/cancel"), Some("alice"), None).await;
    assert_eq!(status, 409);
    let unknown = format!("/v1/runs/{}", Uuid::new_v4());
    assert_eq!(exchange(&app, &doc, run_path, &unknown, Some("alice"), None).await.0, 404);
    assert_eq!(exchange(&app, &doc, run_path, "/v1/runs/not-a-uuid", Some("alice"), None).await.0, 400);
    assert_eq!(exchange(&app, &doc, run_path, &format!("/v1/runs/{id}"), None, None).await.0, 401);
    let (status, invalid) =
        exchange(&app, &doc, runs, "/v1/runs", Some("alice"), Some(json!({"prompt": "x", "limits": {"max_step": 1}})))
            .await;
    assert_eq!((status, invalid["error"]["code"].as_str()), (422, Some("invalid_request")));
    let deliver = ("post", "/v1/runs/{id}/deliver");
    assert_eq!(exchange(&app, &doc, deliver, &format!("/v1/runs/{id}/deliver"), Some("alice"), None).await.0, 409);
    assert_eq!(exchange(&app, &doc, ("get", "/healthz"), "/healthz", None, None).await.0, 200);
    assert_eq!(exchange(&app, &doc, ("get", "/readyz"), "/readyz", None, None).await.0, 200);
    let (status, _) =
        exchange(&app, &doc, ("post", "/v1/webhooks/github"), "/v1/webhooks/github", None, Some(json!({}))).await;
    assert_eq!(status, 401, "unsigned delivery");

    // The schemas are strict enough to catch a wrong answer.
    let mut wrong = finished.clone();
    wrong["status"] = json!("done");
    let run_schema = response_schema(&doc, "get", "/v1/runs/{id}", 200, "application/json");
    let schema = with_root_ref(&doc, &run_schema);
    assert!(!jsonschema::draft202012::is_valid(&schema, &wrong), "an unknown status must not match Run");
    let bad_event = json!({ "kind": "tool.result", "payload": { "call_id": "c" } });
    let schema = with_root_ref(&doc, "/components/schemas/EventBody");
    assert!(!jsonschema::draft202012::is_valid(&schema, &bad_event), "a payload missing fields must not match");
}

/// The count of the fuzzer's summary line, `N generated, M passed`.
fn generated(report: &str) -> Option<u64> {
    report.lines().find_map(|line| line.trim().split_once(" generated")?.0.parse().ok())
}

/// A client author's test: schemathesis generates requests from the served
/// document alone (valid ones, and ones the document calls invalid) and
/// checks that the server never answers 5xx, accepts every valid request
/// and refuses every invalid one. Its settings, and why, are in
/// `tests/tools/schemathesis.toml`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fuzzer_driven_by_the_document_finds_the_server_agreeing_with_it() {
    let api = kiln_api::ApiSettings {
        // And one that clones over every protocol from any address (no
        // worker runs here, so nothing is cloned): which of those a
        // deployment refuses (422) is its policy, not the request's
        // shape, and is tested in repo_clone.rs.
        repo_rules: kiln_protocol::repo_url::RepoRules { allow_private: true, allow_git_protocols: true },
        // And lets environments name any image (that is an image name):
        // which names a deployment allows (KILN_ENVIRONMENT_IMAGES) is its
        // policy, tested in environment_tenancy.rs.
        environment_images: std::sync::Arc::new(
            kiln_protocol::image_name::ImagePatterns::parse("*").expect("the any-name pattern"),
        ),
        ..fuzzed(every_feature(Options::default().api))
    };
    // Every operation but the webhook (its HMAC cannot be generated), many
    // requests each; the document's three promises only.
    fuzz(api, Some(WEBHOOK_SECRET), &[], 1, 500).await;
}

/// The same fuzzer, with every check it has, against a deployment that has
/// switched off what it can: no environment secrets (`KILN_SECRETS_KEY`),
/// no callbacks (`KILN_CALLBACK_SECRET`), no metrics token, no GitHub
/// webhooks. Its document must leave out what it refuses whatever the
/// request: offered and then refused with 422 (secrets, `callback_url`) or
/// documented while answering 404 (`/metrics`, the webhook) is what the
/// fuzzer found here before the document was made per deployment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fuzzer_with_every_check_finds_a_bare_deployment_agreeing_with_its_document() {
    let api = kiln_api::ApiSettings {
        // Which image names a deployment allows (KILN_ENVIRONMENT_IMAGES)
        // is its policy, tested in environment_tenancy.rs; the document
        // states the name's grammar.
        environment_images: std::sync::Arc::new(
            kiln_protocol::image_name::ImagePatterns::parse("*").expect("the any-name pattern"),
        ),
        ..fuzzed(Options::default().api)
    };
    fuzz(api, None, &["--checks", "all", "--max-examples", "20"], 0, 300).await;
}

/// What lets every fuzzed request reach the checks of its shape.
fn fuzzed(api: kiln_api::ApiSettings) -> kiln_api::ApiSettings {
    kiln_api::ApiSettings {
        // A quota's 429 says nothing about the request's shape: high
        // quotas let every request reach the checks.
        quota: kiln_store::Quota { max_active_runs: 1_000_000, max_runs_per_minute: 1_000_000 },
        // The stream of a run that never ends (no worker) ends soon, so
        // every request of the fuzzer does.
        sse_max_duration: Duration::from_secs(1),
        ..api
    }
}

/// Runs schemathesis against a deployment of `api` (no worker: the runs it
/// creates stay queued, none starts a sandbox), with `extra` arguments, and
/// checks it passed having tested every operation but `untested` with at
/// least `least` requests in all.
async fn fuzz(api: kiln_api::ApiSettings, github_secret: Option<&str>, extra: &[&str], untested: usize, least: u64) {
    let Some(bin) = tool_bin("schemathesis") else {
        assert!(!tools_required(), "KILN_REQUIRE_OPENAPI_TOOLS is set but schemathesis is missing");
        eprintln!("\n!!!!!!!!\nSKIPPED schemathesis: missing (scripts/test installs it)\n!!!!!!!!\n");
        return;
    };
    let app = TestApp::spawn(Options {
        worker: false,
        github_secret: github_secret.map(str::to_owned),
        api,
        ..Default::default()
    })
    .await;
    let workdir = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(&bin)
        .arg("--config-file")
        .arg(root().join("tests/tools/schemathesis.toml"))
        .args(["run", &app.url("/v1/openapi.json"), "--no-color"])
        .args(["-H", &format!("Authorization: Bearer {}", token("fuzzer"))])
        .args(extra)
        .current_dir(workdir.path())
        .output()
        .await
        .unwrap();
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "schemathesis found the server and the document disagreeing:\n{report}");
    let selected = report.lines().find_map(|l| l.trim().strip_prefix("Selected: ")).unwrap_or_default();
    let (selected, total) = selected.split_once('/').unwrap_or_else(|| panic!("no operation count:\n{report}"));
    assert_eq!(selected.parse::<usize>().unwrap() + untested, total.parse::<usize>().unwrap(), "{report}");
    assert!(report.contains(&format!("Tested: {selected}")), "{report}");
    let count = generated(&report).unwrap_or_else(|| panic!("no summary in the report:\n{report}"));
    assert!(count >= least, "only {count} requests:\n{report}");
}

/// A deployment without a feature serves a document without it; the full
/// document (every feature on) has each of them.
#[tokio::test]
async fn a_deployment_documents_only_the_features_it_has() {
    let bare = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let full = app(Vec::new(), false).await;
    let (bare, full) = (served_document(&bare).await, served_document(&full).await);
    for path in ["/metrics", "/v1/webhooks/github", "/v1/callback-key"] {
        assert!(full["paths"].get(path).is_some(), "{path} is documented where it is served");
        assert!(bare["paths"].get(path).is_none(), "{path} is left out where it answers 404");
    }
    // Offered only as what the server still takes: null, or nothing.
    let (bare_run, full_run) =
        (&bare["components"]["schemas"]["CreateRun"], &full["components"]["schemas"]["CreateRun"]);
    assert_eq!(bare_run["properties"]["callback_url"]["type"], "null");
    assert_ne!(full_run["properties"]["callback_url"]["type"], "null");
    let secrets = |doc: &Value| doc["components"]["schemas"]["EnvironmentSpec"]["properties"]["secrets"].clone();
    assert_eq!(secrets(&bare)["maxProperties"], 0);
    assert_ne!(secrets(&full)["maxProperties"], 0);
}

/// The examples of the issue that asked for one definition of valid input:
/// each is now refused, and the document says so.
#[tokio::test]
async fn what_the_document_calls_invalid_is_refused_however_it_is_sent() {
    let app = app(Vec::new(), false).await;
    let doc = served_document(&app).await;
    let (status, run) =
        exchange(&app, &doc, ("post", "/v1/runs"), "/v1/runs", Some("alice"), Some(json!({"prompt": "x"}))).await;
    assert_eq!(status, 201);
    let events = format!("/v1/runs/{}/events", run["id"].as_str().unwrap());
    let param = |path: &str, method: &str, name: &str| {
        doc["paths"][path][method]["parameters"].as_array().unwrap().iter().find(|p| p["name"] == name).unwrap()
            ["schema"]
            .clone()
    };
    assert_eq!(param("/v1/runs/{id}/events", "get", "after")["minimum"], 0);
    assert_eq!(param("/v1/runs/{id}/events", "get", "limit")["minimum"], 1);
    assert_eq!(param("/v1/runs", "get", "cursor")["minLength"], 1);
    // Outside the documented ranges, on the stream too (where `limit` is not
    // used) and when `Last-Event-ID` wins over `after`: both were 200.
    for (query, last_event_id) in [("after=-1&limit=0", Some("0")), ("limit=0", None), ("after=-1", Some("1"))] {
        let mut request = app
            .http
            .get(app.url(&format!("{events}?{query}")))
            .bearer_auth(token("alice"))
            .header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 400, "{query} with Last-Event-ID {last_event_id:?}");
    }
    // An empty cursor is not "no cursor": the document asks for one character.
    let response = app.http.get(app.url("/v1/runs?cursor=")).bearer_auth(token("alice")).send().await.unwrap();
    assert_eq!(response.status(), 400);
    // Bodies: an empty prompt and an unknown provider, refused and documented.
    let schemas = &doc["components"]["schemas"];
    assert_eq!(schemas["CreateRun"]["properties"]["prompt"]["minLength"], 1);
    assert_eq!(schemas["SendMessage"]["properties"]["text"]["minLength"], 1);
    assert!(schemas["ModelSpec"]["properties"]["provider"]["enum"].as_array().unwrap().contains(&json!("anthropic")));
    for body in [json!({"prompt": ""}), json!({"prompt": "x", "model": {"provider": "local"}})] {
        let (status, _) = exchange(&app, &doc, ("post", "/v1/runs"), "/v1/runs", Some("alice"), Some(body)).await;
        assert_eq!(status, 422);
    }
}
