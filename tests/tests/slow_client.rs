//! A client that stops reading its event stream does not make the API
//! buffer for it: the API (a child process here, so its memory can be read
//! from /proc) stays flat while the run writes megabytes of events, and the
//! client, once it reads again, gets every event once and in order.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use eventsource_stream::Eventsource;
use futures::StreamExt;
use kiln_scripted_model::Reply;
use kiln_tests::{Ev, Options, TestApp, assert_dense, kinds, token};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;
use tokio_util::sync::CancellationToken;

const CHILD_DB: &str = "KILN_TEST_CHILD_API_DB";
const CHILD_ADDR_FILE: &str = "KILN_TEST_CHILD_API_ADDR_FILE";
/// How long the client does not read.
const PAUSE: Duration = Duration::from_secs(60);

/// Not a test of its own: the API process of the test below, which runs this
/// binary again with this test's name. Started any other way it does nothing.
#[tokio::test]
#[ignore = "helper: the child API process of a_client_that_stops_reading_..."]
async fn child_api_process() {
    let (Ok(db), Ok(addr_file)) = (std::env::var(CHILD_DB), std::env::var(CHILD_ADDR_FILE)) else { return };
    let store = kiln_store::Store::connect(&db, 8).unwrap();
    let settings = kiln_api::ApiSettings { sse_keep_alive: Duration::from_secs(1), ..Default::default() };
    let listen = "127.0.0.1:0".parse().unwrap();
    let parts = kiln_cli::app::ApiParts {
        auth: kiln_tests::authenticator(),
        settings,
        github: None,
        listen,
        metrics_listen: None,
    };
    let running = kiln_cli::app::Kiln::new(store).api(parts).start(CancellationToken::new()).await.unwrap();
    std::fs::write(addr_file, running.api_addr().unwrap().to_string()).unwrap();
    let _ = running.stopped().await;
}

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// Sixty commands of 300 kB of output each, over more than the pause. Each
/// differs (the step number) so the loop guard does not stop the run.
fn megabytes_script() -> Vec<Reply> {
    let command = |n: u32| {
        format!(
            "echo step {n}; for i in 1 2 3 4 5 6; do head -c 50000 /dev/zero | tr '\\0' a | fold -w 1000; sleep 0.15; done"
        )
    };
    (0..60).map(|n| Reply::tool("bash", json!({"command": command(n)}))).chain([Reply::text("done")]).collect()
}

#[tokio::test]
async fn a_client_that_stops_reading_for_a_minute_costs_the_api_no_memory_and_then_gets_everything() {
    let app = TestApp::spawn(Options { script: megabytes_script(), ..Default::default() }).await;
    let dir = tempfile::tempdir().unwrap();
    let addr_file = dir.path().join("addr");
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["slow_client::child_api_process", "--exact", "--include-ignored", "--nocapture"])
        .env(CHILD_DB, &app.db_url)
        .env(CHILD_ADDR_FILE, &addr_file)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let api_addr = loop {
        if let Ok(addr) = std::fs::read_to_string(&addr_file)
            && !addr.is_empty()
        {
            break addr;
        }
        assert!(Instant::now() < deadline, "the child API never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let run = app.create_run("alice", json!({"prompt": "talk a lot", "limits": {"max_steps": 100}})).await;
    let id = run["id"].as_str().unwrap().to_owned();

    // A raw connection with a small receive buffer, so the API feels the
    // back-pressure soon; HTTP/1.0 so the body is not chunked.
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(16 * 1024).unwrap();
    let mut conn = socket.connect(api_addr.trim().parse().unwrap()).await.unwrap();
    let request = format!(
        "GET /v1/runs/{id}/events HTTP/1.0\r\nHost: kiln\r\nAuthorization: Bearer {}\r\nAccept: text/event-stream\r\n\r\n",
        token("alice")
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let body_start = loop {
        let mut buf = [0u8; 4096];
        let n = conn.read(&mut buf).await.unwrap();
        assert!(n > 0, "connection closed before the headers");
        head.extend_from_slice(&buf[..n]);
        if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    assert!(
        head.starts_with(b"HTTP/1.0 200") || head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let rest = head.split_off(body_start);
    let chunks = futures::stream::once(async move { Ok::<_, std::io::Error>(bytes::Bytes::from(rest)) }).chain(
        futures::stream::unfold(conn, |mut conn| async move {
            let mut buf = vec![0u8; 64 * 1024];
            match conn.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok(bytes::Bytes::from(buf)), conn))
                }
                Err(e) => Some((Err(e), conn)),
            }
        }),
    );
    let mut events = Box::pin(chunks.eventsource());
    let mut seen: Vec<Ev> = Vec::new();
    let mut next = async || {
        let ev = tokio::time::timeout(Duration::from_secs(60), events.next()).await.expect("stream stalled");
        let ev = ev.expect("stream ended early").expect("valid SSE");
        Ev { seq: ev.id.parse().unwrap(), kind: ev.event, data: serde_json::from_str(&ev.data).unwrap() }
    };
    // Read until the first command streams, then stop reading.
    loop {
        let ev = next().await;
        let streaming = ev.kind == "tool.output";
        seen.push(ev);
        if streaming {
            break;
        }
    }
    let before = rss_bytes(pid);
    let written_before = payload_bytes(&app, &id).await;
    let mut peak = before;
    let paused = Instant::now();
    while paused.elapsed() < PAUSE {
        tokio::time::sleep(Duration::from_secs(2)).await;
        peak = peak.max(rss_bytes(pid));
    }
    let written = payload_bytes(&app, &id).await - written_before;
    eprintln!(
        "paused {PAUSE:?}: the run wrote {:.1} MiB of events; API RSS {:.1} MiB before, peak {:.1} MiB",
        mib(written),
        mib(before),
        mib(peak)
    );
    assert!(written > 8 << 20, "the run should write plenty while the client sleeps: {written} bytes");
    // Kernel socket buffers hold a few MiB; the API itself must hold next to nothing.
    assert!(
        peak - before < 4 << 20,
        "API memory grew by {:.1} MiB for a client that does not read",
        mib(peak - before)
    );

    // Reading again: every event, once, in order, to the end.
    loop {
        let ev = next().await;
        let terminal = kiln_protocol::event::is_terminal_kind(&ev.kind);
        seen.push(ev);
        if terminal {
            break;
        }
    }
    assert_dense(&seen, 1);
    assert_eq!(seen.last().unwrap().kind, "run.succeeded", "{:?}", kinds(&seen[seen.len().saturating_sub(5)..]));
    let stored: i64 = app
        .sql()
        .await
        .query_one("SELECT count(*) FROM events WHERE run_id = $1::text::uuid", &[&id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(seen.len() as i64, stored);
    child.kill().await.unwrap();
}

async fn payload_bytes(app: &TestApp, id: &str) -> u64 {
    let row = app
        .sql()
        .await
        .query_one(
            "SELECT COALESCE(sum(octet_length(payload::text)), 0)::bigint FROM events WHERE run_id = $1::text::uuid",
            &[&id],
        )
        .await
        .unwrap();
    row.get::<_, i64>(0) as u64
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
