//! The Postgres queue: leases, fencing, reaping.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use kiln_protocol::{CreateRun, EventBody, Message, RunStatus, Trigger};
use kiln_scripted_model::Reply;
use kiln_store::{NewRun, Store, StoreError};
use kiln_tests::{Options, TestApp, assert_dense, kinds, outcome, pick, worker_config};
use kiln_worker::ProviderKind;
use serde_json::json;

async fn store() -> Store {
    let url = kiln_tests::fresh_database().await;
    kiln_cli::app::open_store(&url, 4).await.unwrap()
}

async fn queued_run(store: &Store) -> kiln_protocol::Run {
    let spec = CreateRun { prompt: "p".into(), repo: None, ..Default::default() };
    let (run, created) = store
        .create_run(NewRun { owner: "alice".into(), spec, trigger: Trigger::Api, idempotency_key: None })
        .await
        .unwrap();
    assert!(created);
    run
}

fn lost(r: Result<impl std::fmt::Debug, StoreError>) -> bool {
    matches!(r, Err(StoreError::LeaseLost(_)))
}

#[tokio::test]
async fn an_expired_lease_is_reclaimed_and_the_old_workers_writes_are_refused() {
    let store = store().await;
    let run = queued_run(&store).await;
    let before_claim = std::time::Instant::now();
    let (claimed, first) = store.claim_run("w1", Duration::from_secs(2)).await.unwrap().unwrap();
    assert_eq!(claimed.id, run.id);
    assert_eq!(first.attempt, 1);
    store.append_event(&first, &EventBody::StepStarted { step: 1 }).await.unwrap();
    // Nothing else to claim while w1 holds it.
    assert!(store.claim_run("w2", Duration::from_secs(30)).await.unwrap().is_none());

    // w1 stops heartbeating; once its lease is over the reaper returns the
    // run to the queue.
    let reaped = loop {
        let reaped = store.reap_expired_leases().await.unwrap();
        if !reaped.is_empty() || before_claim.elapsed() > Duration::from_secs(60) {
            break reaped;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(before_claim.elapsed() >= Duration::from_secs(2), "reaped before the lease was over");
    assert_eq!(reaped.len(), 1);
    assert_eq!(reaped[0].status, RunStatus::Queued);
    let (again, second) = store.claim_run("w2", Duration::from_secs(30)).await.unwrap().unwrap();
    assert_eq!(again.id, run.id);
    assert_eq!(second.attempt, 2);

    // Every late write of w1 is fenced off.
    assert!(lost(store.append_event(&first, &EventBody::StepStarted { step: 2 }).await));
    assert!(lost(store.heartbeat(&first, Duration::from_secs(30)).await));
    assert!(lost(store.append_message(&first, run.session_id, &Message::user("late"), None, None).await));
    assert!(lost(store.finish_run(&first, &EventBody::RunSucceeded { summary: "late".into() }, None).await));

    // w2 carries on and finishes.
    store.append_event(&second, &EventBody::StepStarted { step: 1 }).await.unwrap();
    store.finish_run(&second, &EventBody::RunSucceeded { summary: "ok".into() }, None).await.unwrap();
    let run = store.get_run("alice", run.id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Succeeded);
    let events = store.events_after(run.id, 0, 100).await.unwrap();
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4]);
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["run.queued", "step.started", "step.started", "run.succeeded"]);
    assert!(store.load_messages(run.session_id).await.unwrap().is_empty(), "w1's late message was refused");
}

#[tokio::test]
async fn a_run_that_keeps_losing_its_worker_fails_with_a_clear_error() {
    let store = store().await;
    let run = queued_run(&store).await;
    for attempt in 1..=3 {
        let (_, lease) = store.claim_run("dying", Duration::from_millis(100)).await.unwrap().unwrap();
        assert_eq!(lease.attempt, attempt);
        tokio::time::sleep(Duration::from_millis(200)).await;
        store.reap_expired_leases().await.unwrap();
    }
    let run = store.get_run("alice", run.id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    assert!(run.error.as_deref().unwrap().contains("lost 3 times"), "{:?}", run.error);
    let events = store.events_after(run.id, 0, 100).await.unwrap();
    assert_eq!(events.last().unwrap().kind, "run.failed");
    assert!(store.claim_run("w", Duration::from_secs(1)).await.unwrap().is_none());
}

#[tokio::test]
async fn runs_handed_back_on_purpose_do_not_use_up_their_attempts() {
    let store = store().await;
    let run = queued_run(&store).await;
    // Three deploys in a row hand the run back (graceful shutdown).
    for attempt in 1..=3 {
        let (_, lease) = store.claim_run("stopping", Duration::from_secs(60)).await.unwrap().unwrap();
        assert_eq!(lease.attempt, attempt);
        store.release_run(&lease).await.unwrap();
    }
    // Then its worker dies twice: still queued, for a third try.
    for attempt in 4..=5 {
        let (_, lease) = store.claim_run("dying", Duration::from_millis(100)).await.unwrap().unwrap();
        assert_eq!(lease.attempt, attempt);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let reaped = store.reap_expired_leases().await.unwrap();
        assert_eq!(reaped.iter().map(|r| r.status).collect::<Vec<_>>(), [RunStatus::Queued]);
    }
    assert_eq!(store.get_run("alice", run.id).await.unwrap().unwrap().status, RunStatus::Queued);
    // The third loss is the last.
    store.claim_run("dying", Duration::from_millis(100)).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    store.reap_expired_leases().await.unwrap();
    let run = store.get_run("alice", run.id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    assert!(run.error.as_deref().unwrap().contains("lost 3 times"), "{:?}", run.error);
}

#[tokio::test]
async fn a_heartbeat_keeps_the_lease_and_reports_cancellation() {
    let store = store().await;
    let run = queued_run(&store).await;
    // A lease of 2 s, renewed every 250 ms for twice its length: without the
    // beats it would have expired, and a beat may come 1.75 s late (a
    // loaded machine) before the lease runs out.
    let lease_for = Duration::from_secs(2);
    let claimed = std::time::Instant::now();
    let (_, lease) = store.claim_run("w1", lease_for).await.unwrap().unwrap();
    while claimed.elapsed() < 2 * lease_for {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let beat = store.heartbeat(&lease, lease_for).await.unwrap();
        assert!(!beat.cancel_requested);
        assert!(store.reap_expired_leases().await.unwrap().is_empty());
    }
    store.cancel_run("alice", run.id).await.unwrap();
    assert!(store.heartbeat(&lease, lease_for).await.unwrap().cancel_requested);
}

#[tokio::test]
async fn a_worker_takes_over_a_run_whose_first_worker_vanished() {
    // A "ghost" worker claims the run and dies (never heartbeats); a real
    // worker reaps the expired lease, claims the run and finishes it.
    let app = TestApp::spawn(Options {
        script: vec![Reply::tool("bash", json!({"command": "echo hello"})), Reply::text("done")],
        worker: false,
        ..Default::default()
    })
    .await;
    let id = app.submit("alice", CreateRun::new("say hello")).await.id;
    let (_, ghost) = app.store.claim_run("ghost", Duration::from_secs(1)).await.unwrap().unwrap();
    app.start_worker(worker_config(ProviderKind::OpenAi, Duration::from_secs(3))).await;
    let events = app.events("alice", id).await;
    assert_dense(&events, 1);
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let attempt = pick!(events, EventBody::RunStarted { attempt, .. } => *attempt).next().unwrap();
    assert_eq!(attempt, 2);
    assert!(lost(app.store.append_event(&ghost, &EventBody::StepStarted { step: 9 }).await));
}

#[tokio::test]
async fn finishing_a_run_can_claim_the_next_in_the_same_commit_and_only_under_the_lease() {
    let store = store().await;
    let first = queued_run(&store).await;
    let second = queued_run(&store).await;
    let (_, lease) = store.claim_run("w1", Duration::from_secs(30)).await.unwrap().unwrap();
    let done = EventBody::RunSucceeded { summary: "ok".into() };

    // A worker that lost the run neither finishes it nor claims.
    let stale = kiln_store::Lease { attempt: lease.attempt + 1, ..lease.clone() };
    assert!(lost(store.finish_run_and_claim(&stale, &done, None, "w1", Duration::from_secs(30)).await));
    assert_eq!(store.get_run("alice", second.id).await.unwrap().unwrap().status, RunStatus::Queued);

    let (next, next_lease) =
        store.finish_run_and_claim(&lease, &done, None, "w1", Duration::from_secs(30)).await.unwrap().unwrap();
    assert_eq!(
        (next.id, next.status, next_lease.attempt, next_lease.worker.as_str()),
        (second.id, RunStatus::Running, 1, "w1")
    );
    let ended = store.get_run("alice", first.id).await.unwrap().unwrap();
    assert_eq!(ended.status, RunStatus::Succeeded);
    // One transaction: Postgres' now() is the same for both.
    assert_eq!(ended.finished_at, next.started_at);
    let events = store.events_after(first.id, 0, 10).await.unwrap();
    assert_eq!(events.last().unwrap().kind, "run.succeeded");

    // Nothing queued: the run just ends.
    assert!(
        store.finish_run_and_claim(&next_lease, &done, None, "w1", Duration::from_secs(30)).await.unwrap().is_none()
    );
    assert_eq!(store.get_run("alice", second.id).await.unwrap().unwrap().status, RunStatus::Succeeded);
}

/// Two runs through a worker of one slot (so it can only take the second
/// when the first ends), with or without claim-on-end; both runs as read
/// afterwards.
async fn two_runs_through_one_slot(claim_on_end: bool) -> (kiln_protocol::Run, kiln_protocol::Run) {
    let app = TestApp::spawn(Options {
        worker: false,
        script: vec![Reply::text("first done"), Reply::text("second done")],
        ..Default::default()
    })
    .await;
    let a = app.submit("alice", CreateRun::new("one")).await.id;
    let b = app.submit("alice", CreateRun::new("two")).await.id;
    app.start_worker(kiln_worker::WorkerConfig {
        concurrency: 1,
        claim_on_end,
        ..worker_config(ProviderKind::OpenAi, Duration::from_secs(10))
    })
    .await;
    for id in [a, b] {
        let events = app.events("alice", id).await;
        assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    }
    (app.run("alice", a).await, app.run("alice", b).await)
}

#[tokio::test]
async fn a_worker_whose_run_ends_takes_its_next_run_in_the_same_commit() {
    let (a, b) = two_runs_through_one_slot(true).await;
    assert_eq!(a.finished_at, b.started_at, "claimed in the commit that ended the first: {a:?} {b:?}");
}

/// The same two runs on the plain path (`KILN_WORKER_CLAIM_ON_END=false`):
/// each end is its own statement and the claim loop takes the next run, so
/// the speed layers can be switched off without changing what happens.
#[tokio::test]
async fn without_claim_on_end_runs_end_alone_and_the_claim_loop_takes_the_next() {
    let (a, b) = two_runs_through_one_slot(false).await;
    assert_ne!(a.finished_at, b.started_at, "claimed by the end's statement: {a:?} {b:?}");
}
