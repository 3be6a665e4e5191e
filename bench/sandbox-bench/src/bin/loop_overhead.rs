//! The agent loop's own cost per step (issue 4, made fair in issue 22): the
//! real loop against the plain way of making the same model calls and the
//! same tool calls, the two alternating run by run.
//!
//! Kiln: a real `AgentRun` as the worker drives it: real Postgres (a scratch
//! database, the deployment's pool size), a real sandbox, the real tool set
//! (`Registry::standard`) and system prompt (`drive` builds it), the OpenAI
//! provider streaming from the scripted model server on loopback, the
//! stream consumed by the loop as it arrives (events held and written as in
//! a real run). Every step the model calls `bash` with `true`, which runs
//! through the toolbox as any command does.
//!
//! Baseline: a plain agent loop doing the same calls with none of Kiln's
//! bookkeeping: the same provider, request (the system prompt Kiln sent,
//! the same tool specs, the conversation so far) and stream assembly
//! (`AssistantBuilder`), the same toolbox exec of each call's command, the
//! result appended to an in-memory conversation. Nothing stored, no events,
//! no guards or budgets.
//!
//! Per step: the time from one model call's start to the next one's, in
//! both; Kiln's overhead is the difference of the medians. Timing only
//! notes when `stream()` is called: the stream is handed on untouched.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use futures::StreamExt;
use kiln_bench_sandbox::setup::{self, Common};
use kiln_bench_sandbox::{delay_proxy, stats};
use kiln_protocol::{CreateRun, Limits, Message, Part, Role, Trigger};
use kiln_scripted_model::{Reply, ScriptedModel};
use kiln_store::{NewRun, Store};
use kiln_toolbox::protocol::{ExecRequest, Reply as ToolboxReply, RequestBody};
use kiln_worker::agent::{AgentRun, Outcome};
use kiln_worker::event_sink::EventSink;
use kiln_worker::providers::assemble::AssistantBuilder;
use kiln_worker::providers::pricing::PriceTable;
use kiln_worker::providers::{ModelEvent, ModelProvider, ModelRequest, ModelStream, ProviderError};
use kiln_worker::sandbox::Sandbox;
use kiln_worker::tools::Registry;
use kiln_worker::{ProviderEndpoints, ProviderKind, Providers};
use serde_json::json;

/// Steps measured after these first ones (connection pools, caches).
const WARM_UP_STEPS: usize = 3;
/// As `KILN_DB_POOL_SIZE` defaults.
const POOL: usize = 16;
/// As the worker's defaults (`KILN_MODEL_MAX_TOKENS`; the scripted model
/// ignores it) and `KILN_MODEL`, which the built-in price table prices: the
/// loop computes each step's cost as in a deployment.
const MAX_TOKENS: u32 = 4096;
const MODEL: &str = "gpt-4o-mini";

#[derive(Parser)]
#[command(about = "Agent-loop overhead per step: the real loop vs a plain loop making the same calls")]
struct Args {
    #[command(flatten)]
    common: Common,
    /// Runs of each kind, alternating (Kiln first in even rounds).
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Admin URL of the Postgres server; a scratch database is created on it and dropped.
    #[arg(long, env = "DATABASE_URL", default_value = "postgres://kiln:kiln@127.0.0.1:5432/kiln")]
    database_url: String,
    /// Holds the loop's database traffic this many microseconds each way
    /// (a loopback proxy): a database across a network, simulated. 0: the
    /// server directly.
    #[arg(long, default_value_t = 0)]
    db_delay_us: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = args.common.sandbox_config()?;
    let steps = args.common.runs + WARM_UP_STEPS;
    let (db_url, db_name) = setup::scratch_database(&args.database_url, "kiln_loop_bench").await?;
    let docker = setup::docker().await?;
    let sandbox = Sandbox::start(&docker, &config, &setup::owner()).await?;
    let result =
        async { measure(&through_delay(&db_url, args.db_delay_us)?, &sandbox, steps, args.rounds).await }.await;
    sandbox.remove().await;
    setup::drop_database(&args.database_url, &db_name).await;
    let m = result?;

    println!(
        "agent loop, {} rounds of {} measured steps (after {WARM_UP_STEPS} warm-up), a `bash true` per step:",
        args.rounds,
        steps - WARM_UP_STEPS
    );
    let k = stats::report("Kiln: step (model call start to next)", &m.kiln);
    let p = stats::report("plain loop: step (same calls)", &m.plain);
    println!(
        "Kiln's overhead per step: {:.2} ms (difference of medians); per round: {}",
        k.median_ms - p.median_ms,
        m.per_round.iter().map(|d| format!("{d:.2}")).collect::<Vec<_>>().join(", ")
    );
    stats::ratio("Kiln step / plain step", k, p, None);
    stats::report("  of the plain step: model call", &m.plain_model);
    stats::report("  of the plain step: `bash` through the toolbox", &m.plain_tool);
    let c = stats::report("Postgres: one INSERT committed (same server)", &m.commits);
    println!(
        "Kiln per step: {:.1} rows written (events + messages); rows x commit median = {:.2} ms",
        m.rows_per_step,
        m.rows_per_step * c.median_ms
    );
    Ok(())
}

/// `db_url`, or with `delay_us` one a proxy's address that delays its
/// traffic that much each way.
fn through_delay(db_url: &str, delay_us: u64) -> anyhow::Result<String> {
    if delay_us == 0 {
        return Ok(db_url.to_owned());
    }
    let mut url = reqwest::Url::parse(db_url).context("DATABASE_URL is not a URL")?;
    let target = url.socket_addrs(|| Some(5432))?.into_iter().next().context("DATABASE_URL has no address")?;
    let proxy = delay_proxy::start(target, Duration::from_micros(delay_us))?;
    println!("database traffic delayed {delay_us} µs each way (simulated, through {proxy})");
    url.set_port(Some(proxy.port())).map_err(|()| anyhow::anyhow!("DATABASE_URL takes no port"))?;
    Ok(url.to_string())
}

struct Measured {
    kiln: Vec<Duration>,
    plain: Vec<Duration>,
    /// Kiln's median step less the plain loop's, per round (ms).
    per_round: Vec<f64>,
    /// The plain loop's step split: its model call (request to the
    /// stream's end) and its `bash` exec through the toolbox.
    plain_model: Vec<Duration>,
    plain_tool: Vec<Duration>,
    rows_per_step: f64,
    commits: Vec<Duration>,
}

async fn measure(db_url: &str, sandbox: &Sandbox, steps: usize, rounds: usize) -> anyhow::Result<Measured> {
    let store = Store::connect(db_url, POOL)?;
    store.migrate().await?;
    // An unmeasured short run: warms the pool and the sandbox, and shows
    // which system prompt and tools Kiln sends, for the plain loop to send.
    let (_, _, first_request) = kiln_pass(&store, sandbox, 2).await?;
    let system = first_request["messages"][0]["content"].as_str().context("Kiln's system prompt")?.to_owned();
    let mut m = Measured {
        kiln: vec![],
        plain: vec![],
        per_round: vec![],
        plain_model: vec![],
        plain_tool: vec![],
        rows_per_step: 0.0,
        commits: vec![],
    };
    for round in 0..rounds {
        let mut kiln = Vec::new();
        let mut plain = Vec::new();
        for kiln_turn in if round % 2 == 0 { [true, false] } else { [false, true] } {
            if kiln_turn {
                let (starts, rows, _) = kiln_pass(&store, sandbox, steps).await?;
                kiln = step_times(&starts);
                m.rows_per_step = rows as f64 / (steps + 1) as f64;
            } else {
                let pass = plain_pass(sandbox, steps, &system).await?;
                plain = step_times(&pass.starts);
                m.plain_model.extend(pass.model.into_iter().skip(WARM_UP_STEPS));
                m.plain_tool.extend(pass.tool.into_iter().skip(WARM_UP_STEPS));
            }
        }
        m.per_round.push(stats::Summary::of(&kiln).median_ms - stats::Summary::of(&plain).median_ms);
        m.kiln.extend(kiln);
        m.plain.extend(plain);
    }
    let (client, conn) = tokio_postgres::connect(db_url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    m.commits = commit_latency(&client, steps).await?;
    Ok(m)
}

/// Step k: from model call k's start to model call k+1's, past the warm-up.
fn step_times(starts: &[Instant]) -> Vec<Duration> {
    starts.windows(2).skip(WARM_UP_STEPS).map(|w| w[1] - w[0]).collect()
}

/// `steps` calls of `bash true` (each differently commented: the loop guard
/// stops a model repeating one call) and a final answer.
fn script(steps: usize) -> Vec<Reply> {
    let mut script: Vec<Reply> =
        (0..steps).map(|i| Reply::tool("bash", json!({ "command": format!("true # {i}") }))).collect();
    script.push(Reply::text("done"));
    script
}

fn providers(model: &ScriptedModel) -> anyhow::Result<Providers> {
    Ok(Providers::new(ProviderEndpoints {
        openai_base_url: Some(model.openai_base_url()),
        openai_api_key: Some("sk-bench".into()),
        anthropic_base_url: None,
        anthropic_api_key: None,
        read_timeout: None,
    })?)
}

/// Notes when each model call starts; the stream itself is passed on.
struct StartClock {
    inner: Arc<dyn ModelProvider>,
    starts: Mutex<Vec<Instant>>,
}

#[async_trait::async_trait]
impl ModelProvider for StartClock {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn stream(&self, request: &ModelRequest) -> Result<ModelStream, ProviderError> {
        self.starts.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(Instant::now());
        self.inner.stream(request).await
    }
}

/// One run of `steps` steps through the real loop: each model call's start,
/// the rows the run wrote, and the first request the model received.
async fn kiln_pass(
    store: &Store,
    sandbox: &Sandbox,
    steps: usize,
) -> anyhow::Result<(Vec<Instant>, i64, serde_json::Value)> {
    let model = ScriptedModel::start(script(steps)).await.context("starting the scripted model")?;
    let providers = providers(&model)?;
    let clock = Arc::new(StartClock { inner: providers.get(ProviderKind::OpenAi), starts: Mutex::default() });
    let tools = kiln_worker::toolset::Toolset::fixed(Registry::standard());
    let prices = PriceTable::from_env()?;
    let spec = CreateRun {
        prompt: "Run `true` with bash until told otherwise.".into(),
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
        provider: clock.clone(),
        model: MODEL.into(),
        max_tokens: MAX_TOKENS,
        pricing: &|model, usage| prices.cost(model, usage),
        tools: &tools,
        events: &mut events,
        control: Arc::default(),
        notice: None,
        system: String::new(),
        agents_md: None,
        // The worker's defaults; never due with this small a conversation.
        compaction: kiln_worker::agent::compaction::Policy { context_window: 128_000, threshold: 0.8 },
        max_tool_calls_per_step: kiln_worker::config::DEFAULT_MAX_TOOL_CALLS_PER_STEP,
        prompt_cache: true,
        role: None,
        read_only: false,
        seat: None,
    };
    match agent.drive().await? {
        Outcome::Succeeded { .. } => {}
        other => bail!("the run did not succeed: {other:?}"),
    }
    events.commit().await?;
    let starts = std::mem::take(&mut *clock.starts.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    if starts.len() != steps + 1 {
        bail!("expected {} model calls, saw {}", steps + 1, starts.len());
    }
    let rows = rows_written(store, run.id).await?;
    let first = model.requests().first().map(|r| r.body.clone()).context("no model request recorded")?;
    Ok((starts, rows, first))
}

/// The plain loop's timings: each model call's start, and per step the
/// model call's and the `bash` exec's time.
struct PlainPass {
    starts: Vec<Instant>,
    model: Vec<Duration>,
    tool: Vec<Duration>,
}

/// The same calls made the plain way.
async fn plain_pass(sandbox: &Sandbox, steps: usize, system: &str) -> anyhow::Result<PlainPass> {
    let model = ScriptedModel::start(script(steps)).await.context("starting the scripted model")?;
    let provider = providers(&model)?.get(ProviderKind::OpenAi);
    let tools = Registry::standard().specs().to_vec();
    let cache_key = uuid::Uuid::new_v4().to_string();
    let mut messages = vec![Message::user("Run `true` with bash until told otherwise.")];
    let mut starts = Vec::new();
    let (mut model_times, mut tool_times) = (Vec::new(), Vec::new());
    for step in 0..=steps as u32 {
        starts.push(Instant::now());
        let request = ModelRequest {
            model: MODEL.into(),
            system: system.to_owned(),
            messages: messages.clone(),
            tools: tools.clone(),
            max_tokens: MAX_TOKENS,
            temperature: None,
            cache_key: Some(cache_key.clone()),
        };
        let mut stream = provider.stream(&request).await?;
        let mut builder = AssistantBuilder::for_step(step);
        while let Some(event) = stream.next().await {
            let event = event?;
            builder.push(&event);
            if matches!(event, ModelEvent::Finish(_)) {
                break;
            }
        }
        model_times.push(starts[starts.len() - 1].elapsed());
        let answer = builder.finish().message;
        let calls: Vec<(String, String, Option<String>, String)> = answer
            .parts
            .iter()
            .filter_map(|p| match p {
                Part::ToolCall { id, name, arguments, provider_id } => Some((
                    id.clone(),
                    name.clone(),
                    provider_id.clone(),
                    arguments["command"].as_str().unwrap_or_default().to_owned(),
                )),
                _ => None,
            })
            .collect();
        messages.push(answer);
        if calls.is_empty() {
            break;
        }
        let mut results = Vec::new();
        let tool_started = Instant::now();
        for (call_id, name, provider_call_id, command) in calls {
            let output = match sandbox.toolbox_call(RequestBody::Exec(ExecRequest::new(command)), None).await? {
                Some(ToolboxReply::Exec(r)) if r.exit_code == Some(0) => r.output,
                other => bail!("bash in the plain loop: {other:?}"),
            };
            results.push(Part::ToolResult { call_id, name, output, is_error: false, provider_call_id });
        }
        tool_times.push(tool_started.elapsed());
        messages.push(Message { role: Role::Tool, parts: results });
    }
    if starts.len() != steps + 1 {
        bail!("expected {} model calls, made {}", steps + 1, starts.len());
    }
    Ok(PlainPass { starts, model: model_times, tool: tool_times })
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
