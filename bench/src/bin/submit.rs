//! Submission: `POST /v1/runs` per second sustained and its latency, served
//! by `kiln serve` itself (its settings, pool and accept loop), against the
//! best plain way to durably enqueue the same run in Postgres, measured in
//! the same run, the figures alternating round by round.
//!
//! The baselines write what a submission writes (a session, a queued run
//! with the same JSON settings, its `run.queued` event) and wake the same
//! listeners (`kiln_runs_queued` and `kiln_run_events`), over as many
//! connections as the API's pool, each statement prepared once:
//! - *notify after*: one `INSERT … RETURNING` statement (the three rows in
//!   CTEs, one autocommitted transaction), then the two `pg_notify`s in a
//!   second statement, after the commit;
//! - *notify inside*: the same statement with the `pg_notify`s in it (one
//!   round trip, but the notifying commit holds Postgres' notify lock
//!   through its WAL flush).
//!
//! The better of the two in each round is the baseline Kiln is compared
//! with. Neither does what the API does besides (HTTP, the JWT, the body's
//! validation, and with `--limits` a number, the quota check under a
//! per-subject lock): that is Kiln's cost over the database's.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use kiln_bench::{Server, Summary, connect, database, http, kiln_binary, median, median_range, token};
use kiln_protocol::CreateRun;

#[derive(Parser)]
struct Args {
    /// Concurrent HTTP clients of the API.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 4)]
    seconds: u64,
    /// Rounds; each measures every figure once, in an order that alternates.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Subjects the clients submit as (with `--limits` a number, a
    /// subject's submissions share its quota lock and those waiting for it
    /// go in one statement; with no quota, every subject's share one line);
    /// one subject is measured too.
    #[arg(long, default_value_t = 32)]
    subjects: usize,
    /// The API's connection pool (`KILN_DB_POOL_SIZE`, default as deployed)
    /// and the baselines' connections.
    #[arg(long, default_value_t = 16)]
    pool: usize,
    /// The `kiln` binary (default: target/release/kiln, else target/debug/kiln).
    #[arg(long)]
    kiln: Option<PathBuf>,
    /// Both per-subject limits of the API (`KILN_MAX_ACTIVE_RUNS_PER_SUBJECT`,
    /// `KILN_MAX_RUNS_PER_MINUTE`). `unlimited` (the default): no quota, so
    /// nothing is counted. A number above what the run reaches (say
    /// 1000000000) measures the quota check itself: each count stops only at
    /// its limit, so here it counts every run of the subject's backlog and
    /// minute, thousands, which a deployment whose limits are reached
    /// (20 and 60 by default) never counts.
    #[arg(long, default_value = "unlimited")]
    limits: String,
}

#[derive(Clone, Copy, PartialEq)]
enum Figure {
    NotifyAfter,
    NotifyInside,
    Kiln { one_subject: bool },
}

impl Figure {
    fn label(self, subjects: usize) -> String {
        match self {
            Figure::NotifyAfter => "baseline  INSERT … RETURNING, then NOTIFY".into(),
            Figure::NotifyInside => "baseline  INSERT with pg_notify, one statement".into(),
            Figure::Kiln { one_subject: false } => format!("kiln      POST /v1/runs, {subjects} subjects"),
            Figure::Kiln { one_subject: true } => "kiln      POST /v1/runs, 1 subject".into(),
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let kiln = kiln_binary(args.kiln.as_deref())?;
    let duration = Duration::from_secs(args.seconds);
    println!(
        "submission: {} s per figure, {} rounds; API: {} serve, {} HTTP clients, pool {}, limits {}; baselines: {} connections",
        args.seconds,
        args.rounds,
        kiln.display(),
        args.concurrency,
        args.pool,
        args.limits,
        args.pool
    );
    let (url, _) = database().await?;
    // `kiln serve` as deployed, but with quotas that refuse nothing: the
    // benchmark measures admission, not refusals.
    let [active, per_minute] = kiln_bench::quotas(&args.limits);
    let api =
        Server::kiln_serve(&kiln, &url, &[("KILN_DB_POOL_SIZE", args.pool.to_string()), active, per_minute]).await?;

    let figures = [
        Figure::NotifyAfter,
        Figure::Kiln { one_subject: false },
        Figure::NotifyInside,
        Figure::Kiln { one_subject: true },
    ];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); figures.len()];
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); figures.len()];
    let mut ratios = Vec::new();
    let mut ratios_one = Vec::new();
    for round in 0..args.rounds {
        // A B A B, then B A B A: neither side always goes first.
        let order: Vec<usize> =
            if round % 2 == 0 { (0..figures.len()).collect() } else { (0..figures.len()).rev().collect() };
        let mut this = [0.0; 4];
        for i in order {
            let (rate, sample) = match figures[i] {
                Figure::Kiln { one_subject } => {
                    let subjects = if one_subject { 1 } else { args.subjects };
                    api_rate(&api, args.concurrency, subjects, duration).await?
                }
                f => baseline(&url, args.pool, duration, f == Figure::NotifyInside).await?,
            };
            println!(
                "round {round}  {:<48} {rate:>7.0}/s  {}",
                figures[i].label(args.subjects),
                Summary::of(sample.clone())
            );
            this[i] = rate;
            rates[i].push(rate);
            samples[i].extend(sample);
        }
        let best_baseline = this[0].max(this[2]);
        ratios.push(this[1] / best_baseline);
        ratios_one.push(this[3] / best_baseline);
    }
    println!("\nmedians of {} rounds (range), latency over all rounds:", args.rounds);
    for (i, f) in figures.iter().enumerate() {
        println!(
            "{:<48} {}/s  {}",
            f.label(args.subjects),
            median_range(&rates[i], 0),
            Summary::of(std::mem::take(&mut samples[i]))
        );
    }
    println!(
        "kiln / better baseline of the round: {} subjects {}x, 1 subject {}x",
        args.subjects,
        median_range(&ratios, 2),
        median_range(&ratios_one, 2)
    );
    println!("(median ratio {:.2}x)", median(&ratios));
    drop(api);
    kiln_bench::drop_databases().await?;
    Ok(())
}

async fn api_rate(
    api: &Server,
    concurrency: usize,
    subjects: usize,
    duration: Duration,
) -> anyhow::Result<(f64, Vec<Duration>)> {
    let http = http()?;
    let tokens: Arc<Vec<String>> =
        Arc::new((0..subjects).map(|i| token(&format!("bench-{i}"))).collect::<Result<_, _>>()?);
    let url = format!("http://{}/v1/runs", api.addr);
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|c| {
            let (http, tokens, url) = (http.clone(), tokens.clone(), url.clone());
            tokio::spawn(async move {
                let mut sample = Vec::new();
                let mut i = c;
                while started.elapsed() < duration {
                    let t = Instant::now();
                    let r = http
                        .post(&url)
                        .bearer_auth(&tokens[i % tokens.len()])
                        .json(&serde_json::json!({"prompt": "bench"}))
                        .send()
                        .await?;
                    anyhow::ensure!(r.status() == 201, "POST /v1/runs: {}", r.status());
                    r.bytes().await?;
                    sample.push(t.elapsed());
                    i += concurrency;
                }
                anyhow::Ok(sample)
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let rate = all.len() as f64 / started.elapsed().as_secs_f64();
    Ok((rate, all))
}

/// The rows of one submission in one statement; `$1` owner, `$2` prompt,
/// `$3`..`$5` the run's model, limits and policy as Kiln stores them, `$6`
/// the event's payload.
const INSERT: &str = "WITH s AS (
         INSERT INTO sessions (id, owner) VALUES (gen_random_uuid(), $1) RETURNING id
     ), r AS (
         INSERT INTO runs (id, session_id, owner, status, prompt, model, limits, policy, trigger, last_event_seq)
         SELECT gen_random_uuid(), s.id, $1, 'queued', $2, $3, $4, $5, 'api', 1 FROM s
         RETURNING id
     ), e AS (
         INSERT INTO events (run_id, seq, kind, payload) SELECT id, 1, 'run.queued', $6 FROM r
     )";

/// Enqueues as fast as plain SQL can over `connections` connections for
/// `duration`; `notify_inside`: the notifications in the insert's statement,
/// else in a statement after its commit.
async fn baseline(
    url: &str,
    connections: usize,
    duration: Duration,
    notify_inside: bool,
) -> anyhow::Result<(f64, Vec<Duration>)> {
    let spec = CreateRun { prompt: "bench".into(), ..Default::default() };
    let model = serde_json::to_value(spec.model.clone().unwrap_or_default())?;
    let limits = serde_json::to_value(spec.limits.unwrap_or_default())?;
    let policy = serde_json::to_value(spec.policy())?;
    let payload = serde_json::json!({ "prompt": "bench" });
    let mut clients = Vec::new();
    for _ in 0..connections {
        clients.push(connect(url).await?);
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (c, client) in clients.into_iter().enumerate() {
        let (model, limits, policy, payload) = (model.clone(), limits.clone(), policy.clone(), payload.clone());
        tasks.push(tokio::spawn(async move {
            let insert = if notify_inside {
                client
                    .prepare(&format!(
                        "{INSERT} SELECT r.id, pg_notify('kiln_runs_queued', r.id::text),
                                 pg_notify('kiln_run_events', r.id::text || ':1') FROM r"
                    ))
                    .await?
            } else {
                client.prepare(&format!("{INSERT} SELECT id FROM r")).await?
            };
            let notify = client
                .prepare("SELECT pg_notify('kiln_runs_queued', $1::uuid::text), pg_notify('kiln_run_events', $1::uuid::text || ':1')")
                .await?;
            let owner = format!("baseline-{c}");
            let mut sample = Vec::new();
            while started.elapsed() < duration {
                let t = Instant::now();
                let row = client.query_one(&insert, &[&owner, &"bench", &model, &limits, &policy, &payload]).await?;
                if !notify_inside {
                    let run: uuid::Uuid = row.try_get(0)?;
                    client.execute(&notify, &[&run]).await?;
                }
                sample.push(t.elapsed());
            }
            anyhow::Ok(sample)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let rate = all.len() as f64 / started.elapsed().as_secs_f64();
    Ok((rate, all))
}
