//! The test harness itself: a test's workers leave nothing in Docker once
//! its app drops, whatever they were doing: an idle session's container
//! kept, a warm one waiting or being made, a run in the middle of a command,
//! runs whose containers were being created as the test ended.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bollard::Docker;
use kiln_protocol::{CreateRun, EventBody, RunStatus};
use kiln_scripted_model::Reply;
use kiln_tests::leftovers::{CALL_TIMEOUT, Leftovers, clean_up, find, remove};
use kiln_tests::{Options, TestApp, outcome, worker_config};
use kiln_worker::{ProviderKind, WorkerConfig};
use serde_json::json;

/// Runs whose containers are being created when the test ends.
const STARTING: usize = 3;
/// How long after the end the test watches for something to appear: a
/// container whose create the engine was still working on when the app
/// dropped lands only then. (Waiting is the point here: the test checks
/// that nothing shows up.)
const WATCH_FOR: Duration = Duration::from_secs(5);

/// What a test that ends early leaves: an idle session's container kept,
/// a warm pool refilling, a run in the middle of a command and runs just
/// claimed. Returns the database, the workers and what they had in Docker
/// just before the end.
async fn a_test_that_ends_mid_run() -> (String, Vec<String>, Leftovers) {
    let app = TestApp::spawn(Options {
        worker: false,
        script: vec![Reply::text("first run done"), Reply::tool("bash", json!({"command": "sleep 600"}))],
        ..Default::default()
    })
    .await;
    let config = WorkerConfig {
        sandbox_idle: Duration::from_secs(600),
        warm_pool: 2,
        // A slot for each run below, so those submitted last are claimed
        // (and their containers made) at once.
        concurrency: 2 + STARTING,
        ..worker_config(ProviderKind::OpenAi, Duration::from_secs(30))
    };
    app.start_worker(config).await;
    let done = app.submit("alice", CreateRun::new("finish")).await.id;
    assert_eq!(outcome(&app.events("alice", done).await), Some(RunStatus::Succeeded));
    let busy = app.submit("alice", CreateRun::new("hang")).await.id;
    app.events_until("alice", busy, None, |e| matches!(e.body, EventBody::ToolCallReady { .. })).await;
    // New sessions: each takes a warm container (the pool starts others)
    // or makes its own, while the test ends.
    for _ in 0..STARTING {
        app.submit("bob", CreateRun::new("starting")).await;
    }
    let docker = Docker::connect_with_local_defaults().unwrap();
    let (db_url, workers) = (app.db_url.clone(), app.worker_ids());
    let before = find(&docker, &db_url, &workers).await.unwrap();
    (db_url, workers, before)
    // The app drops here, as at the end of any test.
}

/// Asserts that nothing of `workers` is in Docker now, nor a while later;
/// removes what it finds first, so a failure leaves nothing either.
fn assert_nothing_left(runtime: &tokio::runtime::Runtime, db_url: &str, workers: &[String]) {
    let docker = Docker::connect_with_local_defaults().unwrap();
    let at_end = runtime.block_on(find(&docker, db_url, workers)).unwrap();
    runtime.block_on(remove(&docker, &at_end));
    std::thread::sleep(WATCH_FOR);
    let later = runtime.block_on(find(&docker, db_url, workers)).unwrap();
    runtime.block_on(remove(&docker, &later));
    assert!(at_end.is_empty(), "left behind when the app dropped: {at_end:?}");
    assert!(later.is_empty(), "appeared after the app dropped: {later:?}");
}

fn ends_mid_run_on(runtime: tokio::runtime::Runtime) {
    let (db_url, workers, before) = runtime.block_on(a_test_that_ends_mid_run());
    // The two sessions' containers, and warm ones.
    assert!(before.containers.len() >= 2, "{before:?}");
    assert_nothing_left(&runtime, &db_url, &workers);
}

#[test]
fn a_test_that_ends_mid_run_leaves_no_containers_of_its_workers_behind() {
    ends_mid_run_on(tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap());
}

/// On a runtime of several threads (as `#[tokio::test(flavor =
/// "multi_thread")]`), where nothing stops the workers while the app drops
/// unless the harness does.
#[test]
fn a_test_on_several_threads_that_ends_mid_run_leaves_nothing_behind() {
    ends_mid_run_on(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap());
}

/// A database that takes connections and never answers (a test's own
/// server, frozen or gone behind something that still listens): the
/// clean-up waits for it once, not at every look, and still removes a
/// container the test's worker left, and says what it could not look for.
#[test]
fn a_clean_up_waits_once_for_a_database_that_does_not_answer_and_still_removes_a_leftover() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // Loopback: accepts, holds every connection, never says a word.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let db_url = format!("postgres://kiln@{}/silent", silent.local_addr().unwrap());
    let held = std::thread::spawn(move || silent.incoming().take(8).map(Result::unwrap).collect::<Vec<_>>());

    // A container of the test's worker, as one it left behind.
    let worker = format!("test-{}", uuid::Uuid::new_v4().simple());
    let docker = Docker::connect_with_local_defaults().unwrap();
    let image = std::env::var("KILN_SANDBOX_IMAGE").unwrap_or_else(|_| "kiln-sandbox:latest".into());
    let body = bollard::models::ContainerCreateBody {
        image: Some(image),
        cmd: Some(vec!["true".into()]),
        labels: Some(std::collections::HashMap::from([
            (kiln_worker::sandbox::LABEL_MANAGED.to_owned(), "true".to_owned()),
            (kiln_worker::sandbox::LABEL_WORKER.to_owned(), worker.clone()),
        ])),
        network_disabled: Some(true),
        ..Default::default()
    };
    let left = runtime.block_on(docker.create_container(None, body)).unwrap().id;

    let started = std::time::Instant::now();
    let done = clean_up(None, db_url, vec![worker.clone()]);
    let took = started.elapsed();
    let gone = runtime.block_on(docker.inspect_container(&left, None)).is_err();
    drop(held);
    assert!(gone, "the leftover container {left} was removed");
    assert_eq!(done.removed.containers.len(), 1, "{:?} (created {left})", done.removed);
    // One wait for the database (the first look), not one a look.
    assert!(took < CALL_TIMEOUT + CALL_TIMEOUT / 2, "the clean-up took {took:?}");
    let why = done.unfinished.unwrap_or_default();
    assert!(why.contains("networks were not looked for") && why.contains("no answer"), "{why}");
}
