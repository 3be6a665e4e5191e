//! Talking to runs: steering messages, follow-up runs, approvals, allowed tools.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kiln_protocol::{ApprovalMode, CreateRun, EventBody, Run, RunStatus};
use kiln_scripted_model::{Reply, ScriptedCall};
use kiln_tests::{Event, Options, TestApp, assert_dense, docker_exec, kinds, outcome, pick, token};
use serde_json::{Value, json};
use uuid::Uuid;

async fn until(app: &TestApp, id: Uuid, after: Option<i64>, kind: &str) -> Vec<Event> {
    let evs = app.events_until("alice", id, after, |e| e.kind() == kind).await;
    assert_eq!(evs.last().map(Event::kind), Some(kind), "{:?}", kinds(&evs));
    evs
}

fn user_texts(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().map(str::to_owned).unwrap_or_else(|| m["content"].to_string()))
        .collect()
}

#[tokio::test]
async fn a_message_sent_mid_run_joins_the_conversation_before_the_next_model_call() {
    let app = TestApp::spawn(Options {
        script: vec![Reply::tool("bash", json!({"command": "sleep 2; echo first"})), Reply::text("done")],
        ..Default::default()
    })
    .await;
    let id = app.submit("alice", CreateRun::new("start")).await.id;
    let seen = until(&app, id, None, "tool_call.ready").await;
    let (status, body) =
        app.post_json("alice", &format!("/v1/runs/{id}/messages"), json!({"text": "also check the tests"})).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["disposition"], "queued");
    let rest = app.events_after("alice", id, Some(seen.last().unwrap().seq)).await;
    assert_eq!(outcome(&rest), Some(RunStatus::Succeeded));
    assert!(rest.iter().any(|e| e.body == EventBody::MessageQueued { text: "also check the tests".into() }));
    let requests = app.model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(user_texts(&requests[1].body).last().unwrap(), "also check the tests");
    // Stored in the order the model saw: the tool message (held for the
    // next model call) is committed before the message joins.
    let roles: Vec<String> = app
        .sql()
        .await
        .query("SELECT role FROM messages WHERE run_id = $1 ORDER BY seq", &[&id])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(roles, ["user", "assistant", "tool", "user", "assistant"]);
}

#[tokio::test]
async fn a_message_to_a_finished_run_starts_a_follow_up_that_sees_the_conversation() {
    let app = TestApp::spawn(Options {
        script: vec![Reply::text("first answer"), Reply::text("second answer")],
        ..Default::default()
    })
    .await;
    let run = app.submit("alice", CreateRun::new("first question")).await;
    let id = run.id;
    assert_eq!(outcome(&app.events("alice", id).await), Some(RunStatus::Succeeded));
    let (status, body) =
        app.post_json("alice", &format!("/v1/runs/{id}/messages"), json!({"text": "second question"})).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["disposition"], "follow_up");
    let follow: Run = serde_json::from_value(body["run"].clone()).unwrap();
    assert_ne!(follow.id, run.id);
    assert_eq!(follow.session_id, run.session_id);
    let events = app.events("alice", follow.id).await;
    assert_dense(&events, 1);
    assert_eq!(events.last().unwrap().body, EventBody::RunSucceeded { summary: "second answer".into() });
    let requests = app.model.requests();
    let messages = requests[1].body["messages"].as_array().unwrap();
    let text = serde_json::to_string(messages).unwrap();
    assert!(text.contains("first question") && text.contains("first answer") && text.contains("second question"));
}

#[tokio::test]
async fn an_approved_call_runs_and_a_denied_one_goes_back_to_the_model() {
    let app = TestApp::spawn(Options {
        script: vec![
            Reply::tool("bash", json!({"command": "echo approved-ran"})),
            Reply::tool("bash", json!({"command": "rm -rf /workspace"})),
            Reply::text("done"),
        ],
        ..Default::default()
    })
    .await;
    let spec = CreateRun { approval: Some(ApprovalMode::Mutating), ..CreateRun::new("work") };
    let id = app.submit("alice", spec).await.id;

    let first = until(&app, id, None, "approval.requested").await;
    let request = first.last().unwrap();
    let EventBody::ApprovalRequested { call_id: call, name, .. } = &request.body else { panic!("{request:?}") };
    assert_eq!(name, "bash");
    assert_eq!(app.run("alice", id).await.status, RunStatus::AwaitingApproval);
    // Another subject cannot decide; an unknown call is not found.
    let path = format!("/v1/runs/{id}/approvals/{call}");
    assert_eq!(app.post_json("mallory", &path, json!({"decision": "approve"})).await.0, 404);
    assert_eq!(
        app.post_json("alice", &format!("/v1/runs/{id}/approvals/nope"), json!({"decision": "approve"})).await.0,
        404
    );
    assert_eq!(app.post_json("alice", &path, json!({"decision": "maybe"})).await.0, 422);
    assert_eq!(app.post_json("alice", &path, json!({"decision": "approve"})).await.0, 200);
    assert_eq!(app.post_json("alice", &path, json!({"decision": "deny"})).await.0, 409, "decided once");

    let second = until(&app, id, Some(request.seq), "approval.requested").await;
    let output = pick!(second, EventBody::ToolResult { output, .. } => output).next().unwrap();
    assert!(output.contains("approved-ran"));
    assert!(second.iter().any(|e| matches!(e.body, EventBody::ApprovalResolved { approved: true, .. })));
    let asked = second.last().unwrap();
    let EventBody::ApprovalRequested { call_id: call2, .. } = &asked.body else { panic!("{asked:?}") };
    let (status, _) = app
        .post_json(
            "alice",
            &format!("/v1/runs/{id}/approvals/{call2}"),
            json!({"decision": "deny", "reason": "too risky"}),
        )
        .await;
    assert_eq!(status, 200);
    let rest = app.events_after("alice", id, Some(asked.seq)).await;
    assert_eq!(outcome(&rest), Some(RunStatus::Succeeded));
    let denied = pick!(rest, EventBody::ToolResult { output, is_error, .. } => (*is_error, output.as_str())).next();
    assert_eq!(denied, Some((true, "the user denied this call: too risky")));
    assert_eq!(app.run("alice", id).await.status, RunStatus::Succeeded);
    let requests = app.model.requests();
    assert!(requests[2].body.to_string().contains("the user denied this call: too risky"));
}

/// The files `touch` made in the run's workspace, seen from outside the
/// sandbox (the engine's exec, not a tool call of the run).
async fn in_workspace(app: &TestApp, id: Uuid) -> Vec<String> {
    let containers = app.containers_of(id).await;
    assert_eq!(containers.len(), 1, "{containers:?}");
    let (code, listing) = docker_exec(&containers[0], &["ls", "-A", "/workspace"]).await;
    assert_eq!(code, 0, "{listing}");
    listing.split_whitespace().filter(|f| ["first", "second"].contains(f)).map(str::to_owned).collect()
}

/// A bash call that creates `file` in the workspace, sent under `id`.
fn touch(file: &str, id: &str) -> ScriptedCall {
    ScriptedCall::new("bash", json!({"command": format!("touch {file} && echo made {file}")})).with_id(id)
}

/// Runs `script` (whose last two replies list the workspace and finish)
/// with approval for mutating calls: approves the first call that asks,
/// denies the second, and returns what the listing saw. The second call
/// reuses the first one's provider id, `wire_id`: approving the first must
/// not let it through, and the provider still sees its own ids.
async fn approve_first_deny_second(script: Vec<Reply>, wire_id: &str) -> String {
    let app = TestApp::spawn(Options { script, ..Default::default() }).await;
    let spec = CreateRun { approval: Some(ApprovalMode::Mutating), ..CreateRun::new("work") };
    let id = app.submit("alice", spec).await.id;

    let first = until(&app, id, None, "approval.requested").await;
    let asked = first.last().unwrap();
    let EventBody::ApprovalRequested { call_id: call, arguments, .. } = &asked.body else { panic!("{asked:?}") };
    assert!(arguments.to_string().contains("touch first"), "{arguments}");
    // Not yet approved: it has not run.
    assert_eq!(in_workspace(&app, id).await, Vec::<String>::new(), "a call waiting for approval ran");
    let (status, body) =
        app.post_json("alice", &format!("/v1/runs/{id}/approvals/{call}"), json!({"decision": "approve"})).await;
    assert_eq!(status, 200, "{body}");

    // The second call asks for itself, under an id of its own.
    let second = until(&app, id, Some(asked.seq), "approval.requested").await;
    let asked = second.last().unwrap();
    let EventBody::ApprovalRequested { call_id: call2, arguments, .. } = &asked.body else { panic!("{asked:?}") };
    assert!(arguments.to_string().contains("touch second"), "{arguments}");
    assert_ne!(call2, call, "each call has its own id");
    assert_eq!(app.run("alice", id).await.status, RunStatus::AwaitingApproval);
    // The approved call ran (so the look below can see a file); the one
    // waiting did not.
    assert_eq!(in_workspace(&app, id).await, ["first"], "only the approved call ran");
    let (status, body) =
        app.post_json("alice", &format!("/v1/runs/{id}/approvals/{call2}"), json!({"decision": "deny"})).await;
    assert_eq!(status, 200, "{body}");

    let all = app.events("alice", id).await;
    assert_eq!(outcome(&all), Some(RunStatus::Succeeded), "{:?}", kinds(&all));
    let results: Vec<(bool, &str)> =
        pick!(all, EventBody::ToolResult { output, is_error, .. } => (*is_error, output.as_str())).collect();
    assert_eq!(results.len(), 3, "{results:?}");
    assert!(results[0].1.contains("made first"), "{results:?}");
    assert_eq!(results[1], (true, "the user denied this call"));
    // The provider's id still travels back to it with each result.
    let requests = app.model.requests();
    let wire = requests.last().unwrap().body["messages"].to_string();
    let sent = |field: &str| wire.matches(&format!("\"{field}\":\"{wire_id}\"")).count();
    assert_eq!((sent("id"), sent("tool_call_id")), (2, 2), "{wire}");
    results[2].1.to_owned()
}

#[tokio::test]
async fn two_calls_with_one_id_in_one_answer_each_need_their_own_approval() {
    const WIRE: &str = "dup";
    let listing = approve_first_deny_second(
        vec![
            Reply::tools(vec![touch("first", WIRE), touch("second", WIRE)]),
            Reply::tool("ls", json!({"path": "."})),
            Reply::text("done"),
        ],
        WIRE,
    )
    .await;
    assert!(listing.contains("first") && !listing.contains("second"), "the denied call did not run: {listing}");
}

#[tokio::test]
async fn call_0_in_two_steps_with_other_arguments_each_needs_its_own_approval() {
    const WIRE: &str = "call_0";
    let listing = approve_first_deny_second(
        vec![
            Reply::tools(vec![touch("first", WIRE)]),
            Reply::tools(vec![touch("second", WIRE)]),
            Reply::tool("ls", json!({"path": "."})),
            Reply::text("done"),
        ],
        WIRE,
    )
    .await;
    assert!(listing.contains("first") && !listing.contains("second"), "the denied call did not run: {listing}");
}

#[tokio::test]
async fn allowed_tools_limit_what_the_model_sees_and_can_call() {
    let app = TestApp::spawn(Options {
        script: vec![Reply::tool("bash", json!({"command": "echo should-not-run"})), Reply::text("ok")],
        ..Default::default()
    })
    .await;
    let run =
        app.submit("alice", CreateRun { allowed_tools: Some(vec!["view".into()]), ..CreateRun::new("look") }).await;
    assert_eq!(run.allowed_tools, Some(vec!["view".to_owned()]));
    let events = app.events("alice", run.id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded));
    let (is_error, output) =
        pick!(events, EventBody::ToolResult { output, is_error, .. } => (*is_error, output)).next().unwrap();
    assert!(is_error);
    assert!(output.contains("not available"));
    let requests = app.model.requests();
    let tools: Vec<&str> =
        requests[0].body["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert_eq!(tools, ["view"]);
}

#[tokio::test]
async fn messages_are_validated_and_scoped_to_their_owner() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let id = app.submit("alice", CreateRun::new("p")).await.id;
    assert_eq!(app.post_json("alice", &format!("/v1/runs/{id}/messages"), json!({"text": " "})).await.0, 422);
    assert_eq!(app.post_json("alice", &format!("/v1/runs/{id}/messages"), json!({"txt": "x"})).await.0, 422);
    assert_eq!(app.post_json("bob", &format!("/v1/runs/{id}/messages"), json!({"text": "x"})).await.0, 404);
    let (status, body) =
        app.post_json("alice", &format!("/v1/runs/{id}/messages"), json!({"text": "queued early"})).await;
    assert_eq!(status, 202, "a queued run takes messages too: {body}");
}

/// A run held by a stand-in worker (this test), so the test decides when it
/// ends: after a message arrived that the worker never read.
async fn held_run(app: &TestApp) -> (Uuid, kiln_store::Lease) {
    let id = app.submit("alice", CreateRun::new("first question")).await.id;
    let (claimed, lease) = app.store.claim_run("stand-in", std::time::Duration::from_secs(60)).await.unwrap().unwrap();
    assert_eq!(claimed.id, id);
    let (status, body) =
        app.post_json("alice", &format!("/v1/runs/{id}/messages"), json!({"text": "one more thing"})).await;
    assert_eq!((status, body["disposition"].as_str()), (202, Some("queued")), "{body}");
    (id, lease)
}

async fn runs_in_session(app: &TestApp, id: Uuid) -> Vec<(Uuid, String, String)> {
    app.sql()
        .await
        .query(
            "SELECT id, status, prompt FROM runs
             WHERE session_id = (SELECT session_id FROM runs WHERE id = $1) ORDER BY created_at",
            &[&id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

#[tokio::test]
async fn a_message_that_arrives_after_the_workers_last_look_becomes_a_follow_up_not_lost() {
    let app =
        TestApp::spawn(Options { worker: false, script: vec![Reply::text("done that too")], ..Default::default() })
            .await;
    let (id, lease) = held_run(&app).await;
    // The worker ends the run without having read the message (it looked
    // just before the message came).
    let done = kiln_protocol::EventBody::RunSucceeded { summary: "done".into() };
    app.store.finish_run(&lease, &done, None).await.unwrap();

    let runs = runs_in_session(&app, id).await;
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[0].1, "succeeded");
    let (follow_up, status, prompt) = runs[1].clone();
    assert_eq!((status.as_str(), prompt.as_str()), ("queued", "one more thing"));
    // It is a run like any other: its own events from seq 1, and a worker
    // runs it with the message as the next turn of the conversation.
    app.start_worker(kiln_tests::worker_config(kiln_worker::ProviderKind::OpenAi, std::time::Duration::from_secs(10)))
        .await;
    let events = app.events("alice", follow_up).await;
    assert_dense(&events, 1);
    assert_eq!(events[0].body, EventBody::RunQueued { prompt: "one more thing".into() });
    assert_eq!(events.last().unwrap().body, EventBody::RunSucceeded { summary: "done that too".into() });
    let requests = app.model.requests();
    assert_eq!(user_texts(&requests[0].body).last().unwrap(), "one more thing");
    let unread: i64 = app
        .sql()
        .await
        .query_one("SELECT count(*) FROM run_inbox WHERE consumed_at IS NULL", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(unread, 0);
}

#[tokio::test]
async fn a_cancelled_runs_unread_message_starts_nothing() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let (id, lease) = held_run(&app).await;
    let cancelled = kiln_protocol::EventBody::RunCancelled { reason: "cancelled by the client".into() };
    app.store.finish_run(&lease, &cancelled, None).await.unwrap();
    let runs = runs_in_session(&app, id).await;
    assert_eq!(runs.len(), 1, "a cancel ends the conversation: {runs:?}");
}

/// Ends run `id` as a process that stops right after the end's commit
/// would leave it: ended, with the follow-up it owes not yet queued.
async fn end_and_stop(app: &TestApp, id: Uuid) {
    app.sql()
        .await
        .execute(
            "UPDATE runs SET status = 'succeeded', finished_at = now(), lease_owner = NULL, lease_expires_at = NULL
             WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(runs_in_session(app, id).await.len(), 1);
}

#[tokio::test]
async fn a_follow_up_owed_by_a_process_that_stopped_is_queued_by_the_reaper() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let (id, _lease) = held_run(&app).await;
    end_and_stop(&app, id).await;

    app.store.reap_expired_leases().await.unwrap();

    let runs = runs_in_session(&app, id).await;
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!((runs[1].1.as_str(), runs[1].2.as_str()), ("queued", "one more thing"));
    let events = app.sql().await.query("SELECT kind FROM events WHERE run_id = $1", &[&runs[1].0]).await;
    let kinds: Vec<String> = events.unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(kinds, ["run.queued"]);
    app.store.reap_expired_leases().await.unwrap();
    assert_eq!(runs_in_session(&app, id).await.len(), 2, "queued once");
}

#[tokio::test]
async fn a_message_to_a_run_whose_follow_up_is_owed_finds_the_session_busy_with_it() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let (id, _lease) = held_run(&app).await;
    end_and_stop(&app, id).await;

    let (status, body) = app.post_json("alice", &format!("/v1/runs/{id}/messages"), json!({"text": "and this"})).await;

    assert_eq!(status, 409, "{body}");
    let runs = runs_in_session(&app, id).await;
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!((runs[1].1.as_str(), runs[1].2.as_str()), ("queued", "one more thing"));
    assert!(body["error"]["message"].as_str().unwrap().contains(&runs[1].0.to_string()), "{body}");
}

#[tokio::test]
async fn a_message_accepted_while_the_runs_end_waits_for_it_is_not_lost() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let id = app.submit("alice", CreateRun::new("first question")).await.id;
    let (_, lease) = app.store.claim_run("stand-in", std::time::Duration::from_secs(60)).await.unwrap().unwrap();
    // What `send_message` does for an active run, held open: the run's end
    // waits for it, then commits after it.
    let mut sql = app.sql().await;
    let message = sql.transaction().await.unwrap();
    message.execute("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE", &[&id]).await.unwrap();
    message.execute("INSERT INTO run_inbox (run_id, text) VALUES ($1, 'just in time')", &[&id]).await.unwrap();
    message.execute("UPDATE runs SET steered = true WHERE id = $1", &[&id]).await.unwrap();
    let store = app.store.clone();
    let end = tokio::spawn(async move {
        store.finish_run(&lease, &kiln_protocol::EventBody::RunSucceeded { summary: "done".into() }, None).await
    });
    app.until_waiting_on_locks(1).await;
    assert!(!end.is_finished(), "the end waits for the run's row");
    message.commit().await.unwrap();
    end.await.unwrap().unwrap();

    let runs = runs_in_session(&app, id).await;
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!((runs[1].1.as_str(), runs[1].2.as_str()), ("queued", "just in time"));
}

#[tokio::test]
async fn a_decision_on_an_ended_run_is_409_and_a_bad_call_id_is_400_json() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let id = app.submit("alice", CreateRun::new("x")).await.id;
    let (_, lease) = app.store.claim_run("stand-in", std::time::Duration::from_secs(60)).await.unwrap().unwrap();
    app.sql()
        .await
        .execute("INSERT INTO approvals (run_id, call_id, name, arguments) VALUES ($1, 'call-1', 'bash', '{}')", &[&id])
        .await
        .unwrap();
    // Percent-encoded NUL (Postgres refuses it in text: was a 500) and bytes
    // that are not UTF-8 (was axum's plain-text 400).
    for call in ["%00", "a%01b", "%FF"] {
        let (status, body) =
            app.post_json("alice", &format!("/v1/runs/{id}/approvals/{call}"), json!({"decision": "approve"})).await;
        assert_eq!(status, 400, "{call}: {body}");
        assert_eq!(body["error"]["code"], "bad_request", "{call}: {body}");
    }
    let cancelled = kiln_protocol::EventBody::RunCancelled { reason: "cancelled by the client".into() };
    app.store.finish_run(&lease, &cancelled, None).await.unwrap();
    let before: i64 = app.sql().await.query_one("SELECT last_event_seq FROM runs", &[]).await.unwrap().get(0);
    let (status, body) =
        app.post_json("alice", &format!("/v1/runs/{id}/approvals/call-1"), json!({"decision": "approve"})).await;
    assert_eq!(status, 409, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("the run has ended"), "{body}");
    let after: i64 = app.sql().await.query_one("SELECT last_event_seq FROM runs", &[]).await.unwrap().get(0);
    assert_eq!(after, before, "no approval.resolved after the run's end");
}

#[tokio::test]
async fn a_follow_up_counts_against_the_subjects_quota() {
    let api = kiln_api::ApiSettings {
        sse_keep_alive: std::time::Duration::from_secs(1),
        quota: kiln_store::Quota { max_active_runs: 20, max_runs_per_minute: 1 },
        ..Default::default()
    };
    let app = TestApp::spawn(Options { api, script: vec![Reply::text("first answer")], ..Default::default() }).await;
    let id = app.submit("alice", CreateRun::new("first question")).await.id;
    assert_eq!(outcome(&app.events("alice", id).await), Some(RunStatus::Succeeded));
    // Each message to a finished run is a new run: without the check, any
    // number of sessions could be restarted at once past the quota.
    let r = app
        .http
        .post(app.url(&format!("/v1/runs/{id}/messages")))
        .bearer_auth(token("alice"))
        .json(&json!({"text": "second question"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let retry_after: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    let body: Value = r.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("per minute"), "{body}");
    let runs: i64 = app.sql().await.query_one("SELECT count(*) FROM runs", &[]).await.unwrap().get(0);
    assert_eq!(runs, 1);
}
