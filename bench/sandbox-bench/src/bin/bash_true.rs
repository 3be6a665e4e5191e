//! One `bash` call of `true`: through the sandbox's toolbox as the `bash`
//! tool sends it (worker -> Docker attach stream -> toolbox -> bash and its
//! state capture -> back), against `docker exec <c> true` via the CLI on the
//! same container, and against the plain way through the Docker API (the
//! worker's own `Sandbox::exec`: an exec of `timeout … bash -c true` as the
//! sandbox user, created, started attached, read to its end, inspected for
//! the exit code), and against the barest API exec of `bash -c true` (no
//! `timeout` around it: one process fewer than the worker's exec). A
//! toolbox `ping` shows what the transport alone costs.
//!
//! The toolbox runs a command in a shell it started ahead of it (one of
//! its three standbys, topped up once each command is over: 50 ms later
//! while one still waits, or once a command running then is over). Kiln's
//! first
//! figure is that best case, and it is the real case after a model call:
//! the call takes far longer than starting a standby. The worst cases are
//! measured too: a `bash true` sent the moment the previous one answered
//! (as the second of two calls in one step: it takes the older standby,
//! the state being unchanged, while the shell that replaces the first is
//! put off; with one standby it found it still starting), a third sent as
//! the second answered, and one no
//! standby can take (a request with its own
//! environment: a fresh `bash -c`, as when the standbys failed or none was
//! ready at all).

use std::time::{Duration, Instant};

use bollard::Docker;
use clap::Parser;
use kiln_bench_sandbox::setup::{self, Common};
use kiln_bench_sandbox::{api, cli, stats};
use kiln_toolbox::protocol::{ExecRequest, Reply, RequestBody};
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
    let result = measure(&docker, &sandbox, args.common.runs).await;
    let floor = spawn_floor(&sandbox).await;
    sandbox.remove().await;
    let s = result?;
    let (bash_us, true_us) = floor?;

    println!("one `bash true`, image {}:", args.common.image);
    let k = stats::report("Kiln bash `true`, standby ready (real case)", &s.kiln);
    let b = stats::report("Kiln, sent as the previous one answered", &s.back_to_back);
    let third = stats::report("Kiln, the third sent at once", &s.third);
    let f = stats::report("Kiln, no standby (fresh bash -c)", &s.fresh_shell);
    stats::report("Kiln toolbox ping (transport only)", &s.ping);
    let a = stats::report("API exec of bash -c true (baseline)", &s.api_exec);
    let bare = stats::report("API exec of bash -c true, no timeout", &s.api_bare);
    let e = stats::report("docker exec <c> true (CLI)", &s.exec);
    stats::ratio("Kiln / API exec", k, a, Some(0.05));
    stats::ratio("Kiln / API exec, no timeout", k, bare, Some(0.05));
    stats::ratio("Kiln back to back / API exec", b, a, None);
    stats::ratio("Kiln third at once / API exec", third, a, None);
    stats::ratio("Kiln no standby / API exec", f, a, None);
    stats::ratio("Kiln / docker exec (CLI, as before)", k, e, None);
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

/// Each series, in the order [`measure`] fills them.
struct Series {
    kiln: Vec<Duration>,
    back_to_back: Vec<Duration>,
    /// A third call straight after the second: more than the standbys.
    third: Vec<Duration>,
    fresh_shell: Vec<Duration>,
    ping: Vec<Duration>,
    api_exec: Vec<Duration>,
    api_bare: Vec<Duration>,
    exec: Vec<Duration>,
}

/// Time a model call takes at the very least, waited before the best case
/// so its standby is ready as it is after any real model call.
const AFTER_A_MODEL_CALL: Duration = Duration::from_millis(100);

async fn measure(docker: &Docker, sandbox: &Sandbox, runs: usize) -> anyhow::Result<Series> {
    let mut s = Series {
        kiln: vec![],
        back_to_back: vec![],
        third: vec![],
        fresh_shell: vec![],
        ping: vec![],
        api_exec: vec![],
        api_bare: vec![],
        exec: vec![],
    };
    let exec_args = cli::exec_args(sandbox.id(), &["true"]);
    for rep in 0..=runs {
        tokio::time::sleep(AFTER_A_MODEL_CALL).await;
        let started = Instant::now();
        setup::bash(sandbox, "true", TIMEOUT).await?;
        let took = started.elapsed();
        // Straight after: the standby started after the one before is
        // still starting; the older one waits.
        let started = Instant::now();
        setup::bash(sandbox, "true", TIMEOUT).await?;
        let took_back_to_back = started.elapsed();
        let started = Instant::now();
        setup::bash(sandbox, "true", TIMEOUT).await?;
        let took_third = started.elapsed();

        tokio::time::sleep(AFTER_A_MODEL_CALL).await;
        let started = Instant::now();
        fresh_shell_true(sandbox).await?;
        let took_fresh = started.elapsed();

        let started = Instant::now();
        sandbox.toolbox_call(RequestBody::Ping, None).await?;
        let took_ping = started.elapsed();

        let started = Instant::now();
        let plain = sandbox.exec("true", TIMEOUT, 64 * 1024, |_| {}).await?;
        let took_api = started.elapsed();
        anyhow::ensure!(plain.exit_code == Some(0), "exec of true: {plain:?}");

        let (took_bare, _) = api::exec(docker, sandbox.id(), &["bash", "-c", "true"]).await?;

        let (took_exec, _) = cli::docker(&exec_args)?;
        if rep > 0 {
            s.api_exec.push(took_api);
            s.api_bare.push(took_bare);
            s.kiln.push(took);
            s.back_to_back.push(took_back_to_back);
            s.third.push(took_third);
            s.fresh_shell.push(took_fresh);
            s.ping.push(took_ping);
            s.exec.push(took_exec);
        }
    }
    Ok(s)
}

/// `true` with a variable of its own: the standby (started with the
/// session's environment) cannot take it, so the toolbox starts `bash -c`.
async fn fresh_shell_true(sandbox: &Sandbox) -> anyhow::Result<()> {
    let request = ExecRequest {
        timeout_ms: TIMEOUT.as_millis() as u64,
        env: vec![("KILN_BENCH".into(), "1".into())],
        ..ExecRequest::new("true")
    };
    match sandbox.toolbox_call(RequestBody::Exec(request), None).await? {
        Some(Reply::Exec(r)) if r.exit_code == Some(0) => Ok(()),
        other => anyhow::bail!("true with its own environment: {other:?}"),
    }
}
