//! A long-lived process in the sandbox that the worker talks to over its
//! stdin and stdout: an in-sandbox MCP server (see `crate::mcp::stdio`).
//!
//! It is one attached `docker exec` as the command user, like the file
//! transfers of `exec_raw`: same uid, environment, cgroup limits and
//! network namespace as the agent's commands, no capabilities
//! (`no-new-privileges`, non-root exec), never root. Not through the
//! toolbox: its protocol answers requests with replies and has no way to
//! feed a running command's stdin, and an attached exec already is the
//! byte pipe a stdio server needs.
//!
//! What comes out is bounded: stdout in lines of at most `line_cap` bytes
//! (a longer one ends the process, and says why), stderr kept as a short
//! head and tail for error messages. The process is killed, with its
//! process group, when its [`StdioHandle`] goes.

use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use tokio::io::{AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::sync::watch;

use super::backend::{Exec, ExecChunk, ExecSpec, ExecStream};
use super::{HeadTail, Sandbox, SandboxError};

/// Bytes of stderr kept for error messages.
const STDERR_CAP: usize = 2048;
/// Bytes buffered between the engine's stream and the reader.
const PIPE_BYTES: usize = 64 * 1024;
/// How long to wait for the engine to record an ended process's status.
const EXIT_WAIT: Duration = Duration::from_secs(2);
/// Starts the program with its process id on the first line of stdout (so
/// it can be killed later, with its group: an exec is a session leader)
/// and then becomes it.
const WRAPPER: &str = r#"echo "$$"; exec "$@""#;

/// A started process: read its stdout, write its stdin; the handle keeps it
/// alive.
pub struct StdioProcess {
    pub stdout: DuplexStream,
    pub stdin: Pin<Box<dyn AsyncWrite + Send>>,
    pub handle: StdioHandle,
}

/// Kills the process (and its group) when dropped.
pub struct StdioHandle {
    sandbox: Sandbox,
    state: Arc<State>,
    pump: tokio::task::JoinHandle<()>,
}

struct State {
    pid: OnceLock<u32>,
    stderr: Mutex<HeadTail>,
    /// How the process ended, once its output has.
    ended: watch::Sender<Option<String>>,
}

impl Sandbox {
    /// Starts `argv` in `cwd` as the command user with `env` added, stdin
    /// and stdout attached.
    pub async fn start_stdio(
        &self,
        argv: &[String],
        env: &[(String, String)],
        cwd: &str,
        line_cap: usize,
    ) -> Result<StdioProcess, SandboxError> {
        let mut cmd = vec!["bash", "-c", WRAPPER, "kiln-stdio"];
        cmd.extend(argv.iter().map(String::as_str));
        let env: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let spec = ExecSpec { argv: cmd, user: &self.config.user, env, cwd: Some(cwd), stdin: true };
        let Exec { id: exec, output, input } = self.start_exec(&spec).await?;
        let (reader, writer) = tokio::io::duplex(PIPE_BYTES);
        let state = Arc::new(State {
            pid: OnceLock::new(),
            stderr: Mutex::new(HeadTail::new(STDERR_CAP)),
            ended: watch::channel(None).0,
        });
        let pump = tokio::spawn(pump(self.clone(), exec, output, writer, state.clone(), line_cap));
        Ok(StdioProcess { stdout: reader, stdin: input, handle: StdioHandle { sandbox: self.clone(), state, pump } })
    }
}

/// Moves stdout into `writer` line-checked and stderr into the state's
/// buffer; at the end records how the process ended, then closes `writer`
/// (the reader's EOF).
async fn pump(
    sandbox: Sandbox,
    exec_id: String,
    mut output: ExecStream,
    mut writer: DuplexStream,
    state: Arc<State>,
    line_cap: usize,
) {
    let mut pid_line: Vec<u8> = Vec::new();
    let mut line_len = 0usize;
    let why = loop {
        match output.next().await {
            Some(Ok(ExecChunk::Stdout(message))) => {
                let mut bytes = &message[..];
                if state.pid.get().is_none() {
                    match read_pid_line(&state, &mut pid_line, bytes) {
                        PidLine::Incomplete => continue,
                        PidLine::Read(rest) => bytes = rest,
                        PidLine::Bad => break Some("it did not start as expected".to_owned()),
                    }
                }
                line_len = match bytes.iter().rposition(|&b| b == b'\n') {
                    Some(last) => bytes.len() - last - 1,
                    None => line_len + bytes.len(),
                };
                // Lines before the last newline of the chunk are not
                // measured one by one: a chunk is at most the engine's
                // buffer, far below any sensible cap.
                if line_len > line_cap {
                    break Some(format!("it sent a message of more than {line_cap} bytes, so it was stopped"));
                }
                if writer.write_all(bytes).await.is_err() {
                    // Nobody reads any more.
                    break None;
                }
            }
            Some(Ok(ExecChunk::Stderr(message))) => lock(&state.stderr).push(&message),
            Some(Ok(_)) => {}
            Some(Err(e)) => break Some(format!("its output broke off: {e}")),
            None => break None,
        }
    };
    let ended = match why {
        Some(why) => {
            kill_group(&sandbox, &state).await;
            why
        }
        None => match exit_code(&sandbox, &exec_id).await {
            Some(code) => format!("it exited with status {code}"),
            None => "it exited".to_owned(),
        },
    };
    state.ended.send_replace(Some(ended));
    drop(writer);
}

/// Where the wrapper's first line (the pid, not the program's) stands after
/// a chunk of stdout.
enum PidLine<'a> {
    /// No newline yet.
    Incomplete,
    /// The pid is recorded; this is what the chunk holds after it.
    Read(&'a [u8]),
    /// Too long, or not a pid.
    Bad,
}

/// Adds `bytes` to the wrapper's first line and records the pid once the
/// line is complete.
#[inline]
fn read_pid_line<'a>(state: &State, pid_line: &mut Vec<u8>, bytes: &'a [u8]) -> PidLine<'a> {
    let Some(end) = bytes.iter().position(|&b| b == b'\n') else {
        pid_line.extend_from_slice(bytes);
        if pid_line.len() > 32 {
            return PidLine::Bad;
        }
        return PidLine::Incomplete;
    };
    pid_line.extend_from_slice(&bytes[..end]);
    match std::str::from_utf8(pid_line).ok().and_then(|p| p.trim().parse().ok()) {
        Some(pid) => {
            let _ = state.pid.set(pid);
            PidLine::Read(&bytes[end + 1..])
        }
        None => PidLine::Bad,
    }
}

/// The exec's exit status, once the engine has it.
async fn exit_code(sandbox: &Sandbox, exec_id: &str) -> Option<i64> {
    let deadline = tokio::time::Instant::now() + EXIT_WAIT;
    loop {
        let state = sandbox.backend.exec_status(&sandbox.id, exec_id).await.ok()?;
        if state.running == Some(false) {
            return state.exit_code;
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Kills the process's group as the command user (never root: it can only
/// reach the user's own processes). Best effort.
async fn kill_group(sandbox: &Sandbox, state: &State) {
    let Some(pid) = state.pid.get().copied().filter(|&p| p > 1) else { return };
    let group = format!("-{pid}");
    let spec =
        ExecSpec { argv: vec!["kill", "-9", "--", group.as_str()], user: &sandbox.config.user, ..Default::default() };
    if let Err(e) = sandbox.backend.exec_detached(&sandbox.id, &spec).await {
        tracing::warn!(container = %sandbox.id, pid, error = %e, "killing a stdio process in the sandbox failed");
    }
}

impl StdioHandle {
    /// The process id in the container, once it started.
    pub fn pid(&self) -> Option<u32> {
        self.state.pid.get().copied()
    }

    /// How the process ended and the end of its stderr, waiting a moment
    /// for the end to be known; `None` while it still runs.
    pub async fn ending(&self) -> Option<String> {
        let mut ended = self.state.ended.subscribe();
        let how = tokio::time::timeout(EXIT_WAIT, ended.wait_for(Option::is_some)).await.ok()?.ok()?.clone()?;
        let (stderr, _) = lock(&self.state.stderr).render();
        let stderr = stderr.trim();
        Some(match stderr.is_empty() {
            true => how,
            false => format!("{how}; its stderr ends: {stderr}"),
        })
    }
}

impl Drop for StdioHandle {
    fn drop(&mut self) {
        self.pump.abort();
        // Dropping the stdin writer (the caller's) tells a well-behaved
        // server to stop; this stops one that does not listen.
        let (sandbox, state) = (self.sandbox.clone(), self.state.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { kill_group(&sandbox, &state).await });
        }
    }
}

fn lock(m: &Mutex<HeadTail>) -> std::sync::MutexGuard<'_, HeadTail> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
