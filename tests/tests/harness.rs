//! The test harness itself: a test's workers leave nothing running in
//! Docker once the test ends, whatever state they were in.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bollard::Docker;
use kiln_protocol::{CreateRun, EventBody, RunStatus};
use kiln_scripted_model::Reply;
use kiln_tests::leftovers::{Leftovers, find};
use kiln_tests::{Options, TestApp, outcome, worker_config};
use kiln_worker::{ProviderKind, WorkerConfig};
use serde_json::json;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// What a test that ends early leaves: an idle session's container kept,
/// a warm one waiting, and a run in the middle of a command. Returns the
/// database, the workers and what they had in Docker just before the end.
async fn a_test_that_ends_mid_run() -> (String, Vec<String>, Leftovers) {
    let app = TestApp::spawn(Options {
        worker: false,
        script: vec![Reply::text("first run done"), Reply::tool("bash", json!({"command": "sleep 600"}))],
        ..Default::default()
    })
    .await;
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
    (db_url, workers, before)
    // The app drops here, and the test's runtime ends with it: the worker
    // tasks die where they are, as at the end of any test.
}

#[test]
fn a_test_that_ends_mid_run_leaves_no_containers_of_its_workers_behind() {
    let (db_url, workers, before) = runtime().block_on(a_test_that_ends_mid_run());
    // Two sessions' containers, and the warm pool's (which may still have
    // been in the making).
    assert!(before.containers.len() >= 2, "{before:?}");
    let docker = Docker::connect_with_local_defaults().unwrap();
    let after = runtime().block_on(find(&docker, &db_url, &workers));
    assert!(after.is_empty(), "left behind: {after:?}");
}
