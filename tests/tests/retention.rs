//! Event retention: the events of runs that ended longer ago than the
//! retention are pruned in batches (all but the terminal event), the rest are
//! kept, and the worker does it on its own when configured.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use kiln_protocol::{CreateRun, EventBody, Trigger};
use kiln_store::{Lease, NewRun, Pruned, Store};
use kiln_tests::{Options, TestApp, kinds, worker_config};
use kiln_worker::ProviderKind;
use uuid::Uuid;

const DAY: Duration = Duration::from_secs(86_400);
/// Events a test run writes between `run.queued` and its terminal event.
const STEPS: i64 = 20;

/// A run with `run.queued`, [`STEPS`] step events, and (when `finish`) a
/// terminal event and a delivery report after it, claimed as `worker`.
async fn run_with_events(store: &Store, finish: bool) -> (Uuid, Lease) {
    let spec = CreateRun { prompt: "p".into(), repo: None, ..Default::default() };
    let new = NewRun { owner: "alice".into(), spec, trigger: Trigger::Api, idempotency_key: None };
    let (run, _) = store.create_run(new).await.unwrap();
    let (claimed, lease) = store.claim_run("w", Duration::from_secs(600)).await.unwrap().unwrap();
    assert_eq!(claimed.id, run.id);
    for step in 1..=STEPS {
        store.append_event(&lease, &EventBody::StepStarted { step: step as u32 }).await.unwrap();
    }
    if finish {
        store.finish_run(&lease, &EventBody::RunSucceeded { summary: "ok".into() }, None).await.unwrap();
    }
    (run.id, lease)
}

async fn ended_days_ago(app: &TestApp, run: Uuid, days: i32) {
    app.sql()
        .await
        .execute("UPDATE runs SET finished_at = now() - make_interval(days => $2) WHERE id = $1", &[&run, &days])
        .await
        .unwrap();
}

async fn event_count(app: &TestApp, run: Uuid) -> i64 {
    app.sql().await.query_one("SELECT count(*) FROM events WHERE run_id = $1", &[&run]).await.unwrap().get(0)
}

#[tokio::test]
async fn events_of_runs_that_ended_before_the_retention_are_pruned_in_batches_but_the_ending_stays() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let old_a = run_with_events(&app.store, true).await.0;
    let old_b = run_with_events(&app.store, true).await.0;
    let recent = run_with_events(&app.store, true).await.0;
    // Active for ten days and not ended: never pruned, however old.
    let (active, _lease) = run_with_events(&app.store, false).await;
    app.sql()
        .await
        .execute("UPDATE runs SET created_at = now() - interval '10 days' WHERE id = $1", &[&active])
        .await
        .unwrap();
    ended_days_ago(&app, old_a, 10).await;
    ended_days_ago(&app, old_b, 8).await;
    ended_days_ago(&app, recent, 6).await;

    // A batch of 7 events takes several statements per run.
    let pruned = app.store.prune_events(7 * DAY, 7).await.unwrap();
    // run.queued and the steps of each old run; the terminal events stay.
    assert_eq!(pruned, Pruned { events: 2 * (1 + STEPS as u64), runs: 2 });
    for old in [old_a, old_b] {
        // The stream of a pruned run still says how it ended, and ends.
        let events = app.events("alice", old).await;
        assert_eq!(kinds(&events), ["run.succeeded"]);
        assert_eq!(events[0].seq, STEPS + 2, "the terminal event keeps its id");
    }
    assert_eq!(event_count(&app, recent).await, STEPS + 2);
    assert_eq!(event_count(&app, active).await, STEPS + 1);

    // Nothing left to do; the pruned runs are not looked at again.
    assert_eq!(app.store.prune_events(7 * DAY, 7).await.unwrap(), Pruned::default());
    // A shorter retention reaches the recent run too.
    assert_eq!(app.store.prune_events(5 * DAY, 1000).await.unwrap(), Pruned { events: 1 + STEPS as u64, runs: 1 });
    assert_eq!(event_count(&app, recent).await, 1);
    assert_eq!(event_count(&app, active).await, STEPS + 1);
}

#[tokio::test]
async fn a_worker_with_a_retention_prunes_old_runs_on_its_own() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let old = run_with_events(&app.store, true).await.0;
    let recent = run_with_events(&app.store, true).await.0;
    ended_days_ago(&app, old, 31).await;
    ended_days_ago(&app, recent, 29).await;

    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    config.event_retention = Some(30 * DAY);
    app.start_worker(config).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while event_count(&app, old).await > 1 {
        assert!(Instant::now() < deadline, "the worker never pruned the old run");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(event_count(&app, recent).await, STEPS + 2);
}

/// Scans of the partial index `events_terminal` (migrations/V28) in this
/// test's database, once the statistics of the backends that made them
/// have been flushed (at a transaction's end at most once a second, after
/// ten idle seconds, or as the backend exits): waits until there are more
/// than `than`.
async fn terminal_index_scans_above(app: &TestApp, than: i64) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let scans: i64 = app
            .sql()
            .await
            .query_one(
                "SELECT coalesce(sum(idx_scan), 0)::bigint FROM pg_stat_user_indexes
                 WHERE indexrelname = 'events_terminal'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if scans > than {
            return scans;
        }
        assert!(
            Instant::now() < deadline,
            "no scan of events_terminal was recorded: the lookup walked the run's events"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every page of an ended run's events, and every run the retention task
/// prunes, asks where the run ended: through the partial index of terminal
/// events that is one probe, through the primary key a walk over the run's
/// events up to its end.
#[tokio::test]
async fn an_ended_runs_end_is_found_through_the_terminal_index() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let (run, _) = run_with_events(&app.store, true).await;
    // Each lookup on a store of its own, closed after it: its backend
    // exits and so reports its statistics at once. Generic plans only: the
    // first executions of a prepared statement are planned with its
    // parameters' values, in which a bound list of kinds would match the
    // index's predicate too; a long-lived connection soon plans it once for
    // any value, where only a list written in the query does.
    let url = format!("{}?options=-c%20plan_cache_mode%3Dforce_generic_plan", app.db_url);
    let store = Store::connect(&url, 1).unwrap();
    let opening = store.open_events("alice", run, 0, 500, 1 << 21).await.unwrap().unwrap();
    assert_eq!(opening.terminal_seq, Some(STEPS + 2));
    drop(store);
    let scans = terminal_index_scans_above(&app, 0).await;

    ended_days_ago(&app, run, 10).await;
    let store = Store::connect(&url, 1).unwrap();
    let pruned = store.prune_events(7 * DAY, 1000).await.unwrap();
    assert_eq!(pruned, Pruned { events: 1 + STEPS as u64, runs: 1 });
    drop(store);
    terminal_index_scans_above(&app, scans).await;
}

/// Ended runs marked pruned that still have events before their terminal one.
async fn marked_but_unpruned(app: &TestApp) -> i64 {
    app.sql()
        .await
        .query_one(
            "SELECT count(*) FROM runs r
             WHERE r.events_pruned_at IS NOT NULL
               AND EXISTS (SELECT 1 FROM events e WHERE e.run_id = r.id
                             AND e.seq < (SELECT min(t.seq) FROM events t
                                          WHERE t.run_id = r.id AND t.kind = 'run.succeeded'))",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn concurrent_passes_never_mark_a_run_pruned_while_it_still_has_events() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    // More runs than one batch looks at, each needing several statements.
    let mut runs = Vec::new();
    for _ in 0..60 {
        runs.push(run_with_events(&app.store, true).await.0);
    }
    app.sql()
        .await
        .execute("UPDATE runs SET finished_at = now() - interval '10 days' + random() * interval '1 hour'", &[])
        .await
        .unwrap();

    // Every worker prunes when it starts: passes overlap, each deleting
    // rows another is deleting too.
    let passes: Vec<_> = (0..4)
        .map(|_| {
            let store = app.store.clone();
            tokio::spawn(async move { store.prune_events(7 * DAY, 7).await.unwrap() })
        })
        .collect();
    let mut deleted = 0;
    for pass in passes {
        deleted += pass.await.unwrap().events;
    }
    assert_eq!(marked_but_unpruned(&app).await, 0, "runs were marked pruned with their events still there");
    // Whatever the passes left is finished by the next one, and every run's
    // stream is down to its ending.
    deleted += app.store.prune_events(7 * DAY, 7).await.unwrap().events;
    assert_eq!(deleted, runs.len() as u64 * (1 + STEPS as u64));
    for run in runs {
        assert_eq!(event_count(&app, run).await, 1);
    }
    let unmarked: i64 = app
        .sql()
        .await
        .query_one("SELECT count(*) FROM runs WHERE events_pruned_at IS NULL", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(unmarked, 0);
}
