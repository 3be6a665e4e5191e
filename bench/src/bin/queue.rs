//! Queue throughput and claim latency.
//!
//! 1. Runs claimed and completed per second with N runs held at once: what
//!    Kiln's worker does (one `claim_run` per slot, then
//!    `finish_run_and_claim` at each run's end, through its pool), as one
//!    worker of N slots and as N workers of one, against the baseline:
//!    Kiln's claim statement, prepared once, in a tight loop over N plain
//!    connections (what this database can do on this machine; half the
//!    work, as it never completes a run), and against the same work done
//!    the best plain way: the faster of two loops of Kiln's statements
//!    over plain connections (claim then finish; finish-and-claim).
//!    Medians of alternating rounds.
//! 2. Claim latency with 100,000 finished runs in the table (not yet
//!    vacuumed, and vacuumed) against an empty one: three databases
//!    prepared up front, claims taken from them in alternating blocks
//!    (A B C, then C B A).

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use kiln_bench::{Summary, connect, database, insert_runs};
use kiln_protocol::EventBody;
use kiln_store::Store;

#[derive(Parser)]
struct Args {
    /// Runs a Kiln worker holds at once (its slots, `KILN_WORKER_MAX_SESSIONS`)
    /// and the baseline's connections; one set of figures per value.
    #[arg(long, value_delimiter = ',', default_value = "4,8,16")]
    workers: Vec<usize>,
    /// Runs drained per throughput measurement.
    #[arg(long, default_value_t = 4000)]
    runs: i64,
    /// Finished runs in the table for the latency comparison.
    #[arg(long, default_value_t = 100_000)]
    finished: i64,
    /// Claims timed per table in the latency comparison.
    #[arg(long, default_value_t = 2000)]
    claims: i64,
    /// Claims taken from one table before moving to the next.
    #[arg(long, default_value_t = 100)]
    block: i64,
    /// Rounds of the throughput figures (each figure is the median).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Only one of the two parts.
    #[arg(long, value_enum)]
    only: Option<Part>,
}

#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum Part {
    Throughput,
    Latency,
}

const LEASE: Duration = Duration::from_secs(60);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.only != Some(Part::Latency) {
        for &n in &args.workers {
            throughput(&args, n).await?;
        }
    }
    if args.only != Some(Part::Throughput) {
        claim_latency(&args).await?;
    }
    kiln_bench::drop_databases().await?;
    Ok(())
}

/// The throughput figures with `n` slots / connections.
async fn throughput(args: &Args, n: usize) -> anyhow::Result<()> {
    println!(
        "queue throughput: {n} slots/connections, {} runs per figure, median of {} rounds",
        args.runs, args.rounds
    );
    // The figures alternate within each round, and every other round runs
    // them in reverse (A B … then … B A), so a checkpoint or a noisy
    // neighbour lands on all of them alike rather than on whichever runs
    // first or last.
    let mut figures: [Vec<f64>; FIGURES.len()] = Default::default();
    for round in 0..args.rounds {
        let mut order: Vec<usize> = (0..FIGURES.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            figures[i].push(match FIGURES[i] {
                Figure::Baseline(what) => baseline_per_s(args, n, what).await?,
                Figure::Kiln(path) => kiln_per_s(args, n, path).await?,
            });
        }
        eprintln!("round {}: {:?}", round + 1, figures.iter().map(|f| f[round].round()).collect::<Vec<_>>());
    }
    report_throughput(n, figures.map(median));
    Ok(())
}

/// The medians of the throughput figures, in `FIGURES`' order.
fn report_throughput(n: usize, medians: [f64; 7]) {
    let [baseline, handoff, apart, baseline_finish, baseline_handoff, claim_only, claim_finish] = medians;
    // The same work as Kiln's (each run claimed and completed), done the
    // best plain way this database allows: the faster of the two loops of
    // plain statements.
    let same_work = baseline_finish.max(baseline_handoff);
    println!(
        "same work: the best plain claim-and-complete loop, {n} conns:    {same_work:>8.0} runs/s; \
         kiln one worker {:.2}x, {n} workers {:.2}x",
        handoff / same_work,
        apart / same_work
    );
    println!("baseline  claim statement, tight loop, {n} conns:              {baseline:>8.0} claims/s");
    println!(
        "kiln      one worker, {n} runs at a time (finish_run_and_claim): {handoff:>8.0} runs/s   ({:.2}x baseline)",
        handoff / baseline
    );
    println!(
        "kiln      {n} workers, one run each (finish_run_and_claim):     {apart:>8.0} runs/s   ({:.2}x baseline)",
        apart / baseline
    );
    println!(
        "  for reference: finish-and-claim statement, tight loop, {n} conns: {baseline_handoff:>8.0} runs/s   \
         ({:.2}x baseline; kiln's path {:.2}x this)",
        baseline_handoff / baseline,
        handoff / baseline_handoff
    );
    println!(
        "  for reference: claim then finish statements, {n} conns:          {baseline_finish:>8.0} runs/s   ({:.2}x)",
        baseline_finish / baseline
    );
    println!(
        "  for reference: kiln claim_run only, {n} workers:                 {claim_only:>8.0} claims/s ({:.2}x)",
        claim_only / baseline
    );
    println!(
        "  for reference: kiln claim_run then finish_run, {n} workers:      {claim_finish:>8.0} runs/s   ({:.2}x)",
        claim_finish / baseline
    );
}

/// One figure of a round.
#[derive(Clone, Copy)]
enum Figure {
    Baseline(Baseline),
    Kiln(Path),
}

/// The figures of a round, in the order of an even round (odd rounds run
/// them in reverse).
const FIGURES: [Figure; 7] = [
    Figure::Baseline(Baseline::Claim),
    Figure::Kiln(Path::FinishAndClaim),
    Figure::Kiln(Path::FinishAndClaimApart),
    Figure::Baseline(Baseline::ClaimThenFinish),
    Figure::Baseline(Baseline::FinishAndClaim),
    Figure::Kiln(Path::ClaimOnly),
    Figure::Kiln(Path::ClaimThenFinish),
];

fn median(mut sample: Vec<f64>) -> f64 {
    sample.sort_by(f64::total_cmp);
    sample.get(sample.len() / 2).copied().unwrap_or(0.0)
}

/// A fresh database with `runs` queued runs, checkpointed so that no phase
/// pays for the previous one's dirty pages.
async fn queued_database(runs: i64) -> anyhow::Result<String> {
    let (url, _store) = database().await?;
    let sql = connect(&url).await?;
    insert_runs(&sql, runs, "queued").await?;
    sql.batch_execute("VACUUM ANALYZE runs").await?;
    sql.batch_execute("CHECKPOINT").await?;
    Ok(url)
}

/// What the baseline's connections run, each statement prepared once.
#[derive(Clone, Copy, PartialEq)]
enum Baseline {
    /// The claim statement alone: the older goal's baseline (≥ 0.8×), which
    /// does half of Kiln's work (it never completes a run).
    Claim,
    /// The claim, then the finish: two commits per run.
    ClaimThenFinish,
    /// The claim once, then the finish-and-claim statement: what Kiln's
    /// worker asks of the database, without Kiln around it.
    FinishAndClaim,
}

/// Kiln's own statements, prepared once, over plain connections.
async fn baseline_per_s(args: &Args, n: usize, what: Baseline) -> anyhow::Result<f64> {
    let url = queued_database(args.runs).await?;
    let mut conns = Vec::new();
    for i in 0..n {
        let client = connect(&url).await?;
        let claim = client.prepare(&kiln_store::claim_statement()).await?;
        let finish = client.prepare(&kiln_store::finish_statement()).await?;
        let finish_and_claim = client.prepare(&kiln_store::finish_and_claim_statement()).await?;
        conns.push((client, claim, finish, finish_and_claim, format!("baseline-{i}")));
    }
    let started = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|(client, claim, finish, finish_and_claim, worker)| {
            tokio::spawn(async move {
                let lease_ms = LEASE.as_secs_f64() * 1000.0;
                let payload = serde_json::json!({"summary": ""});
                let no_result: Option<serde_json::Value> = None;
                let no_error: Option<String> = None;
                let mut n = 0u64;
                let mut held = client.query_opt(&claim, &[&worker, &lease_ms]).await?;
                while let Some(row) = held {
                    n += 1;
                    let id: uuid::Uuid = row.try_get("id")?;
                    let attempt: i32 = row.try_get("attempt")?;
                    let ends: [&(dyn tokio_postgres::types::ToSql + Sync); 8] =
                        [&id, &attempt, &worker, &"succeeded", &no_result, &no_error, &"run.succeeded", &payload];
                    held = match what {
                        Baseline::Claim => client.query_opt(&claim, &[&worker, &lease_ms]).await?,
                        Baseline::ClaimThenFinish => {
                            client.query_opt(&finish, &ends).await?;
                            client.query_opt(&claim, &[&worker, &lease_ms]).await?
                        }
                        Baseline::FinishAndClaim => {
                            let mut params = ends.to_vec();
                            params.push(&worker);
                            params.push(&lease_ms);
                            let row = client.query_one(&finish_and_claim, &params).await?;
                            row.try_get::<_, Option<uuid::Uuid>>("id")?.map(|_| row)
                        }
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

/// What each Kiln worker of the throughput figure does with the queue.
#[derive(Clone, Copy, PartialEq)]
enum Path {
    /// Claims and never finishes (against the claim-only baseline).
    ClaimOnly,
    /// Claims, then finishes: two statements, two commits per run.
    ClaimThenFinish,
    /// What a worker with N slots does: claims once per slot, then each
    /// run's end claims the next in the same statement
    /// (`finish_run_and_claim`); ends that meet share a statement.
    FinishAndClaim,
    /// The same as N workers of one slot each (distinct worker names, so
    /// their ends never share a statement).
    FinishAndClaimApart,
}

async fn kiln_per_s(args: &Args, n: usize, path: Path) -> anyhow::Result<f64> {
    let url = queued_database(args.runs).await?;
    // One worker process (one store, its pool as big as its slots), or N
    // processes of one slot each.
    let shared = Arc::new(Store::connect(&url, n)?);
    let mut stores = Vec::new();
    for _ in 0..n {
        stores.push(if path == Path::FinishAndClaimApart {
            Arc::new(Store::connect(&url, 1)?)
        } else {
            shared.clone()
        });
    }
    let started = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let store = stores[i].clone();
            tokio::spawn(async move {
                // One worker's slots share its name; `FinishAndClaimApart`
                // plays N workers.
                let worker = if path == Path::FinishAndClaimApart { format!("kiln-{i}") } else { "kiln".to_owned() };
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
                        Path::FinishAndClaim | Path::FinishAndClaimApart => {
                            store.finish_run_and_claim(&lease, &done, None, &worker, LEASE).await?
                        }
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

/// Claims taken from each table first and not counted: each store's first
/// claims open its connections and prepare its statements.
const WARM_UP: i64 = 20;

/// Times `n` claims (each followed by a finish, like a worker).
async fn time_claims(store: &Store, n: i64) -> anyhow::Result<Vec<Duration>> {
    let mut sample = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let t = Instant::now();
        let Some((_, lease)) = store.claim_run("latency", LEASE).await? else {
            anyhow::bail!("the queue ran dry after {} claims", sample.len())
        };
        sample.push(t.elapsed());
        store.finish_run(&lease, &EventBody::RunSucceeded { summary: String::new() }, None).await?;
    }
    Ok(sample)
}

/// A fresh database with `finished` ended runs, then enough queued runs for
/// the warm-up and `args.claims` claims.
async fn latency_table(args: &Args, finished: i64, vacuumed: bool) -> anyhow::Result<Store> {
    let (url, store) = database().await?;
    let sql = connect(&url).await?;
    if finished > 0 {
        // The finished runs went through the queue like real ones: queued,
        // then moved on, leaving entries behind in the queue's index until
        // vacuum.
        insert_runs(&sql, finished, "queued").await?;
        sql.execute("UPDATE runs SET status = 'succeeded', attempt = 1, finished_at = now()", &[]).await?;
    }
    insert_runs(&sql, WARM_UP + args.claims, "queued").await?;
    if vacuumed {
        sql.batch_execute("VACUUM ANALYZE runs").await?;
    } else if finished > 0 {
        // Alternation spreads the measurement over minutes; autovacuum
        // would clean this table part-way through and blur the two states.
        sql.batch_execute("ALTER TABLE runs SET (autovacuum_enabled = false)").await?;
    }
    // No table pays for an earlier one's preparation (the last checkpoint
    // covers them all: it is the whole server's).
    sql.batch_execute("CHECKPOINT").await?;
    Ok(store)
}

/// The claim latency of the three tables, taken in alternating blocks of
/// `args.block` claims (A B C, then C B A), so a neighbour's burst or a
/// checkpoint falls on all three alike.
async fn claim_latency(args: &Args) -> anyhow::Result<()> {
    let tables = [
        ("empty table (baseline)", latency_table(args, 0, false).await?),
        ("finished runs, not vacuumed", latency_table(args, args.finished, false).await?),
        ("finished runs, vacuumed", latency_table(args, args.finished, true).await?),
    ];
    for (_, store) in &tables {
        time_claims(store, WARM_UP).await?;
    }
    let mut blocks: [Vec<Vec<Duration>>; 3] = Default::default();
    let mut taken = 0;
    while taken < args.claims {
        let n = args.block.min(args.claims - taken);
        let mut order = [0, 1, 2];
        if (taken / args.block) % 2 == 1 {
            order.reverse();
        }
        for i in order {
            blocks[i].push(time_claims(&tables[i].1, n).await?);
        }
        taken += n;
    }
    report_latency(args, &tables.map(|(name, _)| name), &blocks);
    Ok(())
}

fn report_latency(args: &Args, names: &[&str; 3], blocks: &[Vec<Vec<Duration>>; 3]) {
    let all = blocks.clone().map(|b| Summary::of(b.concat()));
    let block_p50 =
        |i: usize| -> Vec<f64> { blocks[i].iter().map(|b| Summary::of(b.clone()).p50.as_secs_f64()).collect() };
    println!(
        "claim latency: {} claims per table in blocks of {} alternated (A B C / C B A) after {WARM_UP} not counted; \
         {} finished runs",
        args.claims, args.block, args.finished
    );
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    for i in 0..3 {
        print!("  {:30} {}", names[i], all[i]);
        if i > 0 {
            let per_block: Vec<f64> = block_p50(i).iter().zip(block_p50(0)).map(|(a, b)| a / b).collect();
            print!(
                "   p50 {:.2}x p99 {:.2}x the empty table (per-block p50 ratio {})",
                ms(all[i].p50) / ms(all[0].p50),
                ms(all[i].p99) / ms(all[0].p99),
                kiln_bench::median_range(&per_block, 2)
            );
        }
        println!();
    }
}
