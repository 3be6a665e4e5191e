//! The test harness itself: a test's workers leave nothing running in
//! Docker once its `TestApp` drops, whatever state they were in.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bollard::Docker;
use kiln_protocol::{CreateRun, EventBody, RunStatus};
use kiln_scripted_model::Reply;
use kiln_tests::leftovers::find;
use kiln_tests::{Options, TestApp, outcome, worker_config};
use kiln_worker::{ProviderKind, WorkerConfig};
use serde_json::json;

#[tokio::test]
async fn a_dropped_app_leaves_no_containers_of_its_workers_behind() {
    let app = TestApp::spawn(Options {
        worker: false,
        script: vec![Reply::text("first run done"), Reply::tool("bash", json!({"command": "sleep 600"}))],
        ..Default::default()
    })
    .await;
    // An idle session's container kept, a warm one waiting, and a run in
    // the middle of a command: what a test that ends early leaves.
    let config = WorkerConfig {
        sandbox_idle: Duration::from_secs(600),
        warm_pool: 1,
        ..worker_config(ProviderKind::OpenAi, Duration::from_secs(30))
    };
    app.start_worker(config).await;
    let done = app.submit("alice", CreateRun::new("finish")).await.id;
    assert_eq!(outcome(&app.events("alice", done).await), Some(RunStatus::Succeeded));
    let busy = app.submit("alice", CreateRun::new("hang")).await.id;
    app.events_until("alice", busy, None, |e| matches!(e.body, EventBody::ToolCallReady { .. })).await;

    let docker = Docker::connect_with_local_defaults().unwrap();
    let (db_url, workers) = (app.db_url.clone(), app.worker_ids());
    let before = find(&docker, &db_url, &workers).await;
    // Two sessions' containers, and the warm pool's (which may still be
    // being refilled).
    assert!(before.containers.len() >= 2, "{before:?}");

    drop(app);
    let after = find(&docker, &db_url, &workers).await;
    assert!(after.is_empty(), "left behind: {after:?}");
}
