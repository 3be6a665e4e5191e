//! Database faults: Postgres restarted under an active run, and the API
//! while the database is down. Each test has a Postgres server of its own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use kiln_scripted_model::Reply;
use kiln_tests::pg::PrivatePostgres;
use kiln_tests::{Options, TestApp, assert_dense, kinds, token};
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
    let run = app.create_run("alice", json!({"prompt": "survive"})).await;
    let id = run["id"].as_str().unwrap().to_owned();
    let before = app.sse_until(app.addr, "alice", &id, None, usize::MAX, |e| e.kind == "tool_call.ready").await;

    // Restart Postgres while the command runs (and the worker holds the run).
    let stopper = tokio::task::spawn_blocking(move || {
        pg.restart(Duration::from_secs(3));
        pg
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // While it is down the API says so, in JSON, with 503.
    let ready = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
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
    let rest = app.sse(app.addr, "alice", &id, Some(before.last().unwrap().seq), usize::MAX).await;
    let mut all = before.clone();
    all.extend(rest);
    assert_dense(&all, 1);
    assert_eq!(all.last().unwrap().kind, "run.succeeded", "{:?}", kinds(&all));
    let first_result = all.iter().find(|e| e.kind == "tool.result").unwrap();
    assert!(first_result.data["output"].as_str().unwrap().contains("after-restart"));
    assert_eq!(all.iter().filter(|e| e.kind == "run.started").count(), 1, "not run twice");
    assert_eq!(app.http.get(app.url("/readyz")).send().await.unwrap().status(), 200);
    // A run created after the restart is claimed (LISTEN reconnected or polling).
    let next = app.create_run("alice", json!({"prompt": "after"})).await;
    let events = app.events_to_end("alice", next["id"].as_str().unwrap()).await;
    assert!(kiln_protocol::event::is_terminal_kind(&events.last().unwrap().kind));
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
    let run = app.create_run("alice", json!({"prompt": "ask first", "approval": "always"})).await;
    let id = run["id"].as_str().unwrap().to_owned();
    let before = app.sse_until(app.addr, "alice", &id, None, usize::MAX, |e| e.kind == "approval.requested").await;
    let call = before.last().unwrap().data["call_id"].as_str().unwrap().to_owned();

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
    let rest = app.sse(app.addr, "alice", &id, Some(before.last().unwrap().seq), usize::MAX).await;
    let mut all = before.clone();
    all.extend(rest);
    assert_dense(&all, 1);
    assert_eq!(all.last().unwrap().kind, "run.succeeded", "{:?}", kinds(&all));
    let result = all.iter().find(|e| e.kind == "tool.result").unwrap();
    assert!(result.data["output"].as_str().unwrap().contains("approved-ran"), "{result:?}");
}
