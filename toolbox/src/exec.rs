//! Running shell commands for one session.
//!
//! Each command is `bash -c COMMAND` in a process group of its own, stdin
//! `/dev/null`, stdout and stderr into one pipe (so their interleaving is
//! kept). Commands run one at a time. The working directory and exported
//! variables carry over from one command to the next: an EXIT trap, set by a
//! preamble bash sources through `BASH_ENV`, writes `$PWD` and the exported
//! environment to a private state file. Nothing of that goes through the
//! output, so no marker can be confused with what the command prints, and the
//! command line bash reports in its errors is exactly the user's.
//!
//! The shell that runs a command is usually started before the command
//! arrives (see [`standby`]): starting bash is most of a short command's time.
//!
//! Why a file and not an inherited pipe on fd 3: every background child would
//! inherit the pipe (`sleep 600 &` would hold it open), and the trap must also
//! run when the command calls `exit`, where a descriptor closed around the
//! user's command is already gone.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io::{self, PipeReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::process::{Pid, PidfdFlags, Signal, WaitOptions};

mod export_list;
mod standby;

use self::standby::{BOOTSTRAP, Launched, Standby};
use crate::output::{HeadTail, Sanitizer};
use crate::protocol::{ErrorKind, ExecRequest, ExecResult, ToolError, defaults};

/// Largest read from the output pipe, and so the largest streamed chunk.
const CHUNK: usize = 16 * 1024;
/// How often a running command is checked for cancellation when nothing
/// else wakes us (exit and output wake us at once).
const TICK: Duration = Duration::from_millis(25);
/// After the shell exits, how long we keep collecting output that is still
/// in the pipe (background children may keep writing; they are not waited for).
const DRAIN_LIMIT: Duration = Duration::from_millis(200);
/// After killing a process group, how long we wait for all of it to be gone.
const REAP_LIMIT: Duration = Duration::from_secs(2);

/// Variables of the toolbox's own plumbing, never persisted.
const STATE_VAR: &str = "KILN_TOOLBOX_STATE";
const COMMAND_VAR: &str = "KILN_TOOLBOX_COMMAND";
const USER_BASH_ENV_VAR: &str = "KILN_TOOLBOX_USER_BASH_ENV";

/// Sourced by bash (through `BASH_ENV`) before the command. It unsets its own
/// plumbing so nested shells see none of it, and sets the EXIT trap that
/// records the state. `builtin` guards against functions of the same name.
/// A standby shell (see [`standby`]) waits in `__kiln_standby` for its go
/// line, then takes its command from the file named by `KILN_TOOLBOX_COMMAND`.
const PREAMBLE: &str = r#"# kiln-toolbox preamble: sourced through BASH_ENV before each command.
__kiln_state=$KILN_TOOLBOX_STATE
__kiln_command=${KILN_TOOLBOX_COMMAND-}
unset KILN_TOOLBOX_STATE KILN_TOOLBOX_COMMAND BASH_ENV
__kiln_standby() {
    # The command comes NUL-terminated on stdin, which is then at its end (a
    # command reading it gets EOF); an empty one means "in the file". End of
    # input before a NUL: the toolbox discarded this shell, leave no state.
    IFS= builtin read -r -d '' BASH_EXECUTION_STRING || { builtin trap - EXIT; builtin exit 0; }
    if [[ -z $BASH_EXECUTION_STRING ]]; then
        IFS= builtin read -r -d '' BASH_EXECUTION_STRING <"$__kiln_command"
    fi
}
if [ -n "${KILN_TOOLBOX_USER_BASH_ENV+set}" ]; then
    export BASH_ENV="$KILN_TOOLBOX_USER_BASH_ENV"
    unset KILN_TOOLBOX_USER_BASH_ENV
fi
__kiln_save_state() {
    local __kiln_rc=$?
    # One file, opened once (see export_list.rs); a closed stderr keeps any
    # error about it out of the command's output.
    { builtin printf '%s\0' "$PWD"; builtin export -p; } >|"$__kiln_state" 2>&-
    builtin exit "$__kiln_rc"
}
trap __kiln_save_state EXIT
"#;

/// Where streamed output goes. Offering never blocks, so a slow consumer
/// cannot stop us from enforcing the timeout; it only stops us reading the
/// pipe, which in turn blocks the command (backpressure, bounded memory).
pub trait OutputSink {
    /// Takes the chunk, or hands it back if the consumer is not ready.
    fn try_send(&self, chunk: String) -> Result<(), SinkError>;
    /// Blocks until the consumer takes the chunk (used once the command is over).
    fn send(&self, chunk: String) -> Result<(), SinkError>;
}

pub enum SinkError {
    Full(String),
    /// The consumer is gone: stop streaming, keep running.
    Closed,
}

/// The shell of one session.
pub struct ExecSession {
    /// Held for the whole of a command: commands run one at a time.
    state: Mutex<SessionState>,
    /// Cancellation flags of commands running or waiting for their turn.
    active: Mutex<HashMap<u64, Arc<AtomicBool>>>,
    bash: PathBuf,
    /// Private directory (mode 0700) for the preamble and the state files.
    state_dir: PathBuf,
}

struct SessionState {
    cwd: PathBuf,
    /// Where the toolbox started; the fallback when `cwd` disappears.
    start_dir: PathBuf,
    env: Vec<(OsString, OsString)>,
    seq: u64,
    /// A shell started with `cwd` and `env`, waiting for the next command.
    standby: Option<Standby>,
    /// State and command files of finished commands, not yet removed.
    leftovers: Vec<PathBuf>,
}

enum Kill {
    TimedOut,
    Cancelled,
}

impl ExecSession {
    pub fn new(start_dir: PathBuf) -> Self {
        let env: Vec<_> = std::env::vars_os().collect();
        let bash = find_in_path(&env, "bash").unwrap_or_else(|| PathBuf::from("/bin/bash"));
        let state_dir = choose_state_dir();
        ExecSession {
            state: Mutex::new(SessionState {
                cwd: start_dir.clone(),
                start_dir,
                env,
                seq: 0,
                standby: None,
                leftovers: Vec::new(),
            }),
            active: Mutex::new(HashMap::new()),
            bash,
            state_dir,
        }
    }

    /// Kills exec `id` (running or still waiting); false if there is none.
    pub fn cancel(&self, id: u64) -> bool {
        match lock(&self.active).get(&id) {
            Some(flag) => {
                flag.store(true, Ordering::SeqCst);
                true
            }
            None => false,
        }
    }

    pub fn cancel_all(&self) {
        for flag in lock(&self.active).values() {
            flag.store(true, Ordering::SeqCst);
        }
    }

    /// Reaps exited orphans (we are their subreaper), unless a command is
    /// running: then its own child must not be reaped behind `Child`'s back.
    pub fn reap_idle(&self) {
        if let Ok(_state) = self.state.try_lock() {
            reap_orphans();
        }
    }

    /// Starts the shell for the next command, unless one waits already or a
    /// command is running (the command's own thread calls this when it is
    /// over). Failing is harmless: the next command starts its own shell.
    pub fn prepare_standby(&self) {
        let Ok(mut state) = self.state.try_lock() else { return };
        for file in std::mem::take(&mut state.leftovers) {
            let _ = std::fs::remove_file(file);
        }
        if state.standby.as_mut().is_some_and(Standby::is_alive) {
            return;
        }
        if let Some(gone) = state.standby.take() {
            gone.discard();
        }
        if !state.cwd.is_dir() {
            return;
        }
        let Ok(preamble) = self.prepare_state_dir() else { return };
        state.seq += 1;
        let seq = state.seq;
        let state_file = self.state_dir.join(format!("state-{seq}"));
        let command_file = self.state_dir.join(format!("command-{seq}"));
        let env = command_env(&state.env, &[]);
        let spawned = self.spawn_shell(BOOTSTRAP, &state.cwd, env, &preamble, &state_file, Some(&command_file));
        if let Ok((mut child, output)) = spawned {
            match child.stdin.take() {
                Some(go) => {
                    let cwd = state.cwd.clone();
                    state.standby = Some(Standby::new(child, go, output, state_file, command_file, cwd));
                }
                None => {
                    kill_group(Pid::from_child(&child));
                    let _ = child.wait();
                }
            }
        }
    }

    pub fn run(&self, id: u64, req: &ExecRequest, sink: &dyn OutputSink) -> Result<ExecResult, ToolError> {
        validate(req)?;
        let cancel = Arc::new(AtomicBool::new(false));
        lock(&self.active).insert(id, cancel.clone());
        let result = {
            let mut state = lock(&self.state);
            reap_orphans();
            let r = self.run_locked(&mut state, req, sink, &cancel);
            reap_orphans();
            r
        };
        lock(&self.active).remove(&id);
        result
    }

    fn run_locked(
        &self,
        state: &mut SessionState,
        req: &ExecRequest,
        sink: &dyn OutputSink,
        cancel: &AtomicBool,
    ) -> Result<ExecResult, ToolError> {
        let started = Instant::now();
        if cancel.load(Ordering::SeqCst) {
            return Ok(cancelled_before_start(state));
        }
        let mut note = None;
        let cwd = match &req.cwd {
            Some(dir) => {
                let p = state.cwd.join(dir);
                if !p.is_dir() {
                    return Err(ToolError::new(ErrorKind::NotFound, format!("cwd {} is not a directory", p.display())));
                }
                p
            }
            None if state.cwd.is_dir() => state.cwd.clone(),
            None => {
                note = Some(format!(
                    "the working directory {} no longer exists; the command ran in {}",
                    state.cwd.display(),
                    state.start_dir.display()
                ));
                state.start_dir.clone()
            }
        };
        // The standby was started with the session's cwd and environment: it
        // fits a command that asks for neither another cwd nor variables.
        let standby = match state.standby.take() {
            Some(s) if req.cwd.is_none() && req.env.is_empty() && s.is_in(&cwd) => s.start(&req.command),
            Some(s) => {
                s.discard();
                None
            }
            None => None,
        };
        let launched = match standby {
            Some(launched) => launched,
            None => {
                let preamble = self.prepare_state_dir().map_err(|e| internal("preparing the state directory", e))?;
                state.seq += 1;
                let state_file = self.state_dir.join(format!("state-{}", state.seq));
                let env = command_env(&state.env, &req.env);
                let (child, output) = self.spawn_shell(&req.command, &cwd, env, &preamble, &state_file, None)?;
                Launched { child, output, state_file, command_file: None }
            }
        };

        let cap = req.output_cap_bytes.min(defaults::EXEC_OUTPUT_CAP_MAX) as usize;
        let mut out = Collector::new(sink, cap, req.stream_cap_bytes);
        let deadline = started + Duration::from_millis(req.timeout_ms);
        let (status, kill) = supervise(launched.child, launched.output, deadline, cancel, &mut out)
            .map_err(|e| internal("running the command", e))?;
        out.finish();

        if kill.is_none() {
            // SIGKILL leaves no trap to run; a killed command keeps the old state.
            apply_state_file(state, &launched.state_file, &req.env);
        } else {
            state.cwd = cwd;
        }
        // Removed once the reply is out (`prepare_standby`): each file
        // operation costs a tenth of a millisecond or more in a sandbox.
        state.leftovers.push(launched.state_file);
        state.leftovers.extend(launched.command_file);

        let (output, truncated_bytes) = out.capture.render();
        Ok(ExecResult {
            exit_code: status.code(),
            signal: status.signal(),
            timed_out: matches!(kill, Some(Kill::TimedOut)),
            cancelled: matches!(kill, Some(Kill::Cancelled)),
            output,
            truncated_bytes,
            total_bytes: out.capture.total(),
            cwd: state.cwd.to_string_lossy().into_owned(),
            duration_ms: started.elapsed().as_millis() as u64,
            note,
        })
    }

    /// Starts `bash -c SCRIPT` in a process group of its own, stdout and
    /// stderr into one new pipe. stdin is `/dev/null`, or for a standby
    /// (`command_file` given) a pipe for its go line.
    fn spawn_shell(
        &self,
        script: &str,
        cwd: &Path,
        env: Vec<(OsString, OsString)>,
        preamble: &Path,
        state_file: &Path,
        command_file: Option<&Path>,
    ) -> Result<(Child, PipeReader), ToolError> {
        let _ = std::fs::remove_file(state_file);
        let (reader, writer) = std::io::pipe().map_err(|e| internal("creating the output pipe", e))?;
        let writer2 = writer.try_clone().map_err(|e| internal("creating the output pipe", e))?;
        let mut cmd = Command::new(&self.bash);
        cmd.arg("-c")
            .arg(script)
            .current_dir(cwd)
            .env_clear()
            .envs(env)
            .env("BASH_ENV", preamble)
            .env(STATE_VAR, state_file)
            .stdout(writer)
            .stderr(writer2)
            .process_group(0);
        match command_file {
            Some(file) => cmd.env(COMMAND_VAR, file).stdin(Stdio::piped()),
            None => cmd.stdin(Stdio::null()),
        };
        let child = cmd.spawn().map_err(|e| spawn_error("starting bash", e))?;
        // `cmd` holds our copies of the pipe's write end: drop them, or the
        // pipe would never report end-of-file.
        drop(cmd);
        Ok((child, reader))
    }

    /// (Re)creates the private directory and the preamble: a command may have
    /// removed them (`rm -rf /tmp/*`).
    fn prepare_state_dir(&self) -> io::Result<PathBuf> {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&self.state_dir)?;
        let preamble = self.state_dir.join("preamble.sh");
        if std::fs::read(&preamble).ok().as_deref() != Some(PREAMBLE.as_bytes()) {
            std::fs::write(&preamble, PREAMBLE)?;
        }
        Ok(preamble)
    }
}

impl Drop for ExecSession {
    fn drop(&mut self) {
        if let Some(standby) = lock(&self.state).standby.take() {
            standby.discard();
        }
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}

fn validate(req: &ExecRequest) -> Result<(), ToolError> {
    let invalid = |msg: String| Err(ToolError::new(ErrorKind::InvalidArgument, msg));
    if req.timeout_ms == 0 {
        return invalid("timeout_ms must be positive".into());
    }
    if req.command.contains('\0') {
        return invalid("the command contains a NUL character".into());
    }
    for (k, v) in &req.env {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            return invalid(format!("invalid environment variable {k:?}"));
        }
    }
    Ok(())
}

/// A private directory for the state files, on tmpfs when there is one:
/// creating and truncating files on a journaled disk costs milliseconds, which
/// would be most of a short command's run time.
fn choose_state_dir() -> PathBuf {
    let name = format!("kiln-toolbox-{}", std::process::id());
    let shm = Path::new("/dev/shm").join(&name);
    if is_private_dir(&shm) {
        return shm;
    }
    std::env::temp_dir().join(name)
}

/// Creates `dir` if needed and checks it is ours alone (a directory left by
/// an earlier toolbox with the same pid is fine; anyone else's is not).
fn is_private_dir(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    if std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).is_err() {
        return false;
    }
    matches!(std::fs::symlink_metadata(dir), Ok(m)
        if m.is_dir() && m.uid() == rustix::process::geteuid().as_raw() && m.mode() & 0o077 == 0)
}

fn cancelled_before_start(state: &SessionState) -> ExecResult {
    ExecResult {
        exit_code: None,
        signal: None,
        timed_out: false,
        cancelled: true,
        output: String::new(),
        truncated_bytes: 0,
        total_bytes: 0,
        cwd: state.cwd.to_string_lossy().into_owned(),
        duration_ms: 0,
        note: Some("cancelled before it started".into()),
    }
}

/// The session environment with this call's extra variables on top. A user
/// `BASH_ENV` is passed aside: ours must run first, and restores it.
fn command_env(session: &[(OsString, OsString)], extra: &[(String, String)]) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = session.to_vec();
    for (k, v) in extra {
        match env.iter_mut().find(|(ek, _)| ek == OsStr::new(k)) {
            Some(slot) => slot.1 = v.into(),
            None => env.push((k.into(), v.into())),
        }
    }
    for (k, _) in env.iter_mut() {
        if k == "BASH_ENV" {
            *k = USER_BASH_ENV_VAR.into();
        }
    }
    env
}

/// Reads what the EXIT trap recorded: `$PWD` and a NUL, then what `export
/// -p` printed. A missing or empty file (the command `exec`ed another
/// program, or replaced the trap) keeps the old state.
fn apply_state_file(state: &mut SessionState, file: &Path, extra: &[(String, String)]) {
    let Ok(bytes) = std::fs::read(file) else { return };
    let Some(nul) = bytes.iter().position(|&b| b == 0) else { return };
    let (pwd, exports) = (&bytes[..nul], &bytes[nul + 1..]);
    if pwd.is_empty() {
        return;
    }
    let pwd = PathBuf::from(OsStr::from_bytes(pwd));
    if pwd.is_dir() {
        state.cwd = pwd;
    }
    let mut env: Vec<(OsString, OsString)> = export_list::parse(exports);
    // SHLVL would grow by one each call; `_` is bash's last argument.
    env.retain(|(k, _)| {
        let k = k.as_bytes();
        k != b"SHLVL" && k != b"_" && !k.starts_with(b"KILN_TOOLBOX_")
    });
    // A per-call variable the command left as it was given is not persisted:
    // the session goes back to its previous value (or to not having it).
    for (k, v) in extra {
        let k = OsStr::new(k);
        if let Some(pos) = env.iter().position(|(ek, ev)| ek == k && ev == OsStr::new(v)) {
            match state.env.iter().find(|(ok, _)| ok == k) {
                Some((_, old)) => env[pos].1 = old.clone(),
                None => {
                    env.remove(pos);
                }
            }
        }
    }
    if let Some(shlvl) = state.env.iter().find(|(k, _)| k == "SHLVL") {
        env.push(shlvl.clone());
    }
    state.env = env;
}

/// Sanitizes output as it arrives, keeps head and tail, and streams it to the
/// sink in chunks no larger than [`CHUNK`] (plus escaping).
struct Collector<'a> {
    sink: &'a dyn OutputSink,
    sanitizer: Sanitizer,
    capture: HeadTail,
    /// Text not yet taken by the sink.
    pending: String,
    streamed: u64,
    stream_cap: Option<u64>,
    streaming: bool,
}

impl<'a> Collector<'a> {
    fn new(sink: &'a dyn OutputSink, cap: usize, stream_cap: Option<u64>) -> Self {
        Collector {
            sink,
            sanitizer: Sanitizer::new(),
            capture: HeadTail::new(cap),
            pending: String::new(),
            streamed: 0,
            stream_cap,
            streaming: true,
        }
    }

    /// Whether we may read more: only while the sink keeps up.
    fn ready(&self) -> bool {
        self.pending.len() < CHUNK
    }

    fn push(&mut self, bytes: &[u8]) {
        let mut text = String::with_capacity(bytes.len());
        self.sanitizer.push(bytes, &mut text);
        self.take(&text);
    }

    fn take(&mut self, text: &str) {
        self.capture.push(text.as_bytes());
        if !self.streaming || text.is_empty() {
            return;
        }
        if let Some(cap) = self.stream_cap
            && self.streamed + text.len() as u64 > cap
        {
            self.streaming = false;
            self.pending.push_str(&format!(
                "\n[output streaming stopped after {} bytes; the result keeps the head and the tail]\n",
                self.streamed
            ));
            return;
        }
        self.streamed += text.len() as u64;
        self.pending.push_str(text);
    }

    /// Offers pending text to the sink without blocking.
    fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        match self.sink.try_send(std::mem::take(&mut self.pending)) {
            Ok(()) => {}
            Err(SinkError::Full(back)) => self.pending = back,
            Err(SinkError::Closed) => self.streaming = false,
        }
    }

    /// Hands pending text to the sink, waiting for it (the command is over).
    fn flush_blocking(&mut self) {
        if !self.pending.is_empty() && self.sink.send(std::mem::take(&mut self.pending)).is_err() {
            self.streaming = false;
        }
    }

    fn finish(&mut self) {
        let mut tail = String::new();
        self.sanitizer.finish(&mut tail);
        self.take(&tail);
        self.flush_blocking();
    }
}

/// Runs the command to its end: collects output, enforces the deadline and
/// cancellation (killing the whole process group), and returns how it ended.
fn supervise(
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
            if cancel.load(Ordering::SeqCst) {
                kill = Some(Kill::Cancelled);
            } else if Instant::now() >= deadline {
                kill = Some(Kill::TimedOut);
            }
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
        let readable = match (pipe_open, &pidfd) {
            (true, pidfd) => {
                let mut fds = vec![PollFd::new(&reader, PollFlags::IN)];
                if let Some(fd) = pidfd {
                    fds.push(PollFd::new(fd, PollFlags::IN));
                }
                poll(&mut fds, wait)?;
                !fds[0].revents().is_empty()
            }
            (false, Some(fd)) => {
                poll(&mut [PollFd::new(fd, PollFlags::IN)], wait)?;
                false
            }
            (false, None) => {
                // No pidfd (old kernel or seccomp) and nothing to read: poll the child.
                std::thread::sleep(wait.min(backoff));
                backoff = (backoff * 2).min(TICK);
                false
            }
        };
        if readable {
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
    if pipe_open {
        pipe_open = drain(&mut reader, &mut buf, out)?;
    }
    if pipe_open {
        // Background children still hold the pipe. Keep it drained so they
        // do not die of SIGPIPE or block, but their output is no longer ours.
        // At the pids limit (a fork bomb left running) there may be no thread
        // to spare: then the pipe closes and they get EPIPE, which is fine.
        let _ = std::thread::Builder::new().spawn(move || {
            let mut b = [0u8; 8192];
            while matches!(reader.read(&mut b), Ok(n) if n > 0) {}
        });
    }
    Ok((status, kill))
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

fn poll(fds: &mut [PollFd<'_>], wait: Duration) -> io::Result<()> {
    let ts = Timespec { tv_sec: wait.as_secs() as i64, tv_nsec: i64::from(wait.subsec_nanos()) };
    match rustix::event::poll(fds, Some(&ts)) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn kill_group(pgid: Pid) {
    // ESRCH (already gone) is fine.
    let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
}

/// Waits until no process of the group is left, reaping the members that
/// were reparented to us. Members that called `setsid` have left the group
/// and are out of reach (only a cgroup would catch them).
fn reap_group(pgid: Pid) {
    let until = Instant::now() + REAP_LIMIT;
    loop {
        while let Ok(Some(_)) = rustix::process::waitpgid(pgid, WaitOptions::NOHANG) {}
        if rustix::process::test_kill_process_group(pgid) == Err(rustix::io::Errno::SRCH) || Instant::now() >= until {
            return;
        }
        kill_group(pgid);
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Reaps every exited child. Only called while no command runs (our own
/// `Child` must be reaped by `Child::wait`), so what it reaps are orphans of
/// earlier commands.
fn reap_orphans() {
    while let Ok(Some(_)) = rustix::process::wait(WaitOptions::NOHANG) {}
}

fn find_in_path(env: &[(OsString, OsString)], name: &str) -> Option<PathBuf> {
    let path = env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.clone())?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| p.is_file())
}

fn internal(what: &str, e: io::Error) -> ToolError {
    ToolError::new(ErrorKind::Internal, format!("{what}: {e}"))
}

/// A fork that failed with EAGAIN means the sandbox is at its pids limit
/// (typically a runaway or fork bomb still running): say so, so the worker
/// can reset the sandbox's processes instead of failing the run.
pub fn spawn_error(what: &str, e: io::Error) -> ToolError {
    if e.kind() == io::ErrorKind::WouldBlock {
        ToolError::new(ErrorKind::ProcessLimit, format!("{what}: the sandbox is at its process limit ({e})"))
    } else {
        internal(what, e)
    }
}

/// Locks, ignoring poisoning: the data behind these locks stays consistent
/// even if a request thread panicked while holding one.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_call_variables_override_and_a_user_bash_env_is_passed_aside() {
        let session = vec![("A".into(), "1".into()), ("BASH_ENV".into(), "/u.sh".into())];
        let env = command_env(&session, &[("A".into(), "2".into()), ("B".into(), "3".into())]);
        assert_eq!(
            env,
            vec![("A".into(), "2".into()), (USER_BASH_ENV_VAR.into(), "/u.sh".into()), ("B".into(), "3".into())]
        );
    }

    #[test]
    fn state_file_updates_cwd_and_env_but_not_per_call_or_plumbing_variables() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("state");
        let mut state = SessionState {
            cwd: "/".into(),
            start_dir: "/".into(),
            env: vec![("SHLVL".into(), "1".into()), ("KEEP".into(), "old".into())],
            seq: 0,
            standby: None,
            leftovers: Vec::new(),
        };
        let mut data = format!("{}\0", dir.path().display()).into_bytes();
        data.extend(
            b"declare -x KEEP=\"given\"\ndeclare -x NEW=\"a=b\nc\"\ndeclare -x SHLVL=\"2\"\n\
              declare -x _=\"/bin/ls\"\ndeclare -x ONCE=\"x\"\n",
        );
        std::fs::write(&file, data).unwrap();
        apply_state_file(&mut state, &file, &[("KEEP".into(), "given".into()), ("ONCE".into(), "x".into())]);
        assert_eq!(state.cwd, dir.path());
        assert_eq!(
            state.env,
            vec![("KEEP".into(), "old".into()), ("NEW".into(), "a=b\nc".into()), ("SHLVL".into(), "1".into())]
        );
    }
}
