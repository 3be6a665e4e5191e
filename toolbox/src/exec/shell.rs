//! Starting the shell that runs a command: `bash -c SCRIPT` in a process
//! group of its own, stdout and stderr into one pipe, and the preamble that
//! bash sources first (through `BASH_ENV`) to record the session's state in a
//! private state file when the command ends.
//!
//! An image without bash runs commands with its POSIX `sh` (busybox, dash):
//! `sh` has no `BASH_ENV`, so the `-c` string itself starts by sourcing
//! [`POSIX_PREAMBLE`] (named by a variable, on the command's first line, so
//! line numbers in its errors stay the user's). An image with neither has no
//! shell: starting a command is a tool error saying so.

use std::ffi::OsString;
use std::io::{self, PipeReader};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::{internal, spawn_error};
use crate::protocol::{ErrorKind, SessionShell, ToolError};

/// Variables of the toolbox's own plumbing, never persisted.
const STATE_VAR: &str = "KILN_TOOLBOX_STATE";
const COMMAND_VAR: &str = "KILN_TOOLBOX_COMMAND";
pub(super) const USER_BASH_ENV_VAR: &str = "KILN_TOOLBOX_USER_BASH_ENV";
const POSIX_PREAMBLE_VAR: &str = "KILN_TOOLBOX_PREAMBLE";

/// What an exec gets in an image with no shell at all: the model should
/// stop trying commands and use the file tools.
pub const NO_SHELL: &str = "this sandbox's image has no shell (neither bash nor sh), so commands cannot run here; \
     use the file tools instead (view, ls, glob, grep, edit, write)";

/// Sourced by bash (through `BASH_ENV`) before the command. It unsets its own
/// plumbing so nested shells see none of it, and sets the EXIT trap that
/// records the state. `builtin` guards against functions of the same name.
/// A standby shell (see [`super::standby`]) waits in `__kiln_standby` for its
/// go line, then takes its command from the file named by `KILN_TOOLBOX_COMMAND`.
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

/// The same for a POSIX `sh`, sourced by the first line of the `-c` string:
/// the state is recorded the same way (`export -p` in the POSIX form, see
/// `export_list`), and there is no standby (it reads its command with
/// bash's `read -d`).
const POSIX_PREAMBLE: &str = r#"# kiln-toolbox preamble for sh: sourced by the first line of each command.
__kiln_state=$KILN_TOOLBOX_STATE
unset KILN_TOOLBOX_STATE KILN_TOOLBOX_PREAMBLE
if [ -n "${KILN_TOOLBOX_USER_BASH_ENV+set}" ]; then
    export BASH_ENV="$KILN_TOOLBOX_USER_BASH_ENV"
    unset KILN_TOOLBOX_USER_BASH_ENV
fi
__kiln_save_state() {
    __kiln_rc=$?
    { printf '%s\0' "$PWD"; export -p; } >|"$__kiln_state" 2>&-
    exit "$__kiln_rc"
}
trap __kiln_save_state EXIT
"#;

/// How the `-c` string of a POSIX `sh` starts: sources the preamble, on the
/// command's own first line.
const POSIX_PROLOGUE: &str = ". \"$KILN_TOOLBOX_PREAMBLE\"; ";

/// The shell binary and the private directory its state files go to.
pub(super) struct Shell {
    /// `None`: the image has no shell.
    program: Option<PathBuf>,
    kind: SessionShell,
    /// Private directory (mode 0700) for the preamble and the state files.
    state_dir: PathBuf,
}

impl Shell {
    /// Finds bash, else sh, on the `PATH` of `env` (or in `/bin`) and picks
    /// the state directory.
    pub(super) fn new(env: &[(OsString, OsString)]) -> Self {
        let find =
            |name: &str| find_in_path(env, name).or_else(|| Some(Path::new("/bin").join(name)).filter(|p| p.is_file()));
        let (kind, program) = match (find("bash"), find("sh")) {
            (Some(bash), _) => (SessionShell::Bash, Some(bash)),
            (None, Some(sh)) => (SessionShell::Sh, Some(sh)),
            (None, None) => (SessionShell::Absent, None),
        };
        Shell { program, kind, state_dir: choose_state_dir() }
    }

    /// Which shell commands run with.
    pub(super) fn kind(&self) -> SessionShell {
        self.kind
    }

    /// Whether a standby shell can wait for the next command (bash only).
    pub(super) fn has_standby(&self) -> bool {
        self.kind == SessionShell::Bash
    }

    pub(super) fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Where the EXIT trap of command number `seq` records the state.
    pub(super) fn state_file(&self, seq: u64) -> PathBuf {
        self.state_dir.join(format!("state-{seq}"))
    }

    /// Where a standby shell number `seq` finds a command too long for its pipe.
    pub(super) fn command_file(&self, seq: u64) -> PathBuf {
        self.state_dir.join(format!("command-{seq}"))
    }

    /// Starts `bash -c SCRIPT` (or `sh -c`, the preamble sourced first) in
    /// a process group of its own, stdout and stderr into one new pipe.
    /// stdin is `/dev/null`, or for a standby (`command_file` given) a pipe
    /// for its go line. No shell: a tool error the model can act on.
    pub(super) fn spawn(
        &self,
        script: &str,
        cwd: &Path,
        env: Vec<(OsString, OsString)>,
        preamble: &Path,
        state_file: &Path,
        command_file: Option<&Path>,
    ) -> Result<(Child, PipeReader), ToolError> {
        let Some(program) = &self.program else {
            return Err(ToolError::new(ErrorKind::NotFound, NO_SHELL));
        };
        let _ = std::fs::remove_file(state_file);
        let (reader, writer) = std::io::pipe().map_err(|e| internal("creating the output pipe", e))?;
        let writer2 = writer.try_clone().map_err(|e| internal("creating the output pipe", e))?;
        let mut cmd = Command::new(program);
        cmd.arg("-c").current_dir(cwd).env_clear().envs(env).env(STATE_VAR, state_file);
        if self.kind == SessionShell::Bash {
            cmd.arg(script).env("BASH_ENV", preamble);
        } else {
            cmd.arg(format!("{POSIX_PROLOGUE}{script}")).env(POSIX_PREAMBLE_VAR, preamble);
        }
        cmd.stdout(writer).stderr(writer2).process_group(0);
        if let Some(user) = crate::identity::run_as() {
            // Not std's `uid`/`gid`: its unprivileged `setgid` cannot leave
            // the effective-ids switch the toolbox makes under gVisor (see
            // `identity`). The supplementary groups were dropped at start.
            // SAFETY: the closure makes raw system calls only (no
            // allocation, no locks), as a child between fork and exec must.
            unsafe {
                cmd.pre_exec(|| crate::identity::become_user(user));
            }
        }
        match command_file {
            Some(file) => cmd.env(COMMAND_VAR, file).stdin(Stdio::piped()),
            None => cmd.stdin(Stdio::null()),
        };
        let child = cmd.spawn().map_err(|e| spawn_error("starting the shell", e))?;
        // `cmd` holds our copies of the pipe's write end: drop them, or the
        // pipe would never report end-of-file.
        drop(cmd);
        Ok((child, reader))
    }

    /// (Re)creates the private directory and the preamble: a command may have
    /// removed them (`rm -rf /tmp/*`).
    pub(super) fn prepare_state_dir(&self) -> io::Result<PathBuf> {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&self.state_dir)?;
        let preamble = self.state_dir.join("preamble.sh");
        let text = if self.kind == SessionShell::Bash { PREAMBLE } else { POSIX_PREAMBLE };
        if std::fs::read(&preamble).ok().as_deref() != Some(text.as_bytes()) {
            std::fs::write(&preamble, text)?;
        }
        Ok(preamble)
    }
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
        if m.is_dir() && m.uid() == crate::identity::file_owner().0.as_raw() && m.mode() & 0o077 == 0)
}

fn find_in_path(env: &[(OsString, OsString)], name: &str) -> Option<PathBuf> {
    let path = env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.clone())?;
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| p.is_file())
}
