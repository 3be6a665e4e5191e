//! A session's sandbox lifecycle: its container outlives a run (follow-ups
//! and takeovers continue in the same workspace) until the session is idle;
//! new sessions start from the warm pool; containers nobody will use again
//! are removed, and those of another deployment on the same engine are not.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use kiln_protocol::{CreateRun, EventBody, Run, RunStatus};
use kiln_scripted_model::Reply;
use kiln_tests::logs::Logs;
use kiln_tests::{Event, Options, TestApp, assert_dense, kinds, outcome, pick, token, worker_config};
use kiln_worker::sandbox::{Managed, list_managed, remove_by_id};
use kiln_worker::{ProviderKind, WorkerConfig};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::filter::LevelFilter;
use uuid::Uuid;

const INTERRUPTED: &str = "interrupted: the worker running this call was lost; it may or may not have completed";

fn config(idle: Duration, warm: usize, lease: Duration) -> WorkerConfig {
    WorkerConfig { sandbox_idle: idle, warm_pool: warm, ..worker_config(ProviderKind::OpenAi, lease) }
}

fn docker() -> bollard::Docker {
    bollard::Docker::connect_with_local_defaults().unwrap()
}

async fn managed() -> Vec<Managed> {
    list_managed(&docker()).await.unwrap()
}

/// Waits up to `limit` for `check` to hold on the engine's Kiln containers.
async fn wait_for_containers(limit: Duration, what: &str, check: impl Fn(&[Managed]) -> bool) -> Vec<Managed> {
    let deadline = Instant::now() + limit;
    loop {
        let all = managed().await;
        if check(&all) {
            return all;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn pool_of<'a>(all: &'a [Managed], worker: &str) -> Vec<&'a Managed> {
    all.iter().filter(|c| c.pool_worker.as_deref() == Some(worker)).collect()
}

/// `sandbox.ready` payloads of a run, in order.
fn readies(events: &[Event]) -> Vec<(String, String, bool)> {
    pick!(events, EventBody::SandboxReady { origin, container, workspace_lost, .. } =>
        (origin.clone().unwrap(), container.clone(), *workspace_lost))
    .collect()
}

fn results(events: &[Event]) -> Vec<String> {
    pick!(events, EventBody::ToolResult { output, .. } => output.clone()).collect()
}

/// Waits for the run's output to show `text`.
fn printed(text: &'static str) -> impl Fn(&Event) -> bool {
    move |e| matches!(&e.body, EventBody::ToolOutput { text: out, .. } if out.contains(text))
}

async fn follow_up(app: &TestApp, id: Uuid, text: &str) -> Uuid {
    let body = app.send_message("alice", id, text).await;
    assert_eq!(body["disposition"], "follow_up");
    serde_json::from_value::<Run>(body["run"].clone()).unwrap().id
}

async fn remove_all(ids: &[String]) {
    for id in ids {
        remove_by_id(&docker(), id).await;
    }
}

#[tokio::test]
async fn a_follow_up_continues_in_the_same_container_and_workspace_without_the_old_processes() {
    let app = TestApp::spawn(Options {
        worker: false,
        script: vec![
            Reply::tool("bash", json!({"command": "echo from-first > kept.txt; (nohup sleep 600 >/dev/null 2>&1 &)"})),
            Reply::text("first done"),
            Reply::tool("bash", json!({"command": "cat kept.txt; ps -eo args | grep -c '^sleep 600'"})),
            Reply::text("second done"),
        ],
        ..Default::default()
    })
    .await;
    app.start_worker(config(Duration::from_secs(120), 0, Duration::from_secs(10))).await;
    let first_id = app.submit("alice", CreateRun::new("write a file")).await.id;
    let events = app.events("alice", first_id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let [(origin, container, lost)] = &readies(&events)[..] else { panic!("{:?}", kinds(&events)) };
    assert_eq!((origin.as_str(), *lost), ("new", false));
    assert_eq!(app.containers_of(first_id).await.len(), 1, "the session's container outlives its run");

    let second_id = follow_up(&app, first_id, "now read it").await;
    let events = app.events("alice", second_id).await;
    assert_dense(&events, 1);
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let [(origin, again, lost)] = &readies(&events)[..] else { panic!("{:?}", kinds(&events)) };
    assert_eq!((origin.as_str(), *lost), ("reused", false));
    assert_eq!(again, container, "the same container");
    let out = &results(&events)[0];
    assert!(out.contains("from-first"), "the workspace was kept: {out}");
    assert!(out.lines().any(|l| l.trim() == "0"), "the first run's background process was stopped: {out}");
    remove_all(&app.containers_of(first_id).await).await;
}

#[tokio::test]
async fn an_idle_session_container_is_removed_once_the_idle_time_has_passed() {
    let app = TestApp::spawn(Options { worker: false, script: vec![Reply::text("done")], ..Default::default() }).await;
    app.start_worker(config(Duration::from_secs(4), 0, Duration::from_secs(10))).await;
    let id = app.submit("alice", CreateRun::new("hi")).await.id;
    assert_eq!(outcome(&app.events("alice", id).await), Some(RunStatus::Succeeded));
    let ended = Instant::now();
    assert_eq!(app.containers_of(id).await.len(), 1, "kept while the session is fresh");
    let deadline = ended + Duration::from_secs(40);
    while !app.containers_of(id).await.is_empty() {
        assert!(Instant::now() < deadline, "the idle container was never removed");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(ended.elapsed() >= Duration::from_secs(2), "removed long before the idle time: {:?}", ended.elapsed());
}

#[tokio::test]
async fn new_sessions_take_warm_containers_which_are_never_handed_out_twice() {
    let app = TestApp::spawn(Options {
        worker: false,
        script: vec![
            Reply::tool("bash", json!({"command": "echo one"})),
            Reply::text("a done"),
            Reply::tool("bash", json!({"command": "echo two"})),
            Reply::text("b done"),
        ],
        ..Default::default()
    })
    .await;
    let cfg = config(Duration::ZERO, 1, Duration::from_secs(10));
    let worker = cfg.worker_id.clone();
    let stop = CancellationToken::new();
    let handle = app.start_worker_until(cfg, stop.clone()).await;
    let all =
        wait_for_containers(Duration::from_secs(60), "a warm container", |all| pool_of(all, &worker).len() == 1).await;
    let warm = pool_of(&all, &worker)[0].id.clone();

    let a = app.submit("alice", CreateRun::new("a")).await;
    let a_events = app.events("alice", a.id).await;
    assert_eq!(outcome(&a_events), Some(RunStatus::Succeeded), "{:?}", kinds(&a_events));
    assert_eq!(readies(&a_events), [("warm".to_owned(), warm.clone(), false)]);
    assert!(results(&a_events)[0].contains("one"));

    // The pool starts a replacement; the next session gets that one.
    let all = wait_for_containers(Duration::from_secs(60), "a new warm container", |all| {
        pool_of(all, &worker).iter().any(|c| c.id != warm)
    })
    .await;
    let refill = pool_of(&all, &worker)[0].id.clone();
    let b = app.submit("alice", CreateRun::new("b")).await;
    let b_events = app.events("alice", b.id).await;
    assert_eq!(outcome(&b_events), Some(RunStatus::Succeeded), "{:?}", kinds(&b_events));
    assert_eq!(readies(&b_events), [("warm".to_owned(), refill.clone(), false)]);
    assert_ne!(refill, warm);

    // A worker that stops removes its pool.
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(60), handle).await.unwrap().unwrap();
    let all = managed().await;
    assert!(pool_of(&all, &worker).is_empty(), "the pool was drained on shutdown");
    assert!(
        !all.iter().any(|c| c.id == warm || c.id == refill),
        "idle 0: the sessions' containers went with their runs"
    );
}

#[tokio::test]
async fn a_run_taken_over_from_a_dead_worker_continues_in_its_container() {
    let app = TestApp::spawn(Options {
        worker: false,
        script: vec![
            Reply::tool("bash", json!({"command": "echo before-crash | tee progress.txt; sleep 30; echo never"})),
            Reply::tool("bash", json!({"command": "cat progress.txt; ps -eo args | grep -c '^sleep 30'"})),
            Reply::text("recovered"),
        ],
        ..Default::default()
    })
    .await;
    let lease = Duration::from_secs(3);
    let doomed = app.start_worker_until(config(Duration::from_secs(120), 0, lease), CancellationToken::new()).await;
    let id = app.submit("alice", CreateRun::new("work")).await.id;
    let seen = app.events_until("alice", id, None, printed("before-crash")).await;
    doomed.abort();
    let _ = doomed.await;
    app.start_worker(config(Duration::from_secs(120), 0, lease)).await;
    let rest = app.events_after("alice", id, Some(seen.last().unwrap().seq)).await;
    let all: Vec<Event> = seen.into_iter().chain(rest).collect();
    assert_dense(&all, 1);
    assert_eq!(outcome(&all), Some(RunStatus::Succeeded), "{:?}", kinds(&all));
    let ready = readies(&all);
    assert_eq!(ready.len(), 2, "{ready:?}");
    assert_eq!((ready[0].0.as_str(), ready[1].0.as_str()), ("new", "reused"));
    assert_eq!(ready[0].1, ready[1].1, "the second attempt adopted the first one's container");
    let results = results(&all);
    assert_eq!(results[0], INTERRUPTED);
    assert!(results[1].contains("before-crash"), "the workspace survived the worker: {}", results[1]);
    assert!(results[1].lines().any(|l| l.trim() == "0"), "the interrupted call was stopped: {}", results[1]);
    remove_all(&app.containers_of(id).await).await;
}

#[tokio::test]
async fn warm_containers_of_a_dead_worker_are_removed_but_another_deployments_are_not() {
    let lease = Duration::from_secs(3);
    let ours = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let theirs = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let dead_cfg = config(Duration::from_secs(1), 1, lease);
    let dead = dead_cfg.worker_id.clone();
    let doomed = ours.start_worker_until(dead_cfg, CancellationToken::new()).await;
    let other_cfg = config(Duration::from_secs(1), 1, lease);
    let other = other_cfg.worker_id.clone();
    let stop_other = CancellationToken::new();
    let other_handle = theirs.start_worker_until(other_cfg, stop_other.clone()).await;
    let all = wait_for_containers(Duration::from_secs(60), "both pools filled", |all| {
        pool_of(all, &dead).len() == 1 && pool_of(all, &other).len() == 1
    })
    .await;
    let orphan = pool_of(&all, &dead)[0].id.clone();
    let foreign = pool_of(&all, &other)[0].id.clone();

    // Killed outright: its pool is never drained.
    doomed.abort();
    let _ = doomed.await;
    ours.start_worker(config(Duration::from_secs(1), 0, lease)).await;
    wait_for_containers(Duration::from_secs(60), "the dead worker's warm container removed", |all| {
        !all.iter().any(|c| c.id == orphan)
    })
    .await;
    assert!(managed().await.iter().any(|c| c.id == foreign), "another deployment's container was left alone");
    stop_other.cancel();
    tokio::time::timeout(Duration::from_secs(60), other_handle).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_formerly_warm_container_taken_over_from_a_dead_worker_is_not_reaped_as_its_pool() {
    let lease = Duration::from_secs(3);
    let app = TestApp::spawn(Options {
        worker: false,
        script: vec![
            Reply::tool("bash", json!({"command": "echo before-crash; sleep 30"})),
            // Long enough for several reaper passes of the worker that took over.
            Reply::tool("bash", json!({"command": "sleep 8; echo survived"})),
            Reply::text("recovered"),
        ],
        ..Default::default()
    })
    .await;
    let dead_cfg = config(Duration::from_secs(4), 1, lease);
    let dead = dead_cfg.worker_id.clone();
    let doomed = app.start_worker_until(dead_cfg, CancellationToken::new()).await;
    let all =
        wait_for_containers(Duration::from_secs(60), "a warm container", |all| pool_of(all, &dead).len() == 1).await;
    let warm = pool_of(&all, &dead)[0].id.clone();
    let id = app.submit("alice", CreateRun::new("work")).await.id;
    let seen = app.events_until("alice", id, None, printed("before-crash")).await;
    assert_eq!(readies(&seen), [("warm".to_owned(), warm.clone(), false)]);

    // Killed outright, and long enough ago that every reaper counts it gone.
    doomed.abort();
    let _ = doomed.await;
    app.sql()
        .await
        .execute("UPDATE workers SET seen_at = now() - interval '1 hour' WHERE id = $1", &[&dead])
        .await
        .unwrap();
    // Reaps sandboxes at start and every 2 s while it drives the takeover.
    app.start_worker(config(Duration::from_secs(4), 0, lease)).await;
    let rest = app.events_after("alice", id, Some(seen.last().unwrap().seq)).await;
    let all: Vec<Event> = seen.into_iter().chain(rest).collect();
    assert_eq!(outcome(&all), Some(RunStatus::Succeeded), "{:?}", kinds(&all));
    let ready = readies(&all);
    assert_eq!(ready.len(), 2, "{ready:?}");
    assert_eq!(
        ready[1],
        ("reused".to_owned(), warm.clone(), false),
        "the takeover adopted the formerly warm container"
    );
    let results = results(&all);
    assert_eq!(results[0], INTERRUPTED);
    assert!(results[1].contains("survived"), "the container was kept through the takeover: {}", results[1]);
    remove_all(&app.containers_of(id).await).await;
}

#[tokio::test]
async fn a_worker_whose_lease_was_taken_leaves_the_sessions_container_alone_when_its_run_ends() {
    let logs = Logs::capture(LevelFilter::WARN);
    let app = TestApp::spawn(Options {
        worker: false,
        script: vec![Reply::tool("bash", json!({"command": "sleep 60"}))],
        ..Default::default()
    })
    .await;
    // No idle time: a run's end removes the session's container. A long
    // lease: the heartbeat does not notice the takeover before the run ends.
    let stop = CancellationToken::new();
    let zombie = app.start_worker_until(config(Duration::ZERO, 0, Duration::from_secs(120)), stop.clone()).await;
    let id = app.submit("alice", CreateRun::new("work")).await.id;
    app.events_until("alice", id, None, |e| matches!(e.body, EventBody::ToolCallReady { .. })).await;
    let before = app.containers_of(id).await;
    assert_eq!(before.len(), 1);

    // Taken over, as the lease reaper and another worker's claim would:
    // the container is the new attempt's now.
    app.sql()
        .await
        .execute(
            "UPDATE runs SET attempt = attempt + 1, lease_owner = 'thief',
                             lease_expires_at = now() + interval '1 hour'
             WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    // The first attempt still runs and ends on a cancel; then its worker stops.
    let r = app.http.post(app.url(&format!("/v1/runs/{id}/cancel"))).bearer_auth(token("alice")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 202);
    // Stopped only once its run has ended and it has found the lease gone
    // (when it would have removed the container): stopped earlier, it
    // would leave the container alone whatever it does at a run's end.
    let lost = format!("run_id={id}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !logs.text().lines().any(|l| l.contains("lease lost; another worker has the run") && l.contains(&lost)) {
        assert!(Instant::now() < deadline, "the zombie never ended its run:\n{}", logs.text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(60), zombie).await.unwrap().unwrap();
    assert_eq!(app.containers_of(id).await, before, "the container the takeover holds was left alone");
    let status: String =
        app.sql().await.query_one("SELECT status::text FROM runs WHERE id = $1", &[&id]).await.unwrap().get(0);
    assert_eq!(status, "running", "the zombie wrote no end");
    remove_all(&before).await;
}

/// A worker that stops for good does not strand its idle sessions'
/// containers: while another live worker of the deployment drives the same
/// engine it leaves them to that one; the last one out removes them.
#[tokio::test]
async fn the_last_worker_on_an_engine_to_stop_removes_its_idle_sessions_containers() {
    let app = TestApp::spawn(Options {
        worker: false,
        script: vec![Reply::tool("bash", json!({"command": "echo hi"})), Reply::text("done")],
        ..Default::default()
    })
    .await;
    let lease = Duration::from_secs(10);
    let (first_stop, second_stop) = (CancellationToken::new(), CancellationToken::new());
    let first = app.start_worker_until(config(Duration::from_secs(600), 0, lease), first_stop.clone()).await;
    let id = app.submit("alice", CreateRun::new("work")).await.id;
    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let [(_, container, _)] = &readies(&events)[..] else { panic!("{:?}", kinds(&events)) };
    let alive = |all: &[Managed]| all.iter().any(|c| &c.id == container);

    // Another worker on this engine: the first one's stop leaves the container.
    let second = app.start_worker_until(config(Duration::from_secs(600), 0, lease), second_stop.clone()).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while app
        .sql()
        .await
        .query_one("SELECT count(*) FROM workers WHERE engine IS NOT NULL", &[])
        .await
        .unwrap()
        .get::<_, i64>(0)
        < 2
    {
        assert!(Instant::now() < deadline, "both workers announced their engine");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    first_stop.cancel();
    first.await.unwrap();
    assert!(alive(&managed().await), "a live worker on the engine still looks after the idle session");

    // The last one out removes it.
    second_stop.cancel();
    second.await.unwrap();
    assert!(!alive(&managed().await), "the idle session's container went with the last worker");
}
