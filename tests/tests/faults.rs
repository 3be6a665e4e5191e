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
