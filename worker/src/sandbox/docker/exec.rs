//! Execs as `docker exec`: created, then started attached (the output a
//! multiplexed stream, stdin a pipe) or detached.

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use futures::StreamExt;

use crate::sandbox::backend::{BackendError, Exec, ExecChunk, ExecSpec};

/// Creates (does not start) the exec `spec` says in container `id`, with
/// its streams attached or not: its id. Never a TTY.
async fn create(docker: &Docker, id: &str, spec: &ExecSpec<'_>, attached: bool) -> Result<String, BackendError> {
    let options = CreateExecOptions {
        cmd: Some(spec.argv.clone()),
        user: Some(spec.user),
        env: (!spec.env.is_empty()).then(|| spec.env.iter().map(String::as_str).collect()),
        working_dir: spec.cwd,
        attach_stdin: Some(attached && spec.stdin),
        attach_stdout: Some(attached),
        attach_stderr: Some(attached),
        tty: Some(false),
        ..Default::default()
    };
    Ok(docker.create_exec(id, options).await?.id)
}

pub(super) async fn attached(docker: &Docker, id: &str, spec: &ExecSpec<'_>) -> Result<Exec, BackendError> {
    let exec = create(docker, id, spec, true).await?;
    match docker.start_exec(&exec, None).await? {
        StartExecResults::Attached { output, input } => {
            let output = output.map(|chunk| chunk.map(chunk_of).map_err(BackendError::from));
            Ok(Exec { id: exec, output: Box::pin(output), input })
        }
        StartExecResults::Detached => Err(BackendError::NotAttached("docker did not attach to the exec".into())),
    }
}

pub(super) async fn detached(docker: &Docker, id: &str, spec: &ExecSpec<'_>) -> Result<String, BackendError> {
    let exec = create(docker, id, spec, false).await?;
    docker.start_exec(&exec, Some(StartExecOptions { detach: true, ..Default::default() })).await?;
    Ok(exec)
}

fn chunk_of(log: LogOutput) -> ExecChunk {
    match log {
        LogOutput::StdOut { message } => ExecChunk::Stdout(message),
        LogOutput::StdErr { message } => ExecChunk::Stderr(message),
        LogOutput::StdIn { message } | LogOutput::Console { message } => ExecChunk::Other(message),
    }
}
