//! Attempts: a group of four attempts at one task against one attempt
//! alone (a plain run of the same script), each a scripted run of
//! `--calls` tool calls and an answer with a fixed model latency, on one
//! worker with four slots. Real API, worker, Postgres and Docker. Rounds
//! alternate which goes first; the group's time is its submission to its
//! terminal event (its last attempt's end), the run's likewise.

use std::time::{Duration, Instant};

use clap::Parser;
use kiln_protocol::{CreateRun, RunStatus};
use kiln_tests::kiln_scripted_model::Reply;
use kiln_tests::{Options, TestApp, outcome, worker_config};
use kiln_worker::ProviderKind;
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// Rounds of (group, single run), the order alternating.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Tool calls per attempt (then its answer).
    #[arg(long, default_value_t = 10)]
    calls: usize,
    /// The model's delay per call, in milliseconds.
    #[arg(long, default_value_t = 200)]
    delay_ms: u64,
}

const ATTEMPTS: usize = 4;

/// One attempt's script, for the model named `model`.
fn script(app: &TestApp, model: &str, args: &Args, delay: Duration) {
    let mut replies: Vec<Reply> = (0..args.calls)
        .map(|n| Reply::tool("glob", json!({"pattern": format!("*{model}-{n}*")})).with_delay(delay))
        .collect();
    replies.push(Reply::text("done").with_delay(delay));
    app.model.script_model(model, replies);
}

/// Submits `spec` and waits for its end; how long it took.
async fn time_run(app: &TestApp, spec: CreateRun) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let id = app.submit("bench", spec).await.id;
    let events = app.events("bench", id).await;
    let took = started.elapsed();
    anyhow::ensure!(outcome(&events) == Some(RunStatus::Succeeded), "the run did not succeed");
    Ok(took)
}

fn group(app: &TestApp, round: usize, args: &Args, delay: Duration) -> CreateRun {
    let models: Vec<String> = (0..ATTEMPTS).map(|k| format!("group-{round}-{k}")).collect();
    for model in &models {
        script(app, model, args, delay);
    }
    CreateRun { attempts: Some(ATTEMPTS as u32), attempt_models: Some(models), ..CreateRun::new("look around") }
}

fn single(app: &TestApp, round: usize, args: &Args, delay: Duration) -> CreateRun {
    let model = format!("single-{round}");
    script(app, &model, args, delay);
    let model = kiln_protocol::ModelSpec { name: Some(model), ..Default::default() };
    CreateRun { model: Some(model), ..CreateRun::new("look around") }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let delay = Duration::from_millis(args.delay_ms);
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(30));
    config.concurrency = ATTEMPTS;
    app.start_worker(config).await;
    println!(
        "attempts: {ATTEMPTS} attempts vs 1 run, {} tool calls + an answer each, model delay {} ms, {} rounds",
        args.calls, args.delay_ms, args.rounds
    );
    let (mut groups, mut singles) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        for group_first in [round % 2 == 0, round % 2 != 0] {
            if group_first {
                let took = time_run(&app, group(&app, round, &args, delay)).await?;
                println!("  round {round} group of {ATTEMPTS}: {:.2} s", took.as_secs_f64());
                groups.push(took);
            } else {
                let took = time_run(&app, single(&app, round, &args, delay)).await?;
                println!("  round {round} one run:     {:.2} s", took.as_secs_f64());
                singles.push(took);
            }
        }
    }
    let (group, single) = (median(groups), median(singles));
    println!("median group of {ATTEMPTS}  {:>7.2} s", group.as_secs_f64());
    println!("median one run      {:>7.2} s", single.as_secs_f64());
    println!("group / one run  {:.3}x  (goal <= 1.3x)", group.as_secs_f64() / single.as_secs_f64());
    Ok(())
}
