//! The worker's side of the toolbox protocol: one long-lived `kiln-toolbox`
//! process per container, reached over the stdin/stdout of one attached
//! exec. A reader task ([`super::toolbox_reader`]) decodes frames and hands
//! each `Response` to the call waiting for it (by request id) and each
//! `Output` chunk to that call's stream; callers write their request frames
//! to stdin themselves.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kiln_toolbox::framing::encode_json;
use kiln_toolbox::protocol::{PROTOCOL_VERSION, Reply, Request, RequestBody, SessionShell};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;

use super::WORKSPACE;
use super::backend::{Backend, BackendError, Exec, ExecSpec, Stopped};
use super::toolbox_reader::{CallLimits, Pending, PendingMap, lock, read_frames};
use super::toolbox_watch::{Watched, watch};

/// How long a fresh toolbox may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// When the toolbox's stream ends: how many times, and how far apart, the
/// engine is asked whether the whole sandbox stopped (about a second).
const STOP_CHECKS: u32 = 5;
const STOP_CHECK_PAUSE: Duration = Duration::from_millis(200);
/// Who the toolbox exec runs as. Root, so that commands (which it starts
/// as the sandbox user, named with `--user`) cannot signal, trace or write
/// to it; the container grants root only `CAP_SETUID`, `CAP_SETGID` and
/// `CAP_KILL`, and the toolbox does its file work as the sandbox user.
pub const TOOLBOX_EXEC_USER: &str = "0:0";

#[derive(Debug, thiserror::Error)]
pub enum ToolboxError {
    /// The process ended (killed, crashed, OOM) while the call was in flight.
    #[error("the toolbox process in the sandbox exited during the call")]
    Died,
    /// The whole sandbox stopped (or was removed) while the call was in
    /// flight: nothing more will run in it.
    #[error("{0} during the tool call")]
    SandboxStopped(Stopped),
    #[error("the toolbox did not start: {0}")]
    Start(String),
    /// What the backend said (`docker: …`).
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("writing to the toolbox failed: {0}")]
    Io(#[from] std::io::Error),
    /// An answer that does not fit the request (a bug or version skew).
    #[error("unexpected answer from the toolbox: {0}")]
    Unexpected(String),
    /// The toolbox broke one of the worker's own caps (an oversize frame
    /// or reply): hostile or broken, so the call fails.
    #[error("{0}")]
    Misbehaved(String),
}

/// Where a running exec's output chunks go. Called from the reader task, so
/// it must not block; `false`: the chunk was dropped (the queue is full).
pub type OutputSink = Arc<dyn Fn(String) -> bool + Send + Sync>;

type Input = Pin<Box<dyn AsyncWrite + Send>>;

/// One running toolbox process.
pub struct ToolboxConn {
    next_id: AtomicU64,
    pending: PendingMap,
    input: tokio::sync::Mutex<Input>,
    /// Cleared by the reader when the process's output ends.
    alive: Arc<std::sync::atomic::AtomicBool>,
    reader: tokio::task::JoinHandle<()>,
    /// Ends waiting calls when the sandbox stops (see `toolbox_watch`).
    watch: tokio::task::JoinHandle<()>,
    /// To ask how the sandbox ended when the toolbox's stream does.
    backend: Backend,
    sandbox: String,
    /// The toolbox's pid in the container (from its hello).
    pid: u32,
    /// What the image lacks, from its hello.
    missing: Vec<String>,
    /// The shell its commands run with, from its hello (`None`: a toolbox
    /// too old to say).
    shell: Option<SessionShell>,
}

impl Drop for ToolboxConn {
    fn drop(&mut self) {
        // Dropping `input` closes the toolbox's stdin, which makes it kill a
        // running command and exit; the reader has nothing left to do.
        self.reader.abort();
        self.watch.abort();
    }
}

impl ToolboxConn {
    /// Starts `command` in the container, as root acting for `user` (see
    /// [`TOOLBOX_EXEC_USER`]), and waits for its hello.
    pub async fn start(backend: &Backend, sandbox: &str, command: &str, user: &str) -> Result<Self, ToolboxError> {
        // (Never a TTY, which would mangle the binary frames.)
        let spec = ExecSpec {
            argv: vec![command, "--user", user],
            user: TOOLBOX_EXEC_USER,
            cwd: Some(WORKSPACE),
            stdin: true,
            ..Default::default()
        };
        // Listening before the toolbox starts: no stop after it goes unheard.
        let feed = backend.stop_feed();
        let Exec { output, input, .. } = backend.exec(sandbox, &spec).await?;
        let pending: PendingMap = Arc::default();
        let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (hello_tx, hello_rx) = oneshot::channel();
        let reader = tokio::spawn(read_frames(output, pending.clone(), alive.clone(), hello_tx));
        let watch = tokio::spawn(watch(Watched {
            backend: backend.clone(),
            sandbox: sandbox.to_owned(),
            pending: pending.clone(),
            alive: alive.clone(),
            reader: reader.abort_handle(),
            feed,
            unsure: false,
        }));
        let mut conn = ToolboxConn {
            next_id: AtomicU64::new(1),
            pending,
            input: tokio::sync::Mutex::new(input),
            alive,
            reader,
            watch,
            backend: backend.clone(),
            sandbox: sandbox.to_owned(),
            pid: 0,
            missing: Vec::new(),
            shell: None,
        };
        match tokio::time::timeout(HELLO_TIMEOUT, hello_rx).await {
            Ok(Ok(Ok(hello))) if hello.protocol_version == PROTOCOL_VERSION => {
                conn.pid = hello.pid;
                conn.missing = hello.missing;
                conn.shell = hello.shell;
                Ok(conn)
            }
            Ok(Ok(Err(said))) => Err(ToolboxError::Start(format!("{command}: {said}"))),
            Ok(Ok(Ok(hello))) => Err(ToolboxError::Start(format!(
                "it speaks protocol version {}, this worker speaks {PROTOCOL_VERSION}",
                hello.protocol_version
            ))),
            Ok(Err(_)) => Err(ToolboxError::Start(format!("{command} exited before saying hello"))),
            Err(_) => Err(ToolboxError::Start(format!("no hello from {command} within {HELLO_TIMEOUT:?}"))),
        }
    }

    /// The toolbox's pid in the container.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Programs the image lacks, as the toolbox found at its start.
    pub fn missing(&self) -> &[String] {
        &self.missing
    }

    /// The shell its commands run with; `None` from a toolbox older than
    /// that field (it runs bash, or names it in [`Self::missing`]).
    pub fn shell(&self) -> Option<SessionShell> {
        self.shell
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Sends one request and waits for its response; `output` receives the
    /// chunks of a running command.
    pub async fn call(&self, body: RequestBody, output: Option<OutputSink>) -> Result<Reply, ToolboxError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let limits = CallLimits::for_request(&body);
        let frame = encode_json(&Request { id, body })?;
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id, Pending::new(tx, output, limits));
        // Checked after registering: a reader that ended before this point
        // has already drained the map, and one ending later drains it too.
        if !self.is_alive() {
            lock(&self.pending).remove(&id);
            return Err(self.why_died().await);
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
            return Err(if self.is_alive() { e.into() } else { self.why_died().await });
        }
        match rx.await {
            Ok(Err(ToolboxError::Died)) | Err(_) => Err(self.why_died().await),
            Ok(result) => result,
        }
    }

    /// What to say of a toolbox whose stream ended: that its sandbox
    /// stopped, when it did (a killed or crashed container ends the stream
    /// too), else that the toolbox itself died.
    /// The engine may record the container's end a moment after the exec's
    /// stream ends, so a running one is asked again a few times.
    pub async fn why_died(&self) -> ToolboxError {
        for _ in 0..STOP_CHECKS {
            match self.backend.stopped(&self.sandbox).await {
                Ok(Some(how)) => return ToolboxError::SandboxStopped(how),
                Ok(None) => tokio::time::sleep(STOP_CHECK_PAUSE).await,
                Err(_) => break,
            }
        }
        ToolboxError::Died
    }
}
