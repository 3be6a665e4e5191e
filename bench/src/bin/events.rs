//! The event path: latency from the worker's write to an SSE client's
//! receipt with 1, 100 and 1,000 clients on one run (or spread over
//! `--runs`; 10,000 clients need a hard `ulimit -n` above 10,000, the soft
//! limit is raised to it), and the server's memory per idle SSE stream,
//! for `kiln serve` and for a plain axum SSE server reading the same rows
//! (`kiln_bench::sse_baseline`), the two alternated round by round.
//!
//! This process plays the worker, through the worker's own code, in two
//! ways:
//! - *held* (what a streaming model's text goes through): `EventSink`
//!   buffers each delta and writes it once it has waited the loop's 50 ms
//!   (`COALESCE`), merged with the deltas after it, exactly as
//!   `agent::model_call` does (a `write_soon` per delta, `write_if_stale`
//!   on a 50 ms tick). Measured from the moment the delta is produced.
//! - *immediate* (events committed on their own: a step's message and tool
//!   calls, a run's end): one fenced `append_event` per event. Measured from
//!   just before the write.
//!
//! Both servers get the same writes and the same notifications (Kiln's
//! store notifies after each commit); only the server differs.
//!
//! Each latency figure also gives the CPU time spent per 1,000 receipts
//! in its round by the server process and by the local Postgres (all its
//! processes, when the database runs on this machine): once the clients
//! saturate the cores, latencies are mostly queueing, and the CPU a
//! server spends for the same work is the steadier comparison.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use kiln_bench::{Server, Summary, database, http, kiln_binary, local_postgres_cpu_time, median_range, token};
use kiln_protocol::{CreateRun, EventBody, Trigger};
use kiln_store::{Lease, NewRun, Store};
use kiln_worker::event_sink::{COALESCE, EventSink};
use tokio::sync::Barrier;

#[derive(Parser)]
struct Args {
    /// Client counts to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,100,1000")]
    clients: Vec<usize>,
    /// Events (or deltas) written per measurement.
    #[arg(long, default_value_t = 40)]
    events: u32,
    /// Pause between two events (between two deltas: a model streaming 50
    /// tokens a second).
    #[arg(long, default_value_t = 20)]
    interval_ms: u64,
    /// Rounds; each measures both servers, in an order that alternates.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Idle streams opened for the memory figure.
    #[arg(long, default_value_t = 1000)]
    idle: usize,
    /// Runs the clients of a latency figure are spread over (one run: all
    /// on it). With more than one, only *immediate* writes are measured:
    /// each step appends one event to every run, side by side.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Skip the memory figure.
    #[arg(long)]
    no_memory: bool,
    /// The `kiln` binary (default: target/release/kiln, else target/debug/kiln).
    #[arg(long)]
    kiln: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Held,
    Immediate,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if let Some((db, listener)) = kiln_bench::baseline_child().await? {
        return kiln_bench::sse_baseline::serve(db, listener).await;
    }
    let args = Args::parse();
    raise_open_files()?;
    let kiln = kiln_binary(args.kiln.as_deref())?;
    let (url, store) = database().await?;
    // `kiln serve` as deployed; the stream limit per subject is lifted so
    // one subject can hold the benchmark's 1,000 streams.
    let sse_limit = [("KILN_MAX_SSE_PER_SUBJECT", (args.idle.max(10_000) * 2).to_string())];
    let kiln_api = Server::kiln_serve(&kiln, &url, &sse_limit).await?;
    let plain = Server::baseline(&url).await?;
    println!(
        "event path: {} events {} ms apart per figure, {} rounds; kiln: {} serve; baseline: plain axum SSE",
        args.events,
        args.interval_ms,
        args.rounds,
        kiln.display()
    );
    let servers = [("kiln", &kiln_api), ("plain", &plain)];
    let names = [servers[0].0, servers[1].0];
    let modes: &[Mode] = if args.runs > 1 { &[Mode::Immediate] } else { &[Mode::Held, Mode::Immediate] };
    for &n in &args.clients {
        for &mode in modes {
            let mut p50: [Vec<f64>; 2] = Default::default();
            let mut p99: [Vec<f64>; 2] = Default::default();
            let mut open_cpu: [Vec<Cpu>; 2] = Default::default();
            let mut cpu: [Vec<Cpu>; 2] = Default::default();
            for round in 0..args.rounds {
                let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
                for i in order {
                    let (s, spent) = latency(&store, servers[i].1, n, mode, &args).await?;
                    // Opening: per 1,000 streams. Delivery (to the streams'
                    // end): per 1,000 receipts.
                    let opening = spent.open.per(n as f64 / 1000.0);
                    let delivery = spent.delivery.per(s.n as f64 / 1000.0);
                    open_cpu[i].push(opening);
                    cpu[i].push(delivery);
                    p50[i].push(ms(s.p50));
                    p99[i].push(ms(s.p99));
                    println!(
                        "round {round}  {:<5} {n:>5} clients on {} run(s), {}: {s}\n    \
                         cpu: {} per 1,000 receipts; opening {} per 1,000 streams",
                        servers[i].0,
                        args.runs,
                        if mode == Mode::Held { "held delta -> receipt" } else { "write -> receipt      " },
                        delivery,
                        opening,
                    );
                }
            }
            let what = if mode == Mode::Held { "held" } else { "immediate" };
            let of = |cpus: &[Cpu], part: fn(&Cpu) -> f64| median_range(&cpus.iter().map(part).collect::<Vec<_>>(), 2);
            for i in 0..2 {
                println!(
                    "=> {what:<9} {n:>5} clients on {} run(s)  {:<5} p50 {} ms   p99 {} ms\n   \
                     cpu per 1,000 receipts: server {} ms, postgres {} ms; \
                     opening 1,000 streams: server {} ms, postgres {} ms",
                    args.runs,
                    servers[i].0,
                    median_range(&p50[i], 2),
                    median_range(&p99[i], 2),
                    of(&cpu[i], |c| c.server),
                    of(&cpu[i], |c| c.postgres),
                    of(&open_cpu[i], |c| c.server),
                    of(&open_cpu[i], |c| c.postgres),
                );
            }
        }
    }
    drop((kiln_api, plain));
    if args.no_memory {
        kiln_bench::drop_databases().await?;
        return Ok(());
    }
    // Memory: a fresh server each time (an allocator keeps what earlier
    // streams freed, which would hide the growth).
    let mut per_stream: [Vec<f64>; 2] = Default::default();
    for round in 0..args.rounds {
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let server = if i == 0 {
                Server::kiln_serve(&kiln, &url, &sse_limit).await?
            } else {
                Server::baseline(&url).await?
            };
            let bytes = idle_memory(&store, &server, args.idle).await?;
            println!("round {round}  {:<5} idle SSE streams: {:.1} KiB each", names[i], bytes / 1024.0);
            per_stream[i].push(bytes / 1024.0);
        }
    }
    for i in 0..2 {
        println!(
            "=> idle stream memory  {:<5} {} KiB each ({} streams)",
            names[i],
            median_range(&per_stream[i], 1),
            args.idle
        );
    }
    kiln_bench::drop_databases().await?;
    Ok(())
}

/// Lifts this process's soft limit on open files to its hard limit: 10,000
/// streams are 10,000 sockets here and as many in the server, which
/// inherits the limit (each is a process of its own).
fn raise_open_files() -> anyhow::Result<()> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        setrlimit(Resource::Nofile, rustix::process::Rlimit { current: limit.maximum, maximum: limit.maximum })?;
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn claimed_run(store: &Store) -> anyhow::Result<Lease> {
    let spec = CreateRun { prompt: "bench".into(), ..Default::default() };
    store.create_run(NewRun { owner: "bench".into(), spec, trigger: Trigger::Api, idempotency_key: None }).await?;
    let (_, lease) =
        store.claim_run("bench-worker", Duration::from_secs(3600)).await?.ok_or(anyhow::anyhow!("nothing claimed"))?;
    Ok(lease)
}

/// What one client saw: each event's id, data and time of receipt.
type Seen = Vec<(i64, String, Instant)>;

/// One SSE client: every event until the terminal one.
async fn client(
    http: reqwest::Client,
    addr: SocketAddr,
    run: uuid::Uuid,
    token: Arc<String>,
    ready: Arc<Barrier>,
) -> anyhow::Result<Seen> {
    let request = http
        .get(format!("http://{addr}/v1/runs/{run}/events"))
        .bearer_auth(token.as_str())
        .header("accept", "text/event-stream")
        .header("last-event-id", "1")
        .send();
    let opened = match tokio::time::timeout(Duration::from_secs(120), request).await {
        Ok(sent) => sent.and_then(reqwest::Response::error_for_status).map_err(anyhow::Error::from),
        Err(_) => Err(anyhow::anyhow!("no answer in 120 s")),
    };
    // At the barrier whether or not the stream opened: a client that
    // failed must not hold the others (and the benchmark) forever; its
    // error is reported when the clients are collected.
    ready.wait().await;
    let response = opened.with_context(|| format!("opening the stream of run {run}"))?;
    let mut events = response.bytes_stream().eventsource();
    let mut seen = Vec::new();
    while let Some(ev) = events.next().await {
        let ev = ev?;
        let at = Instant::now();
        if kiln_protocol::event::is_terminal_kind(&ev.event) {
            break;
        }
        seen.push((ev.id.parse()?, ev.data, at));
    }
    Ok(seen)
}

/// The markers `[k]` in a delta's text.
fn markers(data: &str) -> impl Iterator<Item = u32> + '_ {
    data.split('[').skip(1).filter_map(|part| part.split_once(']')?.0.parse().ok())
}

/// CPU time spent in a part of a round, in milliseconds: by the server
/// process, and by the local Postgres (every process of it: the writes are
/// the same whichever server runs, the reads are the server's).
#[derive(Debug, Clone, Copy)]
struct Cpu {
    server: f64,
    postgres: f64,
}

impl Cpu {
    /// Both clocks now.
    fn read(server: &Server) -> anyhow::Result<Cpu> {
        Ok(Cpu { server: ms(server.cpu_time()?), postgres: ms(local_postgres_cpu_time()) })
    }

    fn since(self, start: Cpu) -> Cpu {
        Cpu { server: self.server - start.server, postgres: self.postgres - start.postgres }
    }

    fn per(self, units: f64) -> Cpu {
        Cpu { server: self.server / units, postgres: self.postgres / units }
    }
}

impl std::fmt::Display for Cpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "server {:.2} ms, postgres {:.2} ms", self.server, self.postgres)
    }
}

/// Where a round's CPU went: opening the streams (until every stream has
/// made its first read), and the writes' delivery to the streams' end.
struct RoundCpu {
    open: Cpu,
    delivery: Cpu,
}

async fn latency(
    store: &Store,
    server: &Server,
    n: usize,
    mode: Mode,
    args: &Args,
) -> anyhow::Result<(Summary, RoundCpu)> {
    let addr = server.addr;
    let mut leases = Vec::with_capacity(args.runs);
    for _ in 0..args.runs {
        leases.push(claimed_run(store).await?);
    }
    let started = Cpu::read(server)?;
    let http = http()?;
    let token = Arc::new(token("bench")?);
    let ready = Arc::new(Barrier::new(n + 1));
    let clients: Vec<_> = (0..n)
        .map(|c| {
            let run = leases[c % leases.len()].run_id;
            tokio::spawn(client(http.clone(), addr, run, token.clone(), ready.clone()))
        })
        .collect();
    ready.wait().await;
    // Let every stream make its first read and wait for news.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let opened = Cpu::read(server)?;
    let interval = Duration::from_millis(args.interval_ms);
    // When each event (by run and seq) or delta (by marker) was produced.
    let mut produced: HashMap<(uuid::Uuid, i64), Instant> = HashMap::new();
    match mode {
        Mode::Immediate => {
            for step in 0..args.events {
                let writes = leases.iter().map(|lease| async move {
                    let t = Instant::now();
                    let seq = store.append_event(lease, &EventBody::StepStarted { step }).await?;
                    anyhow::Ok(((lease.run_id, seq), t))
                });
                for written in futures::future::join_all(writes).await {
                    let (key, t) = written?;
                    produced.insert(key, t);
                }
                tokio::time::sleep(interval).await;
            }
        }
        Mode::Held => {
            // `agent::model_call::stream_once`'s loop, the model a timer.
            let lease = &leases[0];
            let mut sink = EventSink::new(store.clone(), lease.clone());
            let mut tick = tokio::time::interval(COALESCE);
            let mut next = tokio::time::interval(interval);
            let mut k = 0;
            while k < args.events {
                tokio::select! {
                    _ = next.tick() => {
                        produced.insert((lease.run_id, i64::from(k)), Instant::now());
                        sink.write_soon(EventBody::TextDelta { text: format!("[{k}]") }).await?;
                        k += 1;
                    }
                    _ = tick.tick() => sink.write_if_stale().await?,
                }
            }
            // The step's message would follow the stream; its commit takes
            // the last deltas along.
            tokio::time::sleep(interval).await;
            sink.commit().await?;
        }
    }
    for lease in &leases {
        store.finish_run(lease, &EventBody::RunSucceeded { summary: String::new() }, None).await?;
    }
    let mut sample = Vec::new();
    for (c, task) in clients.into_iter().enumerate() {
        let run = leases[c % leases.len()].run_id;
        // A client that never sees the run's end fails the benchmark
        // rather than hanging it.
        let seen = tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .map_err(|_| anyhow::anyhow!("an SSE client did not see the run end within 60 s"))???;
        for (seq, data, at) in seen {
            let keys: Vec<i64> = match mode {
                Mode::Immediate => vec![seq],
                Mode::Held => markers(&data).map(i64::from).collect(),
            };
            for key in keys {
                if let Some(t) = produced.get(&(run, key)) {
                    sample.push(at.duration_since(*t));
                }
            }
        }
    }
    anyhow::ensure!(sample.len() == n * args.events as usize, "some client missed events: {}", sample.len());
    let spent = RoundCpu { open: opened.since(started), delivery: Cpu::read(server)?.since(opened) };
    Ok((Summary::of(sample), spent))
}

/// Opens `m` SSE streams on an idle run and returns the server's resident
/// memory growth per stream, in bytes.
async fn idle_memory(store: &Store, server: &Server, m: usize) -> anyhow::Result<f64> {
    let lease = claimed_run(store).await?;
    let token = token("bench")?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = server.rss_bytes()?;
    let http = http()?;
    let mut streams = Vec::with_capacity(m);
    for _ in 0..m {
        let r = http
            .get(format!("http://{}/v1/runs/{}/events", server.addr, lease.run_id))
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
    let after = server.rss_bytes()?;
    drop(streams);
    store.finish_run(&lease, &EventBody::RunSucceeded { summary: String::new() }, None).await?;
    Ok(after.saturating_sub(before) as f64 / m as f64)
}
