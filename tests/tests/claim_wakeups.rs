//! A worker with a free slot claims when the queue may have something for
//! it (a run queued, a slot freed, a poll tick, a reconnect), not on every
//! notification it hears: every event of every run is one, and a claim for
//! each was hundreds of empty queries a second against the database.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use kiln_protocol::{CreateRun, EventBody};
use kiln_tests::{Options, TestApp};

/// Claim queries so far: each one scans the queue's partial index (and
/// nothing else does). Postgres publishes a backend's counts once it has
/// been idle for a while (up to 10 s), so this waits for them to settle.
async fn queue_scans(app: &TestApp) -> i64 {
    tokio::time::sleep(Duration::from_secs(11)).await;
    let sql = app.sql().await;
    sql.execute("SELECT pg_stat_clear_snapshot()", &[]).await.unwrap();
    sql.query_one("SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = 'runs_queue'", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn events_of_other_runs_do_not_send_an_idle_worker_to_the_queue() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    // A run held by a stand-in that writes many events, each announced.
    app.submit("alice", CreateRun::new("chatty")).await;
    let (_, lease) = app.store.claim_run("stand-in", Duration::from_secs(120)).await.unwrap().unwrap();
    // A worker with free slots and nothing queued: it polls (every 500 ms
    // in tests) and otherwise waits.
    app.start_worker(kiln_tests::worker_config(kiln_worker::ProviderKind::OpenAi, Duration::from_secs(10))).await;

    let before = queue_scans(&app).await;
    for i in 0..300 {
        app.store.append_event(&lease, &EventBody::TextDelta { text: format!("{i}") }).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let during = queue_scans(&app).await - before;
    // ~13 s at two polls a second is ~26 claims; one per event would be 300
    // more (the notifier sends at most one notice per 2 ms: every event
    // here, 5 ms apart, gets its own).
    assert!(during < 100, "{during} claim queries while 300 events of another run were announced");
    // And the count counts: the polls alone made some.
    assert!(during >= 5, "only {during} claim queries in ~13 s of polling twice a second");
}
