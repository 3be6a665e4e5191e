//! The toolbox watch against the recording backend, on a paused clock: a
//! stop in the backend's news ends a waiting call at once; while the news
//! is up nobody asks the engine; while it is down the watch asks every
//! [`CHECK_EVERY`]; when it comes back, once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use kiln_toolbox::protocol::Reply;
use tokio::sync::oneshot;

use super::backend::Stopped;
use super::recording::Recording;
use super::stops::SandboxStop;
use super::toolbox::ToolboxError;
use super::toolbox_reader::{CallLimits, Pending, PendingMap, lock};
use super::toolbox_watch::{CHECK_EVERY, Watched, watch};

const SANDBOX: &str = "sb";

type CallReply = oneshot::Receiver<Result<Reply, ToolboxError>>;

/// A connection to `SANDBOX` with a reader that never ends (as under
/// gVisor), watched: its calls in flight, none yet.
fn spawn_watch(backend: &Arc<Recording>) -> PendingMap {
    let pending = PendingMap::default();
    let reader = tokio::spawn(std::future::pending::<()>()).abort_handle();
    let plugged = backend.plugged();
    let feed = plugged.stop_feed();
    tokio::spawn(watch(Watched {
        backend: plugged,
        sandbox: SANDBOX.into(),
        pending: pending.clone(),
        alive: Arc::new(AtomicBool::new(true)),
        reader,
        feed,
        unsure: false,
    }));
    pending
}

/// A call put in flight on the connection: its reply.
fn call(pending: &PendingMap) -> CallReply {
    let (tx, rx) = oneshot::channel();
    lock(pending).insert(1, Pending::new(tx, None, CallLimits { stream_bytes: 0, reply_bytes: 0 }));
    rx
}

/// A connection to `SANDBOX` (stopped, as far as the backend says) with
/// one call in flight, watched: the call's reply.
fn watched(backend: &Arc<Recording>) -> CallReply {
    call(&spawn_watch(backend))
}

fn stopped_sandbox() -> Arc<Recording> {
    Arc::new(Recording { sandboxes: vec![(SANDBOX.into(), false)], ..Recording::default() })
}

fn stop(id: &str) -> SandboxStop {
    SandboxStop { id: id.into(), name: None, how: Stopped { exit_code: Some(137), ..Stopped::default() } }
}

/// How many times the engine was asked about the sandbox.
fn asked(backend: &Recording) -> usize {
    backend.calls().iter().filter(|c| *c == &format!("find {SANDBOX}")).count()
}

fn is_stopped(reply: Result<Reply, ToolboxError>) -> bool {
    matches!(reply, Err(ToolboxError::SandboxStopped(Stopped { removed: false, .. })))
}

#[tokio::test(start_paused = true)]
async fn news_of_its_sandbox_stopping_ends_a_waiting_call_at_once() {
    let backend = stopped_sandbox();
    backend.stops.set_up(true);
    let reply = watched(&backend);
    tokio::task::yield_now().await;
    backend.stops.stopped(stop("another"));
    backend.stops.stopped(stop(SANDBOX));
    // Well before the fallback would ask (the clock only moves when every
    // task waits, so a watch that did not wake would be seen waiting).
    let reply = tokio::time::timeout(CHECK_EVERY / 4, reply).await.expect("woken by the news").unwrap();
    assert!(is_stopped(reply));
    assert_eq!(asked(&backend), 1, "asked once, to be sure, and only of its own sandbox");
}

#[tokio::test(start_paused = true)]
async fn while_the_news_is_up_nobody_asks_the_engine() {
    let backend = stopped_sandbox();
    backend.stops.set_up(true);
    let reply = watched(&backend);
    let waited = tokio::time::timeout(Duration::from_secs(600), reply).await;
    assert!(waited.is_err(), "no news, no end: the feed is trusted");
    assert_eq!(asked(&backend), 0);
}

#[tokio::test(start_paused = true)]
async fn while_the_news_is_down_the_watch_asks_and_once_when_it_comes_back() {
    let backend = stopped_sandbox();
    let reply = watched(&backend);
    let reply = tokio::time::timeout(CHECK_EVERY * 2, reply).await.expect("the fallback asked").unwrap();
    assert!(is_stopped(reply));

    let backend = stopped_sandbox();
    let reply = watched(&backend);
    tokio::task::yield_now().await;
    backend.stops.set_up(true);
    let reply = tokio::time::timeout(CHECK_EVERY / 4, reply).await.expect("asked on coming back").unwrap();
    assert!(is_stopped(reply));
}

#[tokio::test(start_paused = true)]
async fn a_call_made_after_the_news_came_back_is_asked_about_once() {
    // The feed comes back while no call waits (a stop in its gap went
    // unheard); the first call made after it is asked about, once.
    let backend = stopped_sandbox();
    let pending = spawn_watch(&backend);
    tokio::task::yield_now().await;
    backend.stops.set_up(true);
    tokio::time::sleep(CHECK_EVERY * 5).await;
    assert_eq!(asked(&backend), 0, "no call waited: nobody asked");
    let reply = call(&pending);
    let reply = tokio::time::timeout(CHECK_EVERY * 2, reply).await.expect("asked at the next tick").unwrap();
    assert!(is_stopped(reply));
    assert_eq!(asked(&backend), 1);
}
