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
struct NoopArgs {}

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
    let (db_url, db_name) = scratch_database(&args.database_url).await?;
    let docker = setup::docker().await?;
    let sandbox = Sandbox::start(&docker, &config, &setup::owner()).await?;
    let result = run(&db_url, &sandbox, steps).await;
    sandbox.remove().await;
    drop_database(&args.database_url, &db_name).await;
    let (overhead, wall, model, tool) = result?;

    println!(
        "agent loop, {} measured steps (after {WARM_UP_STEPS} warm-up), scripted model + no-op tool:",
        overhead.len()
    );
    stats::report("step wall time", &wall);
    stats::report("model time (scripted model, HTTP + SSE parse)", &model);
    stats::report("tool time (no-op)", &tool);
    let o = stats::report("loop overhead (wall - model - tool)", &overhead);
    let verdict = if o.median_ms <= 2.0 { "met" } else { "NOT met" };
    println!("loop overhead median {:.2} ms   goal <= 2 ms: {verdict}", o.median_ms);
    Ok(())
}

type Figures = (Vec<Duration>, Vec<Duration>, Vec<Duration>, Vec<Duration>);

async fn run(db_url: &str, sandbox: &Sandbox, steps: usize) -> anyhow::Result<Figures> {
    let store = Store::connect(db_url, 8)?;
    store.migrate().await?;
    let mut script: Vec<Reply> = (0..steps).map(|_| Reply::tool("noop", json!({}))).collect();
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
        approval: None,
        allowed_tools: None,
    };
    store.create_run(NewRun { owner: "bench".into(), spec, trigger: Trigger::Api, idempotency_key: None }).await?;
    let Some((run, lease)) = store.claim_run("bench-worker", Duration::from_secs(3600)).await? else {
        bail!("the run just created could not be claimed");
    };
    let mut events = EventSink::new(store.clone(), lease.clone());
    let agent = AgentRun {
        store: &store,
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
    };
    match agent.drive().await? {
        Outcome::Succeeded { .. } => {}
        other => bail!("the run did not succeed: {other:?}"),
    }

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
    let (mut overhead, mut wall, mut model_t, mut tool_t) = (vec![], vec![], vec![], vec![]);
    // Step k runs from model call k's start to model call k+1's start.
    for k in WARM_UP_STEPS..steps {
        let (start, model) = model_calls[k];
        let step = model_calls[k + 1].0 - start;
        let tool = tool_calls[k];
        overhead.push(step.saturating_sub(model + tool));
        wall.push(step);
        model_t.push(model);
        tool_t.push(tool);
    }
    Ok((overhead, wall, model_t, tool_t))
}

/// Creates an empty database next to `admin` and returns its URL and name.
async fn scratch_database(admin: &str) -> anyhow::Result<(String, String)> {
    let (client, conn) =
        tokio_postgres::connect(admin, tokio_postgres::NoTls).await.context("connecting to Postgres")?;
    tokio::spawn(conn);
    let name = format!("kiln_bench_{}", uuid::Uuid::new_v4().simple());
    client.execute(&format!("CREATE DATABASE {name}"), &[]).await?;
    let base = admin.rsplit_once('/').map(|(base, _)| base).context("DATABASE_URL has no database name")?;
    Ok((format!("{base}/{name}"), name))
}

async fn drop_database(admin: &str, name: &str) {
    if let Ok((client, conn)) = tokio_postgres::connect(admin, tokio_postgres::NoTls).await {
        tokio::spawn(conn);
        if let Err(e) = client.execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"), &[]).await {
            eprintln!("dropping the scratch database {name} failed: {e}");
        }
    }
}
