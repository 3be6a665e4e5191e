//! The whole path: REST → Postgres queue → worker → Docker sandbox → SSE,
//! against the scripted model speaking each provider's wire format.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use kiln_protocol::{CreateRun, EventBody, RunStatus};
use kiln_scripted_model::Reply;
use kiln_tests::{Event, Options, TestApp, assert_dense, kinds, outcome, pick};
use kiln_worker::ProviderKind;
use serde_json::{Value, json};
use uuid::Uuid;

fn hello_script() -> Vec<Reply> {
    vec![
        Reply::tool("bash", json!({"command": "echo hello > note.txt && cat note.txt"})),
        Reply::tool("view", json!({"path": "note.txt"})),
        Reply::text("done"),
    ]
}

async fn run_hello(provider: ProviderKind) -> (TestApp, Uuid, Vec<Event>) {
    let app = TestApp::spawn(Options { script: hello_script(), provider, ..Default::default() }).await;
    let run = app.submit("alice", CreateRun::new("write hello to note.txt")).await;
    assert_eq!(run.status, RunStatus::Queued);
    let events = app.events("alice", run.id).await;
    (app, run.id, events)
}

/// What every provider's run must show a client, in order.
fn assert_hello_events(events: &[Event]) {
    assert_dense(events, 1);
    let k = kinds(events);
    let pos = |kind: &str, from: usize| {
        k[from..]
            .iter()
            .position(|x| *x == kind)
            .map(|p| p + from)
            .unwrap_or_else(|| panic!("no {kind} after {from} in {k:?}"))
    };
    assert_eq!(&k[..3], ["run.queued", "run.started", "sandbox.ready"]);
    let bash_ready = pos("tool_call.ready", 3);
    let EventBody::ToolCallReady { name, arguments, .. } = &events[bash_ready].body else { unreachable!() };
    assert_eq!(name, "bash");
    assert_eq!(arguments["command"], "echo hello > note.txt && cat note.txt");
    let bash_result = pos("tool.result", bash_ready);
    let EventBody::ToolResult { name, is_error, output, .. } = &events[bash_result].body else { unreachable!() };
    assert_eq!(name, "bash");
    assert!(!is_error);
    assert!(output.contains("hello"));
    let view_ready = pos("tool_call.ready", bash_result);
    let EventBody::ToolCallReady { name, .. } = &events[view_ready].body else { unreachable!() };
    assert_eq!(name, "view");
    let view_result = pos("tool.result", view_ready);
    let EventBody::ToolResult { output: view_out, .. } = &events[view_result].body else { unreachable!() };
    assert!(view_out.contains("     1\thello"), "view shows numbered lines: {view_out}");
    let text: String = pick!(events[view_result..], EventBody::TextDelta { text } => text.as_str()).collect();
    assert_eq!(text, "done");
    assert_eq!(events.last().unwrap().body, EventBody::RunSucceeded { summary: "done".into() });
}

async fn assert_conversation_stored(app: &TestApp, id: Uuid) {
    let sql = app.sql().await;
    let rows = sql
        .query(
            "SELECT m.role, m.parts FROM messages m JOIN runs r ON r.session_id = m.session_id
             WHERE r.id = $1 ORDER BY m.seq",
            &[&id],
        )
        .await
        .unwrap();
    let roles: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant", "tool", "assistant"]);
    let first_result: Value = rows[2].get(1);
    assert_eq!(first_result[0]["type"], "tool_result");
    assert!(first_result[0]["output"].as_str().unwrap().contains("hello"));
}

#[tokio::test]
async fn openai_run_goes_end_to_end() {
    let (app, id, events) = run_hello(ProviderKind::OpenAi).await;
    assert_hello_events(&events);

    // The model's second request carries the first tool's result.
    let requests = app.model.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[1].path, "/v1/chat/completions");
    let messages = requests[1].body["messages"].as_array().unwrap();
    let call_id = messages.iter().find_map(|m| m["tool_calls"][0]["id"].as_str()).expect("assistant tool call");
    let tool_msg = messages.iter().find(|m| m["role"] == "tool").expect("tool message");
    assert_eq!(tool_msg["tool_call_id"], call_id);
    assert!(tool_msg["content"].as_str().unwrap().contains("hello"));
    assert_eq!(requests[0].header("authorization"), Some("Bearer sk-test-openai"));

    assert!(app.containers_of(id).await.is_empty(), "container removed after the run");
    assert_conversation_stored(&app, id).await;
    let run = app.run("alice", id).await;
    assert_eq!(run.status, RunStatus::Succeeded);
    assert_eq!(run.result.unwrap()["summary"], "done");
    assert_eq!(run.last_event_seq, events.len() as i64);
}

#[tokio::test]
async fn anthropic_run_goes_end_to_end() {
    let (app, id, events) = run_hello(ProviderKind::Anthropic).await;
    assert_hello_events(&events);

    let requests = app.model.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[1].path, "/v1/messages");
    assert_eq!(requests[1].header("x-api-key"), Some("sk-ant-test"));
    let messages = requests[1].body["messages"].as_array().unwrap();
    let last = messages.last().unwrap();
    assert_eq!(last["role"], "user");
    let block = &last["content"][0];
    assert_eq!(block["type"], "tool_result");
    let tool_use_id =
        messages[1]["content"].as_array().unwrap().iter().find(|b| b["type"] == "tool_use").unwrap()["id"].clone();
    assert_eq!(block["tool_use_id"], tool_use_id);
    assert!(block["content"].to_string().contains("hello"));

    assert!(app.containers_of(id).await.is_empty(), "container removed after the run");
    assert_conversation_stored(&app, id).await;
}

#[tokio::test]
async fn a_client_resumes_on_another_api_instance_without_gap_or_duplicate() {
    let (app, id, all) = run_hello(ProviderKind::OpenAi).await;
    let k = 4;
    // Read the first k events from the first instance, then drop the stream.
    let first = app.events_on(app.addr, "alice", id, None, k).await;
    assert_eq!(first.len(), k);
    assert_dense(&first, 1);
    // Reconnect to a second instance with Last-Event-ID: k.
    let second_api = app.second_api().await;
    let rest = app.events_on(second_api, "alice", id, Some(k as i64), usize::MAX).await;
    assert_dense(&rest, k as i64 + 1);
    assert_eq!(rest.len(), all.len() - k);
    assert_eq!(outcome(&rest), Some(RunStatus::Succeeded));
    // ?after=N is the same as the header.
    let via_query = app
        .http
        .get(format!("http://{second_api}/v1/runs/{id}/events?after={k}"))
        .bearer_auth(kiln_tests::token("alice"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(via_query.starts_with(&format!("id: {}\n", k + 1)), "{via_query}");
}

#[tokio::test]
async fn a_live_stream_receives_events_as_they_happen() {
    // Subscribe before the worker has done anything and follow to the end:
    // the LISTEN/NOTIFY path (not only the table read) must deliver. The
    // fallback poll is pushed out of reach, so only a notification can
    // wake the stream between its first read and the run's end.
    let defaults = Options::default();
    let api = kiln_api::ApiSettings { sse_poll: Duration::from_secs(3600), ..defaults.api };
    let app = TestApp::spawn(Options { script: hello_script(), api, ..defaults }).await;
    let run = app.submit("alice", CreateRun::new("go")).await;
    let events = tokio::time::timeout(Duration::from_secs(60), app.events("alice", run.id))
        .await
        .expect("the stream followed the run to its end by notifications alone");
    assert_hello_events(&events);
}

#[tokio::test]
async fn events_page_as_json() {
    let (app, id, all) = run_hello(ProviderKind::OpenAi).await;
    let page: Value = app
        .http
        .get(app.url(&format!("/v1/runs/{id}/events?after=2&limit=3")))
        .bearer_auth(kiln_tests::token("alice"))
        .header("accept", "application/json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let seqs: Vec<i64> = page["events"].as_array().unwrap().iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, [3, 4, 5]);
    assert_eq!(page["next_after"], 5);
    assert_eq!(page["done"], false);
    assert_eq!(page["events"][0]["kind"], all[2].kind());
}

/// One JSON page of the run's events after `after` (the default count
/// limit): its events, `next_after` and `done`.
async fn json_page(app: &TestApp, id: Uuid, after: i64) -> (Vec<Value>, i64, bool) {
    let page: Value = app
        .http
        .get(app.url(&format!("/v1/runs/{id}/events?after={after}")))
        .bearer_auth(kiln_tests::token("alice"))
        .header("accept", "application/json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    (page["events"].as_array().unwrap().clone(), page["next_after"].as_i64().unwrap(), page["done"] == true)
}

#[tokio::test]
async fn event_pages_are_bounded_in_bytes_and_page_through_every_event_exactly_once() {
    const PAGE_BYTES: usize = 64 * 1024;
    // Four steps of ~30 KB of output, each twice in events (streamed and
    // the result): some 240 KB in well under 500 events.
    let print =
        |n: u32| Reply::tool("bash", json!({"command": format!("echo {n}; head -c 30000 /dev/zero | tr '\\0' x")}));
    let script = (0..4).map(print).chain([Reply::text("done")]).collect();
    let api = kiln_api::ApiSettings {
        sse_keep_alive: Duration::from_secs(1),
        event_page_bytes: PAGE_BYTES,
        ..Default::default()
    };
    let app = TestApp::spawn(Options { script, api, ..Default::default() }).await;
    let id = app.submit("alice", CreateRun::new("print a lot")).await.id;
    let streamed = app.events("alice", id).await;
    assert_eq!(outcome(&streamed), Some(RunStatus::Succeeded), "{:?}", kinds(&streamed));
    let stored = app.stored_events(id).await;
    assert!(stored.len() < 500);

    let (mut after, mut paged, mut pages) = (0, Vec::new(), 0);
    loop {
        let (events, next_after, done) = json_page(&app, id, after).await;
        assert!(!events.is_empty(), "a page makes progress");
        let bytes: usize =
            events.iter().map(|e| e["kind"].as_str().unwrap().len() + e["payload"].to_string().len()).sum();
        assert!(events.len() == 1 || bytes <= PAGE_BYTES, "page after {after}: {bytes} bytes in {}", events.len());
        pages += 1;
        paged.extend(events.iter().map(|e| (e["seq"].as_i64().unwrap(), e["kind"].as_str().unwrap().to_owned())));
        after = next_after;
        if done {
            break;
        }
    }
    assert!(pages >= 4, "{pages} pages");
    let expected: Vec<(i64, String)> = stored.iter().map(|e| (e.seq, e.kind().to_owned())).collect();
    assert_eq!(paged, expected, "every event once, in order");

    // The stream's catch-up reads the table in the same bounded batches:
    // from the start, and resumed mid-run, it is exact.
    assert_eq!(
        streamed.iter().map(|e| (e.seq, &e.body)).collect::<Vec<_>>(),
        stored.iter().map(|e| (e.seq, &e.body)).collect::<Vec<_>>()
    );
    let mid = stored[stored.len() / 2].seq;
    let rest = app.events_after("alice", id, Some(mid)).await;
    assert_dense(&rest, mid + 1);
    assert_eq!(rest.last().map(|e| e.seq), stored.last().map(|e| e.seq));
    assert!(rest.iter().zip(&stored[stored.len() / 2 + 1..]).all(|(a, b)| a.body == b.body));
}

/// The command would run for ten minutes: a cancel that waited for it
/// would fail the bound, which only catches that (or a hang). How fast a
/// cancel lands is not asserted: speed belongs in bench/ (no benchmark
/// measures it yet).
#[tokio::test]
async fn cancel_stops_a_running_command_without_waiting_for_it() {
    let app = TestApp::spawn(Options {
        script: vec![Reply::tool("bash", json!({"command": "sleep 600"}))],
        ..Default::default()
    })
    .await;
    let id = app.submit("alice", CreateRun::new("sleep")).await.id;
    // Wait until the command is running.
    let before = app.events_until("alice", id, None, |e| matches!(e.body, EventBody::ToolCallReady { .. })).await;
    assert_eq!(before.last().unwrap().kind(), "tool_call.ready");
    // ... and its process is there to be killed.
    let containers = app.containers_of(id).await;
    assert_eq!(containers.len(), 1, "{containers:?}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while kiln_tests::docker_exec(&containers[0], &["pgrep", "-f", "^sleep 600"]).await.0 != 0 {
        assert!(Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    assert_eq!(outcome(&rest), Some(RunStatus::Cancelled));
    assert!(elapsed < Duration::from_secs(60), "cancel took {elapsed:?}: waited for the command?");
    assert_eq!(app.run("alice", id).await.status, RunStatus::Cancelled);
    assert!(app.containers_of(id).await.is_empty(), "container removed after cancel");
}

#[tokio::test]
async fn a_worker_of_another_deployment_leaves_this_ones_sandboxes_alone() {
    // Two Kilns (two databases) share one Docker engine. A worker starting
    // up removes leftover sandboxes, but only those of runs it knows.
    let app = TestApp::spawn(Options {
        script: vec![Reply::tool("bash", json!({"command": "sleep 3; echo survived"})), Reply::text("done")],
        ..Default::default()
    })
    .await;
    let id = app.submit("alice", CreateRun::new("wait")).await.id;
    let seen = app.events_until("alice", id, None, |e| matches!(e.body, EventBody::ToolCallReady { .. })).await;
    let _other = TestApp::spawn(Options::default()).await;
    let rest = app.events_after("alice", id, Some(seen.last().unwrap().seq)).await;
    let output = pick!(rest, EventBody::ToolResult { output, .. } => output).next().unwrap();
    assert!(output.contains("survived"), "{output}");
    assert_eq!(outcome(&rest), Some(RunStatus::Succeeded));
}
