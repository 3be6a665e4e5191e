//! Prompt caching on Anthropic (issue 19): a 20-step run through the real
//! API and worker (`kiln serve` and `kiln worker`, each its own process, on
//! a scratch database, with real sandboxes) against the scripted model,
//! whose Anthropic endpoint computes cache reads and writes from the
//! requests' `cache_control` breakpoints as Anthropic documents them
//! (`ScriptedModel::simulate_prompt_cache`), not from the script.
//!
//! The same run with `KILN_PROMPT_CACHE=0` is the baseline; the two
//! alternate, round by round. Figures: the share of input tokens read from
//! the cache after the first step (goal >= 0.9), and the run's cost at
//! Claude Sonnet's prices (cache reads 0.1x, writes 1.25x the input price)
//! against the baseline's.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use kiln_bench_sandbox::kiln::{Kiln, KilnArgs, build_profile};
use kiln_bench_sandbox::setup;
use kiln_protocol::{EventBody, Usage};
use kiln_scripted_model::{Reply, ScriptedModel};
use serde_json::json;

/// A model name the built-in price table prices as Claude Sonnet.
const MODEL: &str = "claude-sonnet-4-5";

#[derive(Parser)]
#[command(about = "Prompt caching: cache-read share and cost of a 20-step Anthropic run, caching on vs off")]
struct Args {
    // The figures are token counts and prices, the same for a debug or a
    // release build of `kiln`.
    #[command(flatten)]
    kiln: KilnArgs,
    /// Model calls in the run (tool calls, then a final answer).
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// Rounds; each runs caching on and off, in alternating order.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
}

/// One run's figures.
struct Figures {
    steps: Vec<Usage>,
    cost: f64,
    wall: Duration,
}

impl Figures {
    /// Cache reads over all input (read + written + uncached) of steps 2..
    fn read_share_after_first(&self) -> f64 {
        let later = &self.steps[1.min(self.steps.len())..];
        let read: u64 = later.iter().map(|u| u.cache_read_tokens).sum();
        let all: u64 = later.iter().map(|u| u.input_tokens + u.cache_read_tokens + u.cache_write_tokens).sum();
        if all == 0 { 0.0 } else { read as f64 / all as f64 }
    }

    fn total(&self) -> Usage {
        self.steps.iter().fold(Usage::default(), |mut t, u| {
            t.input_tokens += u.input_tokens;
            t.output_tokens += u.output_tokens;
            t.cache_read_tokens += u.cache_read_tokens;
            t.cache_write_tokens += u.cache_write_tokens;
            t
        })
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let kiln = args.kiln.binary()?;
    println!("kiln: {} ({} build)", kiln.display(), build_profile(&kiln));
    let mut on = Vec::new();
    let mut off = Vec::new();
    for round in 0..args.rounds {
        let order = if round % 2 == 0 { [true, false] } else { [false, true] };
        for cache in order {
            let figures = one_run(&args, cache).await?;
            eprintln!(
                "round {round}: caching {}: {} steps, cost ${:.4}, read share after step 1 {:.3}, {:.1} s",
                if cache { "on " } else { "off" },
                figures.steps.len(),
                figures.cost,
                figures.read_share_after_first(),
                figures.wall.as_secs_f64()
            );
            if cache { on.push(figures) } else { off.push(figures) }
        }
    }
    println!("prompt caching, {} model calls per run, {} rounds alternated:", args.steps, args.rounds);
    for (name, runs) in [("caching on (Kiln)", &on), ("caching off (baseline)", &off)] {
        let last = runs.last().context("no runs")?;
        let t = last.total();
        println!(
            "{name:24} input {:>7}  cache read {:>7}  cache write {:>6}  output {:>5}  cost ${:.4}  read share after step 1 {:.3}",
            t.input_tokens,
            t.cache_read_tokens,
            t.cache_write_tokens,
            t.output_tokens,
            last.cost,
            last.read_share_after_first()
        );
    }
    let median = |runs: &[Figures], f: &dyn Fn(&Figures) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let share = median(&on, &|f| f.read_share_after_first());
    let cost_ratio = median(&on, &|f| f.cost) / median(&off, &|f| f.cost);
    // Every figure here is the scripted model's arithmetic, not Anthropic's:
    // said where the figures are, so that no copy of them reads otherwise.
    println!(
        "SIMULATION: the scripted model's own model of Anthropic's cache, not Anthropic's API \
         (bench/README.md, \"What the prompt-cache simulation leaves out\")"
    );
    let verdict = if share >= 0.9 { "met in the simulation" } else { "NOT met, in the simulation" };
    println!("cache-read share of input after the first step: {share:.3}   goal >= 0.9: {verdict}");
    println!("cost with caching / without: {cost_ratio:.3}x");
    Ok(())
}

/// One run on a scratch database, with its own model, API and worker.
async fn one_run(args: &Args, cache: bool) -> anyhow::Result<Figures> {
    let (db_url, db_name) = setup::scratch_database(&args.kiln.database_url, "kiln_cache_bench").await?;
    let result = run_on(args, &db_url, cache).await;
    setup::drop_database(&args.kiln.database_url, &db_name).await;
    result
}

async fn run_on(args: &Args, db_url: &str, cache: bool) -> anyhow::Result<Figures> {
    let mut script: Vec<Reply> =
        (1..args.steps).map(|n| Reply::tool("bash", json!({"command": format!("echo step {n}")}))).collect();
    script.push(Reply::text("done"));
    let model = ScriptedModel::start(script).await?;
    model.simulate_prompt_cache();
    let env = [
        ("KILN_MODEL_PROVIDER", "anthropic".to_owned()),
        ("KILN_ANTHROPIC_BASE_URL", model.anthropic_base_url()),
        ("ANTHROPIC_API_KEY", "sk-ant-bench".to_owned()),
        ("KILN_MODEL", MODEL.to_owned()),
        ("KILN_PROMPT_CACHE", cache.to_string()),
        ("KILN_SANDBOX_IMAGE", args.kiln.image.clone()),
        ("KILN_SANDBOX_WARM", "0".to_owned()),
    ];
    let mut kiln = Kiln::start(&args.kiln.binary()?, db_url, &env).await?;
    let started = Instant::now();
    let body = json!({"prompt": "Echo each step.", "limits": {"max_steps": args.steps + 2, "timeout_s": 600}});
    let result = async {
        let id = kiln.submit(&body).await?;
        kiln.follow(&id, Duration::from_millis(200), Duration::from_secs(900), async |_| Ok(())).await
    }
    .await;
    kiln.stop().await;
    let events = result?;
    let wall = started.elapsed();
    let mut steps = Vec::new();
    let mut cost = 0.0;
    for event in &events {
        if let Some(EventBody::StepFinished { usage, cost_usd, .. }) = event.body() {
            steps.push(usage);
            cost += cost_usd.context("claude-sonnet-4-5 has a built-in price")?;
        }
    }
    if steps.len() != args.steps {
        bail!("the run took {} steps, not {}: {:?}", steps.len(), args.steps, events.last().map(|e| &e.kind));
    }
    Ok(Figures { steps, cost, wall })
}
