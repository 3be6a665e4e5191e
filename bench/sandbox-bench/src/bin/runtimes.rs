//! gVisor against runc on the same engine (issue 30): the same work under
//! `KILN_SANDBOX_RUNTIME=runsc` and under the engine's `runc`, alternated in
//! one run (runc first on even repetitions, runsc first on odd ones), warm
//! against warm and cold against cold. Every figure is the worker's own
//! path, as `session_start` and `bash_true` take it:
//!
//! - session start, cold (`Sandbox::start`, then `bash true`) and warm
//!   (`lifecycle::acquire` from a filled `WarmPool` of that runtime, then
//!   `bash true`); both pools are full before every measured start;
//! - one `bash true` through the toolbox, its standby ready (after 100 ms,
//!   as after any model call);
//! - the `grep` tool (the toolbox's search) over 1,000 files, and the same
//!   search as `grep -rl` through `bash`;
//! - `git status` in a clean 10,000-file repository, through `bash`;
//! - 100 MB through the egress proxy: a sandbox on its session's network
//!   fetching from a server on a network this benchmark made.
//!
//! The sandboxes get the worker's default settings and its disk bound as
//! the probe picks it (`loop` on this engine), under both runtimes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bollard::Docker;
use clap::Parser;
use kiln_bench_sandbox::egress_fetch::{self, EgressSandbox};
use kiln_bench_sandbox::server::Server;
use kiln_bench_sandbox::setup::{self, Common};
use kiln_bench_sandbox::stats;
use kiln_bench_sandbox::workload::{self, order};
use kiln_worker::sandbox::lifecycle::{self, Origin};
use kiln_worker::sandbox::pool::WarmPool;
use kiln_worker::sandbox::{Sandbox, SandboxConfig};
use tokio_util::sync::CancellationToken;

const TRUE_TIMEOUT: Duration = Duration::from_secs(60);
const REFILL_LIMIT: Duration = Duration::from_secs(120);
/// Warm containers each runtime's pool keeps ready.
const WARM: usize = 1;
/// Time a model call takes at the very least (see `bash_true`).
const AFTER_A_MODEL_CALL: Duration = Duration::from_millis(100);
const GREP_DIR: &str = "/workspace/grep";
const REPO_DIR: &str = "/workspace/repo";

#[derive(Parser)]
#[command(about = "gVisor (runsc) against runc: session start, bash true, grep, git status, egress")]
struct Args {
    #[command(flatten)]
    common: Common,
    /// The runtime measured.
    #[arg(long, default_value = "runsc")]
    runtime: String,
    /// The runtime it is measured against.
    #[arg(long, default_value = "runc")]
    baseline: String,
    /// Which parts to run: start, tools, egress.
    #[arg(long, value_delimiter = ',', default_value = "start,tools,egress")]
    parts: Vec<String>,
    /// Files the grep figures search.
    #[arg(long, default_value_t = 1000)]
    grep_files: usize,
    /// Files in the `git status` repository.
    #[arg(long, default_value_t = 10_000)]
    repo_files: usize,
    /// Bytes per egress download.
    #[arg(long, default_value_t = 100_000_000)]
    egress_bytes: u64,
    /// The sandboxes' pids limit (`KILN_SANDBOX_PIDS`); the worker's
    /// default if unset. Under gVisor the container's host limit is 16
    /// times it, for the Sentry's own threads, and this holds the sandbox's
    /// processes (`nproc`), as in the worker.
    #[arg(long)]
    pids_limit: Option<i64>,
}

/// One figure's samples under each runtime: `[baseline, measured]`.
type Pair = [Vec<Duration>; 2];

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let base = args.common.sandbox_config()?;
    let docker = setup::docker().await?;
    let disk_dir = setup::bench_disk_dir()?;
    let configs = [&args.baseline, &args.runtime].map(|runtime| SandboxConfig {
        runtime: Some(runtime.clone()),
        pids_limit: args.pids_limit.unwrap_or(base.pids_limit),
        disk_dir: disk_dir.clone(),
        disk_plan: Arc::default(),
        toolbox_plan: Arc::default(),
        ..base.clone()
    });
    for config in &configs {
        let plan = config.disk_plan(&docker).await?;
        println!("runtime {:?}: disk mechanism {}", config.runtime, plan.mechanism.as_str());
    }
    let result = run(&args, &docker, &configs).await;
    let _ = std::fs::remove_dir(&disk_dir);
    let figures = result?;
    println!("\n{} against {}, image {}, alternated, medians:", args.runtime, args.baseline, args.common.image);
    for (name, [baseline, measured]) in &figures {
        let b = stats::report(&format!("{name}, {}", args.baseline), baseline);
        let m = stats::report(&format!("{name}, {}", args.runtime), measured);
        stats::ratio(&format!("{name}: {} / {}", args.runtime, args.baseline), m, b, None);
    }
    Ok(())
}

async fn run(args: &Args, docker: &Docker, configs: &[SandboxConfig; 2]) -> anyhow::Result<Vec<(String, Pair)>> {
    let mut figures = Vec::new();
    let wants = |part: &str| args.parts.iter().any(|p| p == part);
    if wants("start") {
        figures.extend(starts(docker, configs, args.common.runs).await?);
    }
    if wants("tools") {
        figures.extend(tools(args, docker, configs).await?);
    }
    if wants("egress") {
        let mb = args.egress_bytes as f64 / 1e6;
        let (calls, transfers) = egress(docker, configs, args.egress_bytes, args.common.runs).await?;
        figures.push((format!("egress {mb:.0} MB, bash call"), calls));
        figures.push((format!("egress {mb:.0} MB, transfer"), transfers));
    }
    Ok(figures)
}

/// Cold and warm session starts, each to its first `bash true` done.
async fn starts(docker: &Docker, configs: &[SandboxConfig; 2], runs: usize) -> anyhow::Result<Vec<(String, Pair)>> {
    let worker = setup::owner().worker;
    let pools = configs.clone().map(|c| Arc::new(WarmPool::new(docker.clone(), c, worker.clone(), WARM)));
    let shutdown = CancellationToken::new();
    let fillers: Vec<_> = pools
        .iter()
        .map(|pool| {
            let (pool, shutdown) = (pool.clone(), shutdown.clone());
            tokio::spawn(async move { pool.run(shutdown).await })
        })
        .collect();
    let measured = start_series(docker, configs, &pools, runs).await;
    shutdown.cancel();
    for filler in fillers {
        filler.await.context("a warm pool's task")?;
    }
    let (cold, warm) = measured?;
    Ok(vec![("session start, cold".into(), cold), ("session start, warm".into(), warm)])
}

async fn start_series(
    docker: &Docker,
    configs: &[SandboxConfig; 2],
    pools: &[Arc<WarmPool>; 2],
    runs: usize,
) -> anyhow::Result<(Pair, Pair)> {
    let (mut cold, mut warm): (Pair, Pair) = Default::default();
    // Repetition 0 warms caches (the image's layers, the toolbox binary).
    for rep in 0..=runs {
        for i in order(rep) {
            wait_for_pools(pools).await?;
            let took = cold_start(docker, &configs[i]).await?;
            if rep > 0 {
                cold[i].push(took);
            }
        }
        for i in order(rep + 1) {
            wait_for_pools(pools).await?;
            let took = warm_start(docker, &configs[i], &pools[i]).await?;
            if rep > 0 {
                warm[i].push(took);
            }
        }
    }
    Ok((cold, warm))
}

async fn cold_start(docker: &Docker, config: &SandboxConfig) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let sandbox = Sandbox::start(docker, config, &setup::owner()).await?;
    let first = setup::bash(&sandbox, "true", TRUE_TIMEOUT).await;
    let took = started.elapsed();
    sandbox.remove().await;
    first.map(|_| took)
}

async fn warm_start(docker: &Docker, config: &SandboxConfig, pool: &WarmPool) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let (sandbox, origin) = lifecycle::acquire(docker, config, Some(pool), &setup::owner()).await?;
    let first = setup::bash(&sandbox, "true", TRUE_TIMEOUT).await;
    let took = started.elapsed();
    sandbox.remove().await;
    first?;
    if origin != Origin::Warm {
        bail!("the session did not get a warm container (origin {})", origin.as_str());
    }
    Ok(took)
}

/// Waits until both pools are full, so that no start competes with a
/// replacement's.
async fn wait_for_pools(pools: &[Arc<WarmPool>; 2]) -> anyhow::Result<()> {
    let deadline = Instant::now() + REFILL_LIMIT;
    while pools.iter().any(|p| p.len() < WARM) {
        if Instant::now() >= deadline {
            bail!("a warm pool did not refill within {REFILL_LIMIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// `bash true`, grep and `git status` in one sandbox per runtime.
async fn tools(args: &Args, docker: &Docker, configs: &[SandboxConfig; 2]) -> anyhow::Result<Vec<(String, Pair)>> {
    let mut sandboxes = Vec::new();
    for config in configs {
        match Sandbox::start(docker, config, &setup::owner()).await {
            Ok(sandbox) => sandboxes.push(sandbox),
            Err(e) => {
                for sandbox in &sandboxes {
                    sandbox.remove().await;
                }
                return Err(e.into());
            }
        }
    }
    let result = async {
        for sandbox in &sandboxes {
            workload::grep_tree(sandbox, GREP_DIR, args.grep_files).await?;
            workload::repository(sandbox, REPO_DIR, args.repo_files).await?;
        }
        tool_series(&sandboxes, args.common.runs, (args.grep_files / 10) as u64).await
    }
    .await;
    for sandbox in &sandboxes {
        sandbox.remove().await;
    }
    result
}

async fn tool_series(sandboxes: &[Sandbox], runs: usize, matches: u64) -> anyhow::Result<Vec<(String, Pair)>> {
    let (mut bash, mut grep_tool, mut grep_bash, mut status): (Pair, Pair, Pair, Pair) = Default::default();
    let grep_command = format!("grep -rl {} {GREP_DIR} | wc -l", workload::NEEDLE);
    let status_command = format!("cd {REPO_DIR} && git status --porcelain");
    for rep in 0..=runs {
        for i in order(rep) {
            let sandbox = &sandboxes[i];
            tokio::time::sleep(AFTER_A_MODEL_CALL).await;
            let took = [
                workload::timed_bash(sandbox, "true").await?,
                workload::toolbox_grep(sandbox, GREP_DIR, matches).await?,
                workload::timed_bash(sandbox, &grep_command).await?,
                workload::timed_bash(sandbox, &status_command).await?,
            ];
            if rep > 0 {
                for (series, took) in [&mut bash, &mut grep_tool, &mut grep_bash, &mut status].into_iter().zip(took) {
                    series[i].push(took);
                }
            }
        }
    }
    Ok(vec![
        ("bash true (toolbox, standby ready)".into(), bash),
        ("grep tool, 1,000 files".into(), grep_tool),
        ("grep -rl via bash, 1,000 files".into(), grep_bash),
        ("git status, 10,000-file repository".into(), status),
    ])
}

/// 100 MB through the proxy, from a sandbox on its session's network, per
/// runtime: (the whole `bash` calls, the transfers alone).
async fn egress(
    docker: &Docker,
    configs: &[SandboxConfig; 2],
    bytes: u64,
    runs: usize,
) -> anyhow::Result<(Pair, Pair)> {
    let outside = Server::start(docker, &configs[0].image).await?;
    let settings = Arc::new(egress_fetch::settings(&outside)?);
    let mut sandboxes = Vec::new();
    let mut result = Ok(());
    for config in configs {
        match EgressSandbox::start(docker, config, settings.clone()).await {
            Ok(s) => sandboxes.push(s),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let measured = match result {
        Ok(()) => egress_series(&sandboxes, bytes, runs).await,
        Err(e) => Err(e),
    };
    for sandbox in sandboxes {
        sandbox.remove(docker).await;
    }
    outside.stop().await;
    measured
}

async fn egress_series(sandboxes: &[EgressSandbox], bytes: u64, runs: usize) -> anyhow::Result<(Pair, Pair)> {
    let (mut calls, mut transfers): (Pair, Pair) = Default::default();
    for rep in 0..=runs {
        for i in order(rep) {
            let (call, transfer) = sandboxes[i].fetch(bytes).await?;
            if rep > 0 {
                calls[i].push(call);
                transfers[i].push(transfer);
            }
        }
    }
    Ok((calls, transfers))
}
