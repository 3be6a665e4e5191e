//! The worker's side of the toolbox protocol: one long-lived `kiln-toolbox`
//! process per container, reached over the stdin/stdout of one attached
//! exec. A reader task decodes frames and hands each `Response` to the call
//! waiting for it (by request id) and each `Output` chunk to that call's
//! stream; callers write their request frames to stdin themselves.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use futures::{Stream, StreamExt};
use kiln_toolbox::framing::{FrameDecoder, encode_json};
use kiln_toolbox::protocol::{PROTOCOL_VERSION, Reply, Request, RequestBody, ServerMessage};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;

use super::WORKSPACE;

/// How long a fresh toolbox may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// stderr is diagnostics only; keep a log line short.
const STDERR_LOG_CHARS: usize = 500;

#[derive(Debug, thiserror::Error)]
pub enum ToolboxError {
    /// The process ended (killed, crashed, OOM) while the call was in flight.
    #[error("the toolbox process in the sandbox exited during the call")]
    Died,
    #[error("the toolbox did not start: {0}")]
    Start(String),
    #[error("docker: {0}")]
    Docker(#[from] bollard::errors::Error),
    #[error("writing to the toolbox failed: {0}")]
    Io(#[from] std::io::Error),
    /// An answer that does not fit the request (a bug or version skew).
    #[error("unexpected answer from the toolbox: {0}")]
    Unexpected(String),
}

/// Where a running exec's output chunks go. Called from the reader task, so
/// it must not block.
pub type OutputSink = Arc<dyn Fn(String) + Send + Sync>;

struct Pending {
    reply: oneshot::Sender<Reply>,
    output: Option<OutputSink>,
}

type PendingMap = Arc<Mutex<HashMap<u64, Pending>>>;
type Input = Pin<Box<dyn AsyncWrite + Send>>;

/// One running toolbox process.
pub struct ToolboxConn {
    next_id: AtomicU64,
    pending: PendingMap,
    input: tokio::sync::Mutex<Input>,
    /// Cleared by the reader when the process's output ends.
    alive: Arc<std::sync::atomic::AtomicBool>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for ToolboxConn {
    fn drop(&mut self) {
        // Dropping `input` closes the toolbox's stdin, which makes it kill a
        // running command and exit; the reader has nothing left to do.
        self.reader.abort();
    }
}

impl ToolboxConn {
    /// Starts `command` in the container and waits for its hello.
    pub async fn start(docker: &Docker, container: &str, command: &str, user: &str) -> Result<Self, ToolboxError> {
        let exec = docker
            .create_exec(
                container,
                CreateExecOptions {
                    cmd: Some(vec![command]),
                    attach_stdin: Some(true),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    // A TTY would mangle the binary frames.
                    tty: Some(false),
                    user: Some(user),
                    working_dir: Some(WORKSPACE),
                    ..Default::default()
                },
            )
            .await?;
        let StartExecResults::Attached { output, input } = docker.start_exec(&exec.id, None).await? else {
            return Err(ToolboxError::Start("docker did not attach to the toolbox".into()));
        };
        let pending: PendingMap = Arc::default();
        let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (hello_tx, hello_rx) = oneshot::channel();
        let reader = tokio::spawn(read_frames(output, pending.clone(), alive.clone(), hello_tx));
        let conn =
            ToolboxConn { next_id: AtomicU64::new(1), pending, input: tokio::sync::Mutex::new(input), alive, reader };
        match tokio::time::timeout(HELLO_TIMEOUT, hello_rx).await {
            Ok(Ok(version)) if version == PROTOCOL_VERSION => Ok(conn),
            Ok(Ok(version)) => Err(ToolboxError::Start(format!(
                "it speaks protocol version {version}, this worker speaks {PROTOCOL_VERSION}"
            ))),
            Ok(Err(_)) => Err(ToolboxError::Start(format!("{command} exited before saying hello"))),
            Err(_) => Err(ToolboxError::Start(format!("no hello from {command} within {HELLO_TIMEOUT:?}"))),
        }
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Sends one request and waits for its response; `output` receives the
    /// chunks of a running command.
    pub async fn call(&self, body: RequestBody, output: Option<OutputSink>) -> Result<Reply, ToolboxError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = encode_json(&Request { id, body })?;
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id, Pending { reply: tx, output });
        // Checked after registering: a reader that ended before this point
        // has already drained the map, and one ending later drains it too.
        if !self.is_alive() {
            lock(&self.pending).remove(&id);
            return Err(ToolboxError::Died);
        }
        let written = {
            let mut input = self.input.lock().await;
            match input.write_all(&frame).await {
                Ok(()) => input.flush().await,
                Err(e) => Err(e),
            }
        };
        if let Err(e) = written {
            lock(&self.pending).remove(&id);
            return Err(if self.is_alive() { e.into() } else { ToolboxError::Died });
        }
        rx.await.map_err(|_| ToolboxError::Died)
    }
}

fn lock(map: &PendingMap) -> std::sync::MutexGuard<'_, HashMap<u64, Pending>> {
    // A panic while holding this lock cannot leave the map inconsistent
    // (single inserts and removes), so a poisoned lock is still usable.
    map.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Decodes the toolbox's stdout until it ends, then fails every waiting call.
async fn read_frames(
    mut output: Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>,
    pending: PendingMap,
    alive: Arc<std::sync::atomic::AtomicBool>,
    hello: oneshot::Sender<u32>,
) {
    let mut hello = Some(hello);
    let mut decoder = FrameDecoder::default();
    while let Some(chunk) = output.next().await {
        match chunk {
            Ok(LogOutput::StdOut { message }) => decoder.push(&message),
            Ok(LogOutput::StdErr { message }) => {
                let text = String::from_utf8_lossy(&message);
                let text: String = text.chars().take(STDERR_LOG_CHARS).collect();
                tracing::debug!(stderr = %text.trim_end(), "toolbox");
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
                Ok(body) => body,
                Err(e) => {
                    tracing::warn!(error = %e, "bad frame from the toolbox");
                    continue;
                }
            };
            match serde_json::from_slice::<ServerMessage>(&body) {
                Ok(ServerMessage::Hello(h)) => {
                    if let Some(tx) = hello.take() {
                        let _ = tx.send(h.protocol_version);
                    }
                }
                Ok(ServerMessage::Output(o)) => {
                    if let Some(Pending { output: Some(sink), .. }) = lock(&pending).get(&o.id) {
                        sink(o.data);
                    }
                }
                Ok(ServerMessage::Response(r)) => {
                    if let Some(p) = lock(&pending).remove(&r.id) {
                        let _ = p.reply.send(r.result);
                    }
                }
                Ok(ServerMessage::ProtocolError(e)) => {
                    tracing::warn!(message = %e.message, "the toolbox reported a protocol error");
                }
                Err(e) => tracing::warn!(error = %e, "unreadable message from the toolbox"),
            }
        }
    }
    alive.store(false, Ordering::Release);
    // Dropping the senders wakes every waiting call with `Died`.
    lock(&pending).clear();
}
