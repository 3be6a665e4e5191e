//! Runs outlive their workers: a worker that shuts down hands its runs back
//! at once; a worker that dies loses them after the lease; either way the
//! next worker continues from the stored conversation and never re-runs a
//! call whose result was not stored.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use kiln_protocol::{CreateRun, EventBody, Limits, RunStatus};
use kiln_scripted_model::Reply;
use kiln_tests::{Event, Options, TestApp, assert_dense, kinds, outcome, pick, worker_config};
use kiln_worker::ProviderKind;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const INTERRUPTED: &str = "interrupted: the worker running this call was lost; it may or may not have completed";

fn script() -> Vec<Reply> {
    vec![Reply::tool("bash", json!({"command": "sleep 30; echo never"})), Reply::text("recovered")]
}

async fn started(app: &TestApp, id: Uuid) -> Vec<Event> {
    app.events_until("alice", id, None, |e| matches!(e.body, EventBody::ToolCallReady { .. })).await
}

fn assert_resumed(all: &[Event]) {
    assert_dense(all, 1);
    assert_eq!(outcome(all), Some(RunStatus::Succeeded), "{:?}", kinds(all));
    let attempts: Vec<i32> = pick!(all, EventBody::RunStarted { attempt, .. } => *attempt).collect();
    assert_eq!(attempts, [1, 2]);
    let results: Vec<&str> = pick!(all, EventBody::ToolResult { output, .. } => output.as_str()).collect();
    assert_eq!(results, [INTERRUPTED], "the lost call is answered, not run again");
}

#[tokio::test]
async fn a_worker_shutting_down_hands_its_run_to_another_at_once() {
    let app = TestApp::spawn(Options { script: script(), worker: false, ..Default::default() }).await;
    let mut first = worker_config(ProviderKind::OpenAi, Duration::from_secs(30));
    first.shutdown_grace = Duration::from_secs(1);
    let stop_first = CancellationToken::new();
    let first_done = app.start_worker_until(first, stop_first.clone()).await;
    let id = app.submit("alice", CreateRun::new("work")).await.id;
    let seen = started(&app, id).await;

    let stopping = Instant::now();
    stop_first.cancel();
    tokio::time::timeout(Duration::from_secs(15), first_done).await.expect("worker exits after its grace").unwrap();
    assert!(stopping.elapsed() < Duration::from_secs(15));
    assert_eq!(app.run("alice", id).await.status, RunStatus::Queued, "the lease was handed back");

    // A second worker takes the run long before the 30 s lease would expire.
    app.start_worker(worker_config(ProviderKind::OpenAi, Duration::from_secs(30))).await;
    let rest = app.events_after("alice", id, Some(seen.last().unwrap().seq)).await;
    assert!(stopping.elapsed() < Duration::from_secs(25), "taken over at once, not after the lease");
    let all: Vec<Event> = seen.into_iter().chain(rest).collect();
    assert_resumed(&all);
    let requests = app.model.requests();
    assert!(requests.last().unwrap().body.to_string().contains("interrupted: the worker running this call was lost"));
}

#[tokio::test]
async fn a_run_whose_worker_died_is_taken_over_after_its_lease() {
    let app = TestApp::spawn(Options { script: script(), worker: false, ..Default::default() }).await;
    let lease = Duration::from_secs(3);
    let doomed = app.start_worker_until(worker_config(ProviderKind::OpenAi, lease), CancellationToken::new()).await;
    let id = app.submit("alice", CreateRun::new("work")).await.id;
    let seen = started(&app, id).await;
    // Kill the worker outright: no cleanup, no release, no final write.
    doomed.abort();
    let _ = doomed.await;
    app.start_worker(worker_config(ProviderKind::OpenAi, lease)).await;
    let rest = app.events_after("alice", id, Some(seen.last().unwrap().seq)).await;
    let all: Vec<Event> = seen.into_iter().chain(rest).collect();
    assert_resumed(&all);
    assert!(app.containers_of(id).await.is_empty(), "the dead worker's container is gone too");
}

#[tokio::test]
async fn a_worker_told_to_stop_claims_nothing_more() {
    let app = TestApp::spawn(Options { worker: false, script: script(), ..Default::default() }).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        ids.push(app.submit("alice", CreateRun::new("work")).await.id);
    }
    // The stop comes while the worker is still starting (a SIGTERM during
    // startup), with runs queued and every slot free.
    let stop = CancellationToken::new();
    stop.cancel();
    let worker = app.start_worker_until(worker_config(ProviderKind::OpenAi, Duration::from_secs(10)), stop).await;
    tokio::time::timeout(Duration::from_secs(30), worker).await.unwrap().unwrap();
    let rows = app.sql().await.query("SELECT status::text, attempt FROM runs ORDER BY created_at", &[]).await.unwrap();
    let runs: Vec<(String, i32)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(runs, [("queued".to_owned(), 0), ("queued".to_owned(), 0)], "runs: {ids:?}");
}

/// A run claimed under a worker's name whose answer never reached it (the
/// commit went through, the connection dropped): the worker notices at its
/// next reap that it holds a run it does not run and hands it back, so it
/// runs now rather than after its lease, and is not counted as lost.
#[tokio::test]
async fn a_claim_the_worker_never_heard_of_is_handed_back_not_left_to_expire() {
    let app = TestApp::spawn(Options { worker: false, script: vec![Reply::text("done")], ..Default::default() }).await;
    let id = app.submit("alice", CreateRun::new("x")).await.id;
    let config = worker_config(ProviderKind::OpenAi, Duration::from_secs(60));
    // Claimed in the worker's name 40 s ago (of a 60 s lease), never driven.
    let (_, lease) = app.store.claim_run(&config.worker_id, Duration::from_secs(20)).await.unwrap().unwrap();
    assert_eq!(lease.run_id, id);
    let started = Instant::now();
    app.start_worker(config).await;
    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    assert!(started.elapsed() < Duration::from_secs(15), "waited {:?} for the lease", started.elapsed());
    let losses: i32 = app.sql().await.query_one("SELECT losses FROM runs WHERE id = $1", &[&id]).await.unwrap().get(0);
    assert_eq!(losses, 0, "handed back, not reaped");
}

/// Every deploy hands runs back: a run with a cost budget that had spent
/// something before must go on under the same budget on the next worker,
/// its earlier spend priced, not fail because the cost "cannot be enforced".
#[tokio::test]
async fn a_cost_budgeted_run_handed_back_after_spending_goes_on_under_its_budget() {
    let app = TestApp::spawn(Options { script: script(), worker: false, ..Default::default() }).await;
    let mut first = worker_config(ProviderKind::OpenAi, Duration::from_secs(30));
    first.shutdown_grace = Duration::from_secs(1);
    let stop_first = CancellationToken::new();
    let first_done = app.start_worker_until(first, stop_first.clone()).await;
    // The harness prices the scripted model at $1 per million tokens: a
    // dollar is far more than two steps spend.
    let spec =
        CreateRun { limits: Some(Limits { max_cost_usd: Some(1.0), ..Default::default() }), ..CreateRun::new("work") };
    let id = app.submit("alice", spec).await.id;
    let seen = started(&app, id).await;
    let spent_before: f64 = pick!(seen, EventBody::StepFinished { cost_usd, .. } => cost_usd.unwrap()).sum();
    assert!(spent_before > 0.0, "the first step spent something");
    stop_first.cancel();
    tokio::time::timeout(Duration::from_secs(15), first_done).await.expect("worker exits after its grace").unwrap();

    app.start_worker(worker_config(ProviderKind::OpenAi, Duration::from_secs(30))).await;
    let rest = app.events_after("alice", id, Some(seen.last().unwrap().seq)).await;
    let all: Vec<Event> = seen.into_iter().chain(rest).collect();
    assert_resumed(&all);
}
