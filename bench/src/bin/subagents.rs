//! Sub-agents: four read-only tasks done by a parent with four parallel
//! `explore` children, against the same four tasks done one after the
//! other by a single run. Real API, worker, Postgres and Docker; the
//! scripted model answers every call after a fixed delay (a model's
//! latency), with a script per conversation. Rounds alternate the two.
//!
//! Each task is `--calls` tool calls (`glob`, distinct patterns, so the
//! loop guard never steps in) and an answer. The parallel parent makes
//! one call starting the four children and one reading their answers; the
//! sequential run makes every task's calls in turn, each task's answer said
//! with the next task's first call, and one final answer.
//!
//! Beside the measured ratio it prints what Kiln does not control and what
//! it does: the ratio of pure model time (model calls on each case's
//! critical path times the delay: `calls + 3` against `4 * calls + 1`), and
//! Kiln's overhead per model call of each case, (measured - model time) /
//! calls, which includes each run's share of the sandbox's start and the
//! run's end (both cases pay those once).

use std::time::{Duration, Instant};

use clap::Parser;
use kiln_protocol::{CreateRun, EventBody, Limits, RunStatus};
use kiln_tests::kiln_scripted_model::{Reply, ScriptedCall};
use kiln_tests::{Options, TestApp, outcome, worker_config};
use kiln_worker::ProviderKind;
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// Rounds of (parallel, sequential), the order alternating.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Tool calls per task (then its answer).
    #[arg(long, default_value_t = 10)]
    calls: usize,
    /// The model's delay per call, in milliseconds.
    #[arg(long, default_value_t = 200)]
    delay_ms: u64,
}

const TASKS: usize = 4;

fn glob(tag: &str, n: usize, delay: Duration) -> Reply {
    Reply::tool("glob", json!({"pattern": format!("*{tag}-{n}*")})).with_delay(delay)
}

/// A parent with four children: its script and each child's.
fn parallel(app: &TestApp, round: usize, args: &Args, delay: Duration) -> String {
    let prompt = format!("PAR-{round}: four tasks");
    let tasks = (0..TASKS)
        .map(|t| {
            ScriptedCall::new(
                "task",
                json!({"description": format!("task {t}"), "prompt": format!("KID-{round}-{t}: look"), "agent": "explore"}),
            )
        })
        .collect();
    app.model.script_thread(
        format!("PAR-{round}:"),
        vec![Reply::tools(tasks).with_delay(delay), Reply::text("all four done").with_delay(delay)],
    );
    for t in 0..TASKS {
        let tag = format!("k{round}{t}");
        let mut script: Vec<Reply> = (0..args.calls).map(|n| glob(&tag, n, delay)).collect();
        script.push(Reply::text(format!("task {t} found nothing")).with_delay(delay));
        app.model.script_thread(format!("KID-{round}-{t}:"), script);
    }
    prompt
}

/// One run doing the four tasks in turn.
fn sequential(app: &TestApp, round: usize, args: &Args, delay: Duration) -> String {
    let prompt = format!("SEQ-{round}: four tasks");
    let mut script = Vec::new();
    for t in 0..TASKS {
        let tag = format!("s{round}{t}");
        for n in 0..args.calls {
            let call = glob(&tag, n, delay);
            // The previous task's answer goes with this task's first call.
            script.push(if n == 0 && t > 0 { call.with_text(format!("task {} found nothing", t - 1)) } else { call });
        }
    }
    script.push(Reply::text("all four done").with_delay(delay));
    app.model.script_thread(format!("SEQ-{round}:"), script);
    prompt
}

async fn time_run(app: &TestApp, prompt: String) -> anyhow::Result<(Duration, usize)> {
    let limits = Limits { max_steps: Some(200), ..Limits::default() };
    let started = Instant::now();
    let id = app.submit("bench", CreateRun { limits: Some(limits), ..CreateRun::new(prompt) }).await.id;
    let events = app.events("bench", id).await;
    let took = started.elapsed();
    anyhow::ensure!(outcome(&events) == Some(RunStatus::Succeeded), "the run did not succeed");
    let children = events.iter().filter(|e| matches!(e.body, EventBody::SubagentFinished { .. })).count();
    Ok((took, children))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Model calls on each case's critical path: the parallel parent's two,
/// plus one child's `calls` tool calls and its answer; the sequential run's
/// `TASKS * calls` (each task's answer rides on the next task's first call)
/// and its final answer.
fn critical_calls(calls: usize) -> (usize, usize) {
    (calls + 3, TASKS * calls + 1)
}

/// Kiln's time per model call: what the run took beyond its model time.
fn overhead_per_call(took: Duration, calls: usize, delay: Duration) -> f64 {
    let model = delay.as_secs_f64() * calls as f64;
    (took.as_secs_f64() - model) / calls as f64
}

/// `min-max` of the rounds, in seconds.
fn range(v: &[Duration]) -> String {
    let min = v.iter().min().map_or(0.0, Duration::as_secs_f64);
    let max = v.iter().max().map_or(0.0, Duration::as_secs_f64);
    format!("{min:.2}-{max:.2} s")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let delay = Duration::from_millis(args.delay_ms);
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    app.start_worker(worker_config(ProviderKind::OpenAi, Duration::from_secs(30))).await;
    println!(
        "subagents: {TASKS} tasks of {} tool calls + an answer, model delay {} ms a call, {} rounds",
        args.calls, args.delay_ms, args.rounds
    );
    let (mut par, mut seq) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        for parallel_first in [round % 2 == 0, round % 2 != 0] {
            if parallel_first {
                let (took, children) = time_run(&app, parallel(&app, round, &args, delay)).await?;
                anyhow::ensure!(children == TASKS, "{children} children finished");
                println!("  round {round} parallel children: {:.2} s", took.as_secs_f64());
                par.push(took);
            } else {
                let (took, _) = time_run(&app, sequential(&app, round, &args, delay)).await?;
                println!("  round {round} one run, in turn:  {:.2} s", took.as_secs_f64());
                seq.push(took);
            }
        }
    }
    let (par_range, seq_range) = (range(&par), range(&seq));
    let (par, seq) = (median(par), median(seq));
    let (par_calls, seq_calls) = critical_calls(args.calls);
    println!("median parallel children  {:>7.2} s  (rounds {par_range})", par.as_secs_f64());
    println!("median sequential run     {:>7.2} s  (rounds {seq_range})", seq.as_secs_f64());
    println!("parallel / sequential  {:.3}x  (goal <= 0.35x)", par.as_secs_f64() / seq.as_secs_f64());
    println!(
        "pure model time: {par_calls} vs {seq_calls} calls of {} ms = {:.3}x (Kiln at zero cost, no sandbox start)",
        args.delay_ms,
        par_calls as f64 / seq_calls as f64
    );
    println!(
        "Kiln per model call (median - model time) / calls: parallel {:.1} ms, sequential {:.1} ms",
        1000.0 * overhead_per_call(par, par_calls, delay),
        1000.0 * overhead_per_call(seq, seq_calls, delay)
    );
    Ok(())
}
