//! Sub-agents: four read-only tasks done by a parent with four parallel
//! `explore` children, against the same four tasks done one after the
//! other by a single run. Kiln as users run it: the `kiln serve` and `kiln
//! worker` binaries (release), in processes of their own, on a fresh
//! database, real Docker; the scripted model server in this process is the
//! only stand-in, answering every call after a fixed delay (a model's
//! latency), with a script per conversation. Rounds alternate which case
//! goes first; each run's time is from its `POST /v1/runs` to its terminal
//! status.
//!
//! Each task is `--calls` tool calls (`glob`, distinct patterns, so the
//! loop guard never steps in) and an answer. The parallel parent makes
//! one call starting the four children and one reading their answers; the
//! sequential run makes every task's calls in turn, each task's answer said
//! with the next task's first call, and one final answer.
//!
//! The children run inside the parent's worker task, in its sandbox (not
//! in worker slots): how many at once is the worker's
//! `KILN_SUBAGENT_MAX_PARALLEL`, set here to the four tasks (its default),
//! with `KILN_SUBAGENT_MAX_DEPTH` 1 (the default) so the parent may start
//! them; the bench checks that all four finished.
//!
//! Beside the measured ratio it prints what Kiln does not control and what
//! it does: the ratio of pure model time (model calls on each case's
//! critical path times the delay: `calls + 3` against `4 * calls + 1`), and
//! Kiln's overhead per model call of each case, (measured - model time) /
//! calls, which includes each run's share of the sandbox's start and the
//! run's end (both cases pay those once).

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use kiln_bench::{Server, Worker, connect, database, kiln_binary, median_range, time_run, without_quotas};
use kiln_protocol::{CreateRun, Limits};
use kiln_scripted_model::{Reply, ScriptedCall, ScriptedModel};
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
    /// The `kiln` binary (default: target/release/kiln, else target/debug/kiln).
    #[arg(long)]
    kiln: Option<PathBuf>,
}

const TASKS: usize = 4;

fn glob(tag: &str, n: usize, delay: Duration) -> Reply {
    Reply::tool("glob", json!({"pattern": format!("*{tag}-{n}*")})).with_delay(delay)
}

/// A parent with four children: its script and each child's. `round`
/// tags the conversations (each a thread of its own in the model).
fn parallel(model: &ScriptedModel, round: &str, args: &Args, delay: Duration) -> CreateRun {
    let prompt = format!("PAR-{round}: four tasks");
    let tasks = (0..TASKS)
        .map(|t| {
            ScriptedCall::new(
                "task",
                json!({"description": format!("task {t}"), "prompt": format!("KID-{round}-{t}: look"), "agent": "explore"}),
            )
        })
        .collect();
    model.script_thread(
        format!("PAR-{round}:"),
        vec![Reply::tools(tasks).with_delay(delay), Reply::text("all four done").with_delay(delay)],
    );
    for t in 0..TASKS {
        let tag = format!("k{round}{t}");
        let mut script: Vec<Reply> = (0..args.calls).map(|n| glob(&tag, n, delay)).collect();
        script.push(Reply::text(format!("task {t} found nothing")).with_delay(delay));
        model.script_thread(format!("KID-{round}-{t}:"), script);
    }
    spec(prompt)
}

/// One run doing the four tasks in turn.
fn sequential(model: &ScriptedModel, round: &str, args: &Args, delay: Duration) -> CreateRun {
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
    model.script_thread(format!("SEQ-{round}:"), script);
    spec(prompt)
}

/// The run's request: room for the sequential run's `4 * calls + 1` steps.
fn spec(prompt: String) -> CreateRun {
    let limits = Limits { max_steps: Some(200), ..Limits::default() };
    CreateRun { limits: Some(limits), ..CreateRun::new(prompt) }
}

/// Submits `spec` and waits for the run's end: how long it took, and how
/// many of its children succeeded.
async fn time_run_and_children(
    api: &Server,
    sql: &tokio_postgres::Client,
    spec: &CreateRun,
) -> anyhow::Result<(Duration, i64)> {
    let (took, id) = time_run(api, sql, spec, Duration::from_secs(600)).await?;
    let children = "SELECT count(*) FROM runs WHERE parent_run_id = $1 AND status = 'succeeded'";
    Ok((took, sql.query_one(children, &[&id]).await?.try_get(0)?))
}

/// Model calls on each case's critical path: the parallel parent's two,
/// plus one child's `calls` tool calls and its answer; the sequential run's
/// `TASKS * calls` (each task's answer rides on the next task's first call)
/// and its final answer.
fn critical_calls(calls: usize) -> (usize, usize) {
    (calls + 3, TASKS * calls + 1)
}

/// Kiln's time per model call: what the run took beyond its model time.
fn overhead_per_call(took: f64, calls: usize, delay: Duration) -> f64 {
    let model = delay.as_secs_f64() * calls as f64;
    (took - model) / calls as f64
}

/// One run of the parallel case or the sequential one, tagged `round`: its
/// time in seconds, checked to have had its four children (parallel) or
/// none.
async fn one_case(env: &Bench<'_>, parallel_case: bool, round: &str) -> anyhow::Result<f64> {
    let (args, delay) = (env.args, Duration::from_millis(env.args.delay_ms));
    let spec = match parallel_case {
        true => parallel(env.model, round, args, delay),
        false => sequential(env.model, round, args, delay),
    };
    let (took, children) = time_run_and_children(env.api, env.sql, &spec).await?;
    let expected = if parallel_case { TASKS as i64 } else { 0 };
    anyhow::ensure!(children == expected, "round {round}: {children} children succeeded, {expected} expected");
    Ok(took.as_secs_f64())
}

/// What every run of the bench goes through.
struct Bench<'a> {
    args: &'a Args,
    model: &'a ScriptedModel,
    api: &'a Server,
    sql: &'a tokio_postgres::Client,
}

/// The rounds, alternating which case goes first: each case's times and
/// each round's ratio.
async fn rounds(env: &Bench<'_>) -> anyhow::Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let (mut par, mut seq, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..env.args.rounds {
        let mut this = [0.0; 2];
        for parallel_first in [round % 2 == 0, round % 2 != 0] {
            let took = one_case(env, parallel_first, &round.to_string()).await?;
            match parallel_first {
                true => println!("  round {round} parallel children: {took:.2} s"),
                false => println!("  round {round} one run, in turn:  {took:.2} s"),
            }
            let times = if parallel_first { &mut par } else { &mut seq };
            times.push(took);
            this[usize::from(!parallel_first)] = took;
        }
        ratios.push(this[0] / this[1]);
    }
    Ok((par, seq, ratios))
}

fn report(args: &Args, par: &[f64], seq: &[f64], ratios: &[f64]) {
    let delay = Duration::from_millis(args.delay_ms);
    let (par_median, seq_median) = (kiln_bench::median(par), kiln_bench::median(seq));
    let (par_calls, seq_calls) = critical_calls(args.calls);
    println!("median parallel children  {} s", median_range(par, 2));
    println!("median sequential run     {} s", median_range(seq, 2));
    println!("per-round ratio           {}", median_range(ratios, 3));
    println!("parallel / sequential  {:.3}x  (goal <= 0.35x)", par_median / seq_median);
    println!(
        "pure model time: {par_calls} vs {seq_calls} calls of {} ms = {:.3}x (Kiln at zero cost, no sandbox start)",
        args.delay_ms,
        par_calls as f64 / seq_calls as f64
    );
    println!(
        "Kiln per model call (median - model time) / calls: parallel {:.1} ms, sequential {:.1} ms",
        1000.0 * overhead_per_call(par_median, par_calls, delay),
        1000.0 * overhead_per_call(seq_median, seq_calls, delay)
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let kiln = kiln_binary(args.kiln.as_deref())?;
    let (db_url, _store) = database().await?;
    let model = ScriptedModel::start(Vec::new()).await?;
    let api = Server::kiln_serve(&kiln, &db_url, &without_quotas()).await?;
    let subagents = [("KILN_SUBAGENT_MAX_PARALLEL", TASKS.to_string()), ("KILN_SUBAGENT_MAX_DEPTH", "1".to_owned())];
    let worker = Worker::start(&kiln, &db_url, &model.openai_base_url(), &subagents).await?;
    let sql = connect(&db_url).await?;
    println!(
        "subagents: {TASKS} tasks of {} tool calls + an answer, model delay {} ms a call, {} rounds; \
         {} serve + worker ({TASKS} children at once)",
        args.calls,
        args.delay_ms,
        args.rounds,
        kiln.display()
    );
    let env = Bench { args: &args, model: &model, api: &api, sql: &sql };
    // Warm-up (not counted): the worker's first sandbox, its first children
    // (their connections and prepared statements), for both cases.
    one_case(&env, true, "w").await?;
    one_case(&env, false, "w").await?;
    let (par, seq, ratios) = rounds(&env).await?;
    report(&args, &par, &seq, &ratios);
    worker.stop().await;
    drop(api);
    kiln_bench::drop_databases().await?;
    Ok(())
}
