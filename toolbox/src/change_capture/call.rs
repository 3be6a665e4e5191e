//! The capture as a request on the toolbox's connection: the toolbox runs
//! its own `capture` subcommand (this module's parent) as the command user
//! and streams what it prints back as `Output` chunks.
//!
//! Why not an exec through the engine, as the worker can also do: a Docker
//! exec (create, attach, start, inspect; the runtime entering the
//! container's namespaces) is tens of milliseconds, as much as git's own
//! work on a 10,000-file repository, while the toolbox's connection is
//! already open (issue 28's capture figure). The subcommand runs as a
//! process of its own, as the user, exactly as the exec would run it: the
//! toolbox itself never touches the repository.
//!
//! The output is the patch, so binary: each chunk is the base64 of a run of
//! bytes. The worker bounds what it takes again (what the sandbox sends is
//! hostile); the bound here only stops a capture that would never be read.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rustix::process::Pid;

use crate::exec::process_group::{kill_group, reap_group};
use crate::exec::{OutputSink, spawn_error};
use crate::protocol::{CaptureRequest, CaptureResult, ErrorKind, ToolError};

/// Bytes of stdout per `Output` chunk: 16 KiB once in base64, the size of
/// an exec's chunks.
const CHUNK: usize = 12 * 1024;
/// How much of stderr the result keeps (the worker keeps less).
const STDERR_KEPT: u64 = 4096;

/// Runs the capture `request` asks for, its stdout sent to `sink`.
pub fn run(request: &CaptureRequest, sink: &dyn OutputSink) -> Result<CaptureResult, ToolError> {
    // Refused here, with the subcommand's own words, before anything runs.
    super::Request::parse(&request.args).map_err(|e| ToolError::new(ErrorKind::InvalidRequest, e))?;
    // This very binary: the toolbox that answers is the one whose capture
    // the worker asked for.
    let program = std::env::current_exe().map_err(|e| internal("finding the toolbox's own binary", e))?;
    let mut child = start(&program, &request.args)?;
    // The capture leads its own group (`start`).
    let group = Pid::from_child(&child);
    let stderr = child.stderr.take().and_then(|err| spawn_thread(move || read_start(err, STDERR_KEPT)));
    let (finished, done) = mpsc::channel::<()>();
    let timeout = Duration::from_millis(request.timeout_ms);
    // Kills the capture at its timeout: its stdout may never end otherwise.
    let watchdog = spawn_thread(move || match done.recv_timeout(timeout) {
        Err(RecvTimeoutError::Timeout) => {
            kill_group(group);
            true
        }
        _ => false,
    });
    let overflow = match child.stdout.take() {
        Some(out) => !relay(out, request.max_bytes, sink),
        None => false,
    };
    if overflow {
        kill_group(group);
    }
    let status = child.wait();
    drop(finished);
    let timed_out = matches!(watchdog.map(JoinHandle::join), Some(Ok(true)));
    if timed_out || overflow {
        // The killed git processes were reparented to the toolbox (the
        // sandbox's subreaper): reaped here, after `wait` took the leader.
        reap_group(group);
    }
    let stderr = stderr.and_then(|h| h.join().ok()).unwrap_or_default();
    let exit_code = status.map_err(|e| internal("waiting for the capture", e))?.code();
    Ok(CaptureResult { exit_code, timed_out, overflow, stderr })
}

/// `kiln-toolbox capture ARGS` as the command user, in a process group of
/// its own (so a timeout kills its git too), stdin closed.
fn start(program: &Path, args: &[String]) -> Result<Child, ToolError> {
    let mut command = Command::new(program);
    command
        .arg("capture")
        .args(args)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if let Some(user) = crate::identity::run_as() {
        // As an exec's shell is started (`exec::shell`): raw system calls
        // only between fork and exec.
        // SAFETY: `become_user` makes raw system calls only (no allocation,
        // no locks), as a child between fork and exec must.
        unsafe {
            command.pre_exec(|| crate::identity::become_user(user));
        }
    }
    command.spawn().map_err(|e| spawn_error("starting the capture", e))
}

/// Sends `out` to `sink` in base64 chunks; false when it went past `max`
/// bytes (or nobody reads any more), true at its end.
fn relay(mut out: impl Read, max: u64, sink: &dyn OutputSink) -> bool {
    let mut buf = vec![0; CHUNK];
    let mut sent: u64 = 0;
    loop {
        let n = match out.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // Its stdout broke: the exit status says the rest.
            Err(_) => return true,
        };
        sent += n as u64;
        if sent > max || sink.send(STANDARD.encode(&buf[..n])).is_err() {
            return false;
        }
    }
}

/// The first `keep` bytes of `from`, as text; the rest is read and dropped
/// (a full stderr pipe would stop the capture).
fn read_start(mut from: impl Read, keep: u64) -> String {
    let mut kept = Vec::new();
    let _ = from.by_ref().take(keep).read_to_end(&mut kept);
    let _ = std::io::copy(&mut from, &mut std::io::sink());
    String::from_utf8_lossy(&kept).into_owned()
}

/// A helper thread; `None` when none can be made (the capture then goes on
/// without it: no stderr kept, or no timeout but the worker's own).
fn spawn_thread<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<JoinHandle<T>> {
    thread::Builder::new().spawn(work).ok()
}

fn internal(what: &str, e: std::io::Error) -> ToolError {
    ToolError::new(ErrorKind::Internal, format!("{what}: {e}"))
}
