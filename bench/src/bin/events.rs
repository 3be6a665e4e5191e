//! The event path: latency from the worker's insert to an SSE client's
//! receipt, with 1, 100 and 1,000 clients on one run; and the API's memory
//! per idle SSE connection.
//!
//! The API runs in a child process (so its memory is its own); this process
//! plays the worker (fenced `append_event` through Kiln's store, exactly
//! what a worker calls) and the clients.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use kiln_bench::{ChildApi, Summary, database, http, serve_api_if_child, token};
use kiln_protocol::{CreateRun, EventBody, Trigger};
use kiln_store::{Lease, NewRun, Store};
use tokio::sync::Barrier;

#[derive(Parser)]
struct Args {
    /// Client counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,100,1000")]
    clients: Vec<usize>,
    /// Events written per measurement.
    #[arg(long, default_value_t = 100)]
    events: u32,
    /// Pause between two events.
    #[arg(long, default_value_t = 50)]
    interval_ms: u64,
    /// Idle connections opened for the memory figure.
    #[arg(long, default_value_t = 1000)]
    idle: usize,
    /// The API's connection pool.
    #[arg(long, default_value_t = 16)]
    pool: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    serve_api_if_child().await?;
    let args = Args::parse();
    let (url, store) = database().await?;
    let api = ChildApi::start(&url, args.pool).await?;
    println!(
        "event path: {} events {} ms apart per figure, API pool {}, API at {}",
        args.events, args.interval_ms, args.pool, api.addr
    );
    for &n in &args.clients {
        let s = latency(&store, api.addr, n, &args).await?;
        println!("{n:>5} clients: insert -> SSE receipt {s}");
    }
    let per_conn = idle_memory(&store, &api, args.idle).await?;
    println!("idle SSE connections: {:.1} KiB each ({} connections)", per_conn / 1024.0, args.idle);
    kiln_bench::drop_databases().await?;
    Ok(())
}

async fn claimed_run(store: &Store) -> anyhow::Result<Lease> {
    let spec = CreateRun { prompt: "bench".into(), ..Default::default() };
    store.create_run(NewRun { owner: "bench".into(), spec, trigger: Trigger::Api, idempotency_key: None }).await?;
    let (_, lease) =
        store.claim_run("bench-worker", Duration::from_secs(3600)).await?.ok_or(anyhow::anyhow!("nothing claimed"))?;
    Ok(lease)
}

/// One SSE client: the receipt time of every event until the terminal one.
async fn client(
    http: reqwest::Client,
    addr: SocketAddr,
    run: uuid::Uuid,
    token: Arc<String>,
    ready: Arc<Barrier>,
) -> anyhow::Result<Vec<(i64, Instant)>> {
    let response = http
        .get(format!("http://{addr}/v1/runs/{run}/events"))
        .bearer_auth(token.as_str())
        .header("accept", "text/event-stream")
        .header("last-event-id", "1")
        .send()
        .await?
        .error_for_status()?;
    ready.wait().await;
    let mut events = response.bytes_stream().eventsource();
    let mut seen = Vec::new();
    while let Some(ev) = events.next().await {
        let ev = ev?;
        seen.push((ev.id.parse()?, Instant::now()));
        if kiln_protocol::event::is_terminal_kind(&ev.event) {
            break;
        }
    }
    Ok(seen)
}

async fn latency(store: &Store, addr: SocketAddr, n: usize, args: &Args) -> anyhow::Result<Summary> {
    let lease = claimed_run(store).await?;
    let http = http()?;
    let token = Arc::new(token("bench")?);
    let ready = Arc::new(Barrier::new(n + 1));
    let clients: Vec<_> =
        (0..n).map(|_| tokio::spawn(client(http.clone(), addr, lease.run_id, token.clone(), ready.clone()))).collect();
    ready.wait().await;
    // Let every stream make its first read and wait for news.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut written: HashMap<i64, Instant> = HashMap::new();
    for step in 0..args.events {
        let t = Instant::now();
        let seq = store.append_event(&lease, &EventBody::StepStarted { step }).await?;
        written.insert(seq, t);
        tokio::time::sleep(Duration::from_millis(args.interval_ms)).await;
    }
    store.finish_run(&lease, &EventBody::RunSucceeded { summary: String::new() }, None).await?;
    let mut sample = Vec::new();
    for c in clients {
        for (seq, at) in c.await?? {
            if let Some(t) = written.get(&seq) {
                sample.push(at.duration_since(*t));
            }
        }
    }
    anyhow::ensure!(sample.len() == n * args.events as usize, "some client missed events: {}", sample.len());
    Ok(Summary::of(sample))
}

/// Opens `m` SSE streams on an idle run and returns the API's resident
/// memory growth per stream, in bytes.
async fn idle_memory(store: &Store, api: &ChildApi, m: usize) -> anyhow::Result<f64> {
    let lease = claimed_run(store).await?;
    let token = token("bench")?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = api.rss_bytes()?;
    let http = http()?;
    let mut streams = Vec::with_capacity(m);
    for _ in 0..m {
        let r = http
            .get(format!("http://{}/v1/runs/{}/events", api.addr, lease.run_id))
            .bearer_auth(&token)
            .header("accept", "text/event-stream")
            .send()
            .await?
            .error_for_status()?;
        let mut body = r.bytes_stream();
        // The first event (run.queued): the stream is set up and waiting.
        body.next().await;
        streams.push(body);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = api.rss_bytes()?;
    println!(
        "API RSS: {:.1} MiB before, {:.1} MiB with {m} idle streams",
        before as f64 / 1048576.0,
        after as f64 / 1048576.0
    );
    drop(streams);
    Ok(after.saturating_sub(before) as f64 / m as f64)
}
