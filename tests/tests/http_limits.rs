//! Slow and stalled clients cannot hold the API's connections forever: a
//! request's headers and the whole request have deadlines, a client that
//! takes no bytes has its connection closed (and its SSE slot freed), and
//! an event stream ends after its maximum life, to be resumed; an HTTP/2
//! connection with no request in flight is closed once idle.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use kiln_api::{ApiSettings, HttpTimeouts};
use kiln_tests::{Options, TestApp, token};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const LIMIT: Duration = Duration::from_secs(1);

async fn app_with_short_limits() -> TestApp {
    let api = ApiSettings {
        sse_keep_alive: Duration::from_secs(1),
        request_timeout: LIMIT,
        connection: HttpTimeouts { header_read: LIMIT, write_stall: LIMIT },
        max_sse_per_subject: 1,
        ..Default::default()
    };
    TestApp::spawn(Options { api, worker: false, ..Default::default() }).await
}

/// Reads until the server closes the connection; what it sent, and whether
/// it closed within `within`.
async fn read_until_closed(conn: &mut TcpStream, within: Duration) -> Option<String> {
    let mut got = Vec::new();
    let closed = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    closed.ok().map(|()| String::from_utf8_lossy(&got).into_owned())
}

#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_disconnected() {
    let app = app_with_short_limits().await;
    // Before the connection: the server's limit starts at its accept, and
    // a test thread starved after it must not shorten what is measured.
    let started = Instant::now();
    let mut conn = TcpStream::connect(app.addr).await.unwrap();
    // The blank line that ends the headers never comes.
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: kiln\r\nX-Slow: ").await.unwrap();
    let answer = read_until_closed(&mut conn, Duration::from_secs(15)).await;
    let answer = answer.expect("the server kept a connection whose headers never ended");
    assert!(started.elapsed() >= LIMIT - Duration::from_millis(100), "closed early: {:?}", started.elapsed());
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 408"), "{answer}");
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_408_and_creates_nothing() {
    let app = app_with_short_limits().await;
    let mut conn = TcpStream::connect(app.addr).await.unwrap();
    let head = format!(
        "POST /v1/runs HTTP/1.1\r\nHost: kiln\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n{{\"prompt\": ",
        token("alice")
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let answer = read_until_closed(&mut conn, Duration::from_secs(15)).await;
    let answer = answer.expect("the server kept waiting for a body that does not come");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("connection: close"), "{answer}");
    assert!(answer.contains(r#""code":"request_timeout""#), "{answer}");
    assert!(answer.contains("not received and answered within 1 s"), "{answer}");
    let runs: i64 = app.sql().await.query_one("SELECT count(*) FROM runs", &[]).await.unwrap().get(0);
    assert_eq!(runs, 0);
}

#[tokio::test]
async fn a_stream_whose_client_stopped_reading_is_closed_and_its_slot_freed() {
    let app = app_with_short_limits().await;
    let run = app.create_run("alice", json!({"prompt": "x"})).await;
    let id = run["id"].as_str().unwrap().to_owned();
    // 20 MB of events after run.queued: more than the socket buffers hold.
    let sql = app.sql().await;
    sql.execute(
        "INSERT INTO events (run_id, seq, kind, payload)
         SELECT $1::text::uuid, g, 'note', jsonb_build_object('text', repeat('a', 100000)) FROM generate_series(2, 201) g",
        &[&id],
    )
    .await
    .unwrap();
    sql.execute("UPDATE runs SET last_event_seq = 201 WHERE id = $1::text::uuid", &[&id]).await.unwrap();

    // The subject's only stream slot, on a connection that stops reading
    // after the headers.
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(16 * 1024).unwrap();
    let mut stalled = socket.connect(app.addr).await.unwrap();
    let request = format!(
        "GET /v1/runs/{id}/events HTTP/1.1\r\nHost: kiln\r\nAuthorization: Bearer {}\r\nAccept: text/event-stream\r\n\r\n",
        token("alice")
    );
    stalled.write_all(request.as_bytes()).await.unwrap();
    let mut head = [0u8; 12];
    stalled.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");

    let events = app.url(&format!("/v1/runs/{id}/events"));
    let open_another = || {
        app.http
            .get(&events)
            .bearer_auth(token("alice"))
            .header("accept", "text/event-stream")
            .header("last-event-id", "201")
            .send()
    };
    assert_eq!(open_another().await.unwrap().status(), 429, "the stalled stream holds the only slot");
    // Once the server's writes have stalled for LIMIT, it drops the
    // connection and the slot comes back.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let status = open_another().await.unwrap().status();
        if status == 200 {
            break;
        }
        assert_eq!(status, 429);
        assert!(Instant::now() < deadline, "a client that reads nothing kept its stream open");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Reading again, the stalled client finds its connection closed before
    // the stream's end: it resumes with Last-Event-ID like any other.
    let rest = read_until_closed(&mut stalled, Duration::from_secs(15)).await.expect("closed");
    assert!(!rest.contains("id: 201\n"), "the stalled stream was not cut short");
}

#[tokio::test]
async fn an_event_stream_ends_after_its_maximum_life_and_resumes() {
    let mut api = ApiSettings { sse_keep_alive: Duration::from_secs(1), ..Default::default() };
    api.sse_max_duration = LIMIT;
    let app = TestApp::spawn(Options { api, worker: false, ..Default::default() }).await;
    let run = app.create_run("alice", json!({"prompt": "x"})).await;
    let id = run["id"].as_str().unwrap().to_owned();
    let events = app.url(&format!("/v1/runs/{id}/events"));
    let follow = |after: &'static str| {
        app.http
            .get(&events)
            .bearer_auth(token("alice"))
            .header("accept", "text/event-stream")
            .header("last-event-id", after)
            .send()
    };
    let started = Instant::now();
    let body = tokio::time::timeout(Duration::from_secs(15), async { follow("0").await.unwrap().text().await })
        .await
        .expect("the stream of a quiet run never ended")
        .unwrap();
    assert!(started.elapsed() >= LIMIT - Duration::from_millis(100));
    assert!(body.contains("id: 1\nevent: run.queued"), "{body}");
    // The run goes on; the client resumes after what it has.
    let sql = app.sql().await;
    sql.execute("INSERT INTO events (run_id, seq, kind, payload) VALUES ($1::text::uuid, 2, 'note', '{}')", &[&id])
        .await
        .unwrap();
    sql.execute("UPDATE runs SET last_event_seq = 2 WHERE id = $1::text::uuid", &[&id]).await.unwrap();
    let body = tokio::time::timeout(Duration::from_secs(15), async { follow("1").await.unwrap().text().await })
        .await
        .unwrap()
        .unwrap();
    assert!(body.contains("id: 2\nevent: note") && !body.contains("id: 1\n"), "{body}");
}

#[tokio::test]
async fn a_client_that_connects_and_says_nothing_is_disconnected() {
    let app = app_with_short_limits().await;
    // Before the connection: the server's limit starts at its accept, and
    // a test thread starved after it must not shorten what is measured.
    let started = Instant::now();
    let mut conn = TcpStream::connect(app.addr).await.unwrap();
    let answer = read_until_closed(&mut conn, Duration::from_secs(15)).await;
    let answer = answer.expect("the server kept a connection that never said anything");
    assert!(started.elapsed() >= LIMIT - Duration::from_millis(100), "closed early: {:?}", started.elapsed());
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 408"), "{answer}");
}

/// The HTTP/2 connection preface, then an empty SETTINGS frame.
const H2_HELLO: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Reads the server's first HTTP/2 frame header: 9 bytes, its type at [3].
async fn first_frame_type(conn: &mut TcpStream) -> u8 {
    let mut header = [0u8; 9];
    tokio::time::timeout(Duration::from_secs(10), conn.read_exact(&mut header))
        .await
        .expect("no HTTP/2 frame within 10 s")
        .expect("the server closed instead of speaking HTTP/2");
    header[3]
}

#[tokio::test]
async fn http2_with_prior_knowledge_is_served_beside_http1() {
    let app = app_with_short_limits().await;
    let mut conn = TcpStream::connect(app.addr).await.unwrap();
    conn.write_all(H2_HELLO).await.unwrap();
    // The server's SETTINGS frame (type 4) opens its side of the connection.
    assert_eq!(first_frame_type(&mut conn).await, 4);
    // A client whose preface arrives in pieces is recognised all the same.
    let mut conn = TcpStream::connect(app.addr).await.unwrap();
    conn.write_all(&H2_HELLO[..5]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    conn.write_all(&H2_HELLO[5..]).await.unwrap();
    assert_eq!(first_frame_type(&mut conn).await, 4);
    // And HTTP/1 on the same listener.
    let mut conn = TcpStream::connect(app.addr).await.unwrap();
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: kiln\r\nConnection: close\r\n\r\n").await.unwrap();
    let answer = read_until_closed(&mut conn, Duration::from_secs(10)).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test]
async fn an_http2_connection_with_nothing_in_flight_is_closed_once_idle() {
    // hyper's HTTP/2 server has no idle limit of its own: a client that
    // says the preface and nothing more held its connection for ever.
    let app = app_with_short_limits().await;
    // Before the connection, as above: the idle limit may start at accept.
    let started = Instant::now();
    let mut conn = TcpStream::connect(app.addr).await.unwrap();
    conn.write_all(H2_HELLO).await.unwrap();
    assert_eq!(first_frame_type(&mut conn).await, 4);
    let closed = read_until_closed(&mut conn, Duration::from_secs(15)).await;
    assert!(closed.is_some(), "the server kept an idle HTTP/2 connection for 15 s");
    assert!(started.elapsed() >= LIMIT - Duration::from_millis(100), "closed early: {:?}", started.elapsed());
}

#[tokio::test]
async fn an_http2_event_stream_outlives_the_idle_limit_while_it_is_open() {
    // A request in flight is not idleness, however little the client
    // sends: an event stream on a quiet run gets only the server's
    // keep-alives, and its connection stays open past the idle limit.
    let app = app_with_short_limits().await;
    let run = app.create_run("alice", json!({"prompt": "x"})).await;
    let id = run["id"].as_str().unwrap();
    let client = reqwest::Client::builder().http2_prior_knowledge().build().unwrap();
    let response = client
        .get(app.url(&format!("/v1/runs/{id}/events")))
        .bearer_auth(token("alice"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let mut keep_alives = 0;
    let until = Instant::now() + LIMIT * 4;
    while Instant::now() < until {
        match tokio::time::timeout_at(until.into(), futures::StreamExt::next(&mut body)).await {
            Err(_) => break,
            Ok(Some(Ok(chunk))) => keep_alives += usize::from(chunk.starts_with(b":")),
            Ok(other) => panic!("the stream ended within {:?}: {:?}", LIMIT * 4, other.map(|r| r.err())),
        }
    }
    assert!(keep_alives >= 2, "the stream should have carried keep-alives: {keep_alives}");
}

#[tokio::test]
async fn a_connection_that_has_said_nothing_does_not_hold_the_shutdown() {
    // A connection opened ahead of use (a browser's preconnect, a
    // balancer's pool) has no request to finish: on shutdown it is closed
    // at once, not kept for the header timeout (here a minute, beyond the
    // server's 30 s drain).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let timeouts = HttpTimeouts { header_read: Duration::from_secs(60), write_stall: Duration::from_secs(60) };
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(kiln_api::serve(listener, axum::Router::new(), timeouts, shutdown.clone()));
    let mut silent = TcpStream::connect(addr).await.unwrap();
    // Accepted and waiting for its first bytes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    shutdown.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(10), server).await;
    assert!(stopped.is_ok(), "the server waited on a connection that never asked anything");
    assert_eq!(read_until_closed(&mut silent, Duration::from_secs(5)).await.as_deref(), Some(""));
}
