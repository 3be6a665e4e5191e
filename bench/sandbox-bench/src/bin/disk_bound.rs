//! The disk bound's cost (issue 30): a sandbox holding a 1 GB workspace
//! with its workspace on a loop-mounted disk image (`loop`, the mechanism
//! this engine's probe picks) against the same on tmpfs volumes (`tmpfs`,
//! what it got before), two sandboxes side by side with the worker's
//! settings but for the mechanism (`KILN_SANDBOX_DISK_MODE`).
//!
//! The workspace: a clean git repository of 10,000 files (~2 KB each), and
//! `deps/` in it, ignored by git, holding 1,000 MiB of text files (a
//! checkout's dependencies). Figures:
//! - the memory the sandbox's cgroup holds once the workspace is written
//!   (cgroup v1 `memory.stat`): what it cannot give back (`rss` + `shmem`:
//!   tmpfs pages are shmem) and everything charged (`usage`, page cache
//!   included), after building and again after the timed commands;
//! - `git status --porcelain` in the repository and `grep -rl` over the
//!   whole workspace (all of `deps/` read), through the toolbox's `bash`,
//!   the two sandboxes alternated (loop first on even repetitions), after
//!   one unmeasured run of each.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bollard::Docker;
use clap::Parser;
use kiln_bench_sandbox::setup::{self, Common};
use kiln_bench_sandbox::stats;
use kiln_bench_sandbox::workload::{self, order};
use kiln_worker::sandbox::disk::DiskMode;
use kiln_worker::sandbox::{Sandbox, SandboxConfig};

const REPO_DIR: &str = "/workspace/repo";

#[derive(Parser)]
#[command(about = "A 1 GB workspace on a loop disk vs on tmpfs: memory, git status, grep")]
struct Args {
    #[command(flatten)]
    common: Common,
    /// Rounds, each with two fresh sandboxes and a fresh workspace in each.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// MiB of dependencies in the workspace.
    #[arg(long, default_value_t = 1000)]
    workspace_mib: usize,
    /// Files in the repository.
    #[arg(long, default_value_t = 10_000)]
    repo_files: usize,
    /// The disk bound (`KILN_SANDBOX_DISK_MB`): room for the workspace.
    #[arg(long, default_value_t = 1400)]
    disk_mb: u64,
    /// OCI runtime (`KILN_SANDBOX_RUNTIME`); the engine's default if unset.
    #[arg(long)]
    runtime: Option<String>,
}

/// The mechanisms compared: `[baseline, measured]`.
const MODES: [DiskMode; 2] = [DiskMode::Tmpfs, DiskMode::Loop];
const NAMES: [&str; 2] = ["tmpfs", "loop"];

/// A cgroup's memory, in MiB.
#[derive(Debug, Clone, Copy)]
struct Memory {
    pinned: u64,
    usage: u64,
    limit: u64,
}

#[derive(Default)]
struct Figures {
    memory_built: [Vec<Memory>; 2],
    memory_after: [Vec<Memory>; 2],
    status: [Vec<Duration>; 2],
    grep: [Vec<Duration>; 2],
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let base = args.common.sandbox_config()?;
    let docker = setup::docker().await?;
    let disk_dir = setup::bench_disk_dir()?;
    let configs = MODES.map(|mode| SandboxConfig {
        disk_mode: mode,
        disk_mb: args.disk_mb,
        disk_dir: disk_dir.clone(),
        disk_plan: Arc::default(),
        toolbox_plan: Arc::default(),
        runtime: args.runtime.clone(),
        ..base.clone()
    });
    for config in &configs {
        let plan = config.disk_plan(&docker).await?;
        println!("{:?}: disk mechanism {}", config.disk_mode, plan.mechanism.as_str());
    }
    let mut figures = Figures::default();
    let mut result = Ok(());
    for round in 0..args.rounds {
        result = one_round(&args, &docker, &configs, round, &mut figures).await;
        if result.is_err() {
            break;
        }
    }
    let _ = std::fs::remove_dir(&disk_dir);
    result?;
    report(&args, &figures);
    Ok(())
}

async fn one_round(
    args: &Args,
    docker: &Docker,
    configs: &[SandboxConfig; 2],
    round: usize,
    figures: &mut Figures,
) -> anyhow::Result<()> {
    let mut sandboxes: [Option<Sandbox>; 2] = [None, None];
    let mut result = Ok(());
    for i in order(round) {
        match Sandbox::start(docker, &configs[i], &setup::owner()).await {
            Ok(sandbox) => sandboxes[i] = Some(sandbox),
            Err(e) => {
                result = Err(e.into());
                break;
            }
        }
    }
    if result.is_ok()
        && let [Some(tmpfs), Some(disk)] = &sandboxes
    {
        result = measure(args, docker, [tmpfs, disk], round, figures).await;
    }
    for sandbox in sandboxes.iter().flatten() {
        sandbox.remove().await;
    }
    result
}

async fn measure(
    args: &Args,
    docker: &Docker,
    sandboxes: [&Sandbox; 2],
    round: usize,
    figures: &mut Figures,
) -> anyhow::Result<()> {
    for i in order(round) {
        workload::repository(sandboxes[i], REPO_DIR, args.repo_files).await?;
        workload::dependencies(sandboxes[i], REPO_DIR, args.workspace_mib).await?;
    }
    for (series, sandbox) in figures.memory_built.iter_mut().zip(sandboxes) {
        series.push(memory(docker, sandbox).await?);
    }
    let status = format!("cd {REPO_DIR} && git status --porcelain");
    let grep = format!("grep -rl {} /workspace | wc -l", workload::NEEDLE);
    // Repetition 0 (unmeasured) refreshes the index and reads the files once.
    for rep in 0..=args.common.runs {
        for i in order(rep + round) {
            let took_status = workload::timed_bash(sandboxes[i], &status).await?;
            let took_grep = workload::timed_bash(sandboxes[i], &grep).await?;
            if rep > 0 {
                figures.status[i].push(took_status);
                figures.grep[i].push(took_grep);
            }
        }
    }
    for (series, sandbox) in figures.memory_after.iter_mut().zip(sandboxes) {
        series.push(memory(docker, sandbox).await?);
    }
    Ok(())
}

/// The sandbox's memory cgroup (cgroup v1, Docker's cgroupfs layout).
async fn memory(docker: &Docker, sandbox: &Sandbox) -> anyhow::Result<Memory> {
    let id = docker.inspect_container(sandbox.id(), None).await?.id.context("the container's id")?;
    let dir = PathBuf::from(format!("/sys/fs/cgroup/memory/docker/{id}"));
    let read =
        |file: &str| std::fs::read_to_string(dir.join(file)).with_context(|| format!("{}/{file}", dir.display()));
    let stat = read("memory.stat")?;
    let field = |name: &str| -> anyhow::Result<u64> {
        let value = stat.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' '));
        Ok(value.with_context(|| format!("{name} in memory.stat"))?.trim().parse()?)
    };
    let pinned = field("total_rss")? + field("total_shmem")?;
    let usage: u64 = read("memory.usage_in_bytes")?.trim().parse()?;
    let limit: u64 = read("memory.limit_in_bytes")?.trim().parse()?;
    Ok(Memory { pinned: pinned >> 20, usage: usage >> 20, limit: limit >> 20 })
}

fn report(args: &Args, f: &Figures) {
    println!(
        "\n{} MiB of dependencies + a {}-file repository, disk bound {} MiB, runtime {}, {} rounds:",
        args.workspace_mib,
        args.repo_files,
        args.disk_mb,
        args.runtime.as_deref().unwrap_or("(engine default)"),
        args.rounds
    );
    for (when, series) in [("built", &f.memory_built), ("after the commands", &f.memory_after)] {
        for (name, samples) in NAMES.iter().zip(series) {
            let line: Vec<String> =
                samples.iter().map(|m| format!("rss+shmem {} usage {} limit {}", m.pinned, m.usage, m.limit)).collect();
            println!("memory, {when}, {name:<5} (MiB): {}", line.join(" | "));
        }
        let ratios: Vec<String> = series[1]
            .iter()
            .zip(&series[0])
            .map(|(l, t)| format!("{:.4}x", l.pinned as f64 / t.pinned as f64))
            .collect();
        println!("ratio memory rss+shmem, {when}, loop / tmpfs: {}   goal <= 0.1", ratios.join(" "));
    }
    for (name, series) in [("git status", &f.status), ("grep -rl, whole workspace", &f.grep)] {
        let t = stats::report(&format!("{name}, tmpfs"), &series[0]);
        let l = stats::report(&format!("{name}, loop"), &series[1]);
        stats::ratio(&format!("{name}: loop / tmpfs"), l, t, Some(1.5));
    }
}
