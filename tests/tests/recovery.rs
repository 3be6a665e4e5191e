//! What a run leaves behind when it ends or loses its worker mid-way is
//! repaired before the conversation goes on: tool calls without results are
//! answered before anything else joins the conversation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use kiln_protocol::{ApprovalMode, CreateRun, EventBody, Message, Run, RunStatus};
use kiln_scripted_model::Reply;
use kiln_store::{Lease, StoreError};
use kiln_tests::{Event, Options, TestApp, kinds, outcome, pick, worker_config};
use kiln_worker::ProviderKind;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

async fn until(app: &TestApp, id: Uuid, after: Option<i64>, stop: impl Fn(&EventBody) -> bool) -> Vec<Event> {
    let evs = app.events_until("alice", id, after, |e| stop(&e.body)).await;
    assert!(evs.last().is_some_and(|e| stop(&e.body)), "{:?}", kinds(&evs));
    evs
}

/// The call id of the last event, which must be a tool call's.
fn call_of(events: &[Event]) -> &str {
    match events.last().map(|e| &e.body) {
        Some(EventBody::ToolCallReady { call_id, .. } | EventBody::ApprovalRequested { call_id, .. }) => call_id,
        other => panic!("not a tool call: {other:?}"),
    }
}

#[tokio::test]
async fn a_follow_up_to_a_run_cancelled_mid_call_answers_the_call_before_its_prompt() {
    let app = TestApp::spawn(Options {
        script: vec![Reply::tool("bash", json!({"command": "sleep 30; echo never"})), Reply::text("follow-up done")],
        ..Default::default()
    })
    .await;
    let id = app.submit("alice", CreateRun::new("start")).await.id;
    let ready = until(&app, id, None, |b| matches!(b, EventBody::ToolCallReady { .. })).await;
    let call = call_of(&ready);
    let (status, _) = app.post_json("alice", &format!("/v1/runs/{id}/cancel"), json!({})).await;
    assert!(status == 200 || status == 202, "cancel: {status}");
    until(&app, id, None, |b| matches!(b, EventBody::RunCancelled { .. })).await;

    let (status, body) =
        app.post_json("alice", &format!("/v1/runs/{id}/messages"), json!({"text": "what happened?"})).await;
    assert_eq!(status, 201, "{body}");
    let follow = serde_json::from_value::<Run>(body["run"].clone()).unwrap().id;
    let events = app.events("alice", follow).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));

    // What the model was sent for the follow-up: the call, its answer, then
    // the new prompt; nothing between the call and its answer.
    let requests = app.model.requests();
    assert_eq!(requests.len(), 2);
    let messages = requests[1].body["messages"].as_array().unwrap();
    let at = |pred: &dyn Fn(&Value) -> bool| messages.iter().position(pred).unwrap_or(usize::MAX);
    let asked = at(&|m| m["role"] == "assistant" && m["tool_calls"][0]["id"].is_string());
    // The provider's id for the call (events carry Kiln's).
    let wire = &messages.get(asked).expect("the call was sent")["tool_calls"][0]["id"];
    assert_ne!(wire, call);
    let answered = at(&|m| m["role"] == "tool" && &m["tool_call_id"] == wire);
    let prompt = at(&|m| m["role"] == "user" && m["content"] == "what happened?");
    assert!(asked < messages.len() && answered == asked + 1 && prompt == answered + 1, "{messages:#?}");
    let answer = messages[answered]["content"].as_str().unwrap();
    assert!(answer.starts_with("interrupted: the run ended"), "{answer}");

    // The follow-up says so in its events, in the tool message's commit.
    let result = pick!(events, EventBody::ToolResult { call_id, .. } => call_id).next().expect("tool.result");
    assert_eq!(result, call);
    let sql = app.sql().await;
    let event_tx: i64 = sql
        .query_one("SELECT xmin::text::bigint FROM events WHERE run_id = $1 AND kind = 'tool.result'", &[&follow])
        .await
        .unwrap()
        .get(0);
    let message_tx: i64 = sql
        .query_one("SELECT xmin::text::bigint FROM messages WHERE run_id = $1 AND role = 'tool'", &[&follow])
        .await
        .unwrap()
        .get(0);
    assert_eq!(event_tx, message_tx);
}

/// How the first worker goes while its run waits for an approval.
enum Gone {
    /// Killed outright: the run waits out its lease.
    Killed,
    /// Shut down: the run is handed back to the queue at once.
    ShutDown,
}

#[tokio::test]
async fn a_call_waiting_for_approval_when_its_worker_died_runs_once_approved_after_the_takeover() {
    approval_survives(Gone::Killed).await;
}

#[tokio::test]
async fn a_call_waiting_for_approval_when_its_worker_shut_down_runs_once_approved_after_the_handover() {
    approval_survives(Gone::ShutDown).await;
}

async fn approval_survives(gone: Gone) {
    let app = TestApp::spawn(Options {
        script: vec![Reply::tool("bash", json!({"command": "echo approved-after-takeover"})), Reply::text("done")],
        worker: false,
        ..Default::default()
    })
    .await;
    let lease = Duration::from_secs(3);
    let mut first = worker_config(ProviderKind::OpenAi, lease);
    first.shutdown_grace = Duration::from_secs(1);
    let stop_first = CancellationToken::new();
    let first = app.start_worker_until(first, stop_first.clone()).await;
    let id = app.submit("alice", CreateRun { approval: Some(ApprovalMode::Always), ..CreateRun::new("work") }).await.id;
    let asked = until(&app, id, None, |b| matches!(b, EventBody::ApprovalRequested { .. })).await;
    let call = call_of(&asked);
    match gone {
        Gone::Killed => {
            first.abort();
            let _ = first.await;
        }
        Gone::ShutDown => {
            stop_first.cancel();
            first.await.unwrap();
            assert_eq!(app.run("alice", id).await.status, RunStatus::Queued, "handed back");
        }
    }

    app.start_worker(worker_config(ProviderKind::OpenAi, lease)).await;
    // The next worker brings the call back to the gate and waits again.
    let after = asked.last().unwrap().seq;
    let again = until(&app, id, Some(after), |b| matches!(b, EventBody::ToolCallReady { .. })).await;
    assert_eq!(call_of(&again), call);
    let deadline = Instant::now() + Duration::from_secs(30);
    while app.run("alice", id).await.status != RunStatus::AwaitingApproval {
        assert!(Instant::now() < deadline, "the run never waited for the approval again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) =
        app.post_json("alice", &format!("/v1/runs/{id}/approvals/{call}"), json!({"decision": "approve"})).await;
    assert_eq!(status, 200, "{body}");

    let all = app.events("alice", id).await;
    assert_eq!(outcome(&all), Some(RunStatus::Succeeded), "{:?}", kinds(&all));
    let results: Vec<&str> = pick!(all, EventBody::ToolResult { output, .. } => output.as_str()).collect();
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(results[0].contains("approved-after-takeover"), "the approved call ran: {results:?}");
    let requests = pick!(all, EventBody::ApprovalRequested { .. } => ()).count();
    assert_eq!(requests, 1, "one request, answered once");
    let started: bool = app
        .sql()
        .await
        .query_one("SELECT started_at IS NOT NULL FROM approvals WHERE call_id = $1", &[&call])
        .await
        .unwrap()
        .get(0);
    assert!(started);
}

#[tokio::test]
async fn a_decision_recorded_for_other_arguments_does_not_let_the_call_run_after_a_takeover() {
    let app = TestApp::spawn(Options {
        script: vec![
            Reply::tool("bash", json!({"command": "touch made-by-call && echo made"})),
            Reply::tool("ls", json!({"path": "."})),
            Reply::text("done"),
        ],
        worker: false,
        ..Default::default()
    })
    .await;
    let lease = Duration::from_secs(3);
    let first = app.start_worker_until(worker_config(ProviderKind::OpenAi, lease), CancellationToken::new()).await;
    let spec = CreateRun { approval: Some(ApprovalMode::Mutating), ..CreateRun::new("work") };
    let id = app.submit("alice", spec).await.id;
    let asked = until(&app, id, None, |b| matches!(b, EventBody::ApprovalRequested { .. })).await;
    let call = call_of(&asked).to_owned();
    first.abort();
    let _ = first.await;
    // What the call's row says was approved is another call: a decision
    // on other arguments (a reused id, a row from before the upgrade).
    let changed = app
        .sql()
        .await
        .execute(
            "UPDATE approvals SET arguments = '{\"command\": \"echo harmless\"}', approved = true,
                    decided_by = 'alice', decided_at = now()
             WHERE run_id = $1 AND call_id = $2",
            &[&id, &call],
        )
        .await
        .unwrap();
    assert_eq!(changed, 1);

    app.start_worker(worker_config(ProviderKind::OpenAi, lease)).await;
    // The next worker asks again, for the arguments the call really has.
    let after = asked.last().unwrap().seq;
    let again = until(&app, id, Some(after), |b| {
        matches!(b, EventBody::ApprovalRequested { .. } | EventBody::ToolResult { .. })
    })
    .await;
    let Some(EventBody::ApprovalRequested { call_id, arguments, .. }) = again.last().map(|e| &e.body) else {
        panic!("the call ran on a decision about other arguments: {:?}", kinds(&again));
    };
    assert_eq!(call_id, &call);
    assert!(arguments.to_string().contains("touch made-by-call"), "{arguments}");
    let (status, body) =
        app.post_json("alice", &format!("/v1/runs/{id}/approvals/{call}"), json!({"decision": "deny"})).await;
    assert_eq!(status, 200, "{body}");

    let all = app.events("alice", id).await;
    assert_eq!(outcome(&all), Some(RunStatus::Succeeded), "{:?}", kinds(&all));
    let results: Vec<(bool, &str)> =
        pick!(all, EventBody::ToolResult { output, is_error, .. } => (*is_error, output.as_str())).collect();
    assert_eq!(results.len(), 2, "{results:?}");
    assert_eq!(results[0], (true, "the user denied this call"));
    assert!(!results[1].1.contains("made-by-call"), "the call never ran: {results:?}");
}

#[tokio::test]
async fn a_steering_message_is_marked_read_in_the_commit_that_stores_it() {
    let app = TestApp::spawn(Options {
        script: vec![Reply::tool("bash", json!({"command": "sleep 2; echo first"})), Reply::text("done")],
        ..Default::default()
    })
    .await;
    let run = app.submit("alice", CreateRun::new("start")).await.id;
    until(&app, run, None, |b| matches!(b, EventBody::ToolCallReady { .. })).await;
    let (status, body) =
        app.post_json("alice", &format!("/v1/runs/{run}/messages"), json!({"text": "also check the tests"})).await;
    assert_eq!(status, 202, "{body}");
    let events = app.events("alice", run).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let rows = app
        .sql()
        .await
        .query(
            "SELECT i.consumed_at IS NOT NULL, i.xmin::text::bigint, m.xmin::text::bigint
             FROM run_inbox i
             LEFT JOIN messages m ON m.run_id = i.run_id AND m.role = 'user' AND m.parts->0->>'text' = i.text
             WHERE i.run_id = $1",
            &[&run],
        )
        .await
        .unwrap();
    let seen: Vec<(bool, i64, Option<i64>)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
    let [(consumed, inbox_tx, message_tx)] = seen[..] else { panic!("{seen:?}") };
    assert!(consumed);
    assert_eq!(Some(inbox_tx), message_tx, "consumed and stored in one transaction");
}

#[tokio::test]
async fn moving_inbox_messages_again_after_a_lost_answer_stores_nothing_twice() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let id = app.submit("alice", CreateRun::new("p")).await.id;
    let (claimed, lease) = app.store.claim_run("w", Duration::from_secs(600)).await.unwrap().unwrap();
    for text in ["one", "two"] {
        assert_eq!(app.post_json("alice", &format!("/v1/runs/{id}/messages"), json!({ "text": text })).await.0, 202);
    }
    let unread = app.store.unread_inbox(lease.run_id).await.unwrap();
    let texts: Vec<&str> = unread.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(texts, ["one", "two"]);
    // A stale lease moves nothing.
    let stale = Lease { attempt: lease.attempt + 1, ..lease.clone() };
    let refused = app.store.consume_inbox(&stale, claimed.session_id, &unread).await;
    assert!(matches!(refused, Err(StoreError::LeaseLost(_))), "{refused:?}");
    assert_eq!(app.store.unread_inbox(lease.run_id).await.unwrap(), unread);

    app.store.consume_inbox(&lease, claimed.session_id, &unread).await.unwrap();
    // What a retry after a commit whose answer was lost does: the same rows again.
    app.store.consume_inbox(&lease, claimed.session_id, &unread).await.unwrap();
    assert!(app.store.unread_inbox(lease.run_id).await.unwrap().is_empty());
    let stored = app.store.load_messages(claimed.session_id).await.unwrap();
    assert_eq!(stored, [Message::user("one"), Message::user("two")]);
}

#[tokio::test]
async fn a_fenced_write_waits_for_a_takeover_under_way_and_is_then_refused() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let id = app.submit("alice", CreateRun::new("p")).await.id;
    let (claimed, lease) = app.store.claim_run("w", Duration::from_secs(600)).await.unwrap().unwrap();
    assert_eq!(app.post_json("alice", &format!("/v1/runs/{id}/messages"), json!({"text": "steer"})).await.0, 202);
    let unread = app.store.unread_inbox(lease.run_id).await.unwrap();

    // Another worker's claim, not yet committed.
    let mut sql = app.sql().await;
    let takeover = sql.transaction().await.unwrap();
    takeover
        .execute("UPDATE runs SET attempt = attempt + 1, lease_owner = 'w2' WHERE id = $1", &[&lease.run_id])
        .await
        .unwrap();
    let (store, old) = (app.store.clone(), lease.clone());
    let session = claimed.session_id;
    let summary = tokio::spawn(async move {
        store.append_summary(&old, Uuid::now_v7(), session, &Message::user("summary"), 0, None, None).await
    });
    let (store, old) = (app.store.clone(), lease.clone());
    let inbox = tokio::spawn(async move { store.consume_inbox(&old, session, &unread).await });
    // Both writes reach the server and wait there for the takeover's lock
    // on the run row (not merely slow to start).
    app.until_waiting_on_locks(2).await;
    assert!(!summary.is_finished() && !inbox.is_finished(), "the writes wait for the run row");
    takeover.commit().await.unwrap();

    let summary = summary.await.unwrap();
    assert!(matches!(summary, Err(StoreError::LeaseLost(_))), "{summary:?}");
    let inbox = inbox.await.unwrap();
    assert!(matches!(inbox, Err(StoreError::LeaseLost(_))), "{inbox:?}");
    assert!(app.store.load_messages(session).await.unwrap().is_empty());
    assert_eq!(app.store.unread_inbox(lease.run_id).await.unwrap().len(), 1, "the message stays unread");
}
