//! Database faults: Postgres restarted under an active run, and the API
//! while the database is down. Each test has a Postgres server of its own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use kiln_protocol::{ApprovalMode, CreateRun, EventBody, RunStatus};
use kiln_scripted_model::Reply;
use kiln_tests::pg::PrivatePostgres;
use kiln_tests::{Options, TestApp, assert_dense, kinds, outcome, pick, token};
use serde_json::json;

#[tokio::test]
async fn a_run_survives_a_database_restart_and_its_events_stay_dense() {
    let pg = PrivatePostgres::start();
    let app = TestApp::spawn(Options {
        postgres: Some(pg.admin_url()),
        script: vec![
            Reply::tool("bash", json!({"command": "sleep 1.5; echo after-restart"})),
            Reply::tool("bash", json!({"command": "echo second"})),
            Reply::text("done"),
        ],
        ..Default::default()
    })
    .await;
    let id = app.submit("alice", CreateRun::new("survive")).await.id;
    let before = app.events_until("alice", id, None, |e| matches!(e.body, EventBody::ToolCallReady { .. })).await;

    // Restart Postgres while the command runs (and the worker holds the run).
    let stopper = tokio::task::spawn_blocking(move || {
        pg.restart(Duration::from_secs(3));
        pg
    });
    // While it is down the API says so, in JSON, with 503: wait for the
    // stop to take effect (a fixed pause was too short on a busy machine).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while app.http.get(app.url("/readyz")).send().await.unwrap().status() != 503 {
        assert!(tokio::time::Instant::now() < deadline, "/readyz never said the database is down");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let create = app
        .http
        .post(app.url("/v1/runs"))
        .bearer_auth(token("alice"))
        .json(&json!({"prompt": "while down"}))
        .send()
        .await
        .unwrap();
    assert_eq!(create.status(), 503);
    let body: serde_json::Value = create.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unavailable");
    let _pg = stopper.await.unwrap();

    // The stream resumes after the restart and the run finishes normally.
    let rest = app.events_after("alice", id, Some(before.last().unwrap().seq)).await;
    let mut all = before.clone();
    all.extend(rest);
    assert_dense(&all, 1);
    assert_eq!(outcome(&all), Some(RunStatus::Succeeded), "{:?}", kinds(&all));
    let first_result = pick!(all, EventBody::ToolResult { output, .. } => output).next().unwrap();
    assert!(first_result.contains("after-restart"));
    assert_eq!(pick!(all, EventBody::RunStarted { .. } => ()).count(), 1, "not run twice");
    assert_eq!(app.http.get(app.url("/readyz")).send().await.unwrap().status(), 200);
    // A run created after the restart is claimed (LISTEN reconnected or polling).
    let next = app.submit("alice", CreateRun::new("after")).await;
    let events = app.events("alice", next.id).await;
    assert!(events.last().unwrap().body.is_terminal());
}

#[tokio::test]
async fn a_run_waiting_for_approval_rides_out_a_database_restart() {
    let pg = PrivatePostgres::start();
    let app = TestApp::spawn(Options {
        postgres: Some(pg.admin_url()),
        script: vec![Reply::tool("bash", json!({"command": "echo approved-ran"})), Reply::text("done")],
        ..Default::default()
    })
    .await;
    let spec = CreateRun { approval: Some(ApprovalMode::Always), ..CreateRun::new("ask first") };
    let id = app.submit("alice", spec).await.id;
    let before = app.events_until("alice", id, None, |e| matches!(e.body, EventBody::ApprovalRequested { .. })).await;
    let asked = before.last().unwrap();
    let EventBody::ApprovalRequested { call_id: call, .. } = &asked.body else { panic!("{asked:?}") };

    // Down for longer than the worker's one-second look at the decision.
    let _pg = tokio::task::spawn_blocking(move || {
        pg.restart(Duration::from_secs(3));
        pg
    })
    .await
    .unwrap();

    // The person decides after the restart; the run was still waiting.
    let url = app.url(&format!("/v1/runs/{id}/approvals/{call}"));
    let decided = loop {
        let r = app.http.post(&url).bearer_auth(token("alice")).json(&json!({"decision": "approve"})).send().await;
        match r {
            Ok(r) if r.status() != 503 => break r,
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    assert_eq!(decided.status(), 200, "{:?}", decided.text().await);
    let rest = app.events_after("alice", id, Some(asked.seq)).await;
    let mut all = before.clone();
    all.extend(rest);
    assert_dense(&all, 1);
    assert_eq!(outcome(&all), Some(RunStatus::Succeeded), "{:?}", kinds(&all));
    let output = pick!(all, EventBody::ToolResult { output, .. } => output).next().unwrap();
    assert!(output.contains("approved-ran"), "{output:?}");
}

/// What the attempt that takes a run over answers for a call whose result
/// the lost attempt never recorded.
const INTERRUPTED: &str = "interrupted: the worker running this call was lost; it may or may not have completed";

/// A worker whose database is away for longer than its lease cannot keep
/// the run: it stops driving it (nobody could extend the lease, so another
/// attempt may begin), and once the database is back the run is taken up
/// again and finished exactly once: a second attempt, the lost call
/// answered once (by the takeover, never by the first attempt's command),
/// one terminal event, the events dense.
#[tokio::test]
async fn a_run_whose_database_is_away_for_longer_than_the_lease_is_handed_back_and_finished_once() {
    let pg = PrivatePostgres::start();
    let lease = Duration::from_secs(3);
    let app = TestApp::spawn(Options {
        postgres: Some(pg.admin_url()),
        lease,
        script: vec![
            // Long enough to outlast the outage: if the first attempt went
            // on driving the run, its result would be this output.
            Reply::tool("bash", json!({"command": "sleep 12; echo first-attempt-finished"})),
            Reply::text("done"),
        ],
        ..Default::default()
    })
    .await;
    let id = app.submit("alice", CreateRun::new("outlast")).await.id;
    let before = app.events_until("alice", id, None, |e| matches!(e.body, EventBody::ToolCallReady { .. })).await;

    // Away for three leases while the command runs.
    let _pg = tokio::task::spawn_blocking(move || {
        pg.restart(lease * 3);
        pg
    })
    .await
    .unwrap();

    let rest = app.events_after("alice", id, Some(before.last().unwrap().seq)).await;
    let all: Vec<_> = before.into_iter().chain(rest).collect();
    assert_dense(&all, 1);
    assert_eq!(outcome(&all), Some(RunStatus::Succeeded), "{:?}", kinds(&all));
    let attempts: Vec<i32> = pick!(all, EventBody::RunStarted { attempt, .. } => *attempt).collect();
    assert_eq!(attempts, [1, 2], "handed back and taken up again once: {:?}", kinds(&all));
    let results: Vec<&str> = pick!(all, EventBody::ToolResult { output, .. } => output.as_str()).collect();
    assert_eq!(results, [INTERRUPTED], "the lost call answered once, by the takeover");
    assert_eq!(all.iter().filter(|e| e.body.is_terminal()).count(), 1, "{:?}", kinds(&all));
    // Each attempt asked the model once; the first, stopped, nothing more.
    assert_eq!(app.model.requests().len(), 2);
    let sql = app.sql().await;
    let row = sql.query_one("SELECT status::text, attempt FROM runs WHERE id = $1", &[&id]).await.unwrap();
    assert_eq!((row.get::<_, String>(0), row.get::<_, i32>(1)), ("succeeded".to_owned(), 2));
    // Nothing written after the end, by either attempt (the first one's
    // command would have ended by now were it still driven).
    let stored = app.stored_events(id).await;
    assert_eq!(stored.len(), all.len(), "{:?}", kinds(&stored));
}
