//! Running a command in the sandbox: one exec per call.

use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, CreateExecResults, StartExecResults};
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

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

/// How an exec made by [`Sandbox::create_exec_as`] is wired.
#[derive(Default)]
pub(super) struct ExecSetup<'a> {
    /// stdin, stdout and stderr attached; else none (the exec is started
    /// detached).
    pub attached: bool,
    /// `KEY=value` pairs added to the container's environment.
    pub env: Option<Vec<&'a str>>,
    /// Working directory; `None`: the image's.
    pub cwd: Option<&'a str>,
}

impl Sandbox {
    /// Creates (does not start) an exec of `cmd` as `user` in the
    /// container: its id. Never a TTY, which would mangle the streams.
    pub(super) async fn create_exec_as(
        &self,
        cmd: Vec<&str>,
        user: &str,
        setup: ExecSetup<'_>,
    ) -> Result<String, bollard::errors::Error> {
        let options = CreateExecOptions {
            cmd: Some(cmd),
            user: Some(user),
            env: setup.env,
            working_dir: setup.cwd,
            attach_stdin: Some(setup.attached),
            attach_stdout: Some(setup.attached),
            attach_stderr: Some(setup.attached),
            tty: Some(false),
            ..Default::default()
        };
        Ok(self.docker.create_exec(&self.id, options).await?.id)
    }

    /// Creates an attached exec of `argv` as the command user in
    /// `/workspace`, under GNU `timeout` (which kills the command's whole
    /// process group), stdout and stderr attached, stdin if asked.
    async fn create_user_exec(
        &self,
        argv: &[&str],
        timeout: Duration,
        stdin: bool,
    ) -> Result<CreateExecResults, bollard::errors::Error> {
        let secs = timeout.as_secs().max(1).to_string();
        let mut cmd = vec!["timeout", "-k", "2", secs.as_str()];
        cmd.extend_from_slice(argv);
        self.docker
            .create_exec(
                &self.id,
                CreateExecOptions {
                    cmd: Some(cmd),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    attach_stdin: Some(stdin),
                    tty: Some(false),
                    working_dir: Some(WORKSPACE),
                    user: Some(self.config.user.as_str()),
                    ..Default::default()
                },
            )
            .await
    }

    /// Runs `command` with bash in `/workspace`, stdin closed. `timeout`
    /// kills the command's whole process group (GNU `timeout` signals its
    /// group); `on_output` sees each chunk as it arrives.
    pub async fn exec(
        &self,
        command: &str,
        timeout: Duration,
        output_cap: usize,
        mut on_output: impl FnMut(&[u8]),
    ) -> Result<ExecOutput, SandboxError> {
        let exec = self.create_user_exec(&["bash", "-c", command], timeout, false).await?;
        let mut captured = HeadTail::new(output_cap);
        if let StartExecResults::Attached { mut output, .. } = self.docker.start_exec(&exec.id, None).await? {
            // The timeout inside the container is authoritative; this outer
            // one only guards against an engine that never closes the stream.
            let guard = tokio::time::sleep(timeout + Duration::from_secs(10));
            tokio::pin!(guard);
            loop {
                tokio::select! {
                    chunk = output.next() => match chunk {
                        Some(Ok(log)) => {
                            let bytes = log.into_bytes();
                            on_output(&bytes);
                            captured.push(&bytes);
                        }
                        Some(Err(e)) => return Err(e.into()),
                        None => break,
                    },
                    _ = &mut guard => break,
                }
            }
        }
        let exit_code = self.docker.inspect_exec(&exec.id).await?.exit_code;
        let timed_out = matches!(exit_code, Some(TIMEOUT_EXIT) | Some(KILLED_EXIT));
        Ok(ExecOutput { exit_code, output: captured.render().0, timed_out })
    }
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
        let exec = self.create_user_exec(argv, timeout, stdin.is_some()).await?;
        let mut out = RawOutput { exit_code: None, stdout: Vec::new(), overflow: false, stderr: String::new() };
        if let StartExecResults::Attached { mut output, mut input } = self.docker.start_exec(&exec.id, None).await? {
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
                        LogOutput::StdOut { message } => {
                            if out.stdout.len() + message.len() > stdout_cap {
                                out.overflow = true;
                                break;
                            }
                            out.stdout.extend_from_slice(&message);
                        }
                        LogOutput::StdErr { message } if out.stderr.len() < RAW_STDERR_CAP => {
                            out.stderr.push_str(&String::from_utf8_lossy(&message));
                        }
                        _ => {}
                    }
                }
                Ok::<(), SandboxError>(())
            };
            // The timeout inside the container is authoritative; this one
            // guards against an engine that never closes the stream.
            match tokio::time::timeout(timeout + Duration::from_secs(10), transfer).await {
                Ok(result) => result?,
                Err(_) => return Err(SandboxError::Workspace("a file transfer in the sandbox hung".into())),
            }
        }
        if out.overflow {
            return Ok(out);
        }
        out.exit_code = self.docker.inspect_exec(&exec.id).await?.exit_code;
        Ok(out)
    }
}
