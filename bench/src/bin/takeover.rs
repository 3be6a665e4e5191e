//! How long a dead worker's run waits: the time from SIGKILL of the worker
//! driving a run (mid-step, a command running) to the run's next event
//! (`run.started` of the next attempt) written by another worker, median of
//! `--rounds`. Both workers are `kiln worker` processes with the settings
//! users run (`KILN_LEASE_S` 30 unless told otherwise); the baseline is the
//! lease-only path (`KILN_DEAD_WORKER_CHECK_MS=0`), the two alternating in
//! each round.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Parser;
use kiln_bench::{Worker, kiln_binary};
use kiln_scripted_model::{Reply, ScriptedModel};
use serde_json::json;
use uuid::Uuid;

#[derive(Parser)]
struct Args {
    /// The `kiln` binary the workers run (default: target/release/kiln,
    /// else target/debug/kiln).
    #[arg(long)]
    kiln: Option<PathBuf>,
    /// Kills per path; each figure is the median.
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// `KILN_LEASE_S` of both workers.
    #[arg(long, default_value_t = 30)]
    lease_s: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path {
    /// Kiln as it runs: dead workers looked for every second.
    Lock,
    /// `KILN_DEAD_WORKER_CHECK_MS=0`: only the lease's expiry.
    LeaseOnly,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let kiln = kiln_binary(args.kiln.as_deref())?;
    let (db_url, _store) = kiln_bench::database().await?;
    let sql = kiln_bench::connect(&db_url).await?;
    // Each kill costs two replies: the first attempt's command, the second's answer.
    let script = (0..args.rounds * 2)
        .flat_map(|_| [Reply::tool("bash", json!({"command": "sleep 600"})), Reply::text("recovered")])
        .collect();
    let model = ScriptedModel::start(script).await?;
    let setup = Setup { kiln, db_url, model_url: model.openai_base_url(), lease_s: args.lease_s };
    println!(
        "takeover: {} from SIGKILL to the run's next event on another worker ({})",
        args.rounds,
        setup.kiln.display()
    );
    let mut lock = Vec::new();
    let mut lease = Vec::new();
    for round in 0..args.rounds {
        // Alternated, so a neighbour's burst falls on both alike.
        let order = if round % 2 == 0 { [Path::Lock, Path::LeaseOnly] } else { [Path::LeaseOnly, Path::Lock] };
        for path in order {
            let took = setup.one_kill(&sql, path).await?;
            eprintln!("round {}: {path:?} {:.3} s", round + 1, took.as_secs_f64());
            match path {
                Path::Lock => lock.push(took),
                Path::LeaseOnly => lease.push(took),
            }
        }
    }
    let (lock, lease) = (kiln_bench::Summary::of(lock), kiln_bench::Summary::of(lease));
    println!("with the lock check (KILN_DEAD_WORKER_CHECK_MS=1000): {lock}");
    println!("lease only (KILN_DEAD_WORKER_CHECK_MS=0, KILN_LEASE_S={}): {lease}", args.lease_s);
    println!("median ratio lock/lease-only: {:.3}", lock.p50.as_secs_f64() / lease.p50.as_secs_f64());
    model.shutdown().await;
    kiln_bench::drop_databases().await?;
    Ok(())
}

struct Setup {
    kiln: PathBuf,
    db_url: String,
    model_url: String,
    lease_s: u64,
}

impl Setup {
    /// One run, one kill: the run is claimed by worker A and its command
    /// started; worker B starts; A is killed; B's `run.started` is awaited.
    async fn one_kill(&self, sql: &tokio_postgres::Client, path: Path) -> anyhow::Result<Duration> {
        let a = self.worker(path).await?;
        let run = queue_run(sql).await?;
        wait_for(sql, "SELECT 1 FROM events WHERE run_id = $1 AND kind = 'tool_call.ready'", run).await?;
        let b = self.worker(path).await?;
        let killed = Instant::now();
        a.kill().await?;
        wait_for(
            sql,
            "SELECT 1 FROM events WHERE run_id = $1 AND kind = 'run.started' AND payload->>'attempt' = '2'",
            run,
        )
        .await?;
        let took = killed.elapsed();
        wait_for(sql, "SELECT 1 FROM runs WHERE id = $1 AND status = 'succeeded'", run).await?;
        b.stop().await;
        Ok(took)
    }

    /// `kiln worker` on the bench's database and model, checking for
    /// dead workers as `path` says; returns once it holds its lock.
    async fn worker(&self, path: Path) -> anyhow::Result<Worker> {
        let check = match path {
            Path::Lock => "1000",
            Path::LeaseOnly => "0",
        };
        let env = [("KILN_LEASE_S", self.lease_s.to_string()), ("KILN_DEAD_WORKER_CHECK_MS", check.to_owned())];
        Worker::start(&self.kiln, &self.db_url, &self.model_url, &env).await
    }
}

/// Queues a run (as the API would: session, run, `run.queued`, NOTIFY).
async fn queue_run(sql: &tokio_postgres::Client) -> anyhow::Result<Uuid> {
    let run = Uuid::new_v4();
    sql.execute(
        "WITH s AS (INSERT INTO sessions (id, owner) VALUES (gen_random_uuid(), 'bench') RETURNING id)
         INSERT INTO runs (id, session_id, owner, status, prompt) SELECT $1, id, 'bench', 'queued', 'bench' FROM s",
        &[&run],
    )
    .await?;
    sql.execute("SELECT pg_notify('kiln_runs_queued', $1)", &[&run.to_string()]).await?;
    Ok(run)
}

/// Polls `query` (of `$1` = the run) every 10 ms until it answers a row.
async fn wait_for(sql: &tokio_postgres::Client, query: &str, run: Uuid) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    while sql.query_opt(query, &[&run]).await?.is_none() {
        if Instant::now() > deadline {
            bail!("waited 300 s for: {query}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}
