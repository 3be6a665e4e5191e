//! Session start to first command done: Kiln cold (`Sandbox::start`: create,
//! start, copy the toolbox in, start it, then `bash true`), Kiln from the
//! warm pool (`lifecycle::acquire` taking a warm container, binding it to the
//! session, then `bash true`), and `docker run --rm IMAGE true` via the CLI
//! (plain, and with Kiln's hardening flags for reference). The three are
//! interleaved per repetition so drifting machine load hits them alike.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use kiln_bench_sandbox::setup::{self, Common};
use kiln_bench_sandbox::{cli, stats};
use kiln_worker::sandbox::lifecycle::{self, Origin};
use kiln_worker::sandbox::pool::WarmPool;
use kiln_worker::sandbox::{Sandbox, SandboxConfig};
use tokio_util::sync::CancellationToken;

const TRUE_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest to wait for the pool to refill between repetitions.
const REFILL_LIMIT: Duration = Duration::from_secs(60);
/// Kiln's hardening, as CLI flags: the reference `docker run` pays for the
/// same isolation (no network namespace setup, limits, non-root).
const HARDENED: &[&str] = &[
    "--init",
    "--network",
    "none",
    "--cap-drop",
    "ALL",
    "--security-opt",
    "no-new-privileges:true",
    "--pids-limit",
    "256",
    "--memory",
    "1g",
    "--memory-swap",
    "1g",
    "--cpus",
    "1",
    "-u",
    "1000:1000",
];

#[derive(Parser)]
#[command(about = "Session start to first command done: Kiln cold and warm vs docker run")]
struct Args {
    #[command(flatten)]
    common: Common,
    /// Warm containers the pool keeps ready.
    #[arg(long, default_value_t = 1)]
    warm: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = args.common.sandbox_config()?;
    let docker = setup::docker().await?;
    let image = args.common.image.as_str();
    let pool = Arc::new(WarmPool::new(docker.clone(), config.clone(), setup::owner().worker, args.warm.max(1)));
    let shutdown = CancellationToken::new();
    let filler = tokio::spawn({
        let (pool, shutdown) = (pool.clone(), shutdown.clone());
        async move { pool.run(shutdown).await }
    });
    let result = measure(&docker, &config, &pool, image, args.common.runs, args.warm.max(1)).await;
    shutdown.cancel();
    filler.await.context("the warm pool task")?;
    let (cold, warm, cli_plain, cli_hardened) = result?;

    println!("session start to first command done, image {image}:");
    let cold = stats::report("Kiln cold (start + toolbox + bash true)", &cold);
    let warm = stats::report("Kiln warm pool (take + bind + bash true)", &warm);
    let plain = stats::report("docker run --rm IMAGE true (CLI)", &cli_plain);
    stats::report("docker run --rm <Kiln's flags> IMAGE true", &cli_hardened);
    stats::ratio("Kiln warm / docker run", warm, plain, Some(0.05));
    stats::ratio("Kiln cold / docker run", cold, plain, Some(0.7));
    Ok(())
}

type Series = (Vec<Duration>, Vec<Duration>, Vec<Duration>, Vec<Duration>);

async fn measure(
    docker: &bollard::Docker,
    config: &SandboxConfig,
    pool: &WarmPool,
    image: &str,
    runs: usize,
    warm_target: usize,
) -> anyhow::Result<Series> {
    let (mut cold, mut warm, mut plain, mut hardened) = (vec![], vec![], vec![], vec![]);
    let mut hardened_args = vec!["run", "--rm"];
    hardened_args.extend_from_slice(HARDENED);
    hardened_args.extend([image, "true"]);
    // Repetition 0 warms caches (image layers, the toolbox binary read once).
    for rep in 0..=runs {
        let started = Instant::now();
        let sandbox = Sandbox::start(docker, config, &setup::owner()).await?;
        let first = setup::bash(&sandbox, "true", TRUE_TIMEOUT).await;
        let took = started.elapsed();
        sandbox.remove().await;
        first?;

        wait_for_pool(pool, warm_target).await?;
        let started = Instant::now();
        let (sandbox, origin) = lifecycle::acquire(docker, config, Some(pool), &setup::owner()).await?;
        let first = setup::bash(&sandbox, "true", TRUE_TIMEOUT).await;
        let took_warm = started.elapsed();
        sandbox.remove().await;
        first?;
        if origin != Origin::Warm {
            bail!("the session did not get a warm container (origin {})", origin.as_str());
        }

        let (took_plain, _) = cli::docker(&["run", "--rm", image, "true"])?;
        let (took_hardened, _) = cli::docker(&hardened_args)?;
        if rep > 0 {
            cold.push(took);
            warm.push(took_warm);
            plain.push(took_plain);
            hardened.push(took_hardened);
        }
    }
    Ok((cold, warm, plain, hardened))
}

/// Waits until the pool is full again, so a measured take never waits for
/// (or competes with) the start of the previous one's replacement.
async fn wait_for_pool(pool: &WarmPool, target: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + REFILL_LIMIT;
    while pool.len() < target {
        if Instant::now() >= deadline {
            bail!("the warm pool did not refill within {REFILL_LIMIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
