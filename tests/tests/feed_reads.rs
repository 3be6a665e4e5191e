//! The feeds' reads gathered (`kiln_api::page_reads`): when many followed
//! runs have news at once, their readers' reads of the events table go
//! together as a few statements, and every stream still gets its events;
//! and the statement that reads several runs (`Store::events_pages`) bounds
//! each run's page as `Store::events_page` does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use kiln_protocol::{CreateRun, EventBody, Trigger};
use kiln_store::{Lease, NewRun, Store};
use kiln_tests::{Options, TestApp};
use tokio::sync::mpsc;
use uuid::Uuid;

const METRICS_TOKEN: &str = "metrics-token-feed-reads-0123456789";
/// Statements the feeds made, and the runs they read.
const READS: &str = "kiln_sse_feed_reads_total";
const READ_RUNS: &str = "kiln_sse_feed_read_runs_total";

/// Runs followed at once: more than the statements in flight many times
/// over, fewer than one statement's limit.
const RUNS: usize = 64;

async fn claimed_run(store: &Store) -> Lease {
    let spec = CreateRun::new("followed");
    store
        .create_run(NewRun { owner: "alice".into(), spec, trigger: Trigger::Api, idempotency_key: None })
        .await
        .unwrap();
    store.claim_run("feed-worker", Duration::from_secs(3600)).await.unwrap().expect("a queued run").1
}

async fn last_seq(app: &TestApp, run: Uuid) -> i64 {
    app.sql().await.query_one("SELECT last_event_seq FROM runs WHERE id = $1", &[&run]).await.unwrap().get(0)
}

/// A counter of the API's `/metrics`, 0 before it first moves.
async fn counter(app: &TestApp, name: &str) -> f64 {
    let body = app
        .http
        .get(app.url("/metrics"))
        .bearer_auth(METRICS_TOKEN)
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .text()
        .await
        .unwrap();
    body.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok()).unwrap_or(0.0)
}

/// One event for each run, committed in one transaction: their
/// notifications reach the API together, as in a busy deployment's step.
async fn commit_news_of(app: &TestApp, runs: &[Uuid], step: u32) {
    let mut sql = app.sql().await;
    let tx = sql.transaction().await.unwrap();
    for run in runs {
        let payload = serde_json::json!({ "step": step });
        let seq: i64 = tx
            .query_one(
                "WITH bump AS (
                     UPDATE runs SET last_event_seq = last_event_seq + 1 WHERE id = $1 RETURNING last_event_seq
                 )
                 INSERT INTO events (run_id, seq, kind, payload)
                 SELECT $1, last_event_seq, 'step.started', $2 FROM bump RETURNING seq",
                &[run, &payload],
            )
            .await
            .unwrap()
            .get(0);
        tx.execute("SELECT pg_notify($1, $2)", &[&kiln_store::channels::RUN_EVENTS, &format!("{run}:{seq}")])
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
}

/// A stream of `run` from `after` that reads two events: it says when it
/// has the first (`got_first`), and returns the seqs of both.
async fn two_events(app: &TestApp, run: Uuid, after: i64, got_first: mpsc::UnboundedSender<()>) -> Vec<i64> {
    let response = app
        .http
        .get(app.url(&format!("/v1/runs/{run}/events")))
        .bearer_auth(kiln_tests::token("alice"))
        .header("last-event-id", after.to_string())
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
    let mut events = response.bytes_stream().eventsource();
    let mut seqs = Vec::new();
    while seqs.len() < 2 {
        let ev = tokio::time::timeout(Duration::from_secs(30), events.next()).await.unwrap().unwrap().unwrap();
        seqs.push(ev.id.parse().unwrap());
        if seqs.len() == 1 {
            got_first.send(()).unwrap();
        }
    }
    seqs
}

#[tokio::test]
async fn news_of_many_runs_at_once_is_read_in_a_few_statements_and_reaches_every_stream() {
    // No worker: the test holds the runs' leases itself.
    let mut options = Options { worker: false, ..Options::default() };
    // Only notifications wake the feeds: the poll would read too.
    options.api.sse_poll = Duration::from_secs(3600);
    options.api.metrics_token = Some(METRICS_TOKEN.into());
    options.api.max_sse_per_subject = RUNS;
    let app = TestApp::spawn(options).await;
    let mut runs = Vec::new();
    for _ in 0..RUNS {
        let run = claimed_run(&app.store).await.run_id;
        runs.push((run, last_seq(&app, run).await));
    }
    let (got_first, mut firsts) = mpsc::unbounded_channel();
    let streams =
        futures::future::join_all(runs.iter().map(|&(run, last)| two_events(&app, run, last, got_first.clone())));
    let ids: Vec<Uuid> = runs.iter().map(|&(run, _)| run).collect();
    let news = async {
        wait_for_connections(&app, RUNS).await;
        // The first news starts each run's feed (or reaches a stream by
        // its own read, after which it joins the feed)...
        commit_news_of(&app, &ids, 1).await;
        for _ in 0..RUNS {
            firsts.recv().await.unwrap();
        }
        // ...and with every feed running, the next news comes at once.
        let before = (counter(&app, READS).await, counter(&app, READ_RUNS).await);
        commit_news_of(&app, &ids, 2).await;
        before
    };
    let (seen, (reads, covered)) = tokio::join!(streams, news);
    for ((_, last), seqs) in runs.iter().zip(&seen) {
        assert_eq!(seqs, &[last + 1, last + 2], "each stream got both events, in order");
    }
    let reads = counter(&app, READS).await - reads;
    let covered = counter(&app, READ_RUNS).await - covered;
    assert!(covered >= RUNS as f64, "each run's news was read by its feed: {covered} runs read");
    assert!(
        reads <= (RUNS / 4) as f64,
        "{RUNS} runs' news arriving together took {reads} statements (one a run would be {RUNS})"
    );
}

/// Until `n` SSE streams are open on the API.
async fn wait_for_connections(app: &TestApp, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while counter(app, "kiln_sse_connections").await < n as f64 {
        assert!(tokio::time::Instant::now() < deadline, "{n} streams did not open in 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_statement_of_several_runs_bounds_each_page_as_one_run_alone() {
    let app = TestApp::spawn(Options { worker: false, ..Options::default() }).await;
    let (a, b, quiet) = (claimed_run(&app.store).await, claimed_run(&app.store).await, claimed_run(&app.store).await);
    let text = "x".repeat(1000);
    for lease in [&a, &b] {
        for step in 0..10 {
            app.store.append_event(lease, &EventBody::TextDelta { text: format!("{step}{text}") }).await.unwrap();
        }
    }
    let (a_last, quiet_last) = (last_seq(&app, a.run_id).await, last_seq(&app, quiet.run_id).await);
    // Each read as `events_page` reads it alone: the same events, the
    // same `more`; the same run twice; a run with nothing new.
    let reads = [(a.run_id, 0), (b.run_id, 2), (a.run_id, a_last - 3), (quiet.run_id, quiet_last), (Uuid::now_v7(), 0)];
    for (limit, max_bytes) in [(500, i64::MAX), (4, i64::MAX), (500, 3_500), (500, 10)] {
        let pages = app.store.events_pages(&reads, limit, max_bytes).await.unwrap();
        assert_eq!(pages.len(), reads.len());
        for ((run, after), page) in reads.iter().zip(&pages) {
            let alone = app.store.events_page(*run, *after, limit, max_bytes).await.unwrap();
            let seqs = |events: &[kiln_protocol::StoredEvent]| events.iter().map(|e| e.seq).collect::<Vec<_>>();
            assert_eq!(seqs(&page.events), seqs(&alone.events), "run {run} after {after}, bounds {limit}/{max_bytes}");
            assert_eq!(page.more, alone.more, "run {run} after {after}, bounds {limit}/{max_bytes}");
            assert_eq!(
                page.events.iter().map(|e| &e.payload).collect::<Vec<_>>(),
                alone.events.iter().map(|e| &e.payload).collect::<Vec<_>>()
            );
        }
        if max_bytes == 10 {
            // Past the byte bound, still each run's next event.
            assert_eq!(pages[0].events.len(), 1);
            assert!(pages[0].more);
        }
    }
    assert!(app.store.events_pages(&[], 500, i64::MAX).await.unwrap().is_empty());
}
