//! A shell started ahead of the next command.
//!
//! Starting bash costs milliseconds inside a sandbox (fork, exec, dynamic
//! loading, and the seccomp filter on every one of those system calls):
//! most of a short command's time. So once a command is over, the toolbox
//! starts the next shell with the session's cwd and environment and leaves it
//! blocked reading its stdin. Running a command then costs a write to a pipe.
//!
//! The shell's `-c` string is [`BOOTSTRAP`]: `__kiln_standby` (defined by the
//! preamble) reads the command from its stdin (or, when it is long, from a
//! file) into `$BASH_EXECUTION_STRING`, where `bash -c` keeps its command too;
//! the toolbox has closed the pipe by then, so the command's stdin is at its
//! end, like `/dev/null`. Then `eval` runs the command on the first line of
//! the `-c` string. So `$LINENO`, `$0`, `exit`, the EXIT trap and bash's
//! error messages are those of `bash -c COMMAND`, except that a syntax error
//! is reported as `bash: eval: line N` instead of `bash: -c: line N`.
//! (`command` skips any function named `eval`; `builtin eval` would drop the
//! line number from syntax errors.)
//!
//! A standby is only good for the state it was started with (the working
//! directory and the exported environment: nothing else carries from one
//! command to the next). Three wait at once (`STANDBYS`), so that each of
//! up to three commands sent one the moment the one before it answered
//! (three calls in one step) still finds a shell ready (a new one takes a
//! few milliseconds to start, and its start is put off while one waits:
//! `TOP_UP_AFTER`): the oldest serves it when the command before left the
//! state as it was. One whose state is gone is killed.

use std::ffi::OsString;
use std::io::{PipeReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin};

use rustix::process::Pid;

/// The standby shell's `-c` string. One line: `$LINENO` in the command
/// counts from the line `eval` is on.
pub(super) const BOOTSTRAP: &str = r#"__kiln_standby; command eval "$BASH_EXECUTION_STRING""#;

/// Longest command sent through the pipe rather than the file.
const INLINE_MAX: usize = 256;

/// A started shell, waiting for its command.
pub(super) struct Standby {
    child: Child,
    /// The command (or an empty one, meaning "in `command_file`"),
    /// NUL-terminated, starts it; end of file makes it exit.
    go: ChildStdin,
    output: PipeReader,
    state_file: PathBuf,
    command_file: PathBuf,
    /// The working directory it was started in.
    cwd: PathBuf,
    /// The environment it was started with, sorted.
    env: Vec<(OsString, OsString)>,
}

/// A shell running a command: a standby that was started, or a new `bash -c`.
pub(super) struct Launched {
    pub child: Child,
    pub output: PipeReader,
    /// Where its EXIT trap records the cwd and environment.
    pub state_file: PathBuf,
    /// The file a standby read its command from (removed afterwards).
    pub command_file: Option<PathBuf>,
}

impl Standby {
    pub(super) fn new(
        child: Child,
        go: ChildStdin,
        output: PipeReader,
        state_file: PathBuf,
        command_file: PathBuf,
        cwd: PathBuf,
        env: &[(OsString, OsString)],
    ) -> Self {
        let env = sorted(env).into_iter().cloned().collect();
        Standby { child, go, output, state_file, command_file, cwd, env }
    }

    /// Whether it can run the next command of a session whose state is `cwd`
    /// and `env`: started with that state, and the directory still the one
    /// at that path.
    pub(super) fn fits(&self, cwd: &Path, env: &[(OsString, OsString)]) -> bool {
        self.env.len() == env.len() && self.env.iter().eq(sorted(env)) && self.is_in(cwd)
    }

    /// Whether the shell still waits (a command may have killed it: `kill -9
    /// -1` kills everything the sandbox user owns).
    pub(super) fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Whether it was started in `cwd`, and that directory is still the one
    /// at that path (not removed, or removed and made again).
    fn is_in(&self, cwd: &Path) -> bool {
        if self.cwd != cwd {
            return false;
        }
        let pid = self.child.id();
        // The kernel's view of its cwd: a removed directory reads as
        // "<path> (deleted)".
        std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|actual| actual == cwd)
    }

    /// Hands `command` to the shell and lets it run. `None` (the standby is
    /// discarded) when it is gone or cannot be reached: start a new shell.
    pub(super) fn start(mut self, command: &str) -> Option<Launched> {
        if !self.is_alive() {
            return None;
        }
        // bash reads a pipe a byte at a time (it must not read past the
        // NUL), so only a short command comes that way; a long one is
        // written to the file, announced by an empty one.
        let inline = !command.is_empty() && command.len() <= INLINE_MAX;
        let sent = if inline {
            let mut message = Vec::with_capacity(command.len() + 1);
            message.extend_from_slice(command.as_bytes());
            message.push(0);
            self.go.write_all(&message)
        } else {
            std::fs::write(&self.command_file, command).and_then(|()| self.go.write_all(b"\0"))
        };
        if sent.is_err() {
            let _ = std::fs::remove_file(&self.command_file);
            self.discard();
            return None;
        }
        // Closing our end leaves the shell's stdin at its end: a command
        // that reads it gets EOF at once, as from /dev/null.
        drop(self.go);
        Some(Launched {
            child: self.child,
            output: self.output,
            state_file: self.state_file,
            command_file: (!inline).then_some(self.command_file),
        })
    }

    /// Kills the shell, unless it is already gone (then its pid may belong to
    /// someone else by now, so it is not signalled).
    pub(super) fn discard(mut self) {
        if self.is_alive() {
            super::process_group::kill_group(Pid::from_child(&self.child));
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.state_file);
    }
}

/// `env` in one order (by reference: it is compared before every command,
/// and nothing of it need be copied): the session's is in `export -p`'s
/// after a command and in the toolbox's own before the first, the same
/// variables either way.
fn sorted(env: &[(OsString, OsString)]) -> Vec<&(OsString, OsString)> {
    let mut env: Vec<_> = env.iter().collect();
    env.sort_unstable();
    env
}
