//! One `bash` call of `true`: through the sandbox's toolbox as the `bash`
//! tool sends it (worker -> Docker attach stream -> toolbox -> bash and its
//! state capture -> back), against `docker exec <c> true` via the CLI on the
//! same container. A toolbox `ping` shows what the transport alone costs.

use std::time::{Duration, Instant};

use clap::Parser;
use kiln_bench_sandbox::setup::{self, Common};
use kiln_bench_sandbox::{cli, stats};
use kiln_toolbox::protocol::RequestBody;
use kiln_worker::sandbox::Sandbox;

const TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Parser)]
#[command(about = "One bash call of `true`: Kiln's toolbox vs docker exec")]
struct Args {
    #[command(flatten)]
    common: Common,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = args.common.sandbox_config()?;
    let docker = setup::docker().await?;
    let sandbox = Sandbox::start(&docker, &config, &setup::owner()).await?;
    let result = measure(&sandbox, args.common.runs).await;
    let floor = spawn_floor(&sandbox).await;
    sandbox.remove().await;
    let (kiln, ping, exec) = result?;
    let (bash_us, true_us) = floor?;

    println!("one `bash true`, image {}:", args.common.image);
    let k = stats::report("Kiln bash `true` (toolbox)", &kiln);
    stats::report("Kiln toolbox ping (transport only)", &ping);
    let e = stats::report("docker exec <c> true (CLI)", &exec);
    stats::ratio("Kiln / docker exec", k, e, Some(0.05));
    println!(
        "inside the container, mean of {FLOOR_LOOPS}: `bash -c true` {:.2} ms, `/bin/true` {:.2} ms (what starting bash costs)",
        bash_us / 1000.0,
        true_us / 1000.0
    );
    Ok(())
}

const FLOOR_LOOPS: u32 = 50;

/// What starting a bash (and, for scale, any process) costs in this
/// container: a loop inside it, timed by the container's own clock.
async fn spawn_floor(sandbox: &Sandbox) -> anyhow::Result<(f64, f64)> {
    let mean_us = |what: &str| {
        format!(
            "s=$(date +%s%N); for i in $(seq {FLOOR_LOOPS}); do {what}; done; e=$(date +%s%N); echo $(( (e - s) / {FLOOR_LOOPS} / 1000 ))"
        )
    };
    let bash = setup::bash(sandbox, &mean_us("bash -c true"), TIMEOUT).await?;
    let proc = setup::bash(sandbox, &mean_us("/bin/true"), TIMEOUT).await?;
    Ok((bash.trim().parse()?, proc.trim().parse()?))
}

async fn measure(sandbox: &Sandbox, runs: usize) -> anyhow::Result<(Vec<Duration>, Vec<Duration>, Vec<Duration>)> {
    let (mut kiln, mut ping, mut exec) = (vec![], vec![], vec![]);
    let exec_args = cli::exec_args(sandbox.id(), &["true"]);
    for rep in 0..=runs {
        let started = Instant::now();
        setup::bash(sandbox, "true", TIMEOUT).await?;
        let took = started.elapsed();

        let started = Instant::now();
        sandbox.toolbox_call(RequestBody::Ping, None).await?;
        let took_ping = started.elapsed();

        let (took_exec, _) = cli::docker(&exec_args)?;
        if rep > 0 {
            kiln.push(took);
            ping.push(took_ping);
            exec.push(took_exec);
        }
    }
    Ok((kiln, ping, exec))
}
