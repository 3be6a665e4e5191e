//! Submission: `POST /v1/runs` per second sustained and its latency, against
//! a baseline of the same inserts done directly in SQL over as many
//! connections (what the database can take).

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use kiln_bench::{ChildApi, Summary, connect, database, http, serve_api_if_child, token};

#[derive(Parser)]
struct Args {
    /// Concurrent clients (API) and connections (baseline).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Subjects the clients submit as (quotas serialise one subject's submissions).
    #[arg(long, default_value_t = 32)]
    subjects: usize,
    /// The API's connection pool.
    #[arg(long, default_value_t = 16)]
    pool: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    serve_api_if_child().await?;
    let args = Args::parse();
    let duration = Duration::from_secs(args.seconds);
    println!(
        "submission: {} clients for {} s, {} subjects, API pool {}",
        args.concurrency, args.seconds, args.subjects, args.pool
    );

    let (url, _) = database().await?;
    // As many connections as the API's pool: all the database it gets.
    let (base_rate, base) = baseline(&url, args.pool, duration).await?;
    println!("baseline  the same inserts in SQL, {} conns: {base_rate:>7.0}/s  {base}", args.pool);

    for subjects in [args.subjects, 1] {
        let (url, _) = database().await?;
        let api = ChildApi::start(&url, args.pool).await?;
        let (rate, s) = api_rate(&api, args.concurrency, subjects, duration).await?;
        println!(
            "kiln      POST /v1/runs, {subjects:>2} subject(s):     {rate:>7.0}/s  {s}  ({:.2}x baseline)",
            rate / base_rate
        );
    }
    kiln_bench::drop_databases().await?;
    Ok(())
}

async fn api_rate(
    api: &ChildApi,
    concurrency: usize,
    subjects: usize,
    duration: Duration,
) -> anyhow::Result<(f64, Summary)> {
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
    Ok((rate, Summary::of(all)))
}

/// What one submission writes (session, run, run.queued event, NOTIFY), in
/// one transaction, as plain SQL with prepared statements.
async fn baseline(url: &str, concurrency: usize, duration: Duration) -> anyhow::Result<(f64, Summary)> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..concurrency {
        let mut client = connect(url).await?;
        tasks.push(tokio::spawn(async move {
            let session =
                client.prepare("INSERT INTO sessions (id, owner) VALUES (gen_random_uuid(), $1) RETURNING id").await?;
            let run = client
                .prepare(
                    "INSERT INTO runs (id, session_id, owner, status, prompt, last_event_seq)
                     VALUES (gen_random_uuid(), $1, $2, 'queued', 'bench', 1) RETURNING id",
                )
                .await?;
            let event = client
                .prepare("INSERT INTO events (run_id, seq, kind, payload) VALUES ($1, 1, 'run.queued', '{}'::jsonb)")
                .await?;
            let notify = client.prepare("SELECT pg_notify('kiln_runs_queued', $1::uuid::text)").await?;
            let owner = format!("baseline-{c}");
            let mut sample = Vec::new();
            while started.elapsed() < duration {
                let t = Instant::now();
                let tx = client.transaction().await?;
                let s: uuid::Uuid = tx.query_one(&session, &[&owner]).await?.get(0);
                let r: uuid::Uuid = tx.query_one(&run, &[&s, &owner]).await?.get(0);
                tx.execute(&event, &[&r]).await?;
                tx.execute(&notify, &[&r]).await?;
                tx.commit().await?;
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
    Ok((rate, Summary::of(all)))
}
