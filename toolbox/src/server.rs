//! The request loop, independent of where the bytes come from: `main` runs
//! it on stdin/stdout, tests can run it on anything `Read`/`Write`.
//!
//! One thread reads frames and dispatches; each request other than `ping`
//! and `cancel` (answered at once) runs on a thread of its own, so read-only
//! file tools run concurrently while `exec` serializes itself. Every outgoing
//! message goes through one bounded channel to one writer thread: frames
//! never interleave, and a peer that stops reading stalls the producers
//! instead of growing memory.

use std::io::{self, BufWriter, Read, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use serde_json::Value;

use crate::exec::{ExecSession, OutputSink, SinkError};
use crate::framing::{FrameError, FrameReader, encode_json};
use crate::line_index::LineIndexCache;
use crate::protocol::{
    CancelResult, ErrorKind, Hello, Output, PROTOCOL_VERSION, ProtocolError, Reply, Request, RequestBody, Response,
    ServerMessage, ToolError,
};
use crate::{change_capture, edit, files, search, view};

/// Messages waiting for the writer. Output chunks are ≤ 16 KiB, so this
/// bounds the queue to a few MiB at worst.
const OUT_QUEUE: usize = 64;
/// How often exited orphans are reaped while no command runs.
const REAP_INTERVAL: Duration = Duration::from_secs(2);

pub const TOOLBOX_VERSION: &str = env!("CARGO_PKG_VERSION");

/// What request threads share.
struct Tools {
    /// Relative request paths are taken from here (the workspace).
    base: PathBuf,
    exec: ExecSession,
    views: LineIndexCache,
}

pub struct Server {
    tools: Arc<Tools>,
}

impl Server {
    /// A server whose relative paths and first command start in `base`.
    pub fn new(base: PathBuf) -> Self {
        Server { tools: Arc::new(Tools { exec: ExecSession::new(base.clone()), views: LineIndexCache::new(), base }) }
    }

    /// Serves until `input` ends, then kills any running command, waits for
    /// the requests in flight and returns.
    pub fn serve<R: Read, W: Write + Send + 'static>(&self, input: R, output: W) -> io::Result<()> {
        let (tx, rx) = mpsc::sync_channel(OUT_QUEUE);
        let writer = thread::spawn(move || write_loop(output, rx));
        let hello = Hello {
            protocol_version: PROTOCOL_VERSION,
            toolbox_version: TOOLBOX_VERSION.into(),
            pid: std::process::id(),
            missing: self.tools.exec.missing_programs(),
            shell: Some(self.tools.exec.shell()),
        };
        let _ = tx.send(ServerMessage::Hello(hello));

        let (stop_reaper, stopped) = mpsc::channel::<()>();
        let tools = self.tools.clone();
        let reaper = thread::spawn(move || {
            tools.exec.prepare_standby();
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(REAP_INTERVAL) {
                tools.exec.reap_idle();
                // Replaces a standby shell that a command killed.
                tools.exec.prepare_standby();
            }
        });

        let mut handlers: Vec<JoinHandle<()>> = Vec::new();
        let mut reader = FrameReader::new(input);
        let mut result = Ok(());
        while let Some(frame) = reader.read_frame() {
            match frame {
                Ok(body) => {
                    if let Some(h) = self.dispatch(&body, &tx) {
                        handlers.push(h);
                    }
                }
                Err(FrameError::Io(e)) => {
                    result = Err(e);
                    break;
                }
                Err(e) => protocol_error(&tx, e.to_string()),
            }
            handlers.retain(|h| !h.is_finished());
        }

        // The peer is gone: nobody will read a running command's result.
        self.tools.exec.cancel_all();
        self.tools.views.stop_counting();
        for h in handlers {
            let _ = h.join();
        }
        drop(stop_reaper);
        let _ = reaper.join();
        drop(tx);
        let _ = writer.join();
        result
    }

    /// Answers `ping` and `cancel` at once; starts a thread for anything else.
    fn dispatch(&self, body: &[u8], tx: &SyncSender<ServerMessage>) -> Option<JoinHandle<()>> {
        let value: Value = match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => {
                protocol_error(tx, format!("frame body is not JSON: {e}"));
                return None;
            }
        };
        let Some(id) = value.get("id").and_then(Value::as_u64) else {
            protocol_error(tx, "request has no numeric \"id\"".into());
            return None;
        };
        let request: Request = match serde_json::from_value(value) {
            Ok(r) => r,
            Err(e) => {
                let msg = e.to_string();
                // serde's wording for an unknown `type` tag: a newer worker.
                let kind =
                    if msg.contains("unknown variant") { ErrorKind::Unsupported } else { ErrorKind::InvalidRequest };
                respond(tx, id, Reply::Error(ToolError::new(kind, msg)));
                return None;
            }
        };
        match request.body {
            RequestBody::Ping => {
                respond(tx, id, Reply::Pong);
                None
            }
            RequestBody::Cancel(c) => {
                let was_running = self.tools.exec.cancel(c.target);
                respond(tx, id, Reply::Cancel(CancelResult { target: c.target, was_running }));
                None
            }
            body => self.spawn_handler(id, body, tx),
        }
    }

    /// Handles request `id` on a thread of its own, which sends the reply.
    fn spawn_handler(&self, id: u64, body: RequestBody, tx: &SyncSender<ServerMessage>) -> Option<JoinHandle<()>> {
        let tools = self.tools.clone();
        let thread_tx = tx.clone();
        // `thread::spawn` panics when no thread can be made (a fork
        // bomb at the pids limit); that must not take the toolbox down.
        let spawned = thread::Builder::new().spawn(move || {
            let tx = thread_tx;
            let is_exec = matches!(body, RequestBody::Exec(_));
            let reply = catch_unwind(AssertUnwindSafe(|| tools.handle(id, body, &tx))).unwrap_or_else(|_| {
                Reply::Error(ToolError::new(ErrorKind::Internal, "the toolbox failed while handling this request"))
            });
            respond(&tx, id, reply);
            if is_exec {
                // After the reply: the next command's shell starts
                // while the model thinks, not on this call's clock.
                tools.exec.prepare_standby();
            }
        });
        match spawned {
            Ok(handle) => Some(handle),
            Err(e) => {
                respond(tx, id, Reply::Error(crate::exec::spawn_error("starting a request thread", e)));
                None
            }
        }
    }
}

impl Tools {
    fn handle(&self, id: u64, body: RequestBody, tx: &SyncSender<ServerMessage>) -> Reply {
        let base = &self.base;
        let reply = match body {
            RequestBody::Exec(r) => self.exec.run(id, &r, &ChannelSink { id, tx }).map(Reply::Exec),
            RequestBody::View(r) => view::view(&self.views, base, &r).map(Reply::View),
            RequestBody::Write(r) => files::write(base, &r).map(Reply::Write),
            RequestBody::Edit(r) => edit::edit(base, &r).map(Reply::Edit),
            RequestBody::Ls(r) => files::ls(base, &r).map(Reply::Ls),
            RequestBody::Glob(r) => search::glob(base, &r).map(Reply::Glob),
            RequestBody::Grep(r) => search::grep(base, &r).map(Reply::Grep),
            RequestBody::Stat(r) => files::stat(base, &r).map(Reply::Stat),
            RequestBody::Capture(r) => change_capture::call::run(&r, &ChannelSink { id, tx }).map(Reply::Capture),
            RequestBody::Ping => Ok(Reply::Pong),
            RequestBody::Cancel(c) => {
                Ok(Reply::Cancel(CancelResult { target: c.target, was_running: self.exec.cancel(c.target) }))
            }
        };
        reply.unwrap_or_else(Reply::Error)
    }
}

/// Streams an exec's output as `Output` frames of its request.
struct ChannelSink<'a> {
    id: u64,
    tx: &'a SyncSender<ServerMessage>,
}

impl OutputSink for ChannelSink<'_> {
    fn try_send(&self, data: String) -> Result<(), SinkError> {
        match self.tx.try_send(ServerMessage::Output(Output { id: self.id, data })) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(ServerMessage::Output(o))) => Err(SinkError::Full(o.data)),
            Err(_) => Err(SinkError::Closed),
        }
    }

    fn send(&self, data: String) -> Result<(), SinkError> {
        self.tx.send(ServerMessage::Output(Output { id: self.id, data })).map_err(|_| SinkError::Closed)
    }
}

fn respond(tx: &SyncSender<ServerMessage>, id: u64, result: Reply) {
    let _ = tx.send(ServerMessage::Response(Response { id, result }));
}

fn protocol_error(tx: &SyncSender<ServerMessage>, message: String) {
    let _ = tx.send(ServerMessage::ProtocolError(ProtocolError { message }));
}

/// Writes every message as a frame, flushing whenever the queue runs dry.
/// After a write error (the peer is gone) it keeps receiving and dropping,
/// so no producer ever blocks on a dead writer.
fn write_loop<W: Write>(output: W, rx: Receiver<ServerMessage>) {
    let mut out = BufWriter::with_capacity(64 * 1024, output);
    let mut broken = false;
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(msg) = next {
            if !broken && out.write_all(&frame_of(msg)).is_err() {
                broken = true;
            }
            next = rx.try_recv().ok();
        }
        if !broken && out.flush().is_err() {
            broken = true;
        }
    }
}

/// The frame for `msg`; a message too large for a frame (which the result
/// caps should make impossible) becomes an internal error for its request.
fn frame_of(msg: ServerMessage) -> Vec<u8> {
    match encode_json(&msg) {
        Ok(frame) => frame,
        Err(e) => {
            let message = format!("the toolbox could not send its reply: {e}");
            let fallback = match msg {
                ServerMessage::Response(Response { id, .. }) => ServerMessage::Response(Response {
                    id,
                    result: Reply::Error(ToolError::new(ErrorKind::Internal, message)),
                }),
                _ => ServerMessage::ProtocolError(ProtocolError { message }),
            };
            encode_json(&fallback).unwrap_or_default()
        }
    }
}
