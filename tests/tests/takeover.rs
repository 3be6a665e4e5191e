//! A dead worker's runs move to a live one in seconds, not after their
//! lease: each worker holds an advisory lock on a connection of its own, the
//! others look for free locks every second (`store/src/presence.rs`). The
//! lease still fences every write, and a worker that is only slow keeps its
//! runs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use kiln_protocol::{CreateRun, EventBody, RunStatus};
use kiln_scripted_model::Reply;
use kiln_store::Store;
use kiln_tests::netcut::CutProxy;
use kiln_tests::worker_process::WorkerProcess;
use kiln_tests::{Event, Options, TestApp, assert_dense, kinds, outcome, pick, worker_config};
use kiln_worker::ProviderKind;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const INTERRUPTED: &str = "interrupted: the worker running this call was lost; it may or may not have completed";

/// Long enough that waiting for it would fail every bound below.
const LEASE_S: u64 = 30;

fn lease() -> Duration {
    Duration::from_secs(LEASE_S)
}

/// Generous for a loaded CI machine; the bench measures the real figure.
const TAKEOVER_BOUND: Duration = Duration::from_secs(10);

async fn until_call_ready(app: &TestApp, id: Uuid) -> Vec<Event> {
    app.events_until("alice", id, None, |e| matches!(e.body, EventBody::ToolCallReady { .. })).await
}

/// The run's events from after `seen` until the second attempt starts, and
/// how long after `since` that was.
async fn until_second_attempt(app: &TestApp, id: Uuid, seen: &[Event], since: Instant) -> (Vec<Event>, Duration) {
    let after = seen.last().map(|e| e.seq);
    let rest =
        app.events_until("alice", id, after, |e| matches!(e.body, EventBody::RunStarted { attempt: 2, .. })).await;
    (rest, since.elapsed())
}

async fn losses(app: &TestApp, id: Uuid) -> i32 {
    app.sql().await.query_one("SELECT losses FROM runs WHERE id = $1", &[&id]).await.unwrap().get(0)
}

fn workers_of(all: &[Event]) -> Vec<(i32, String)> {
    pick!(all, EventBody::RunStarted { attempt, worker } => (*attempt, worker.clone())).collect()
}

#[tokio::test]
async fn a_run_whose_worker_was_killed_mid_step_resumes_on_another_within_seconds() {
    let script = vec![Reply::tool("bash", json!({"command": "sleep 60; echo never"})), Reply::text("recovered")];
    let app = TestApp::spawn(Options { script, worker: false, ..Default::default() }).await;
    let doomed = WorkerProcess::start(&app, LEASE_S, &[]).await;
    let doomed_id = doomed.id.clone();
    let id = app.submit("alice", CreateRun::new("work")).await.id;
    let seen = until_call_ready(&app, id).await;
    // The survivor starts once the run is the doomed worker's.
    let survivor = worker_config(ProviderKind::OpenAi, lease());
    let survivor_id = survivor.worker_id.clone();
    app.start_worker(survivor).await;

    let killed = Instant::now();
    doomed.kill().await;
    let (resumed, took) = until_second_attempt(&app, id, &seen, killed).await;
    eprintln!("resumed on the second worker {took:?} after SIGKILL (lease {LEASE_S} s)");
    assert!(took < TAKEOVER_BOUND, "took {took:?}: waited for the lease?");

    let rest = app.events_after("alice", id, resumed.last().map(|e| e.seq)).await;
    let all: Vec<Event> = seen.into_iter().chain(resumed).chain(rest).collect();
    assert_dense(&all, 1);
    assert_eq!(outcome(&all), Some(RunStatus::Succeeded), "{:?}", kinds(&all));
    assert_eq!(workers_of(&all), [(1, doomed_id), (2, survivor_id)]);
    let results: Vec<&str> = pick!(all, EventBody::ToolResult { output, .. } => output.as_str()).collect();
    assert_eq!(results, [INTERRUPTED], "the lost call is answered, not run again");
    assert_eq!(losses(&app, id).await, 1, "a dead worker's run counts a loss");
}

/// `url` with its host and port replaced by `addr`.
fn through(url: &str, addr: std::net::SocketAddr) -> String {
    let config: tokio_postgres::Config = url.parse().unwrap();
    let host = match &config.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        other => panic!("not a TCP database address: {other:?}"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let from = format!("@{host}:{port}/");
    assert!(url.contains(&from), "{url}");
    url.replace(&from, &format!("@{addr}/"))
}

fn postgres_addr(url: &str) -> std::net::SocketAddr {
    let config: tokio_postgres::Config = url.parse().unwrap();
    let tokio_postgres::config::Host::Tcp(host) = &config.get_hosts()[0] else { panic!("not TCP: {url}") };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port)).unwrap().next().unwrap()
}

#[tokio::test]
async fn a_worker_whose_lock_connection_is_cut_stops_its_run_and_another_takes_it() {
    let script = vec![Reply::tool("bash", json!({"command": "sleep 3; echo finished-here"})), Reply::text("recovered")];
    let app = TestApp::spawn(Options { script, worker: false, ..Default::default() }).await;
    // Only the cut worker's lock connection goes through the proxy; its
    // pool, and so every other read and write it makes, does not.
    let proxy = CutProxy::start(postgres_addr(&app.db_url)).await;
    let store = Store::connect(&app.db_url, 8).unwrap().with_presence_url(&through(&app.db_url, proxy.addr())).unwrap();
    let cut = worker_config(ProviderKind::OpenAi, lease());
    let cut_id = cut.worker_id.clone();
    let _cut_worker = app.start_worker_on(store, cut, CancellationToken::new()).await;
    let id = app.submit("alice", CreateRun::new("work")).await.id;
    let seen = until_call_ready(&app, id).await;
    let other = worker_config(ProviderKind::OpenAi, lease());
    let other_id = other.worker_id.clone();
    app.start_worker(other).await;

    let cut_at = Instant::now();
    proxy.cut();
    let (resumed, took) = until_second_attempt(&app, id, &seen, cut_at).await;
    eprintln!("taken over {took:?} after the lock connection was cut");
    assert!(took < TAKEOVER_BOUND, "took {took:?}: waited for the lease?");
    let rest = app.events_after("alice", id, resumed.last().map(|e| e.seq)).await;
    let all: Vec<Event> = seen.into_iter().chain(resumed).chain(rest).collect();
    // Nothing written twice, nothing by the cut worker after the cut: its
    // call's result is the takeover's answer, not the command's output,
    // though the command ran on in the container for a while.
    assert_dense(&all, 1);
    assert_eq!(outcome(&all), Some(RunStatus::Succeeded), "{:?}", kinds(&all));
    assert_eq!(workers_of(&all), [(1, cut_id.clone()), (2, other_id)]);
    let results: Vec<&str> = pick!(all, EventBody::ToolResult { output, .. } => output.as_str()).collect();
    assert_eq!(results, [INTERRUPTED]);
    let sql = app.sql().await;
    let lost: Option<chrono::DateTime<chrono::Utc>> =
        sql.query_one("SELECT lost_at FROM workers WHERE id = $1", &[&cut_id]).await.unwrap().get(0);
    assert!(lost.is_some(), "the cut worker was found without its lock");
    // The model was asked twice: once by each attempt. The cut worker, once
    // stopped, asked nothing more.
    assert_eq!(app.model.requests().len(), 2);

    // Back on the network, the cut worker takes its lock again and works.
    proxy.restore();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let row = sql.query_one("SELECT lost_at IS NULL FROM workers WHERE id = $1", &[&cut_id]).await.unwrap();
        if row.get::<_, bool>(0) {
            break;
        }
        assert!(Instant::now() < deadline, "the cut worker never took its lock again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_worker_paused_for_less_than_its_lease_keeps_its_run() {
    let script = vec![Reply::tool("bash", json!({"command": "sleep 6; echo ran-once"})), Reply::text("done")];
    let app = TestApp::spawn(Options { script, worker: false, ..Default::default() }).await;
    let lease_s = 12;
    let paused = WorkerProcess::start(&app, lease_s, &[]).await;
    let paused_id = paused.id.clone();
    let id = app.submit("alice", CreateRun::new("work")).await.id;
    let seen = until_call_ready(&app, id).await;
    // Another worker, looking for dead workers every second all along.
    app.start_worker(worker_config(ProviderKind::OpenAi, Duration::from_secs(lease_s))).await;

    // A long GC pause, a starved CPU: the process says nothing for four of
    // the other worker's looks, but its connection (and lock) stays up.
    paused.pause();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let sql = app.sql().await;
    let row = sql
        .query_one(
            "SELECT r.status::text, r.lease_owner, w.lost_at IS NULL FROM runs r, workers w
             WHERE r.id = $1 AND w.id = $2",
            &[&id, &paused_id],
        )
        .await
        .unwrap();
    paused.resume();
    let (status, owner, not_lost): (String, Option<String>, bool) = (row.get(0), row.get(1), row.get(2));
    assert_eq!((status.as_str(), owner.as_deref(), not_lost), ("running", Some(paused_id.as_str()), true));

    let rest = app.events_after("alice", id, seen.last().map(|e| e.seq)).await;
    let all: Vec<Event> = seen.into_iter().chain(rest).collect();
    assert_dense(&all, 1);
    assert_eq!(outcome(&all), Some(RunStatus::Succeeded), "{:?}", kinds(&all));
    assert_eq!(workers_of(&all), [(1, paused_id)], "never taken over");
    let results: Vec<&str> = pick!(all, EventBody::ToolResult { output, .. } => output.as_str()).collect();
    assert_eq!(results.len(), 1);
    assert!(results[0].contains("ran-once"), "{results:?}");
    assert_eq!(losses(&app, id).await, 0);
    paused.stop().await;
}

/// A cost-budgeted run taken over after it spent something goes on under
/// its budget, its earlier spend priced: one with room finishes, one whose
/// first step already spent the budget stops on it. Neither fails because
/// the cost "cannot be enforced" (the survivor once recorded the earlier
/// usage without a price, and an unknown cost refuses a cost budget).
#[tokio::test]
async fn cost_budgeted_runs_taken_over_after_spending_go_on_under_their_budgets() {
    // Both first steps call a long command; the one run with room left asks
    // again after the takeover and finishes.
    let sleep = || Reply::tool("bash", json!({"command": "sleep 60; echo never"}));
    let script = vec![sleep(), sleep(), Reply::text("recovered")];
    let app = TestApp::spawn(Options { script, worker: false, ..Default::default() }).await;
    // The doomed process prices the scripted model as the harness's own
    // workers do: $1 per million tokens.
    let prices = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(prices.path(), r#"{"scripted": {"input": 1.0, "output": 1.0}}"#).unwrap();
    let doomed = WorkerProcess::start(&app, LEASE_S, &[("KILN_PRICES_FILE", prices.path().to_str().unwrap())]).await;
    let budgeted = |usd: f64| CreateRun {
        limits: Some(kiln_protocol::Limits { max_cost_usd: Some(usd), ..Default::default() }),
        ..CreateRun::new("work")
    };
    // A dollar is far more than the two steps spend; a millionth of one is
    // less than the first step's prompt alone.
    let roomy = app.submit("alice", budgeted(1.0)).await.id;
    let spent = app.submit("alice", budgeted(0.000_001)).await.id;
    let roomy_seen = until_call_ready(&app, roomy).await;
    let spent_seen = until_call_ready(&app, spent).await;
    for seen in [&roomy_seen, &spent_seen] {
        let cost: f64 = pick!(seen, EventBody::StepFinished { cost_usd, .. } => cost_usd.unwrap()).sum();
        assert!(cost > 0.000_001, "the first step spent something: ${cost}");
    }
    app.start_worker(worker_config(ProviderKind::OpenAi, lease())).await;
    doomed.kill().await;

    let rest = app.events_after("alice", roomy, roomy_seen.last().map(|e| e.seq)).await;
    let all: Vec<Event> = roomy_seen.into_iter().chain(rest).collect();
    assert_dense(&all, 1);
    assert_eq!(outcome(&all), Some(RunStatus::Succeeded), "{:?}", kinds(&all));
    assert_eq!(workers_of(&all).len(), 2, "taken over: {:?}", workers_of(&all));
    let costs: Vec<Option<f64>> = pick!(all, EventBody::StepFinished { cost_usd, .. } => *cost_usd).collect();
    assert!(costs.len() == 2 && costs.iter().all(|c| c.is_some_and(|c| c > 0.0)), "{costs:?}");

    let rest = app.events_after("alice", spent, spent_seen.last().map(|e| e.seq)).await;
    let all: Vec<Event> = spent_seen.into_iter().chain(rest).collect();
    assert_dense(&all, 1);
    assert_eq!(workers_of(&all).len(), 2, "taken over: {:?}", workers_of(&all));
    let error = match all.last().map(|e| &e.body) {
        Some(EventBody::RunFailed { error }) => error.clone(),
        _ => panic!("the run did not stop on its budget: {:?}", kinds(&all)),
    };
    assert!(error.starts_with("cost budget exhausted"), "{error}");
    assert_eq!(pick!(all, EventBody::StepFinished { .. } => ()).count(), 1, "no step after the takeover");
    // Two first steps and the roomy run's one step after the takeover.
    assert_eq!(app.model.requests().len(), 3);
}
