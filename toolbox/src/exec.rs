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
//! arrives (see `standby`): starting bash is most of a short command's time.
//! An image without bash runs commands with its POSIX `sh`, the same way but
//! without a standby; one with no shell answers every exec with a tool
//! error (see `shell`).
//!
//! Why a file and not an inherited pipe on fd 3: every background child would
//! inherit the pipe (`sleep 600 &` would hold it open), and the trap must also
//! run when the command calls `exit`, where a descriptor closed around the
//! user's command is already gone.
//!
//! This module is the session: one command at a time, cancellation, and the
//! result. The parts each have a module: `shell` starts bash with the
//! preamble, `session_state` keeps what carries over between commands,
//! `supervise` watches a running command (output, exit, deadline, cancel),
//! `capture` sanitizes, keeps and streams its output, and `process_group`
//! kills and reaps what it started.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::process::Pid;

mod capture;
mod export_list;
pub(crate) mod process_group;
mod session_state;
mod shell;
mod standby;
mod supervise;

use self::capture::Collector;
pub use self::capture::{OutputSink, SinkError};
use self::process_group::{kill_group, reap_orphans};
use self::session_state::{SessionState, command_env};
use self::shell::Shell;
use self::standby::{BOOTSTRAP, Launched, Standby};
use self::supervise::{Kill, supervise};
use crate::protocol::{ErrorKind, ExecRequest, ExecResult, SessionShell, ToolError, defaults};

/// Shells kept waiting for the next commands (see `standby`): three calls
/// in one step each find one, while the replacements are put off.
pub const STANDBYS: usize = 3;

/// How long a shell for the command after next waits before it starts, when
/// one for the next command waits already: a command sent the moment the
/// previous one answered (two calls in one step) then runs with the CPU to
/// itself instead of sharing it with a shell's start-up. If a command is
/// running when the time is up, the shell starts when it is over.
const TOP_UP_AFTER: Duration = Duration::from_millis(50);

/// What a standby shell is started with, read under the state's lock.
struct StandbyPlan {
    /// Standbys that fit and wait already.
    waiting: usize,
    seq: u64,
    cwd: PathBuf,
    env: Vec<(OsString, OsString)>,
}

/// The shell of one session.
pub struct ExecSession {
    /// Held for the whole of a command: commands run one at a time.
    state: Mutex<SessionState>,
    /// Shells waiting for the next commands, oldest first, each started
    /// with the session's state of its time (see `standby`). Apart from
    /// `state`, so that a command never waits for one to start; taken after
    /// `state` where both are.
    standbys: Mutex<VecDeque<Standby>>,
    /// Cancellation flags of commands running or waiting for their turn.
    active: Mutex<HashMap<u64, Arc<AtomicBool>>>,
    shell: Shell,
}

impl ExecSession {
    pub fn new(start_dir: PathBuf) -> Self {
        let env = crate::identity::command_env(std::env::vars_os().collect());
        let shell = Shell::new(&env);
        ExecSession {
            state: Mutex::new(SessionState::new(start_dir, env)),
            standbys: Mutex::new(VecDeque::new()),
            active: Mutex::new(HashMap::new()),
            shell,
        }
    }

    /// What an older worker needs and the image lacks: `bash` (such a
    /// worker refuses the sandbox; a newer one reads [`Self::shell`]).
    pub fn missing_programs(&self) -> Vec<String> {
        if self.shell.kind() == SessionShell::Bash { Vec::new() } else { vec!["bash".to_owned()] }
    }

    /// Which shell commands run with (none: every exec is a tool error).
    pub fn shell(&self) -> SessionShell {
        self.shell.kind()
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

    /// Kills the waiting shells that can no longer run a command (a command
    /// killed them, or changed the state they were started with), then
    /// starts shells for the next commands until `STANDBYS` wait, unless a
    /// command is running; when one waits already, only after
    /// `TOP_UP_AFTER` (and then only if no command runs). The command's own
    /// thread calls this when it is over (after its reply), and the
    /// toolbox's reaper every few seconds. Failing is harmless: the next
    /// command starts its own shell.
    pub fn prepare_standby(&self) {
        let mut deferred = false;
        while let Some(plan) = self.standby_plan() {
            if plan.waiting > 0 && !deferred {
                deferred = true;
                std::thread::sleep(TOP_UP_AFTER);
                continue;
            }
            // Started with no lock held: a command that arrives meanwhile
            // takes a shell that waits already instead of waiting for this
            // one; if it changes the state, this one will not fit it.
            let Some(standby) = self.start_standby(plan) else { return };
            let mut standbys = lock(&self.standbys);
            if standbys.len() >= STANDBYS {
                drop(standbys);
                standby.discard();
                return;
            }
            standbys.push_back(standby);
        }
    }

    /// The state the next standby starts with, if one is wanted: none while
    /// a command runs, or when `STANDBYS` fit the session's state (those
    /// that do not are killed here).
    fn standby_plan(&self) -> Option<StandbyPlan> {
        let mut state = self.state.try_lock().ok()?;
        for file in std::mem::take(&mut state.leftovers) {
            let _ = std::fs::remove_file(file);
        }
        if !self.shell.has_standby() {
            return None;
        }
        let mut standbys = lock(&self.standbys);
        for mut standby in std::mem::take(&mut *standbys) {
            if standby.is_alive() && standby.fits(&state.cwd, &state.env) {
                standbys.push_back(standby);
            } else {
                standby.discard();
            }
        }
        if standbys.len() >= STANDBYS || !state.cwd.is_dir() {
            return None;
        }
        state.seq += 1;
        Some(StandbyPlan { waiting: standbys.len(), seq: state.seq, cwd: state.cwd.clone(), env: state.env.clone() })
    }

    /// Starts one shell waiting with `plan`'s state.
    fn start_standby(&self, plan: StandbyPlan) -> Option<Standby> {
        let preamble = self.shell.prepare_state_dir().ok()?;
        let state_file = self.shell.state_file(plan.seq);
        let command_file = self.shell.command_file(plan.seq);
        let env = command_env(&plan.env, &[]);
        let (mut child, output) =
            self.shell.spawn(BOOTSTRAP, &plan.cwd, env, &preamble, &state_file, Some(&command_file)).ok()?;
        let Some(go) = child.stdin.take() else {
            kill_group(Pid::from_child(&child));
            let _ = child.wait();
            return None;
        };
        Some(Standby::new(child, go, output, state_file, command_file, plan.cwd, &plan.env))
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
        let (cwd, note) = state.resolve_cwd(req.cwd.as_deref())?;
        let launched = self.launch(state, req, &cwd)?;

        let cap = req.output_cap_bytes.min(defaults::EXEC_OUTPUT_CAP_MAX) as usize;
        let mut out = Collector::new(sink, cap, req.stream_cap_bytes);
        let deadline = started + Duration::from_millis(req.timeout_ms);
        let (status, kill) = supervise(launched.child, launched.output, deadline, cancel, &mut out)
            .map_err(|e| internal("running the command", e))?;
        out.finish();

        if kill.is_none() {
            // SIGKILL leaves no trap to run; a killed command keeps the old state.
            state.apply_state_file(&launched.state_file, &req.env);
        } else {
            state.cwd = cwd;
        }
        // Removed once the reply is out (`prepare_standby`): each file
        // operation costs a tenth of a millisecond or more in a sandbox.
        state.leftovers.push(launched.state_file);
        state.leftovers.extend(launched.command_file);

        let (output, truncated_bytes) = out.capture().render();
        Ok(ExecResult {
            exit_code: status.code(),
            signal: status.signal(),
            timed_out: matches!(kill, Some(Kill::TimedOut)),
            cancelled: matches!(kill, Some(Kill::Cancelled)),
            output,
            truncated_bytes,
            total_bytes: out.capture().total(),
            cwd: state.cwd.to_string_lossy().into_owned(),
            duration_ms: started.elapsed().as_millis() as u64,
            note,
        })
    }

    /// Starts the command: in the oldest waiting shell that fits, else in a
    /// new `bash -c`. A waiting shell fits a command that asks for neither
    /// another cwd nor variables, when the session's cwd and environment are
    /// still those it was started with; those passed over are killed.
    fn launch(&self, state: &mut SessionState, req: &ExecRequest, cwd: &Path) -> Result<Launched, ToolError> {
        let plain = req.cwd.is_none() && req.env.is_empty();
        loop {
            let Some(standby) = lock(&self.standbys).pop_front() else { break };
            if !(plain && standby.fits(cwd, &state.env)) {
                standby.discard();
                continue;
            }
            // `None`: it was gone, and is discarded; the next may do.
            if let Some(launched) = standby.start(&req.command) {
                return Ok(launched);
            }
        }
        let preamble = self.shell.prepare_state_dir().map_err(|e| internal("preparing the state directory", e))?;
        state.seq += 1;
        let state_file = self.shell.state_file(state.seq);
        let env = command_env(&state.env, &req.env);
        let (child, output) = self.shell.spawn(&req.command, cwd, env, &preamble, &state_file, None)?;
        Ok(Launched { child, output, state_file, command_file: None })
    }
}

impl Drop for ExecSession {
    fn drop(&mut self) {
        for standby in std::mem::take(&mut *lock(&self.standbys)) {
            standby.discard();
        }
        let _ = std::fs::remove_dir_all(self.shell.state_dir());
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
