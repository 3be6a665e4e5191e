//! Reading the toolbox's stdout: frames in, each `Response` to the call
//! waiting for it, each `Output` chunk to that call's stream.
//!
//! Everything the toolbox sends is hostile input (it runs in the sandbox),
//! so the caps the toolbox applies to itself are enforced here again:
//! a frame may be at most [`MAX_FRAME_BYTES`] (a bigger one ends the
//! connection: the stream is no longer trusted), a call streams at most its
//! stream cap (later chunks are dropped and its result says so), and each
//! reply kind has a size bound (over it, the call gets a clear error).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kiln_toolbox::framing::{FrameDecoder, FrameError};
use kiln_toolbox::protocol::{Reply, RequestBody, ServerMessage};
use tokio::sync::oneshot;

use super::backend::ExecChunk;
use super::toolbox::{OutputSink, ToolboxError};

/// Largest frame the worker accepts from a toolbox. The biggest legitimate
/// reply is a listing (1000 glob paths or ls entries) or a 100 KiB view,
/// JSON-escaped: well under this, and far under the protocol's 16 MiB.
pub const MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;
/// Output a call may stream when its request names no cap (and the most it
/// may name): matches the bash tool's cap.
pub const MAX_STREAM_BYTES: u64 = 1024 * 1024;
/// Room beyond a call's stream cap for the note the toolbox appends when it
/// stops streaming.
const STREAM_NOTE_SLACK: u64 = 1024;
/// Room beyond a capture's bound: one more chunk, so that going past the
/// bound is seen by the sink (the capture then fails), never cut here.
const CAPTURE_SLACK: u64 = 64 * 1024;
/// A capture's reply: its exit status and the start of its stderr.
const CAPTURE_REPLY_BYTES: usize = 64 * 1024;
/// JSON escaping can grow text up to six times (`\u001b`); plus the
/// reply's other fields.
const ESCAPE_FACTOR: u64 = 6;
const REPLY_OVERHEAD: u64 = 64 * 1024;
/// stderr is diagnostics only; keep a log line short.
const STDERR_LOG_CHARS: usize = 500;

/// What a call may receive, derived from its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallLimits {
    /// Bytes of `Output` chunks passed on to the call's sink.
    pub stream_bytes: u64,
    /// Size of the `Response` frame body.
    pub reply_bytes: usize,
}

impl CallLimits {
    pub fn for_request(body: &RequestBody) -> Self {
        let bounded = |text_bytes: u64| {
            let n = text_bytes.saturating_mul(ESCAPE_FACTOR).saturating_add(REPLY_OVERHEAD);
            usize::try_from(n).unwrap_or(usize::MAX).min(MAX_FRAME_BYTES)
        };
        match body {
            RequestBody::Exec(e) => CallLimits {
                stream_bytes: e.stream_cap_bytes.unwrap_or(MAX_STREAM_BYTES).min(MAX_STREAM_BYTES) + STREAM_NOTE_SLACK,
                reply_bytes: bounded(e.output_cap_bytes),
            },
            RequestBody::View(v) => CallLimits { stream_bytes: 0, reply_bytes: bounded(v.max_bytes) },
            // Its output is the patch, base64 in chunks: the caller's sink
            // bounds the decoded bytes exactly; this only keeps the reader
            // from cutting a chunk before the sink sees the overflow.
            RequestBody::Capture(c) => CallLimits {
                stream_bytes: c.max_bytes.saturating_add(CAPTURE_SLACK).saturating_mul(4) / 3,
                reply_bytes: CAPTURE_REPLY_BYTES,
            },
            _ => CallLimits { stream_bytes: 0, reply_bytes: MAX_FRAME_BYTES },
        }
    }
}

/// A call waiting for its response.
pub(super) struct Pending {
    pub reply: oneshot::Sender<Result<Reply, ToolboxError>>,
    pub output: Option<OutputSink>,
    pub limits: CallLimits,
    /// Bytes passed on to `output` so far.
    pub streamed: u64,
    /// Some output was dropped (over the cap, or the queue was full).
    pub dropped: bool,
}

impl Pending {
    pub fn new(
        reply: oneshot::Sender<Result<Reply, ToolboxError>>,
        output: Option<OutputSink>,
        limits: CallLimits,
    ) -> Self {
        Pending { reply, output, limits, streamed: 0, dropped: false }
    }

    /// Passes on as much of `data` as the cap allows.
    fn offer(&mut self, mut data: String) {
        let Some(sink) = &self.output else { return };
        let room = self.limits.stream_bytes.saturating_sub(self.streamed);
        if data.len() as u64 > room {
            self.dropped = true;
            let mut cut = usize::try_from(room).unwrap_or(usize::MAX).min(data.len());
            while !data.is_char_boundary(cut) {
                cut -= 1;
            }
            data.truncate(cut);
        }
        if data.is_empty() {
            return;
        }
        let len = data.len() as u64;
        if sink(data) {
            self.streamed += len;
        } else {
            self.dropped = true;
        }
    }

    /// The reply as the call gets it: the worker's note on dropped output
    /// added to an exec's result.
    fn finish(self, reply: Reply) {
        let reply = match reply {
            Reply::Exec(mut r) if self.dropped => {
                let note = format!(
                    "the worker stopped streaming this command's output after {} bytes; the result keeps the head \
                     and the tail",
                    self.streamed
                );
                r.note = Some(match r.note.take() {
                    Some(n) => format!("{n}; {note}"),
                    None => note,
                });
                Reply::Exec(r)
            }
            other => other,
        };
        let _ = self.reply.send(Ok(reply));
    }
}

pub(super) type PendingMap = Arc<Mutex<HashMap<u64, Pending>>>;

pub(super) fn lock(map: &PendingMap) -> std::sync::MutexGuard<'_, HashMap<u64, Pending>> {
    // A panic while holding this lock cannot leave the map inconsistent
    // (single inserts and removes), so a poisoned lock is still usable.
    map.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What the toolbox said in its hello.
#[derive(Debug, Clone)]
pub(super) struct HelloInfo {
    pub protocol_version: u32,
    /// Its pid in the container, to kill it from outside when it is stuck.
    pub pid: u32,
    /// Programs the image lacks (bounded: it is the sandbox talking).
    pub missing: Vec<String>,
    /// The shell its commands run with (`None`: an older toolbox).
    pub shell: Option<kiln_toolbox::protocol::SessionShell>,
}

/// How the start ended: the hello, or what came instead of one (Docker's
/// own error text, such as `OCI runtime exec failed: ... not found`, when
/// the command could not be started at all).
pub(super) type HelloResult = Result<HelloInfo, String>;

/// What is kept of the bytes that came instead of a hello.
const NOT_A_HELLO_CHARS: usize = 300;
/// Names of missing programs passed on, and their length.
const MISSING_MAX: usize = 4;
const MISSING_NAME_CHARS: usize = 64;

pub(super) type Output = super::backend::ExecStream;

/// Decodes the toolbox's stdout until it ends (or breaks the protocol
/// beyond repair), then fails every waiting call.
pub(super) async fn read_frames(
    mut output: Output,
    pending: PendingMap,
    alive: Arc<AtomicBool>,
    hello: oneshot::Sender<HelloResult>,
) {
    let mut hello = Some(hello);
    let mut decoder = FrameDecoder::new(MAX_FRAME_BYTES);
    let mut broken: Option<String> = None;
    // Until the hello: the raw bytes, for when they are no frames at all.
    let mut before_hello: Vec<u8> = Vec::new();
    'stream: while let Some(chunk) = output.next().await {
        match chunk {
            Ok(ExecChunk::Stdout(message)) => {
                if hello.is_some() {
                    keep_before_hello(&mut before_hello, &message);
                }
                decoder.push(&message)
            }
            Ok(ExecChunk::Stderr(message)) => {
                log_stderr(&message);
                continue;
            }
            Ok(_) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "reading from the toolbox failed");
                break;
            }
        }
        while let Some(frame) = decoder.next_frame() {
            let body = match frame {
                Ok(body) if hello.is_some() && !is_hello(&body) => {
                    not_a_hello(&mut hello, &before_hello);
                    break 'stream;
                }
                Err(_) if hello.is_some() => {
                    // Not a toolbox talking (Docker's exec error, "OCI ...",
                    // read as a frame length): say what it said.
                    not_a_hello(&mut hello, &before_hello);
                    break 'stream;
                }
                Ok(body) => body,
                Err(e @ FrameError::TooLarge { .. }) => {
                    // Which call it was for is unknown, and a toolbox that
                    // sends this is not behaving: stop listening to it.
                    tracing::warn!(error = %e, "oversize frame from the toolbox; dropping the connection");
                    broken = Some(format!("the sandbox's tool process sent a {e}"));
                    break 'stream;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "bad frame from the toolbox");
                    continue;
                }
            };
            dispatch(&body, &pending, &mut hello);
        }
    }
    alive.store(false, Ordering::Release);
    fail_waiting(&pending, broken.as_deref());
}

/// Keeps the start of what came before the hello, for when it is no frame
/// at all.
#[inline]
fn keep_before_hello(before_hello: &mut Vec<u8>, message: &[u8]) {
    if before_hello.len() < NOT_A_HELLO_CHARS {
        before_hello.extend_from_slice(&message[..message.len().min(NOT_A_HELLO_CHARS)]);
    }
}

/// The toolbox's stderr goes to the worker's debug log, cut short.
fn log_stderr(message: &[u8]) {
    let text = String::from_utf8_lossy(message);
    let text: String = text.chars().take(STDERR_LOG_CHARS).collect();
    tracing::debug!(stderr = %text.trim_end(), "toolbox");
}

/// Ends every call still waiting for a reply: with the reason the toolbox
/// was dropped (`broken`), else as died.
fn fail_waiting(pending: &PendingMap, broken: Option<&str>) {
    let waiting: Vec<Pending> = lock(pending).drain().map(|(_, p)| p).collect();
    for p in waiting {
        match broken {
            Some(reason) => {
                let _ = p.reply.send(Err(ToolboxError::Misbehaved(reason.to_owned())));
            }
            // Dropping the sender wakes the call with `Died`.
            None => drop(p),
        }
    }
}

fn is_hello(body: &[u8]) -> bool {
    matches!(serde_json::from_slice::<ServerMessage>(body), Ok(ServerMessage::Hello(_)))
}

/// Ends the start with what came instead of a hello, as text.
fn not_a_hello(hello: &mut Option<oneshot::Sender<HelloResult>>, raw: &[u8]) {
    let text: String = String::from_utf8_lossy(raw).chars().take(NOT_A_HELLO_CHARS).collect();
    let text = text.trim();
    let said = if text.is_empty() { "no hello".to_owned() } else { format!("instead of a hello: {text}") };
    if let Some(tx) = hello.take() {
        let _ = tx.send(Err(said));
    }
}

/// Hands one frame body to whoever waits for it.
fn dispatch(body: &[u8], pending: &PendingMap, hello: &mut Option<oneshot::Sender<HelloResult>>) {
    match serde_json::from_slice::<ServerMessage>(body) {
        Ok(ServerMessage::Hello(h)) => {
            if let Some(tx) = hello.take() {
                let missing = h
                    .missing
                    .into_iter()
                    .take(MISSING_MAX)
                    .map(|m| m.chars().take(MISSING_NAME_CHARS).collect())
                    .collect();
                let _ = tx.send(Ok(HelloInfo {
                    protocol_version: h.protocol_version,
                    pid: h.pid,
                    missing,
                    shell: h.shell,
                }));
            }
        }
        Ok(ServerMessage::Output(o)) => {
            if let Some(p) = lock(pending).get_mut(&o.id) {
                p.offer(o.data);
            }
        }
        Ok(ServerMessage::Response(r)) => {
            let Some(p) = lock(pending).remove(&r.id) else { return };
            if body.len() > p.limits.reply_bytes {
                let message = format!(
                    "the sandbox's tool process sent a reply of {} bytes, over the worker's limit of {} for this \
                     request",
                    body.len(),
                    p.limits.reply_bytes
                );
                let _ = p.reply.send(Err(ToolboxError::Misbehaved(message)));
            } else {
                p.finish(r.result);
            }
        }
        Ok(ServerMessage::ProtocolError(e)) => {
            tracing::warn!(message = %e.message, "the toolbox reported a protocol error");
        }
        Err(e) => tracing::warn!(error = %e, "unreadable message from the toolbox"),
    }
}

#[cfg(test)]
#[path = "toolbox_reader_tests.rs"]
mod tests;
