//! Session start to first command done: Kiln cold (`Sandbox::start`: create,
//! start, copy the toolbox in, start it, then `bash true`), Kiln from the
//! warm pool (`lifecycle::acquire` taking a warm container, binding it to the
//! session, then `bash true`), against the same span done the plain way
//! through the Docker API (bollard, as Kiln talks to Docker; a container with
//! Kiln's settings, started, `true` exec'd in it; and `docker run`'s create,
//! start, wait). No timer includes removal. For reference, and as the
//! earlier figures were measured, `docker run --rm IMAGE true` via the CLI
//! (its start-up and the `--rm` teardown included). The figures rotate
//! their order each repetition so drifting machine load hits them alike.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::query_parameters::WaitContainerOptionsBuilder;
use clap::Parser;
use futures::StreamExt;
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
    let series = result?;

    println!("session start to first command done, image {image} (removal never timed but in the CLI's --rm):");
    let mut summaries = Vec::new();
    for (figure, samples) in FIGURES.iter().zip(&series) {
        summaries.push(stats::report(figure.label(), samples));
    }
    let [cold, warm, exec, run, plain, _hardened] = summaries[..] else { bail!("six series") };
    stats::ratio("Kiln warm / API create+start+exec", warm, exec, Some(0.05));
    stats::ratio("Kiln cold / API create+start+exec", cold, exec, Some(0.7));
    stats::ratio("Kiln cold / API create+start+wait (run)", cold, run, None);
    stats::ratio("Kiln warm / docker run --rm (CLI, as before)", warm, plain, None);
    stats::ratio("Kiln cold / docker run --rm (CLI, as before)", cold, plain, None);
    Ok(())
}

/// What is timed, in the order of the first repetition (later ones rotate
/// it, so no figure always follows the same one).
#[derive(Clone, Copy)]
enum Figure {
    KilnCold,
    KilnWarm,
    ApiExec,
    ApiRun,
    CliPlain,
    CliHardened,
}

const FIGURES: [Figure; 6] =
    [Figure::KilnCold, Figure::KilnWarm, Figure::ApiExec, Figure::ApiRun, Figure::CliPlain, Figure::CliHardened];

impl Figure {
    fn label(self) -> &'static str {
        match self {
            Figure::KilnCold => "Kiln cold (start + toolbox + bash true)",
            Figure::KilnWarm => "Kiln warm pool (take + bind + bash true)",
            Figure::ApiExec => "API: create + start + exec true (baseline)",
            Figure::ApiRun => "API: create(true) + start + wait exit",
            Figure::CliPlain => "docker run --rm IMAGE true (CLI, --rm in)",
            Figure::CliHardened => "docker run --rm <Kiln's flags> (CLI)",
        }
    }
}

async fn measure(
    docker: &bollard::Docker,
    config: &SandboxConfig,
    pool: &WarmPool,
    image: &str,
    runs: usize,
    warm_target: usize,
) -> anyhow::Result<Vec<Vec<Duration>>> {
    let mut series: Vec<Vec<Duration>> = vec![Vec::new(); FIGURES.len()];
    let mut hardened_args = vec!["run", "--rm"];
    hardened_args.extend_from_slice(HARDENED);
    hardened_args.extend([image, "true"]);
    let worker = setup::owner().worker;
    // Repetition 0 warms caches (image layers, the toolbox binary read once).
    for rep in 0..=runs {
        for k in 0..FIGURES.len() {
            let i = (k + rep) % FIGURES.len();
            let took = match FIGURES[i] {
                Figure::KilnCold => {
                    let started = Instant::now();
                    let sandbox = Sandbox::start(docker, config, &setup::owner()).await?;
                    let first = setup::bash(&sandbox, "true", TRUE_TIMEOUT).await;
                    let took = started.elapsed();
                    sandbox.remove().await;
                    first?;
                    took
                }
                Figure::KilnWarm => {
                    wait_for_pool(pool, warm_target).await?;
                    let started = Instant::now();
                    let (sandbox, origin) = lifecycle::acquire(docker, config, Some(pool), &setup::owner()).await?;
                    let first = setup::bash(&sandbox, "true", TRUE_TIMEOUT).await;
                    let took = started.elapsed();
                    sandbox.remove().await;
                    first?;
                    if origin != Origin::Warm {
                        bail!("the session did not get a warm container (origin {})", origin.as_str());
                    }
                    took
                }
                Figure::ApiExec => api_exec_true(docker, config, &worker).await?,
                Figure::ApiRun => api_run_true(docker, config, &worker).await?,
                Figure::CliPlain => cli::docker(&["run", "--rm", image, "true"])?.0,
                Figure::CliHardened => cli::docker(&hardened_args)?.0,
            };
            if rep > 0 {
                series[i].push(took);
            }
        }
    }
    Ok(series)
}

/// The plain way to a session's first command through the Docker API: a
/// container with Kiln's settings kept running, then `true` exec'd in it as
/// the sandbox user (create exec, start attached, read to the end, inspect
/// the exit code). Timed to the exit code, as Kiln's is; removal is not.
async fn api_exec_true(docker: &bollard::Docker, config: &SandboxConfig, worker: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let id = setup::create_like_kiln(docker, config, worker, &["sleep", "infinity"]).await?;
    let result = async {
        docker.start_container(&id, None).await?;
        let exec = docker
            .create_exec(
                &id,
                CreateExecOptions {
                    cmd: Some(vec!["true"]),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    user: Some(config.user.as_str()),
                    working_dir: Some("/workspace"),
                    ..Default::default()
                },
            )
            .await?;
        if let StartExecResults::Attached { mut output, .. } = docker.start_exec(&exec.id, None).await? {
            while output.next().await.transpose()?.is_some() {}
        }
        let code = docker.inspect_exec(&exec.id).await?.exit_code;
        anyhow::ensure!(code == Some(0), "true exited {code:?}");
        anyhow::Ok(started.elapsed())
    }
    .await;
    setup::remove_container(docker, &id).await;
    result
}

/// `docker run IMAGE true` through the API, without the CLI: a container
/// with Kiln's settings running `true`, started, waited for until it has
/// exited 0. Removal is not timed.
async fn api_run_true(docker: &bollard::Docker, config: &SandboxConfig, worker: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let id = setup::create_like_kiln(docker, config, worker, &["true"]).await?;
    let result = async {
        docker.start_container(&id, None).await?;
        let options = WaitContainerOptionsBuilder::new().condition("not-running").build();
        match docker.wait_container(&id, Some(options)).next().await {
            Some(Ok(r)) if r.status_code == 0 => {}
            Some(Err(bollard::errors::Error::DockerContainerWaitError { code: 0, .. })) => {}
            other => bail!("true did not exit 0: {other:?}"),
        }
        anyhow::Ok(started.elapsed())
    }
    .await;
    setup::remove_container(docker, &id).await;
    result
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
