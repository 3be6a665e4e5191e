//! A hostile toolbox, as a frame stream fed to the worker's reader: no
//! Docker needed. Whatever it sends, the worker's memory and what reaches
//! the event stream stay within the worker's own caps.

use std::sync::atomic::AtomicUsize;

use bytes::Bytes;

use crate::sandbox::backend::BackendError;
use kiln_toolbox::framing::encode_json;
use kiln_toolbox::protocol::{
    ExecRequest, ExecResult, Hello, Output as OutputMsg, Response, ServerMessage, ViewRequest, ViewResult,
};

use super::*;

fn frame(msg: &ServerMessage) -> Vec<u8> {
    encode_json(msg).unwrap()
}

fn hello() -> Vec<u8> {
    frame(&ServerMessage::Hello(Hello {
        protocol_version: 1,
        toolbox_version: "x".into(),
        pid: 42,
        missing: Vec::new(),
        shell: None,
    }))
}

fn output(id: u64, data: String) -> Vec<u8> {
    frame(&ServerMessage::Output(OutputMsg { id, data }))
}

fn exec_result(output: String) -> Reply {
    Reply::Exec(ExecResult {
        exit_code: Some(0),
        signal: None,
        timed_out: false,
        cancelled: false,
        output,
        truncated_bytes: 0,
        total_bytes: 0,
        cwd: "/workspace".into(),
        duration_ms: 1,
        note: None,
    })
}

fn response(id: u64, result: Reply) -> Vec<u8> {
    frame(&ServerMessage::Response(Response { id, result }))
}

/// Splits `bytes` into stdout chunks of at most 64 KiB, as Docker would.
fn chunks(bytes: Vec<u8>) -> Vec<Result<ExecChunk, BackendError>> {
    bytes.chunks(64 * 1024).map(|c| Ok(ExecChunk::Stdout(Bytes::copy_from_slice(c)))).collect()
}

/// A sink that counts what it is handed, and accepts it all.
fn counting_sink() -> (OutputSink, Arc<AtomicUsize>) {
    let total = Arc::new(AtomicUsize::new(0));
    let seen = total.clone();
    let sink: OutputSink = Arc::new(move |text: String| {
        seen.fetch_add(text.len(), Ordering::Relaxed);
        true
    });
    (sink, total)
}

struct Call {
    reply: oneshot::Receiver<Result<Reply, ToolboxError>>,
}

/// Registers call `id` for `body` with `sink`, like `ToolboxConn::call`.
fn register(pending: &PendingMap, id: u64, body: &RequestBody, sink: Option<OutputSink>) -> Call {
    let (tx, rx) = oneshot::channel();
    lock(pending).insert(id, Pending::new(tx, sink, CallLimits::for_request(body)));
    Call { reply: rx }
}

async fn run(stream: Vec<u8>, pending: &PendingMap) {
    let (hello_tx, _hello_rx) = oneshot::channel();
    let alive = Arc::new(AtomicBool::new(true));
    read_frames(Box::pin(futures::stream::iter(chunks(stream))), pending.clone(), alive, hello_tx).await;
}

fn bash_request() -> RequestBody {
    RequestBody::Exec(ExecRequest {
        output_cap_bytes: 30_000,
        stream_cap_bytes: Some(MAX_STREAM_BYTES),
        ..ExecRequest::new("yes")
    })
}

#[tokio::test]
async fn output_beyond_the_stream_cap_is_dropped_and_the_result_says_so() {
    let pending = PendingMap::default();
    let (sink, streamed) = counting_sink();
    let call = register(&pending, 1, &bash_request(), Some(sink));
    // 40 frames of 1 MiB each (forged or not): 40 MiB offered.
    let mut stream = hello();
    let big = "o".repeat(1024 * 1024 - 100);
    for _ in 0..40 {
        stream.extend(output(1, big.clone()));
        // Chunks for calls nobody waits for go nowhere.
        stream.extend(output(7, big.clone()));
    }
    stream.extend(response(1, exec_result("tail".into())));
    run(stream, &pending).await;
    let streamed = streamed.load(Ordering::Relaxed) as u64;
    assert!(streamed <= MAX_STREAM_BYTES + 1024, "streamed {streamed}");
    assert!(streamed >= MAX_STREAM_BYTES, "up to the cap is passed on: {streamed}");
    let Ok(Ok(Reply::Exec(r))) = call.reply.await else { panic!("no exec reply") };
    assert!(r.note.unwrap().contains("stopped streaming this command's output"), "truncation is stated");
}

#[tokio::test]
async fn a_full_queue_counts_as_dropped_output() {
    let pending = PendingMap::default();
    let refusing: OutputSink = Arc::new(|_| false);
    let call = register(&pending, 1, &bash_request(), Some(refusing));
    let mut stream = hello();
    stream.extend(output(1, "hi".into()));
    stream.extend(response(1, exec_result("hi".into())));
    run(stream, &pending).await;
    let Ok(Ok(Reply::Exec(r))) = call.reply.await else { panic!("no exec reply") };
    assert!(r.note.unwrap().contains("stopped streaming"));
}

#[tokio::test]
async fn an_oversize_frame_is_never_buffered_and_fails_the_waiting_calls() {
    let pending = PendingMap::default();
    let call = register(&pending, 1, &bash_request(), None);
    let mut stream = hello();
    // Announces 15 MiB (under the protocol's 16 MiB, over the worker's 4 MiB).
    let len = 15 * 1024 * 1024u32;
    stream.extend(len.to_be_bytes());
    stream.extend(vec![b'x'; len as usize]);
    stream.extend(response(1, exec_result("late".into())));
    run(stream, &pending).await;
    match call.reply.await {
        Ok(Err(ToolboxError::Misbehaved(m))) => assert!(m.contains("exceeds the maximum of 4194304"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(lock(&pending).is_empty());
}

#[tokio::test]
async fn a_reply_over_its_kinds_cap_is_a_clear_error() {
    let pending = PendingMap::default();
    let exec = register(&pending, 1, &bash_request(), None);
    let view_body = RequestBody::View(ViewRequest::new("a.txt"));
    let view = register(&pending, 2, &view_body, None);
    let fine = register(&pending, 3, &bash_request(), None);
    let mut stream = hello();
    // 1 MiB of exec output where 30 000 bytes were asked for.
    stream.extend(response(1, exec_result("e".repeat(1024 * 1024))));
    let huge_view = ViewResult {
        path: "/workspace/a.txt".into(),
        text: "v".repeat(3 * 1024 * 1024),
        version: kiln_toolbox::protocol::FileVersion { size: 1, mtime_ns: 0 },
        total_lines: 1,
        total_known: true,
        first_line: 1,
        last_line: 1,
        next_offset: None,
        binary: None,
        lossy: false,
        bytes_scanned: 0,
    };
    stream.extend(response(2, Reply::View(huge_view)));
    stream.extend(response(3, exec_result("ok".into())));
    run(stream, &pending).await;
    for (call, what) in [(exec, "exec"), (view, "view")] {
        match call.reply.await {
            Ok(Err(ToolboxError::Misbehaved(m))) => assert!(m.contains("over the worker's limit"), "{what}: {m}"),
            other => panic!("{what}: {other:?}"),
        }
    }
    let Ok(Ok(Reply::Exec(r))) = fine.reply.await else { panic!("the connection stays usable") };
    assert_eq!(r.output, "ok");
}

#[test]
fn limits_follow_the_request_and_never_exceed_the_frame_cap() {
    let exec = CallLimits::for_request(&bash_request());
    assert_eq!(exec.stream_bytes, MAX_STREAM_BYTES + 1024);
    assert!(exec.reply_bytes < 512 * 1024);
    let greedy = RequestBody::Exec(ExecRequest {
        output_cap_bytes: u64::MAX,
        stream_cap_bytes: Some(u64::MAX),
        ..ExecRequest::new("x")
    });
    let greedy = CallLimits::for_request(&greedy);
    assert_eq!(greedy.reply_bytes, MAX_FRAME_BYTES);
    assert_eq!(greedy.stream_bytes, MAX_STREAM_BYTES + 1024);
    assert_eq!(CallLimits::for_request(&RequestBody::Ping).stream_bytes, 0);
}

async fn hello_of(stream: Vec<u8>) -> HelloResult {
    let (hello_tx, hello_rx) = oneshot::channel();
    let alive = Arc::new(AtomicBool::new(true));
    read_frames(Box::pin(futures::stream::iter(chunks(stream))), PendingMap::default(), alive, hello_tx).await;
    hello_rx.await.unwrap_or_else(|_| Err("the reader dropped the hello".into()))
}

#[tokio::test]
async fn dockers_exec_error_instead_of_a_hello_is_reported_as_text_not_read_as_a_frame() {
    let said = "OCI runtime exec failed: exec failed: unable to start container process: exec: \"kiln-toolbox\": \
                executable file not found in $PATH: unknown\r\n";
    let err = hello_of(said.as_bytes().to_vec()).await.unwrap_err();
    assert!(err.contains("executable file not found"), "{err}");
    assert!(!err.contains("frame"), "{err}");
}

#[tokio::test]
async fn a_first_frame_that_is_no_hello_ends_the_start() {
    let err = hello_of(output(1, "x".into())).await.unwrap_err();
    assert!(err.starts_with("instead of a hello"), "{err}");
    let ok = hello_of(hello()).await.unwrap();
    assert_eq!((ok.pid, ok.missing.len()), (42, 0));
}
