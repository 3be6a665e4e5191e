//! Running an environment's script (setup or maintenance) in a sandbox as
//! the command user, its output streamed as `environment.output` events.
//!
//! The script's variables (and, for setup, secrets) are the exec's own
//! environment: they exist in that process tree only, not in the
//! container's configuration, not on a command line, not in a file.

use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecResults};
use futures::StreamExt;
use kiln_protocol::EventBody;
use kiln_store::StoreError;

use super::mask::{Masker, masked};
use super::tail::Tail;
use crate::event_sink::EventSink;
use crate::sandbox::WORKSPACE;

/// Bytes of a script's output sent as events; past it, the output is kept
/// only as the tail an error quotes (a chatty install would otherwise
/// spend the run's whole event budget).
const MAX_EVENT_OUTPUT: usize = 256 * 1024;
/// Output is sent in pieces of about this many bytes, or after this long.
const PIECE: usize = 8 * 1024;
const PIECE_EVERY: Duration = Duration::from_millis(200);

/// How a script ended.
pub struct ScriptEnd {
    /// `None`: Docker could not tell (the engine lost the exec).
    pub exit_code: Option<i64>,
    pub duration: Duration,
    /// The last lines of its output, for the error a failure ends the run with.
    pub tail: String,
}

/// A script to run.
pub struct Script<'a> {
    pub docker: &'a Docker,
    pub container: &'a str,
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
pub fn shell_of(sandbox: &crate::sandbox::Sandbox) -> Option<&'static str> {
    match sandbox.shell() {
        None => Some("bash"),
        Some(shell) => shell.program(),
    }
}

/// Runs the script with `shell` in `/workspace`, streaming its output.
pub async fn run(
    script: Script<'_>,
    events: &mut EventSink,
) -> Result<Result<ScriptEnd, bollard::errors::Error>, StoreError> {
    let started = Instant::now();
    let (docker, mask, phase) = (script.docker, script.mask, script.phase);
    let exec = match create(&script).await {
        Ok(e) => e,
        Err(e) => return Ok(Err(e)),
    };
    let output = match docker.start_exec(&exec.id, None).await {
        Ok(StartExecResults::Attached { output, .. }) => output,
        Ok(StartExecResults::Detached) => return Ok(Ok(end(docker, &exec.id, started, Tail::new(), mask).await)),
        Err(e) => return Ok(Err(e)),
    };
    let tail = match relay(output, events, phase, mask).await? {
        Ok(tail) => tail,
        Err(e) => return Ok(Err(e)),
    };
    Ok(Ok(end(docker, &exec.id, started, tail, mask).await))
}

/// The script's exec: the shell running it as the user, in the workspace,
/// with its variables, stdout and stderr attached.
async fn create(script: &Script<'_>) -> Result<bollard::exec::CreateExecResults, bollard::errors::Error> {
    script
        .docker
        .create_exec(
            script.container,
            CreateExecOptions {
                cmd: Some(vec![script.shell.to_owned(), "-c".to_owned(), script.text.to_owned()]),
                env: Some(script.env.clone()),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                attach_stdin: Some(false),
                tty: Some(false),
                working_dir: Some(WORKSPACE.to_owned()),
                user: Some(script.user.to_owned()),
                ..Default::default()
            },
        )
        .await
}

/// Relays the script's output as `environment.output` events (masked,
/// in pieces, up to the allowance) while keeping its tail; the tail once
/// the output ends.
async fn relay(
    mut output: impl futures::Stream<Item = Result<bollard::container::LogOutput, bollard::errors::Error>> + Unpin,
    events: &mut EventSink,
    phase: &str,
    mask: &[&str],
) -> Result<Result<Tail, bollard::errors::Error>, StoreError> {
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

async fn end(docker: &Docker, exec: &str, started: Instant, tail: Tail, mask: &[&str]) -> ScriptEnd {
    let exit_code = docker.inspect_exec(exec).await.ok().and_then(|i| i.exit_code);
    ScriptEnd { exit_code, duration: started.elapsed(), tail: masked(&tail.render(), mask) }
}
