//! A sandbox's toolbox: started with the container, restarted when it dies,
//! and the session's record of which file versions the model has seen
//! (so `edit`/`write` can insist on a fresh `view`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kiln_toolbox::protocol::{ErrorKind, FileVersion, Reply, RequestBody, SessionShell};

use super::backend::{BackendError, ExecSpec, Provenance};
use super::toolbox::{OutputSink, TOOLBOX_EXEC_USER, ToolboxConn, ToolboxError};
use super::toolbox_binary::{self, CONTAINER_PATH, IMAGE_COMMAND};
use super::{Sandbox, SandboxError, WORKSPACE};

/// Beyond a command's own timeout (which the toolbox enforces), how long to
/// wait before deciding the toolbox is stuck.
const EXEC_GRACE: Duration = Duration::from_secs(30);
/// Bound on the file tools, which the toolbox keeps small by design.
const FILE_CALL_TIMEOUT: Duration = Duration::from_secs(120);
const PROCESS_RESET_NOTE: &str = "the sandbox had reached its process limit (something kept forking), so every \
     process in it was killed before this command ran, background processes included";
/// Tries to run the sandbox-wide kill before giving up.
const KILL_ATTEMPTS: u32 = 10;
/// Tries to bring a dead toolbox back before the call fails.
const RESTART_ATTEMPTS: u32 = 3;

#[derive(Default)]
pub(super) struct ToolboxState {
    /// What to exec to start the toolbox; `None`: this sandbox has none and
    /// the tools use one exec per call.
    command: Option<String>,
    conn: tokio::sync::Mutex<Option<Arc<ToolboxConn>>>,
    /// Version of each file as the model last saw it (by `view`) or made it
    /// (by `write`/`edit`), keyed by normalized absolute path.
    seen: Mutex<HashMap<String, FileVersion>>,
    /// The shell commands run with, once known (from the toolbox's hello,
    /// or found by trying): `None` for a container adopted by name, where
    /// bash is tried first (see `exec`).
    shell: Mutex<Option<SessionShell>>,
}

impl std::fmt::Debug for ToolboxState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolboxState").field("command", &self.command).finish_non_exhaustive()
    }
}

impl Sandbox {
    /// Installs (when the worker has the binary) and starts the toolbox.
    /// A toolbox that cannot start leaves the sandbox in per-exec mode,
    /// which still works where the image has a shell. Any image the toolbox
    /// runs in is taken: its commands run with bash, else sh, else not at
    /// all (the file tools still work). Refused: an image the toolbox does
    /// not run in and that has no shell (nothing would run), and one whose
    /// (older) toolbox cannot run commands without bash.
    /// `provenance`: whether the backend just made the sandbox or found it.
    pub(super) async fn start_toolbox(&mut self, provenance: Provenance) -> Result<(), SandboxError> {
        let local = toolbox_binary::local_binary(self.config.toolbox_path.as_deref());
        let command = match local {
            Some(binary) => match self.install_toolbox(binary, provenance).await {
                Ok(()) => CONTAINER_PATH,
                Err(e) => {
                    tracing::warn!(container = %self.id, error = %e, "installing the toolbox failed; trying the image's");
                    IMAGE_COMMAND
                }
            },
            None => IMAGE_COMMAND,
        };
        match ToolboxConn::start(&self.backend, &self.id, command, &self.config.user).await {
            Ok(conn) if conn.shell().is_none() && !conn.missing().is_empty() => {
                Err(SandboxError::ImageLacks { image: self.config.image.clone(), missing: conn.missing().join(", ") })
            }
            Ok(conn) => {
                let shell = conn.shell().unwrap_or(SessionShell::Bash);
                if shell != SessionShell::Bash {
                    tracing::debug!(container = %self.id, ?shell, "the image has no bash");
                }
                self.toolbox = Arc::new(ToolboxState {
                    command: Some(command.to_owned()),
                    conn: tokio::sync::Mutex::new(Some(Arc::new(conn))),
                    seen: Mutex::default(),
                    shell: Mutex::new(Some(shell)),
                });
                Ok(())
            }
            Err(e) => {
                warn_fallback_once(&self.config.image, local.is_some(), &e);
                tracing::debug!(container = %self.id, error = %e, "no toolbox in this sandbox; using one exec per call");
                self.check_shell(&e).await
            }
        }
    }

    /// Without a toolbox to say so: which shell runs in the container, as
    /// the command user (126/127: it could not be started). With neither
    /// bash nor sh nothing would run: refused.
    async fn check_shell(&self, toolbox: &ToolboxError) -> Result<(), SandboxError> {
        for shell in [SessionShell::Bash, SessionShell::Sh] {
            let program = shell.program().unwrap_or("sh");
            let started = match self.run_detached(vec![program, "-c", "exit 0"], &self.config.user).await {
                Ok(code) => !matches!(code, Some(126 | 127)),
                // The engine refuses to start a program the image lacks.
                Err(ToolboxError::Backend(BackendError::ExecRefused { .. })) => false,
                Err(e) => return Err(e.into()),
            };
            if started {
                self.set_shell(shell);
                return Ok(());
            }
        }
        Err(SandboxError::NothingRuns { image: self.config.image.clone(), why: toolbox.to_string() })
    }

    /// The shell commands run with, if known (see [`ToolboxState::shell`]).
    pub fn shell(&self) -> Option<SessionShell> {
        *self.toolbox.shell.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn set_shell(&self, shell: SessionShell) {
        *self.toolbox.shell.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(shell);
    }

    /// Whether the sandbox is as good as when it started: a warm container
    /// whose toolbox died is not worth handing out; one that never had a
    /// toolbox (per-exec mode) is exactly what a new one would be.
    pub(super) fn toolbox_alive(&self) -> bool {
        if self.toolbox.command.is_none() {
            return true;
        }
        match self.toolbox.conn.try_lock() {
            Ok(slot) => slot.as_ref().is_some_and(|c| c.is_alive()),
            // Someone is using it: alive enough.
            Err(_) => true,
        }
    }

    /// Whether tools go through the toolbox.
    pub fn has_toolbox(&self) -> bool {
        self.toolbox.command.is_some()
    }

    /// Where the worker's own toolbox binary should be in this sandbox, for
    /// its subcommands (the change capture); `None` where it is not. A
    /// handle that started its toolbox knows which one runs (not one the
    /// image ships, which may be any version); one bound by name (the
    /// capture's) goes by the worker's binary, which it puts in every
    /// sandbox it starts. The caller copes with a binary that is not there.
    pub(crate) fn workers_toolbox(&self) -> Option<&'static str> {
        match self.toolbox.command.as_deref() {
            Some(command) => (command == CONTAINER_PATH).then_some(CONTAINER_PATH),
            None => toolbox_binary::local_binary(self.config.toolbox_path.as_deref()).map(|_| CONTAINER_PATH),
        }
    }

    /// One toolbox request. `Ok(None)`: this sandbox has no toolbox. A
    /// toolbox that died is restarted here, on the call after the one it
    /// died in (which gets [`ToolboxError::Died`]).
    ///
    /// A sandbox at its pids limit (a fork bomb that outlived its command)
    /// cannot start anything: then every process of the command user is
    /// killed and the call is tried once more, an exec's result saying so.
    pub async fn toolbox_call(
        &self,
        body: RequestBody,
        output: Option<OutputSink>,
    ) -> Result<Option<Reply>, ToolboxError> {
        let Some(command) = &self.toolbox.command else { return Ok(None) };
        match self.call_once(command, body.clone(), output.clone()).await? {
            Reply::Error(e) if e.kind == ErrorKind::ProcessLimit => {
                tracing::warn!(container = %self.id, error = %e.message, "sandbox at its process limit; resetting it");
                {
                    let mut slot = self.toolbox.conn.lock().await;
                    if let Some(old) = slot.take() {
                        self.retire(&old).await;
                    }
                    *slot = Some(Arc::new(self.restart_toolbox(command).await?));
                }
                let mut retry = self.call_once(command, body, output).await?;
                if let Reply::Exec(r) = &mut retry {
                    r.note = Some(match r.note.take() {
                        Some(n) => format!("{PROCESS_RESET_NOTE}; {n}"),
                        None => PROCESS_RESET_NOTE.to_owned(),
                    });
                }
                Ok(Some(retry))
            }
            reply => Ok(Some(reply)),
        }
    }

    async fn call_once(
        &self,
        command: &str,
        body: RequestBody,
        output: Option<OutputSink>,
    ) -> Result<Reply, ToolboxError> {
        let limit = match &body {
            RequestBody::Exec(e) => Duration::from_millis(e.timeout_ms) + EXEC_GRACE,
            RequestBody::Capture(c) => Duration::from_millis(c.timeout_ms) + EXEC_GRACE,
            _ => FILE_CALL_TIMEOUT,
        };
        let conn = {
            let mut slot = self.toolbox.conn.lock().await;
            match slot.as_ref() {
                Some(c) if c.is_alive() => c.clone(),
                _ => {
                    // A sandbox that stopped has nothing to restart it in.
                    if let Ok(Some(how)) = self.backend.stopped(&self.id).await {
                        return Err(ToolboxError::SandboxStopped(how));
                    }
                    tracing::warn!(container = %self.id, "the toolbox is not running; restarting it");
                    if let Some(old) = slot.take() {
                        self.retire(&old).await;
                    }
                    let c = Arc::new(self.restart_toolbox(command).await?);
                    *slot = Some(c.clone());
                    c
                }
            }
        };
        match tokio::time::timeout(limit, conn.call(body, output)).await {
            Ok(result) => result,
            Err(_) => {
                // Stuck: drop it (closing its stdin) so the next call starts afresh.
                let mut slot = self.toolbox.conn.lock().await;
                if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, &conn)) {
                    *slot = None;
                }
                self.retire(&conn).await;
                Err(ToolboxError::Died)
            }
        }
    }

    /// Kills a toolbox that is being replaced (stuck, or its stream broke):
    /// it runs as root, so the command user's `kill -9 -1` does not reach it.
    /// Closing its stdin (dropping the connection) also makes it exit; this
    /// is for one that no longer reads. Best effort: a pid that is gone, or
    /// was reused by a command, is harmless to signal.
    async fn retire(&self, conn: &ToolboxConn) {
        let pid = conn.pid().to_string();
        if conn.pid() <= 1 {
            return;
        }
        if let Err(e) = self.run_detached(vec!["kill", "-9", pid.as_str()], TOOLBOX_EXEC_USER).await {
            tracing::warn!(container = %self.id, error = %e, "killing the old toolbox failed");
        }
    }

    /// Kills every process of the command user (orphans of the dead
    /// toolbox, a fork bomb that outlived it), then starts a new toolbox.
    /// The container's main process and the toolbox run as root and survive.
    async fn restart_toolbox(&self, command: &str) -> Result<ToolboxConn, ToolboxError> {
        let mut last = None;
        for attempt in 0..RESTART_ATTEMPTS {
            if let Err(e) = self.kill_user_processes().await {
                tracing::warn!(container = %self.id, error = %e, attempt, "killing the sandbox's processes failed");
            }
            match ToolboxConn::start(&self.backend, &self.id, command, &self.config.user).await {
                Ok(conn) => return Ok(conn),
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(last.unwrap_or_else(|| ToolboxError::Start("no attempt made".into())))
    }

    /// Runs `kill -9 -1` as the command user until one run of it got to
    /// start: at the pids limit starting the kill itself can fail. Stops
    /// everything the run started, background processes included (and the
    /// toolbox, which the next call restarts).
    pub async fn kill_user_processes(&self) -> Result<(), ToolboxError> {
        // No shell: no command of the user's ever ran (and there is no
        // `kill` in such an image to run).
        if self.shell() == Some(SessionShell::Absent) {
            return Ok(());
        }
        let mut last = Ok(());
        for _ in 0..KILL_ATTEMPTS {
            match self.kill_all_once().await {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                // No container: nothing to retry.
                Err(e @ ToolboxError::Backend(BackendError::NotFound { .. })) => return Err(e),
                Err(e) => last = Err(e),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        last
    }

    /// Whether the kill ran. kill(-1) signals every process the caller may
    /// signal in one system call, so a fork bomb cannot outrun it.
    async fn kill_all_once(&self) -> Result<bool, ToolboxError> {
        // kill(-1) spares the caller; procps `kill` exits 1 when some
        // process could not be signalled. 126/127/-1: it never started.
        let code = self.run_detached(vec!["kill", "-9", "-1"], &self.config.user).await?;
        Ok(matches!(code, Some(0) | Some(1) | Some(137)))
    }

    /// Runs `cmd` as `user` without attaching; its exit code, `None` when
    /// it did not finish within a second.
    async fn run_detached(&self, cmd: Vec<&str>, user: &str) -> Result<Option<i64>, ToolboxError> {
        let exec = self.backend.exec_detached(&self.id, &ExecSpec { argv: cmd, user, ..Default::default() }).await?;
        for _ in 0..40 {
            let state = self.backend.exec_status(&self.id, &exec).await?;
            if state.running == Some(false) {
                return Ok(state.exit_code);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Ok(None)
    }

    /// The version of `path` the model last saw, if any.
    pub fn seen_version(&self, path: &str) -> Option<FileVersion> {
        lock(&self.toolbox.seen).get(&version_key(path)).copied()
    }

    pub fn record_seen(&self, path: &str, version: FileVersion) {
        lock(&self.toolbox.seen).insert(version_key(path), version);
    }
}

/// Images already warned about running without a toolbox: the fallback
/// is said once per image and process, not once per container (a warm
/// pool starts many).
static FALLBACK_WARNED: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn warn_fallback_once(image: &str, had_binary: bool, error: &ToolboxError) {
    let mut warned = FALLBACK_WARNED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if warned.iter().any(|i| i == image) {
        return;
    }
    warned.push(image.to_owned());
    if had_binary {
        tracing::warn!(image, error = %error, "the toolbox does not start in sandboxes of this image; tools run one docker exec per call (slower)");
    } else {
        tracing::warn!(
            image,
            "no kiln-toolbox binary (set {} or build it: `cargo build -p kiln-toolbox`) and none in the image; \
             tools run one docker exec per call (slower)",
            toolbox_binary::PATH_ENV
        );
    }
}

fn lock(m: &Mutex<HashMap<String, FileVersion>>) -> std::sync::MutexGuard<'_, HashMap<String, FileVersion>> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Absolute, with `.` and `..` resolved lexically, so `a.txt`, `./a.txt`
/// and `/workspace/a.txt` are one file for view-before-edit.
fn version_key(path: &str) -> String {
    let abs = if path.starts_with('/') { path.to_owned() } else { format!("{WORKSPACE}/{path}") };
    let mut parts: Vec<&str> = Vec::new();
    for part in abs.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::version_key;

    #[test]
    fn paths_naming_one_file_share_a_key() {
        assert_eq!(version_key("a.txt"), "/workspace/a.txt");
        assert_eq!(version_key("./src/../a.txt"), "/workspace/a.txt");
        assert_eq!(version_key("/workspace//a.txt"), "/workspace/a.txt");
        assert_eq!(version_key("/etc/hosts"), "/etc/hosts");
    }
}
