//! Watching a running command: reading its output pipe, noticing its exit,
//! and killing its process group when the deadline passes or it is cancelled.
//!
//! One thread does all of it with `poll`: the output pipe and the shell's
//! pidfd wake it at once; otherwise it wakes every [`TICK`] to check the
//! clock and the cancel flag. What to do with the bytes read is the
//! [`Collector`]'s job.

use std::io::{self, PipeReader, Read};
use std::os::fd::OwnedFd;
use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::process::{Pid, PidfdFlags};

use super::capture::{CHUNK, Collector};
use super::process_group::{kill_group, reap_group};

/// How often a running command is checked for cancellation when nothing
/// else wakes us (exit and output wake us at once).
const TICK: Duration = Duration::from_millis(25);
/// After the shell exits, how long we keep collecting output that is still
/// in the pipe (background children may keep writing; they are not waited for).
const DRAIN_LIMIT: Duration = Duration::from_millis(200);

/// Why a command was killed.
pub(super) enum Kill {
    TimedOut,
    Cancelled,
}

/// Runs the command to its end: collects output, enforces the deadline and
/// cancellation (killing the whole process group), and returns how it ended.
pub(super) fn supervise(
    mut child: Child,
    mut reader: PipeReader,
    deadline: Instant,
    cancel: &AtomicBool,
    out: &mut Collector<'_>,
) -> io::Result<(ExitStatus, Option<Kill>)> {
    let pgid = Pid::from_child(&child);
    // A pidfd becomes readable when the shell exits, so exit wakes the poll
    // at once even while background children keep the output pipe open.
    let pidfd = rustix::process::pidfd_open(pgid, PidfdFlags::empty()).ok();
    let mut buf = vec![0u8; CHUNK];
    let mut kill = None;
    let mut pipe_open = true;
    let mut backoff = Duration::from_millis(1);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if kill.is_none() {
            kill = kill_due(cancel, deadline);
            if kill.is_some() {
                kill_group(pgid);
            }
        }
        out.flush();
        let wait = if kill.is_some() { TICK } else { TICK.min(deadline.saturating_duration_since(Instant::now())) };
        if !out.ready() {
            // The consumer is behind: leave the pipe alone (the command blocks
            // on it) but keep watching the clock.
            std::thread::sleep(wait.min(Duration::from_millis(5)));
            continue;
        }
        if wait_readable(&reader, pipe_open, pidfd.as_ref(), wait, &mut backoff)? {
            match reader.read(&mut buf) {
                Ok(0) => pipe_open = false,
                Ok(n) => out.push(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    };
    if kill.is_some() {
        reap_group(pgid);
    }
    if pipe_open && drain(&mut reader, &mut buf, out)? {
        keep_drained(reader);
    }
    Ok((status, kill))
}

/// Whether the command must be killed now, and why; a cancel wins over a
/// deadline passed at the same time.
fn kill_due(cancel: &AtomicBool, deadline: Instant) -> Option<Kill> {
    if cancel.load(Ordering::SeqCst) {
        Some(Kill::Cancelled)
    } else if Instant::now() >= deadline {
        Some(Kill::TimedOut)
    } else {
        None
    }
}

/// Waits up to `wait` for output or for the shell's exit; returns whether
/// the pipe has something to read.
fn wait_readable(
    reader: &PipeReader,
    pipe_open: bool,
    pidfd: Option<&OwnedFd>,
    wait: Duration,
    backoff: &mut Duration,
) -> io::Result<bool> {
    match (pipe_open, pidfd) {
        (true, pidfd) => {
            let mut fds = vec![PollFd::new(reader, PollFlags::IN)];
            if let Some(fd) = pidfd {
                fds.push(PollFd::new(fd, PollFlags::IN));
            }
            poll(&mut fds, wait)?;
            Ok(!fds[0].revents().is_empty())
        }
        (false, Some(fd)) => {
            poll(&mut [PollFd::new(fd, PollFlags::IN)], wait)?;
            Ok(false)
        }
        (false, None) => {
            // No pidfd (old kernel or seccomp) and nothing to read: poll the child.
            std::thread::sleep(wait.min(*backoff));
            *backoff = (*backoff * 2).min(TICK);
            Ok(false)
        }
    }
}

/// Collects what is left in the pipe after the shell exited; returns whether
/// the pipe is still open (held by background children).
fn drain(reader: &mut PipeReader, buf: &mut [u8], out: &mut Collector<'_>) -> io::Result<bool> {
    let until = Instant::now() + DRAIN_LIMIT;
    while Instant::now() < until {
        let mut fds = [PollFd::new(&*reader, PollFlags::IN)];
        // Zero timeout: only what is already there belongs to this command.
        poll(&mut fds, Duration::ZERO)?;
        if fds[0].revents().is_empty() {
            return Ok(true);
        }
        match reader.read(buf) {
            Ok(0) => return Ok(false),
            Ok(n) => {
                out.push(&buf[..n]);
                out.flush_blocking();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Background children still hold the pipe. Keep it drained so they do not
/// die of SIGPIPE or block, but their output is no longer ours. At the pids
/// limit (a fork bomb left running) there may be no thread to spare: then the
/// pipe closes and they get EPIPE, which is fine.
fn keep_drained(mut reader: PipeReader) {
    let _ = std::thread::Builder::new().spawn(move || {
        let mut b = [0u8; 8192];
        while matches!(reader.read(&mut b), Ok(n) if n > 0) {}
    });
}

fn poll(fds: &mut [PollFd<'_>], wait: Duration) -> io::Result<()> {
    let ts = Timespec { tv_sec: wait.as_secs() as i64, tv_nsec: i64::from(wait.subsec_nanos()) };
    match rustix::event::poll(fds, Some(&ts)) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
