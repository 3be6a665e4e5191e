//! Environments: start to first command of a run whose environment is
//! cached (a hit) against the same environment's setup start (a miss, setup
//! ≥ 10 s) and against a run of the bare image with no environment,
//! alternated over rounds in one process, with real Docker and Postgres and
//! the scripted model.
//!
//! Warm against warm, or cold against cold: `--warm N` keeps N containers
//! ready both for the hot environment (`KILN_ENVIRONMENT_WARM`) and for the
//! bare image (`KILN_SANDBOX_WARM`), so a hit and a bare run each take a
//! started container; `--warm 0` starts every container on the run's path.
//!
//! "Start to first command": from `POST /v1/runs` to the `tool.result` of
//! the run's first command (`true`) as a client sees it over SSE.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use clap::Parser;
use kiln_protocol::{CreateRun, RepoSpec};
use kiln_tests::kiln_scripted_model::Reply;
use kiln_tests::{Options, TestApp, worker_config};
use kiln_worker::ProviderKind;
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// Rounds of (miss, hit, bare), each order rotated.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Seconds the setup script sleeps (besides its real work).
    #[arg(long, default_value_t = 10)]
    setup_s: u64,
    /// Warm containers per hot environment (`KILN_ENVIRONMENT_WARM`) and of
    /// the bare image (`KILN_SANDBOX_WARM`), the same for both so that the
    /// comparison is warm against warm; 0: every hit and every bare run
    /// starts its own container (cold against cold).
    #[arg(long, default_value_t = 1)]
    warm: usize,
}

fn git(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let ok = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "b")
        .env("GIT_AUTHOR_EMAIL", "b@example.com")
        .env("GIT_COMMITTER_NAME", "b")
        .env("GIT_COMMITTER_EMAIL", "b@example.com")
        .status()?
        .success();
    anyhow::ensure!(ok, "git {args:?} failed");
    Ok(())
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Miss,
    Hit,
    Bare,
}

async fn start_to_first_command(app: &TestApp, url: &str, kind: Kind) -> anyhow::Result<Duration> {
    if matches!(kind, Kind::Miss) {
        let (status, _) = app.post_json("bench", "/v1/environments/bench/reset-cache", json!({})).await;
        anyhow::ensure!(status == 200, "reset-cache: {status}");
    }
    let spec = CreateRun {
        repo: Some(RepoSpec { url: url.to_owned(), git_ref: None }),
        environment: (!matches!(kind, Kind::Bare)).then(|| "bench".to_owned()),
        ..CreateRun::new("run true")
    };
    let started = Instant::now();
    let id = app.submit("bench", spec).await.id;
    let seen = app.events_until("bench", id, None, |e| e.kind() == "tool.result").await;
    let took = started.elapsed();
    let hit = seen.iter().find_map(|e| match &e.body {
        kiln_protocol::EventBody::EnvironmentStarted { hit, .. } => Some(*hit),
        _ => None,
    });
    let expected = match kind {
        Kind::Miss => Some(false),
        Kind::Hit => Some(true),
        Kind::Bare => None,
    };
    anyhow::ensure!(hit == expected, "{kind:?}: environment.started said hit = {hit:?}");
    anyhow::ensure!(seen.iter().any(|e| e.kind() == "tool.result"), "{kind:?}: no command ran");
    // The run's end, before the next run takes the model's next replies.
    app.events("bench", id).await;
    Ok(took)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let repo = tempfile::tempdir()?;
    git(repo.path(), &["init", "-q", "-b", "main"])?;
    std::fs::write(repo.path().join("Cargo.lock"), "version = 1\n")?;
    std::fs::write(repo.path().join(".gitignore"), "deps/\n")?;
    git(repo.path(), &["add", "."])?;
    git(repo.path(), &["commit", "-q", "-m", "bench"])?;
    let url = format!("file://{}", repo.path().display());

    let runs = args.rounds * 3;
    let script = (0..runs).flat_map(|_| [Reply::tool("bash", json!({"command": "true"})), Reply::text("done")]);
    let app = TestApp::spawn(Options { script: script.collect(), worker: false, ..Default::default() }).await;
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(30));
    config.environment_warm.per_environment = args.warm;
    config.warm_pool = args.warm;
    // Stopped before the images go: its warm containers use them.
    let stop = tokio_util::sync::CancellationToken::new();
    let worker = app.start_worker_until(config, stop.clone()).await;
    let setup = format!(
        "sleep {}; mkdir -p deps && head -c 20000000 /dev/urandom > deps/blob && mkdir -p ~/.tool && echo ok > ~/.tool/t",
        args.setup_s
    );
    let (status, env) =
        app.post_json("bench", "/v1/environments", json!({"name": "bench", "setup_script": setup})).await;
    anyhow::ensure!(status == 201, "creating the environment: {status}");
    let env_id = env["id"].as_str().unwrap_or_default().to_owned();
    println!(
        "environments: start to first command, {} rounds, setup = sleep {} s + 20 MB of deps, {} warm per environment and of the bare image",
        args.rounds, args.setup_s, args.warm
    );

    let (mut miss, mut hit, mut bare) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..args.rounds {
        let order: &[Kind] = match round % 3 {
            0 => &[Kind::Miss, Kind::Hit, Kind::Bare],
            1 => &[Kind::Bare, Kind::Miss, Kind::Hit],
            _ => &[Kind::Miss, Kind::Bare, Kind::Hit],
        };
        for &kind in order {
            let took = start_to_first_command(&app, &url, kind).await?;
            println!("  round {round} {kind:?}: {:.2} s", took.as_secs_f64());
            match kind {
                Kind::Miss => miss.push(took),
                Kind::Hit => hit.push(took),
                Kind::Bare => bare.push(took),
            }
        }
    }
    let (miss, hit, bare) = (median(miss), median(hit), median(bare));
    println!("median miss (setup)       {:>7.2} s", miss.as_secs_f64());
    println!("median hit (cached)       {:>7.2} s", hit.as_secs_f64());
    let start = if args.warm > 0 { "warm" } else { "cold" };
    println!("median bare image, {start}   {:>7.2} s", bare.as_secs_f64());
    println!("hit / miss  {:.3}x  (goal <= 0.05x)", hit.as_secs_f64() / miss.as_secs_f64());
    println!("hit / bare  {:.3}x  (goal <= 1.5x)", hit.as_secs_f64() / bare.as_secs_f64());
    stop.cancel();
    worker.await?;
    // The prepared images this benchmark made (by its environment's id).
    let filter = format!("label=dev.kiln.environment={env_id}");
    let listed = Command::new("docker").args(["images", "-q", "--filter", &filter]).output()?;
    for image in String::from_utf8_lossy(&listed.stdout).split_whitespace() {
        let _ = Command::new("docker").args(["rmi", "-f", image]).output();
    }
    Ok(())
}
