//! Running an environment's script (setup or maintenance) in a sandbox as
//! the command user, its output streamed as `environment.output` events.
//!
//! The script's variables (and, for setup, secrets) are the exec's own
//! environment: they exist in that process tree only, not in the
//! container's configuration, not on a command line, not in a file.

use std::time::{Duration, Instant};

use futures::StreamExt;
use kiln_protocol::EventBody;
use kiln_store::StoreError;

use super::mask::{Masker, masked};
use super::tail::Tail;
use crate::event_sink::EventSink;
use crate::sandbox::backend::{BackendError, Exec, ExecSpec, ExecStream};
use crate::sandbox::{Sandbox, WORKSPACE};

/// Bytes of a script's output sent as events; past it, the output is kept
/// only as the tail an error quotes (a chatty install would otherwise
/// spend the run's whole event budget).
const MAX_EVENT_OUTPUT: usize = 256 * 1024;
/// Output is sent in pieces of about this many bytes, or after this long.
const PIECE: usize = 8 * 1024;
const PIECE_EVERY: Duration = Duration::from_millis(200);

/// How a script ended.
pub struct ScriptEnd {
    /// `None`: the backend could not tell (the engine lost the exec).
    pub exit_code: Option<i64>,
    pub duration: Duration,
    /// The last lines of its output, for the error a failure ends the run with.
    pub tail: String,
}

/// A script to run.
pub struct Script<'a> {
    pub sandbox: &'a Sandbox,
    /// `uid:gid` it runs as.
    pub user: &'a str,
    /// The shell that runs it: the image's bash, else its sh.
    pub shell: &'a str,
    pub text: &'a str,
    /// `NAME=value`, added to its environment.
    pub env: Vec<String>,
    /// `setup` or `maintenance`: the events' `phase`.
    pub phase: &'a str,
    /// Values replaced in what it prints (the secrets).
    pub mask: &'a [&'a str],
}

/// The shell a script runs with in `sandbox`: its bash (also when not known
/// yet), else its sh; `None`: the image has no shell.
pub fn shell_of(sandbox: &Sandbox) -> Option<&'static str> {
    match sandbox.shell() {
        None => Some("bash"),
        Some(shell) => shell.program(),
    }
}

/// Runs the script with `shell` in `/workspace`, streaming its output.
pub async fn run(script: Script<'_>, events: &mut EventSink) -> Result<Result<ScriptEnd, BackendError>, StoreError> {
    let started = Instant::now();
    let (sandbox, mask, phase) = (script.sandbox, script.mask, script.phase);
    // The shell running it as the user, in the workspace, with its
    // variables, stdout and stderr attached.
    let spec = ExecSpec {
        argv: vec![script.shell, "-c", script.text],
        user: script.user,
        env: script.env,
        cwd: Some(WORKSPACE),
        stdin: false,
    };
    let Exec { id, output, .. } = match sandbox.start_exec(&spec).await {
        Ok(exec) => exec,
        Err(e) => return Ok(Err(e)),
    };
    let tail = match relay(output, events, phase, mask).await? {
        Ok(tail) => tail,
        Err(e) => return Ok(Err(e)),
    };
    Ok(Ok(end(sandbox, &id, started, tail, mask).await))
}

/// Relays the script's output as `environment.output` events (masked,
/// in pieces, up to the allowance) while keeping its tail; the tail once
/// the output ends.
async fn relay(
    mut output: ExecStream,
    events: &mut EventSink,
    phase: &str,
    mask: &[&str],
) -> Result<Result<Tail, BackendError>, StoreError> {
    let mut tail = Tail::new();
    // A secret split across two reads is masked too: see `mask`.
    let mut piece = Masker::new(mask);
    let mut sent = 0usize;
    let mut tick = tokio::time::interval(PIECE_EVERY);
    loop {
        tokio::select! {
            chunk = output.next() => match chunk {
                Some(Ok(log)) => {
                    let bytes = log.into_bytes();
                    tail.push(&bytes);
                    if sent < MAX_EVENT_OUTPUT {
                        piece.push(&bytes);
                        if piece.pending() >= PIECE {
                            sent += flush(events, phase, piece.take(), sent).await?;
                        }
                    }
                }
                Some(Err(e)) => return Ok(Err(e)),
                None => break,
            },
            _ = tick.tick() => {
                if piece.pending() > 0 {
                    sent += flush(events, phase, piece.take(), sent).await?;
                }
            }
        }
    }
    if piece.pending() > 0 {
        sent += flush(events, phase, piece.finish(), sent).await?;
    }
    if sent >= MAX_EVENT_OUTPUT {
        let note = format!("\n[kiln] output past {MAX_EVENT_OUTPUT} bytes is not sent as events; see the tail\n");
        events.write_soon(EventBody::EnvironmentOutput { phase: phase.to_owned(), text: note }).await?;
    }
    Ok(Ok(tail))
}

/// Sends `text` (masked; cut to what is left of the output allowance) as
/// one event; answers the bytes sent.
async fn flush(events: &mut EventSink, phase: &str, mut text: String, sent: usize) -> Result<usize, StoreError> {
    if text.is_empty() {
        return Ok(0);
    }
    let room = MAX_EVENT_OUTPUT.saturating_sub(sent);
    if text.len() > room {
        let mut cut = room;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    let n = text.len();
    events.write_soon(EventBody::EnvironmentOutput { phase: phase.to_owned(), text }).await?;
    Ok(n)
}

async fn end(sandbox: &Sandbox, exec: &str, started: Instant, tail: Tail, mask: &[&str]) -> ScriptEnd {
    let exit_code = sandbox.exec_exit_code(exec).await.ok().flatten();
    ScriptEnd { exit_code, duration: started.elapsed(), tail: masked(&tail.render(), mask) }
}
