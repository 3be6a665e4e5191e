//! Queue throughput and claim latency.
//!
//! 1. Runs claimed and completed per second by N workers doing no work
//!    (Kiln's `claim_run` + `finish_run` through its pool), against the
//!    baseline: Kiln's claim statement, prepared once, in a tight loop over N
//!    plain connections (what this database can do on this machine).
//! 2. Claim latency with 100,000 finished runs in the table against an empty
//!    one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use kiln_bench::{Summary, connect, database, insert_runs};
use kiln_protocol::EventBody;
use kiln_store::Store;

#[derive(Parser)]
struct Args {
    /// Workers (Kiln) and connections (baseline).
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Runs drained per throughput measurement.
    #[arg(long, default_value_t = 4000)]
    runs: i64,
    /// Finished runs in the table for the latency comparison.
    #[arg(long, default_value_t = 100_000)]
    finished: i64,
    /// Claims timed per latency measurement.
    #[arg(long, default_value_t = 2000)]
    claims: i64,
}

const LEASE: Duration = Duration::from_secs(60);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    println!("queue benchmark: {} workers/connections, {} runs per throughput figure", args.workers, args.runs);

    let baseline = baseline_per_s(&args, false).await?;
    let baseline_finish = baseline_per_s(&args, true).await?;
    let claim_only = kiln_per_s(&args, Path::ClaimOnly).await?;
    let claim_finish = kiln_per_s(&args, Path::ClaimThenFinish).await?;
    let handoff = kiln_per_s(&args, Path::FinishAndClaim).await?;
    println!("baseline  claim statement, tight loop, {} conns: {baseline:>8.0} claims/s", args.workers);
    println!(
        "baseline  claim + finish statements, {} conns:     {baseline_finish:>8.0} runs/s    ({:.2}x claim-only)",
        args.workers,
        baseline_finish / baseline
    );
    println!(
        "kiln      claim_run only, {} workers:           {claim_only:>8.0} claims/s  ({:.2}x baseline)",
        args.workers,
        claim_only / baseline
    );
    println!(
        "kiln      claim_run + finish_run, {} workers:   {claim_finish:>8.0} runs/s    ({:.2}x claim-only baseline, \
         {:.2}x claim + finish baseline)",
        args.workers,
        claim_finish / baseline,
        claim_finish / baseline_finish
    );
    println!(
        "kiln      finish_run_and_claim (the worker's path), {} workers: {handoff:>8.0} runs/s  ({:.2}x claim-only \
         baseline)",
        args.workers,
        handoff / baseline
    );

    let (empty, full_dirty, full_clean) = claim_latency(&args).await?;
    println!("claim latency, empty table:                         {empty}");
    println!("claim latency, {} finished runs (not vacuumed): {full_dirty}", args.finished);
    println!("claim latency, {} finished runs (vacuumed):     {full_clean}", args.finished);
    println!(
        "p50 ratio finished/empty: {:.2} (not vacuumed), {:.2} (vacuumed)",
        full_dirty.p50.as_secs_f64() / empty.p50.as_secs_f64(),
        full_clean.p50.as_secs_f64() / empty.p50.as_secs_f64()
    );
    kiln_bench::drop_databases().await?;
    Ok(())
}

/// Kiln's own statements, prepared once, over plain connections: the claim
/// alone, or the claim and then the finish (what a worker that does no work
/// asks of the database).
async fn baseline_per_s(args: &Args, finish: bool) -> anyhow::Result<f64> {
    let (url, _store) = database().await?;
    insert_runs(&connect(&url).await?, args.runs, "queued").await?;
    let mut conns = Vec::new();
    for i in 0..args.workers {
        let client = connect(&url).await?;
        let claim = client.prepare(&kiln_store::claim_statement()).await?;
        let done = client.prepare(kiln_store::FINISH_STATEMENT).await?;
        conns.push((client, claim, done, format!("baseline-{i}")));
    }
    let started = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|(client, claim, done, worker)| {
            tokio::spawn(async move {
                let lease_ms = LEASE.as_secs_f64() * 1000.0;
                let payload = serde_json::json!({"summary": ""});
                let no_result: Option<serde_json::Value> = None;
                let no_error: Option<String> = None;
                let mut n = 0u64;
                while let Some(row) = client.query_opt(&claim, &[&worker, &lease_ms]).await? {
                    if finish {
                        let id: uuid::Uuid = row.try_get(0)?;
                        let attempt: i32 = row.try_get("attempt")?;
                        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 8] =
                            [&id, &attempt, &worker, &"succeeded", &no_result, &no_error, &"run.succeeded", &payload];
                        client.query_opt(&done, &params).await?;
                    }
                    n += 1;
                }
                anyhow::Ok(n)
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// What each Kiln worker of the throughput figure does with the queue.
#[derive(Clone, Copy, PartialEq)]
enum Path {
    /// Claims and never finishes (against the claim-only baseline).
    ClaimOnly,
    /// Claims, then finishes: two statements, two commits per run.
    ClaimThenFinish,
    /// What the worker does: claims once, then each run's end claims the
    /// next in the same statement (`finish_run_and_claim`).
    FinishAndClaim,
}

async fn kiln_per_s(args: &Args, path: Path) -> anyhow::Result<f64> {
    let (url, _) = database().await?;
    insert_runs(&connect(&url).await?, args.runs, "queued").await?;
    let store = Arc::new(Store::connect(&url, args.workers)?);
    let started = Instant::now();
    let tasks: Vec<_> = (0..args.workers)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let worker = format!("kiln-{i}");
                let done = EventBody::RunSucceeded { summary: String::new() };
                let mut n = 0u64;
                let mut held = store.claim_run(&worker, LEASE).await?;
                while let Some((_, lease)) = held {
                    n += 1;
                    held = match path {
                        Path::ClaimOnly => store.claim_run(&worker, LEASE).await?,
                        Path::ClaimThenFinish => {
                            store.finish_run(&lease, &done, None).await?;
                            store.claim_run(&worker, LEASE).await?
                        }
                        Path::FinishAndClaim => store.finish_run_and_claim(&lease, &done, None, &worker, LEASE).await?,
                    };
                }
                anyhow::Ok(n)
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// Times `args.claims` claims (each followed by a finish, like a worker).
async fn time_claims(store: &Store, n: i64) -> anyhow::Result<Summary> {
    let mut sample = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let t = Instant::now();
        let Some((_, lease)) = store.claim_run("latency", LEASE).await? else { break };
        sample.push(t.elapsed());
        store.finish_run(&lease, &EventBody::RunSucceeded { summary: String::new() }, None).await?;
    }
    Ok(Summary::of(sample))
}

async fn claim_latency(args: &Args) -> anyhow::Result<(Summary, Summary, Summary)> {
    let (url, store) = database().await?;
    let sql = connect(&url).await?;
    insert_runs(&sql, args.claims, "queued").await?;
    let empty = time_claims(&store, args.claims).await?;

    let (url, store) = database().await?;
    let sql = connect(&url).await?;
    // The finished runs went through the queue like real ones: queued, then
    // moved on, leaving entries behind in the queue's index until vacuum.
    insert_runs(&sql, args.finished, "queued").await?;
    sql.execute("UPDATE runs SET status = 'succeeded', attempt = 1, finished_at = now()", &[]).await?;
    insert_runs(&sql, 2 * args.claims, "queued").await?;
    let dirty = time_claims(&store, args.claims).await?;
    sql.batch_execute("VACUUM ANALYZE runs").await?;
    let clean = time_claims(&store, args.claims).await?;
    Ok((empty, dirty, clean))
}
