//! Runs of one worker that end while another end is on its way share one
//! statement and commit (`store/src/end_batch.rs`), each still fenced by its
//! own lease and answered on its own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::time::Duration;

use futures::future::join_all;
use kiln_protocol::{CreateRun, EventBody, RunStatus, Trigger};
use kiln_store::{Lease, NewRun, Store, StoreError};
use uuid::Uuid;

const LEASE: Duration = Duration::from_secs(60);

/// A store and a plain connection to the same fresh database.
async fn store() -> (Store, tokio_postgres::Client) {
    let url = kiln_tests::fresh_database().await;
    let store = kiln_cli::app::open_store(&url, 8).await.unwrap();
    let (sql, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    (store, sql)
}

async fn queue_runs(store: &Store, n: usize) {
    for _ in 0..n {
        let spec = CreateRun { prompt: "p".into(), repo: None, ..Default::default() };
        let new = NewRun { owner: "alice".into(), spec, trigger: Trigger::Api, idempotency_key: None };
        store.create_run(new).await.unwrap();
    }
}

async fn claim(store: &Store, n: usize) -> Vec<Lease> {
    let mut leases = Vec::new();
    for _ in 0..n {
        leases.push(store.claim_run("w", LEASE).await.unwrap().unwrap().1);
    }
    leases
}

/// The transaction that last wrote each run: equal for runs committed together.
async fn writer(sql: &tokio_postgres::Client, run: Uuid) -> i64 {
    sql.query_one("SELECT xmin::text::bigint FROM runs WHERE id = $1", &[&run]).await.unwrap().get(0)
}

async fn status(store: &Store, run: Uuid) -> RunStatus {
    store.get_run("alice", run).await.unwrap().unwrap().status
}

/// Ends all `leases` at once, as a worker's runs ending together would.
/// On this single-threaded test runtime every end is queued before any
/// statement comes back. With eight under way, the first four go at once
/// (up to four statements in flight while few ends are under way), the
/// other four wait; once two of the four statements are back, the next one
/// carries all four waiting ends (with a backlog, two statements in flight).
async fn end_all(store: &Store, leases: &[Lease]) -> Vec<Result<Option<(kiln_protocol::Run, Lease)>, StoreError>> {
    let done = EventBody::RunSucceeded { summary: "ok".into() };
    join_all(leases.iter().map(|lease| store.finish_run_and_claim(lease, &done, None, "w", LEASE))).await
}

#[tokio::test]
async fn ends_that_meet_share_one_commit_each_fenced_by_its_own_lease() {
    let (store, sql) = store().await;
    queue_runs(&store, 16).await;
    let mut leases = claim(&store, 8).await;
    // The last one's worker lost the run (another attempt holds it).
    let lost_run = leases[7].run_id;
    sql.execute("UPDATE runs SET attempt = attempt + 1 WHERE id = $1", &[&lost_run]).await.unwrap();

    let answers = end_all(&store, &leases).await;

    assert!(matches!(answers[7], Err(StoreError::LeaseLost(id)) if id == lost_run), "{:?}", answers[7]);
    assert_eq!(status(&store, lost_run).await, RunStatus::Running, "a lost lease ends nothing");
    let mut claimed = HashSet::new();
    for (lease, answer) in leases.iter().zip(&answers).take(7) {
        let (next, next_lease) = answer.as_ref().unwrap().as_ref().expect("each ended run claims the next");
        assert_eq!((next.status, next_lease.worker.as_str(), next_lease.run_id), (RunStatus::Running, "w", next.id));
        assert!(claimed.insert(next.id), "a run handed to two callers");
        assert_eq!(status(&store, lease.run_id).await, RunStatus::Succeeded);
        let events = store.events_after(lease.run_id, 0, 100).await.unwrap();
        assert_eq!(events.iter().filter(|e| e.kind == "run.succeeded").count(), 1);
    }
    // One claim per run that ended, none for the lost one: 16 - 8 - 7.
    let queued: i64 = sql.query_one("SELECT count(*) FROM runs WHERE status = 'queued'", &[]).await.unwrap().get(0);
    assert_eq!(queued, 1);

    // Runs 4, 5 and 6 waited behind the first four statements and went in
    // one (with 7, which ended nothing): their ends and the runs claimed for
    // them have one writer.
    let together = writer(&sql, leases[4].run_id).await;
    for i in [5, 6] {
        assert_eq!(writer(&sql, leases[i].run_id).await, together, "end {i} committed apart");
    }
    let ended = store.get_run("alice", leases[4].run_id).await.unwrap().unwrap();
    for answer in &answers[4..7] {
        let next = &answer.as_ref().unwrap().as_ref().unwrap().0;
        assert_eq!(writer(&sql, next.id).await, together);
        assert_eq!(ended.finished_at, next.started_at, "claimed in the commit that ended it");
    }
    // The first four went at once, each in its own commit.
    let mut apart = HashSet::from([together]);
    for lease in &leases[..4] {
        assert!(apart.insert(writer(&sql, lease.run_id).await), "the first four ends committed apart");
    }

    // The next ends work as before, batched or not.
    leases = answers.into_iter().take(7).map(|a| a.unwrap().unwrap().1).collect();
    let answers = end_all(&store, &leases).await;
    let claimed_again = answers.iter().filter(|a| matches!(a, Ok(Some(_)))).count();
    assert_eq!(claimed_again, 1, "only one run was left to claim");
    assert!(answers.iter().all(|a| a.is_ok()), "{answers:?}");
}

#[tokio::test]
async fn one_bad_end_does_not_fail_the_ends_it_was_sent_with() {
    let (store, sql) = store().await;
    queue_runs(&store, 16).await;
    let leases = claim(&store, 8).await;
    // Run 5's terminal event cannot be stored: its seq is taken (as if the
    // run's history were damaged). Run 5 waits with 4, 6 and 7, so their
    // shared statement fails on it.
    let bad = leases[5].run_id;
    sql.execute(
        "INSERT INTO events (run_id, seq, kind, payload)
         SELECT id, last_event_seq + 1, 'note', '{}' FROM runs WHERE id = $1",
        &[&bad],
    )
    .await
    .unwrap();

    let answers = end_all(&store, &leases).await;

    assert!(matches!(answers[5], Err(StoreError::Db(_))), "the bad end gets its own error: {:?}", answers[5]);
    assert_eq!(status(&store, bad).await, RunStatus::Running);
    for i in [0, 1, 2, 3, 4, 6, 7] {
        assert!(matches!(answers[i], Ok(Some(_))), "end {i}: {:?}", answers[i]);
        assert_eq!(status(&store, leases[i].run_id).await, RunStatus::Succeeded, "end {i}");
    }
    // Retried one by one: 4, 6 and 7 committed apart.
    let writers: HashSet<i64> = join_all([4, 6, 7].map(|i| writer(&sql, leases[i].run_id))).await.into_iter().collect();
    assert_eq!(writers.len(), 3);
    let queued: i64 = sql.query_one("SELECT count(*) FROM runs WHERE status = 'queued'", &[]).await.unwrap().get(0);
    assert_eq!(queued, 1, "one claim per run that ended");
}

#[tokio::test]
async fn runs_ended_together_queue_the_follow_ups_their_unread_messages_owe() {
    let (store, sql) = store().await;
    queue_runs(&store, 16).await;
    let leases = claim(&store, 8).await;
    // Messages the runs never read: run 0 ends alone, runs 5 and 6 in one
    // statement with 4 and 7 (see `end_all`).
    for i in [0, 5, 6] {
        let outcome = store.send_message("alice", leases[i].run_id, &format!("late {i}"), None).await.unwrap();
        assert!(matches!(outcome, kiln_store::MessageOutcome::Queued(_)), "{outcome:?}");
    }

    let answers = end_all(&store, &leases).await;

    let next = |i: usize| answers[i].as_ref().unwrap().as_ref().unwrap().0.id;
    let together = writer(&sql, next(4)).await;
    assert_eq!((writer(&sql, next(5)).await, writer(&sql, next(6)).await), (together, together));
    for (i, lease) in leases.iter().enumerate() {
        let follow_ups: Vec<(String, String)> = sql
            .query(
                "SELECT f.status, f.prompt FROM runs r JOIN runs f ON f.session_id = r.session_id AND f.id <> r.id
                 WHERE r.id = $1",
                &[&lease.run_id],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect();
        let expected = match i {
            0 | 5 | 6 => vec![("queued".to_owned(), format!("late {i}"))],
            _ => vec![],
        };
        assert_eq!(follow_ups, expected, "run {i}");
    }
    let owed: i64 = sql.query_one("SELECT count(*) FROM runs WHERE follow_up_owed", &[]).await.unwrap().get(0);
    assert_eq!(owed, 0);
}
