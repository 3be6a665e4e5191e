//! The agent loop's own cost per step (issue 4): a real `AgentRun` (real
//! Postgres, a real sandbox, the OpenAI provider against the scripted model
//! server on loopback) whose model asks for a no-op tool every step.
//!
//! Per step: wall time from one model call's start to the next one's, less
//! the model time and the tool time, which this harness measures around the
//! provider and inside the tool:
//!
//! - model time: from `stream()` being called until the provider's stream
//!   has yielded its last event. The harness drains the stream itself before
//!   handing the events to the loop, so what the loop does per event (event
//!   rows, tool-call assembly) lands in the overhead, not in the model time.
//! - tool time: the no-op tool's own call, from entry to return.
//!
//! What remains is the loop: persisting the assistant message, the tool
//! results and the events, checking the inbox and budgets, the loop guard,
//! scheduling the tool batch, and building the next request.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use futures::StreamExt;
use kiln_bench_sandbox::setup::{self, Common};
use kiln_bench_sandbox::stats;
use kiln_protocol::{CreateRun, Limits, Trigger};
use kiln_scripted_model::{Reply, ScriptedModel};
use kiln_store::{NewRun, Store};
use kiln_worker::agent::events::EventSink;
use kiln_worker::agent::{AgentRun, Outcome};
use kiln_worker::providers::{ModelProvider, ModelRequest, ModelStream, ProviderError};
use kiln_worker::sandbox::Sandbox;
use kiln_worker::tools::{Registry, Tool, ToolContext, ToolFailure, ToolOutcome, schema_of};
use kiln_worker::{ProviderEndpoints, ProviderKind, Providers};
use serde_json::{Value, json};

/// Steps measured after these first ones (connection pools, caches).
const WARM_UP_STEPS: usize = 3;

#[derive(Parser)]
#[command(about = "Agent-loop overhead per step: step wall time - model time - tool time")]
struct Args {
    #[command(flatten)]
    common: Common,
    /// Admin URL of the Postgres server; a scratch database is created on it and dropped.
    #[arg(long, env = "DATABASE_URL", default_value = "postgres://kiln:kiln@127.0.0.1:5432/kiln")]
    database_url: String,
}

/// When each model call started and how long it took; each tool call's time.
#[derive(Default)]
struct Clock {
    model: Mutex<Vec<(Instant, Duration)>>,
    tool: Mutex<Vec<Duration>>,
}

fn push<T>(m: &Mutex<Vec<T>>, value: T) {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(value);
}

/// Times the real provider, draining its stream before the loop sees it.
struct TimedProvider {
    inner: Arc<dyn ModelProvider>,
    clock: Arc<Clock>,
}

#[async_trait::async_trait]
impl ModelProvider for TimedProvider {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn stream(&self, request: &ModelRequest) -> Result<ModelStream, ProviderError> {
        let started = Instant::now();
        let events: Vec<_> = self.inner.stream(request).await?.collect().await;
        push(&self.clock.model, (started, started.elapsed()));
        Ok(futures::stream::iter(events).boxed())
    }
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct NoopArgs {
    /// Which step this is: differing arguments keep the loop guard (which
    /// stops a model repeating one call) out of the way.
    #[allow(dead_code)]
    step: u64,
}

/// Does nothing and says so; times itself.
struct Noop {
    clock: Arc<Clock>,
}

#[async_trait::async_trait]
impl Tool for Noop {
    fn name(&self) -> &'static str {
        "noop"
    }
    fn description(&self) -> &'static str {
        "Does nothing."
    }
    fn schema(&self) -> Value {
        schema_of::<NoopArgs>()
    }
    fn is_mutating(&self) -> bool {
        false
    }
    async fn call(&self, _ctx: &ToolContext<'_>, _args: Value) -> Result<ToolOutcome, ToolFailure> {
        let started = Instant::now();
        let outcome = ToolOutcome::ok("ok");
        push(&self.clock.tool, started.elapsed());
        Ok(outcome)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = args.common.sandbox_config()?;
    let steps = args.common.runs + WARM_UP_STEPS;
    let (db_url, db_name) = setup::scratch_database(&args.database_url, "kiln_loop_bench").await?;
    let docker = setup::docker().await?;
    let sandbox = Sandbox::start(&docker, &config, &setup::owner()).await?;
    let result = measure(&db_url, &sandbox, steps).await;
    sandbox.remove().await;
    setup::drop_database(&args.database_url, &db_name).await;
    let (durable, relaxed, commits) = result?;

    println!(
        "agent loop, {} measured steps (after {WARM_UP_STEPS} warm-up), scripted model + no-op tool:",
        steps - WARM_UP_STEPS
    );
    let o = durable.report("");
    let verdict = if o.median_ms <= 2.0 { "met" } else { "NOT met" };
    println!("loop overhead median {:.2} ms   goal <= 2 ms: {verdict}", o.median_ms);
    // What the overhead is made of: durable writes, each one commit.
    let c = stats::report("Postgres: one INSERT committed (same server)", &commits);
    println!(
        "per step: {:.1} rows written (events + messages), {:.1} transactions; rows x commit median = {:.2} ms",
        durable.writes_per_step,
        durable.xacts_per_step,
        durable.writes_per_step * c.median_ms
    );
    println!("the same loop with synchronous_commit=off (commits do not wait for the WAL flush):");
    relaxed.report("[no flush wait] ");
    Ok(())
}

/// One pass's per-step figures.
struct Pass {
    overhead: Vec<Duration>,
    wall: Vec<Duration>,
    model: Vec<Duration>,
    tool: Vec<Duration>,
    writes_per_step: f64,
    /// Transactions the database committed per step (reads included: each
    /// statement outside a transaction is one).
    xacts_per_step: f64,
}

impl Pass {
    fn report(&self, prefix: &str) -> stats::Summary {
        stats::report(&format!("{prefix}step wall time"), &self.wall);
        stats::report(&format!("{prefix}model time (HTTP + SSE parse)"), &self.model);
        stats::report(&format!("{prefix}tool time (no-op)"), &self.tool);
        stats::report(&format!("{prefix}loop overhead (wall - model - tool)"), &self.overhead)
    }
}

/// The loop as deployed (every commit waits for its WAL flush), then with
/// `synchronous_commit=off` to separate the loop's own work from the disk's
/// flush latency; and that latency on its own.
async fn measure(db_url: &str, sandbox: &Sandbox, steps: usize) -> anyhow::Result<(Pass, Pass, Vec<Duration>)> {
    let store = Store::connect(db_url, 8)?;
    store.migrate().await?;
    let (client, conn) = tokio_postgres::connect(db_url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let before = committed(&client).await?;
    let mut durable = agent_pass(&store, sandbox, steps).await?;
    durable.xacts_per_step = (committed(&client).await? - before) as f64 / (steps + 1) as f64;
    let sep = if db_url.contains('?') { '&' } else { '?' };
    let relaxed_store = Store::connect(&format!("{db_url}{sep}options=-c%20synchronous_commit%3Doff"), 8)?;
    let relaxed = agent_pass(&relaxed_store, sandbox, steps).await?;
    let commits = commit_latency(&client, steps).await?;
    Ok((durable, relaxed, commits))
}

/// Drives one run of `steps` no-op steps and a final answer.
async fn agent_pass(store: &Store, sandbox: &Sandbox, steps: usize) -> anyhow::Result<Pass> {
    let mut script: Vec<Reply> = (0..steps).map(|i| Reply::tool("noop", json!({ "step": i }))).collect();
    script.push(Reply::text("done"));
    let model = ScriptedModel::start(script).await.context("starting the scripted model")?;
    let providers = Providers::new(ProviderEndpoints {
        openai_base_url: Some(model.openai_base_url()),
        openai_api_key: Some("sk-bench".into()),
        anthropic_base_url: None,
        anthropic_api_key: None,
        read_timeout: None,
    })?;
    let clock = Arc::new(Clock::default());
    let provider = Arc::new(TimedProvider { inner: providers.get(ProviderKind::OpenAi), clock: clock.clone() });
    let tools = Registry::from_tools([Arc::new(Noop { clock: clock.clone() }) as Arc<dyn Tool>]);

    let spec = CreateRun {
        prompt: "Call noop until told otherwise.".into(),
        repo: None,
        model: None,
        limits: Some(Limits { max_steps: Some(steps as u32 + 1), ..Limits::default() }),
        ..CreateRun::default()
    };
    store.create_run(NewRun { owner: "bench".into(), spec, trigger: Trigger::Api, idempotency_key: None }).await?;
    let Some((run, lease)) = store.claim_run("bench-worker", Duration::from_secs(3600)).await? else {
        bail!("the run just created could not be claimed");
    };
    let mut events = EventSink::new(store.clone(), lease.clone());
    let agent = AgentRun {
        store,
        lease: &lease,
        run: &run,
        sandbox,
        provider,
        model: "scripted".into(),
        max_tokens: 1024,
        pricing: &|_, _| None,
        tools: &tools,
        events: &mut events,
        control: Arc::default(),
        notice: None,
        system: String::new(),
        // Never due: the bench's conversation stays small.
        compaction: kiln_worker::agent::compaction::Policy { context_window: 1_000_000, threshold: 1.0 },
        max_tool_calls_per_step: kiln_worker::config::DEFAULT_MAX_TOOL_CALLS_PER_STEP,
        prompt_cache: true,
        role: None,
        seat: None,
    };
    match agent.drive().await? {
        Outcome::Succeeded { .. } => {}
        other => bail!("the run did not succeed: {other:?}"),
    }
    events.commit().await?;

    let model_calls = std::mem::take(&mut *clock.model.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    let tool_calls = std::mem::take(&mut *clock.tool.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    if model_calls.len() != steps + 1 || tool_calls.len() != steps {
        bail!(
            "expected {} model calls and {steps} tool calls, saw {} and {}",
            steps + 1,
            model_calls.len(),
            tool_calls.len()
        );
    }
    let mut pass = Pass {
        overhead: vec![],
        wall: vec![],
        model: vec![],
        tool: vec![],
        writes_per_step: rows_written(store, run.id).await? as f64 / (steps + 1) as f64,
        xacts_per_step: 0.0,
    };
    // Step k runs from model call k's start to model call k+1's start.
    for k in WARM_UP_STEPS..steps {
        let (start, model) = model_calls[k];
        let step = model_calls[k + 1].0 - start;
        let tool = tool_calls[k];
        pass.overhead.push(step.saturating_sub(model + tool));
        pass.wall.push(step);
        pass.model.push(model);
        pass.tool.push(tool);
    }
    Ok(pass)
}

/// Transactions committed in this database so far. Backends report their
/// counts to the statistics system when idle for about a second, so wait.
async fn committed(client: &tokio_postgres::Client) -> anyhow::Result<i64> {
    tokio::time::sleep(Duration::from_millis(2500)).await;
    client.batch_execute("SELECT pg_stat_clear_snapshot()").await?;
    let row =
        client.query_one("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()", &[]).await?;
    Ok(row.try_get(0)?)
}

/// Event and message rows the run wrote.
async fn rows_written(store: &Store, run_id: uuid::Uuid) -> anyhow::Result<i64> {
    let events = store.events_after(run_id, 0, 100_000).await?.len() as i64;
    let messages =
        store.count_run_messages(run_id, "assistant").await? + store.count_run_messages(run_id, "tool").await?;
    Ok(events + messages)
}

/// The floor under every durable write: one small autocommitted INSERT.
async fn commit_latency(client: &tokio_postgres::Client, n: usize) -> anyhow::Result<Vec<Duration>> {
    client.batch_execute("CREATE TABLE bench_commit (x int)").await?;
    let insert = client.prepare("INSERT INTO bench_commit VALUES ($1)").await?;
    let mut out = Vec::with_capacity(n);
    for i in 0..=n {
        let started = Instant::now();
        client.execute(&insert, &[&(i as i32)]).await?;
        if i > 0 {
            out.push(started.elapsed());
        }
    }
    Ok(out)
}
