//! An event insert whose commit succeeded but whose answer was lost with the
//! connection is retried without storing the event twice.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use kiln_protocol::{CreateRun, EventBody, Trigger};
use kiln_store::{Lease, NewRun, Store};
use kiln_tests::{Options, TestApp};
use kiln_worker::event_sink::EventSink;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use uuid::Uuid;

async fn claimed_run(store: &Store) -> Lease {
    let spec = CreateRun { prompt: "p".into(), repo: None, ..Default::default() };
    let new = NewRun { owner: "alice".into(), spec, trigger: Trigger::Api, idempotency_key: None };
    store.create_run(new).await.unwrap();
    store.claim_run("w", Duration::from_secs(600)).await.unwrap().unwrap().1
}

async fn seqs_of_kind(app: &TestApp, run: Uuid, kind: &str) -> Vec<i64> {
    let rows = app
        .sql()
        .await
        .query("SELECT seq FROM events WHERE run_id = $1 AND kind = $2 ORDER BY seq", &[&run, &kind])
        .await
        .unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

async fn last_event_seq(app: &TestApp, run: Uuid) -> i64 {
    app.sql().await.query_one("SELECT last_event_seq FROM runs WHERE id = $1", &[&run]).await.unwrap().get(0)
}

#[tokio::test]
async fn appending_twice_with_one_event_id_stores_the_event_once() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let lease = claimed_run(&app.store).await;
    let id = Uuid::now_v7();
    let body = EventBody::StepStarted { step: 1 };
    let first = app.store.append_event_once(&lease, id, &body).await.unwrap();
    let again = app.store.append_event_once(&lease, id, &body).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(seqs_of_kind(&app, lease.run_id, "step.started").await, [first]);
    assert_eq!(last_event_seq(&app, lease.run_id).await, first, "no seq was spent on the retry");
    // A new id is a new event, right after.
    let next = app.store.append_event_once(&lease, Uuid::now_v7(), &body).await.unwrap();
    assert_eq!(next, first + 1);
}

/// A TCP proxy in front of Postgres that, once armed, lets through the next
/// statement whose text contains `pattern`, throws away the server's answer
/// and drops the connection: the commit happens, the client never hears of it.
struct AnswerEater {
    addr: std::net::SocketAddr,
    armed: Arc<AtomicBool>,
    eaten: Arc<AtomicU32>,
}

impl AnswerEater {
    /// A proxy in front of `app`'s database, and a store that goes through it.
    async fn in_front_of(app: &TestApp, pattern: &'static [u8]) -> (AnswerEater, Store) {
        let config: tokio_postgres::Config = app.db_url.parse().unwrap();
        let port = config.get_ports()[0];
        let host = match &config.get_hosts()[0] {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            other => panic!("test databases are reached over TCP, not {other:?}"),
        };
        let proxy = AnswerEater::start(format!("{host}:{port}"), pattern).await;
        let url = app.db_url.replace(&format!("{host}:{port}/"), &format!("{}/", proxy.addr));
        (proxy, Store::connect(&url, 2).unwrap())
    }

    async fn start(upstream: String, pattern: &'static [u8]) -> AnswerEater {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let armed = Arc::new(AtomicBool::new(false));
        let eaten = Arc::new(AtomicU32::new(0));
        let (a, e) = (armed.clone(), eaten.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(&upstream).await.unwrap();
                tokio::spawn(pipe(client, server, pattern, a.clone(), e.clone()));
            }
        });
        AnswerEater { addr, armed, eaten }
    }
}

/// The protocol's ReadyForQuery message ('Z', length 5), minus its
/// transaction-status byte.
const READY_FOR_QUERY: &[u8] = b"Z\0\0\0\x05";

async fn pipe(client: TcpStream, server: TcpStream, pattern: &[u8], armed: Arc<AtomicBool>, eaten: Arc<AtomicU32>) {
    let (mut client_r, mut client_w) = client.into_split();
    let (mut server_r, mut server_w) = server.into_split();
    let swallow = Arc::new(AtomicBool::new(false));
    let swallowing = swallow.clone();
    // Told when the server, after the swallowed statement, says it is ready
    // for the next one: the statement has run and (outside a transaction)
    // committed.
    let answered = Arc::new(tokio::sync::Notify::new());
    let done = answered.clone();
    let answers = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = server_r.read(&mut buf).await {
            if swallowing.load(Ordering::SeqCst) {
                if buf[..n].windows(READY_FOR_QUERY.len()).any(|w| w == READY_FOR_QUERY) {
                    done.notify_one();
                }
                continue;
            }
            if client_w.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    let mut parsed = false;
    while let Ok(n @ 1..) = client_r.read(&mut buf).await {
        let chunk = &buf[..n];
        // tokio-postgres prepares (Parse, holding the SQL text), waits for
        // the answer, then binds and executes in the next write.
        if parsed {
            swallow.store(true, Ordering::SeqCst);
            server_w.write_all(chunk).await.unwrap();
            // Once the server has executed and committed, cut both ways.
            tokio::time::timeout(Duration::from_secs(30), answered.notified())
                .await
                .expect("the server answered the swallowed statement");
            eaten.fetch_add(1, Ordering::SeqCst);
            answers.abort();
            return;
        }
        if chunk.windows(pattern.len()).any(|w| w == pattern) && armed.swap(false, Ordering::SeqCst) {
            parsed = true;
        }
        if server_w.write_all(chunk).await.is_err() {
            return;
        }
    }
    answers.abort();
}

#[tokio::test]
async fn an_event_whose_commit_answer_was_lost_is_not_stored_twice() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let lease = claimed_run(&app.store).await;
    let (proxy, via_proxy) = AnswerEater::in_front_of(&app, b"INSERT INTO events").await;

    let mut sink = EventSink::new(via_proxy, lease.clone());
    proxy.armed.store(true, Ordering::SeqCst);
    sink.write_now(EventBody::StepStarted { step: 7 }).await.unwrap();
    assert_eq!(proxy.eaten.load(Ordering::SeqCst), 1, "the first answer was lost");
    sink.write_now(EventBody::StepStarted { step: 8 }).await.unwrap();

    // run.queued is 1; step 7 is 2 (once, though written twice); step 8 is 3.
    assert_eq!(seqs_of_kind(&app, lease.run_id, "step.started").await, [2, 3]);
    assert_eq!(last_event_seq(&app, lease.run_id).await, 3);
}

#[tokio::test]
async fn a_message_whose_commit_answer_was_lost_is_not_stored_twice() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let lease = claimed_run(&app.store).await;
    let session: Uuid =
        app.sql().await.query_one("SELECT session_id FROM runs WHERE id = $1", &[&lease.run_id]).await.unwrap().get(0);
    let (proxy, via_proxy) = AnswerEater::in_front_of(&app, b"INSERT INTO messages").await;

    // What the agent loop does: one id, retried until it gets an answer.
    let id = Uuid::now_v7();
    let message = kiln_protocol::Message::user("do the thing");
    proxy.armed.store(true, Ordering::SeqCst);
    let first = via_proxy.append_message_once(&lease, id, session, &message, None, None).await;
    assert!(first.is_err(), "the answer was eaten: {first:?}");
    assert_eq!(proxy.eaten.load(Ordering::SeqCst), 1);
    let seq = via_proxy.append_message_once(&lease, id, session, &message, None, None).await.unwrap();
    let next = via_proxy
        .append_message_once(&lease, Uuid::now_v7(), session, &kiln_protocol::Message::user("next"), None, None)
        .await
        .unwrap();
    assert_eq!((seq, next), (1, 2));
    let rows = app
        .sql()
        .await
        .query("SELECT seq FROM messages WHERE session_id = $1 ORDER BY seq", &[&session])
        .await
        .unwrap();
    assert_eq!(rows.len(), 2, "stored once, though written twice");
    assert_eq!(app.store.load_messages(session).await.unwrap().len(), 2);
}

#[tokio::test]
async fn a_batch_of_events_is_stored_densely_in_order_and_once() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let lease = claimed_run(&app.store).await;
    let batch: Vec<(Uuid, EventBody)> = (1..=3).map(|step| (Uuid::now_v7(), EventBody::StepStarted { step })).collect();
    let last = app.store.append_events_once(&lease, &batch).await.unwrap();
    assert_eq!(last, 4, "run.queued is 1; the batch is 2..=4");
    // A retry of the same batch (its answer lost) stores nothing more.
    assert_eq!(app.store.append_events_once(&lease, &batch).await.unwrap(), 4);
    assert_eq!(seqs_of_kind(&app, lease.run_id, "step.started").await, [2, 3, 4]);
    let steps: Vec<i64> = app
        .sql()
        .await
        .query(
            "SELECT (payload->>'step')::bigint FROM events WHERE run_id = $1 AND seq > 1 ORDER BY seq",
            &[&lease.run_id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(steps, [1, 2, 3], "in the order given");
    assert_eq!(last_event_seq(&app, lease.run_id).await, 4);
    // A worker that lost the lease writes nothing.
    let stale = Lease { attempt: lease.attempt + 1, ..lease.clone() };
    let refused = app.store.append_events_once(&stale, &[(Uuid::now_v7(), EventBody::StepStarted { step: 9 })]).await;
    assert!(matches!(refused, Err(kiln_store::StoreError::LeaseLost(_))), "{refused:?}");
}

#[tokio::test]
async fn a_message_and_its_events_are_stored_together_once_and_only_under_the_lease() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let lease = claimed_run(&app.store).await;
    let session: Uuid =
        app.sql().await.query_one("SELECT session_id FROM runs WHERE id = $1", &[&lease.run_id]).await.unwrap().get(0);
    let (proxy, via_proxy) = AnswerEater::in_front_of(&app, b"INSERT INTO messages").await;

    // What EventSink::commit does with a held message: one id, retried.
    let id = Uuid::now_v7();
    let message = kiln_protocol::Message::user("do the thing");
    let batch: Vec<(Uuid, EventBody)> = (1..=2).map(|step| (Uuid::now_v7(), EventBody::StepStarted { step })).collect();
    proxy.armed.store(true, Ordering::SeqCst);
    let first = via_proxy.append_message_with_events_once(&lease, id, session, &message, None, None, &batch).await;
    assert!(first.is_err(), "the answer was eaten: {first:?}");
    assert_eq!(proxy.eaten.load(Ordering::SeqCst), 1);
    let again = via_proxy.append_message_with_events_once(&lease, id, session, &message, None, None, &batch).await;
    assert_eq!(again.unwrap(), kiln_store::StepWrite { message_seq: 1, last_event_seq: None }, "found, not stored");
    assert_eq!(seqs_of_kind(&app, lease.run_id, "step.started").await, [2, 3], "once, densely after run.queued");
    assert_eq!(last_event_seq(&app, lease.run_id).await, 3);

    // The next one goes on from there, message and events alike.
    let next = app
        .store
        .append_message_with_events_once(
            &lease,
            Uuid::now_v7(),
            session,
            &kiln_protocol::Message::user("next"),
            None,
            None,
            &[(Uuid::now_v7(), EventBody::StepStarted { step: 3 })],
        )
        .await
        .unwrap();
    assert_eq!(next, kiln_store::StepWrite { message_seq: 2, last_event_seq: Some(4) });
    // A message alone spends no event seq.
    let alone = app
        .store
        .append_message_with_events_once(&lease, Uuid::now_v7(), session, &message, None, None, &[])
        .await
        .unwrap();
    assert_eq!(alone, kiln_store::StepWrite { message_seq: 3, last_event_seq: None });
    assert_eq!(last_event_seq(&app, lease.run_id).await, 4);

    // A worker that lost the lease stores neither.
    let stale = Lease { attempt: lease.attempt + 1, ..lease.clone() };
    let refused = app
        .store
        .append_message_with_events_once(
            &stale,
            Uuid::now_v7(),
            session,
            &message,
            None,
            None,
            &[(Uuid::now_v7(), EventBody::StepStarted { step: 9 })],
        )
        .await;
    assert!(matches!(refused, Err(kiln_store::StoreError::LeaseLost(_))), "{refused:?}");
    assert_eq!(app.store.load_messages(session).await.unwrap().len(), 3);
    assert_eq!(last_event_seq(&app, lease.run_id).await, 4);
}
