//! Environments: start to first command of a run whose environment is
//! cached (a hit) against the same environment's setup start (a miss, setup
//! ≥ 10 s) and against a run of the bare image with no environment. Kiln as
//! users run it: the `kiln serve` and `kiln worker` binaries (release), in
//! processes of their own, on a fresh database, real Docker, the scripted
//! model server in this process.
//!
//! Warm against warm, or cold against cold: `--warm N` keeps N containers
//! ready both for the hot environment (`KILN_ENVIRONMENT_WARM`) and for the
//! bare image (`KILN_SANDBOX_WARM`), and before each hit and each bare run
//! the benchmark waits until both pools are full again (the bare pool by
//! the worker's `kiln_warm_pool_size` gauge; the environment's by its warm
//! containers on the engine, started and with no restore process left), so
//! each takes a started container; `--warm 0` starts every container on
//! the run's path. Before every run, the previous run's container is gone
//! (`KILN_SANDBOX_IDLE_S=0`), so no removal overlaps a measurement.
//!
//! "Start to first command": from `POST /v1/runs` to the `tool.result` of
//! the run's first command (`true`) as a client sees it over SSE.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bollard::Docker;
use bollard::query_parameters::ListContainersOptionsBuilder;
use clap::Parser;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use kiln_bench::{Server, Summary, Worker, database, http, kiln_binary, median, token, without_quotas};
use kiln_protocol::{CreateRun, RepoSpec};
use kiln_scripted_model::{Reply, ScriptedModel};
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// Rounds of (hit, bare), the order alternating.
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// Misses (setup runs), spread over the rounds; the first round starts
    /// with one.
    #[arg(long, default_value_t = 5)]
    misses: usize,
    /// Seconds the setup script sleeps (besides its real work).
    #[arg(long, default_value_t = 10)]
    setup_s: u64,
    /// Warm containers per hot environment (`KILN_ENVIRONMENT_WARM`) and of
    /// the bare image (`KILN_SANDBOX_WARM`), the same for both so that the
    /// comparison is warm against warm; 0: every hit and every bare run
    /// starts its own container (cold against cold).
    #[arg(long, default_value_t = 1)]
    warm: usize,
    /// The `kiln` binary (default: target/release/kiln, else target/debug/kiln).
    #[arg(long)]
    kiln: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    Miss,
    Hit,
    Bare,
}

/// What the benchmark drives and watches.
struct Bench {
    api: Server,
    http: reqwest::Client,
    token: String,
    repo_url: String,
    worker: String,
    /// The worker's `KILN_METRICS_LISTEN`.
    metrics: SocketAddr,
    docker: Docker,
    warm: usize,
}

const WAIT: Duration = Duration::from_secs(300);
/// What runs in a ready container: the main process (under the engine's
/// init), the toolbox and its standby shell, which takes the next command.
/// A restore adds its `cp -a` under that shell.
const IDLE: [&str; 3] = ["sleep infinity", "kiln-toolbox", "__kiln_standby"];

impl Bench {
    async fn post(&self, path: &str, body: serde_json::Value) -> anyhow::Result<serde_json::Value> {
        let response = self
            .http
            .post(format!("http://{}{path}", self.api.addr))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await?;
        let status = response.status();
        let text = response.text().await?;
        anyhow::ensure!(status.is_success(), "POST {path}: {status} {text}");
        Ok(serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
    }

    /// One run of `kind`, from its submission to its first command's
    /// result over SSE; then reads on to the run's end.
    async fn start_to_first_command(&self, kind: Kind) -> anyhow::Result<Duration> {
        if kind == Kind::Miss {
            self.post("/v1/environments/bench/reset-cache", json!({})).await?;
        }
        let spec = CreateRun {
            repo: Some(RepoSpec { url: self.repo_url.clone(), git_ref: None }),
            environment: (kind != Kind::Bare).then(|| "bench".to_owned()),
            ..CreateRun::new("run true")
        };
        let started = Instant::now();
        let created = self.post("/v1/runs", serde_json::to_value(&spec)?).await?;
        let id = created["id"].as_str().context("no run id")?;
        let response = self
            .http
            .get(format!("http://{}/v1/runs/{id}/events", self.api.addr))
            .bearer_auth(&self.token)
            .header("accept", "text/event-stream")
            .send()
            .await?
            .error_for_status()?;
        let mut events = response.bytes_stream().eventsource();
        let (mut took, mut hit, mut end) = (None, None, None);
        while let Some(ev) = tokio::time::timeout(WAIT, events.next()).await.context("the run's stream stalled")? {
            let ev = ev?;
            match ev.event.as_str() {
                "tool.result" if took.is_none() => took = Some(started.elapsed()),
                "environment.started" => hit = serde_json::from_str::<serde_json::Value>(&ev.data)?["hit"].as_bool(),
                kind if kiln_protocol::event::is_terminal_kind(kind) => {
                    end = Some(ev.event);
                    break;
                }
                _ => {}
            }
        }
        let expected = match kind {
            Kind::Miss => Some(false),
            Kind::Hit => Some(true),
            Kind::Bare => None,
        };
        anyhow::ensure!(hit == expected, "{kind:?}: environment.started said hit = {hit:?}");
        anyhow::ensure!(end.as_deref() == Some("run.succeeded"), "{kind:?}: run {id} ended {end:?}");
        took.with_context(|| format!("{kind:?}: run {id} ran no command"))
    }

    /// Kiln's containers of this worker on the engine.
    async fn containers(&self) -> anyhow::Result<Vec<bollard::models::ContainerSummary>> {
        let label = format!("{}={}", kiln_worker::sandbox::LABEL_WORKER, self.worker);
        let filters = HashMap::from([("label".to_owned(), vec![label])]);
        let options = ListContainersOptionsBuilder::new().all(true).filters(&filters).build();
        Ok(self.docker.list_containers(Some(options)).await?)
    }

    /// The worker's `kiln_warm_pool_size` (0 before its first report).
    async fn bare_pool(&self) -> anyhow::Result<usize> {
        let text = self.http.get(format!("http://{}/metrics", self.metrics)).send().await?.text().await?;
        let value = text.lines().find_map(|l| l.strip_prefix("kiln_warm_pool_size ")).unwrap_or("0");
        Ok(value.trim().parse::<f64>()? as usize)
    }

    /// The environment's warm containers that are ready: started from a
    /// prepared image, their restore (`cp -a`, run through the toolbox)
    /// finished, so only the processes of [`IDLE`] run.
    async fn environment_pool(&self, containers: &[bollard::models::ContainerSummary]) -> anyhow::Result<usize> {
        let mut ready = 0;
        for c in containers {
            let warm = c.labels.as_ref().is_some_and(|l| l.contains_key(kiln_worker::sandbox::LABEL_POOL));
            let prepared = c.image.as_deref().is_some_and(|i| i.starts_with("kiln-env:"));
            if !(warm && prepared && c.state == Some(bollard::models::ContainerSummaryStateEnum::RUNNING)) {
                continue;
            }
            let Some(id) = c.id.as_deref() else { continue };
            let top = self.docker.top_processes(id, None).await?;
            let column = top.titles.unwrap_or_default().iter().position(|t| t == "CMD").context("no CMD column")?;
            let idle = top.processes.unwrap_or_default().iter().all(|p| {
                let cmd = p.get(column).map(String::as_str).unwrap_or_default();
                IDLE.iter().any(|idle| cmd.contains(idle))
            });
            ready += usize::from(idle);
        }
        Ok(ready)
    }

    /// Waits until the last run's container is gone and, before a hit or
    /// a bare run with warm pools, until both pools are full.
    async fn settle(&self, kind: Kind) -> anyhow::Result<()> {
        let deadline = Instant::now() + WAIT;
        let (mut seen, mut steady) = (String::new(), 0);
        loop {
            let containers = self.containers().await?;
            let session = containers
                .iter()
                .any(|c| c.labels.as_ref().is_some_and(|l| l.contains_key(kiln_worker::sandbox::LABEL_SESSION)));
            let pools_full = kind == Kind::Miss
                || self.warm == 0
                || (self.bare_pool().await? >= self.warm && self.environment_pool(&containers).await? >= self.warm);
            // Twice in a row, 50 ms apart: a restore's last process may
            // have exited a moment before its container joins the pool.
            steady = if !session && pools_full { steady + 1 } else { 0 };
            if steady == 2 {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("before a {kind:?}: not settled in {WAIT:?} (a session's container: {session}); {seen}");
            }
            seen = format!("containers: {:?}", containers.iter().map(|c| (&c.image, &c.state)).collect::<Vec<_>>());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
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

/// A one-commit repository with a lock file (an environment's key reads it).
fn repository(dir: &Path) -> anyhow::Result<String> {
    git(dir, &["init", "-q", "-b", "main"])?;
    std::fs::write(dir.join("Cargo.lock"), "version = 1\n")?;
    std::fs::write(dir.join(".gitignore"), "deps/\n")?;
    git(dir, &["add", "."])?;
    git(dir, &["commit", "-q", "-m", "bench"])?;
    Ok(format!("file://{}", dir.display()))
}

/// Which runs round `round` makes, in order: a miss where one falls due,
/// then hit and bare, their order alternating.
fn order(round: usize, args: &Args) -> Vec<Kind> {
    let every = (args.rounds / args.misses.max(1)).max(1);
    let mut kinds = Vec::new();
    if round.is_multiple_of(every) && round / every < args.misses {
        kinds.push(Kind::Miss);
    }
    kinds.extend(if round.is_multiple_of(2) { [Kind::Hit, Kind::Bare] } else { [Kind::Bare, Kind::Hit] });
    kinds
}

fn report(args: &Args, miss: &[Duration], hit: &[Duration], bare: &[Duration], per_round: &[f64]) {
    let start = if args.warm > 0 { "warm" } else { "cold" };
    for (label, sample) in [("miss (setup)", miss), ("hit (cached)", hit), (&format!("bare image, {start}"), bare)] {
        println!("{label:<18} {}", Summary::of(sample.to_vec()));
    }
    let p50 = |s: &[Duration]| Summary::of(s.to_vec()).p50.as_secs_f64();
    let p95 = |s: &[Duration]| Summary::of(s.to_vec()).p95.as_secs_f64();
    println!("hit / miss  p50 {:.3}x  (goal <= 0.05x)", p50(hit) / p50(miss));
    println!("hit / bare  p50 {:.3}x, p95 {:.3}x  (goal <= 1.5x)", p50(hit) / p50(bare), p95(hit) / p95(bare));
    println!("hit / bare, per round: {}", kiln_bench::median_range(per_round, 3));
    println!("(median of the per-round ratios: {:.3}x)", median(per_round));
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.misses >= 1 && args.rounds >= 1, "at least one miss and one round");
    let kiln = kiln_binary(args.kiln.as_deref())?;
    let repo = tempfile::tempdir()?;
    let repo_url = repository(repo.path())?;
    let (db_url, _store) = database().await?;
    // Each run: its command, then its answer; three runs of warm-up.
    let runs = 3 + args.misses + 2 * args.rounds;
    let script = (0..runs).flat_map(|_| [Reply::tool("bash", json!({"command": "true"})), Reply::text("done")]);
    let model = ScriptedModel::start(script.collect()).await?;
    let api = Server::kiln_serve(&kiln, &db_url, &without_quotas()).await?;
    let metrics: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let settings = [
        ("KILN_ENVIRONMENT_WARM", args.warm.to_string()),
        ("KILN_SANDBOX_WARM", args.warm.to_string()),
        ("KILN_ALLOW_FILE_REPOS", "true".to_owned()),
        ("KILN_METRICS_LISTEN", metrics.to_string()),
    ];
    let worker = Worker::start(&kiln, &db_url, &model.openai_base_url(), &settings).await?;
    let bench = Bench {
        api,
        http: http()?,
        token: token("bench")?,
        repo_url,
        worker: worker.id.clone(),
        metrics,
        docker: Docker::connect_with_local_defaults().context("connecting to Docker")?,
        warm: args.warm,
    };
    let setup = format!(
        "sleep {}; mkdir -p deps && head -c 20000000 /dev/urandom > deps/blob && mkdir -p ~/.tool && echo ok > ~/.tool/t",
        args.setup_s
    );
    let env = bench.post("/v1/environments", json!({"name": "bench", "setup_script": setup})).await?;
    let env_id = env["id"].as_str().unwrap_or_default().to_owned();
    println!(
        "environments: start to first command, {} rounds of (hit, bare), {} misses, setup = sleep {} s + 20 MB of deps, \
         {} warm per environment and of the bare image; {} serve + worker",
        args.rounds,
        args.misses,
        args.setup_s,
        args.warm,
        kiln.display()
    );
    let measured = measure(&bench, &args).await;
    worker.stop().await;
    // The prepared images this benchmark made (by its environment's id).
    let filter = format!("label=dev.kiln.environment={env_id}");
    let listed = Command::new("docker").args(["images", "-q", "--filter", &filter]).output()?;
    for image in String::from_utf8_lossy(&listed.stdout).split_whitespace() {
        let _ = Command::new("docker").args(["rmi", "-f", image]).output();
    }
    model.shutdown().await;
    kiln_bench::drop_databases().await?;
    measured
}

async fn measure(bench: &Bench, args: &Args) -> anyhow::Result<()> {
    let (mut miss, mut hit, mut bare, mut per_round) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // Warm-up, not counted: the first setup, then one hit and one bare run
    // (the first statements, the toolbox binary read once).
    for kind in [Kind::Miss, Kind::Hit, Kind::Bare] {
        bench.settle(kind).await?;
        let took = bench.start_to_first_command(kind).await?;
        println!("  warm-up {kind:?}: {:.3} s", took.as_secs_f64());
    }
    for round in 0..args.rounds {
        let mut this = HashMap::new();
        for kind in order(round, args) {
            bench.settle(kind).await?;
            let took = bench.start_to_first_command(kind).await?;
            println!("  round {round} {kind:?}: {:.3} s  (load {})", took.as_secs_f64(), load());
            this.insert(kind, took.as_secs_f64());
            match kind {
                Kind::Miss => miss.push(took),
                Kind::Hit => hit.push(took),
                Kind::Bare => bare.push(took),
            }
        }
        per_round.push(this[&Kind::Hit] / this[&Kind::Bare]);
    }
    report(args, &miss, &hit, &bare, &per_round);
    Ok(())
}

/// The one-minute load average, for the record.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_default()
}
