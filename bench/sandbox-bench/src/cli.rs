//! The baselines: the Docker CLI, run and timed as a user would run it.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Runs `docker ARGS`, fails unless it succeeds, and returns how long it
/// took and what it printed on stdout.
pub fn docker(args: &[&str]) -> anyhow::Result<(Duration, Vec<u8>)> {
    let started = Instant::now();
    let out: Output = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running docker {}", args.join(" ")))?;
    let took = started.elapsed();
    if !out.status.success() {
        bail!("docker {} failed ({}): {}", args.join(" "), out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok((took, out.stdout))
}

/// `docker exec` as the sandbox's command user, in the workspace.
pub fn exec_args<'a>(container: &'a str, command: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["exec", "-u", "1000:1000", "-w", "/workspace", container];
    args.extend_from_slice(command);
    args
}
