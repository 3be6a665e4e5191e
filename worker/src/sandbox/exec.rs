//! Running a command in the sandbox: one exec per call.

use std::time::Duration;

use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use kiln_toolbox::protocol::SessionShell;

use super::backend::{BackendError, Exec, ExecChunk, ExecSpec};
use super::{HeadTail, Sandbox, SandboxError, WORKSPACE};

/// Exit status GNU `timeout` uses when it had to kill the command.
const TIMEOUT_EXIT: i64 = 124;
/// Exit status when `timeout -k` had to escalate to SIGKILL.
const KILLED_EXIT: i64 = 137;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// Exit code; `None` if Docker could not tell.
    pub exit_code: Option<i64>,
    /// stdout and stderr interleaved, capped (head and tail kept).
    pub output: String,
    pub timed_out: bool,
}

impl Sandbox {
    /// Starts an attached exec of `spec` in the sandbox (the building
    /// block of everything that runs a process in it).
    pub(crate) async fn start_exec(&self, spec: &ExecSpec<'_>) -> Result<Exec, BackendError> {
        self.backend.exec(&self.id, spec).await
    }

    /// How an exec of this sandbox ended; `None` if the backend cannot tell.
    pub(crate) async fn exec_exit_code(&self, exec: &str) -> Result<Option<i64>, BackendError> {
        Ok(self.backend.exec_status(&self.id, exec).await?.exit_code)
    }

    /// Starts `argv` as the command user in `/workspace`, under GNU
    /// `timeout` (which kills the command's whole process group), stdout
    /// and stderr attached, stdin if asked.
    async fn start_user_exec(&self, argv: &[&str], timeout: Duration, stdin: bool) -> Result<Exec, BackendError> {
        let secs = timeout.as_secs().max(1).to_string();
        let mut cmd = vec!["timeout", "-k", "2", secs.as_str()];
        cmd.extend_from_slice(argv);
        let spec = ExecSpec { argv: cmd, user: &self.config.user, cwd: Some(WORKSPACE), stdin, ..Default::default() };
        self.start_exec(&spec).await
    }

    /// Runs `command` with the sandbox's shell (bash, else sh) in
    /// `/workspace`, stdin closed. `timeout` kills the command's whole
    /// process group (GNU `timeout` signals its group); `on_output` sees
    /// each chunk as it arrives. An image without a shell: `NoShell`.
    ///
    /// Where the shell is not known yet (a container adopted by name), bash
    /// is tried, then sh: a shell that could not be started ran nothing, so
    /// trying the next one is safe.
    pub async fn exec(
        &self,
        command: &str,
        timeout: Duration,
        output_cap: usize,
        mut on_output: impl FnMut(&[u8]),
    ) -> Result<ExecOutput, SandboxError> {
        if let Some(known) = self.shell() {
            let Some(program) = known.program() else {
                return Err(SandboxError::NoShell { image: self.config.image.clone() });
            };
            return self.exec_with(program, command, timeout, output_cap, &mut on_output).await;
        }
        for shell in [SessionShell::Bash, SessionShell::Sh] {
            let program = shell.program().unwrap_or("sh");
            let out = self.exec_with(program, command, timeout, output_cap, &mut on_output).await?;
            if !did_not_start(&out, program) {
                self.set_shell(shell);
                return Ok(out);
            }
        }
        Err(SandboxError::NoShell { image: self.config.image.clone() })
    }

    async fn exec_with(
        &self,
        program: &str,
        command: &str,
        timeout: Duration,
        output_cap: usize,
        on_output: &mut impl FnMut(&[u8]),
    ) -> Result<ExecOutput, SandboxError> {
        let Exec { id, mut output, .. } = self.start_user_exec(&[program, "-c", command], timeout, false).await?;
        let mut captured = HeadTail::new(output_cap);
        // The timeout inside the sandbox is authoritative; this outer one
        // only guards against an engine that never closes the stream.
        let guard = tokio::time::sleep(timeout + Duration::from_secs(10));
        tokio::pin!(guard);
        loop {
            tokio::select! {
                chunk = output.next() => match chunk {
                    Some(Ok(chunk)) => {
                        let bytes = chunk.into_bytes();
                        on_output(&bytes);
                        captured.push(&bytes);
                    }
                    Some(Err(e)) => return Err(e.into()),
                    None => break,
                },
                _ = &mut guard => break,
            }
        }
        let exit_code = self.exec_exit_code(&id).await?;
        let timed_out = matches!(exit_code, Some(TIMEOUT_EXIT) | Some(KILLED_EXIT));
        Ok(ExecOutput { exit_code, output: captured.render().0, timed_out })
    }
}

/// Whether `program` could not be started at all: the engine (runc or
/// runsc) says so with 126 and its own message, or `timeout` (GNU or
/// busybox) with 126/127 and its name first. A shell that ran and failed
/// never prints either.
fn did_not_start(out: &ExecOutput, program: &str) -> bool {
    let text = out.output.trim_start();
    matches!(out.exit_code, Some(126 | 127))
        && (text.starts_with("OCI runtime exec failed") || text.starts_with("timeout:"))
        && text.lines().next().is_some_and(|l| l.contains(program))
}

/// A command's raw result: stdout as bytes, stderr as (short) text.
#[derive(Debug)]
pub(crate) struct RawOutput {
    pub exit_code: Option<i64>,
    pub stdout: Vec<u8>,
    /// stdout went past the cap; the rest was not read.
    pub overflow: bool,
    pub stderr: String,
}

/// Most stderr kept from a raw exec: it becomes an error message.
const RAW_STDERR_CAP: usize = 4096;

impl Sandbox {
    /// Runs `argv` (no shell around it) as the command user, with `stdin`
    /// written to it and then closed, keeping up to `stdout_cap` bytes of
    /// stdout. For file transfers that must act with the user's rights, not
    /// the engine's, and for output the worker must bound (the capture).
    pub(crate) async fn exec_raw(
        &self,
        argv: &[&str],
        stdin: Option<&[u8]>,
        stdout_cap: usize,
        timeout: Duration,
    ) -> Result<RawOutput, SandboxError> {
        let Exec { id, mut output, mut input } = self.start_user_exec(argv, timeout, stdin.is_some()).await?;
        let mut out = RawOutput { exit_code: None, stdout: Vec::new(), overflow: false, stderr: String::new() };
        let transfer = async {
            if let Some(bytes) = stdin {
                // A command that failed early stops reading; its exit
                // status and stderr then say why, not the broken pipe.
                if input.write_all(bytes).await.is_ok() {
                    // EOF for the command.
                    let _ = input.shutdown().await;
                }
            }
            drop(input);
            while let Some(chunk) = output.next().await {
                match chunk? {
                    ExecChunk::Stdout(message) => {
                        if out.stdout.len() + message.len() > stdout_cap {
                            out.overflow = true;
                            break;
                        }
                        out.stdout.extend_from_slice(&message);
                    }
                    ExecChunk::Stderr(message) if out.stderr.len() < RAW_STDERR_CAP => {
                        out.stderr.push_str(&String::from_utf8_lossy(&message));
                    }
                    _ => {}
                }
            }
            Ok::<(), SandboxError>(())
        };
        // The timeout inside the sandbox is authoritative; this one guards
        // against an engine that never closes the stream.
        match tokio::time::timeout(timeout + Duration::from_secs(10), transfer).await {
            Ok(result) => result?,
            Err(_) => return Err(SandboxError::Workspace("a file transfer in the sandbox hung".into())),
        }
        if out.overflow {
            return Ok(out);
        }
        out.exit_code = self.exec_exit_code(&id).await?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::{ExecOutput, did_not_start};

    fn out(code: i64, text: &str) -> ExecOutput {
        ExecOutput { exit_code: Some(code), output: text.into(), timed_out: false }
    }

    #[test]
    fn only_a_shell_that_never_started_is_taken_for_a_missing_one() {
        let runc = "OCI runtime exec failed: exec failed: unable to start container process: exec: \"timeout\": \
                    executable file not found in $PATH: unknown";
        assert!(!did_not_start(&out(126, runc), "bash"), "timeout is missing, not bash");
        assert!(did_not_start(&out(126, &runc.replace("timeout", "bash")), "bash"));
        assert!(did_not_start(&out(127, "timeout: can't execute 'bash': No such file or directory\n"), "bash"));
        assert!(did_not_start(&out(127, "timeout: failed to run command ‘bash’: No such file or directory"), "bash"));
        // bash ran, and a command in it was not found.
        assert!(!did_not_start(&out(127, "bash: line 1: git: command not found\n"), "bash"));
        assert!(!did_not_start(&out(0, "timeout: bash\n"), "bash"));
    }
}
