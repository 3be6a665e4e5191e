//! The plain way a program runs one command in a container: an exec
//! through the Docker API (created, started attached, read to its end,
//! inspected for the exit code), as the worker did before the toolbox. The
//! exec baselines use this, not the Docker CLI, whose own start-up (~100 ms
//! on the development VM) would be most of what they measure.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use futures::StreamExt;

/// The sandbox's command user and directory, as `Sandbox::exec` runs commands.
const USER: &str = "1000:1000";
const WORKDIR: &str = "/workspace";

/// Runs `argv` (no shell around it) in `container` as the sandbox's command
/// user in the workspace, fails unless it exits 0, and returns how long the
/// whole exec took and its stdout.
pub async fn exec(docker: &Docker, container: &str, argv: &[&str]) -> anyhow::Result<(Duration, Vec<u8>)> {
    let started = Instant::now();
    let options = CreateExecOptions {
        cmd: Some(argv.to_vec()),
        user: Some(USER),
        working_dir: Some(WORKDIR),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        ..Default::default()
    };
    let created = docker.create_exec(container, options).await.context("creating the exec")?;
    let (stdout, stderr) = match docker.start_exec(&created.id, None).await.context("starting the exec")? {
        StartExecResults::Attached { output, .. } => read_to_end(output).await?,
        StartExecResults::Detached => bail!("the exec of {argv:?} started detached"),
    };
    let exit = docker.inspect_exec(&created.id).await.context("inspecting the exec")?.exit_code;
    let took = started.elapsed();
    if exit != Some(0) {
        bail!("{argv:?} exited {exit:?}: {}", String::from_utf8_lossy(&stderr).trim());
    }
    Ok((took, stdout))
}

/// stdout and stderr of an attached exec, each in full.
async fn read_to_end(
    mut output: impl futures::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Unpin,
) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    while let Some(chunk) = output.next().await {
        match chunk.context("reading the exec's output")? {
            LogOutput::StdOut { message } => stdout.extend_from_slice(&message),
            LogOutput::StdErr { message } => stderr.extend_from_slice(&message),
            _ => {}
        }
    }
    Ok((stdout, stderr))
}
