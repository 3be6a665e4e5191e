//! Attempts: a group of four attempts at one task against one attempt
//! alone (a plain run of the same script), each a scripted run of
//! `--calls` tool calls and an answer with a fixed model latency, on one
//! worker with four slots. Kiln as users run it: the `kiln serve` and `kiln
//! worker` binaries (release), in processes of their own, on a fresh
//! database, real Docker, the scripted model server in this process. Rounds
//! alternate which goes first; the group's time is from its `POST /v1/runs`
//! to its terminal status (its last attempt's end), the run's likewise.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use kiln_bench::{Server, Worker, connect, database, kiln_binary, median_range, time_run, without_quotas};
use kiln_protocol::{CreateRun, ModelSpec};
use kiln_scripted_model::{Reply, ScriptedModel};
use serde_json::json;
use uuid::Uuid;

#[derive(Parser)]
struct Args {
    /// Rounds of (group, single run), the order alternating.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Tool calls per attempt (then its answer).
    #[arg(long, default_value_t = 10)]
    calls: usize,
    /// The model's delay per call, in milliseconds.
    #[arg(long, default_value_t = 200)]
    delay_ms: u64,
    /// The `kiln` binary (default: target/release/kiln, else target/debug/kiln).
    #[arg(long)]
    kiln: Option<PathBuf>,
}

const ATTEMPTS: usize = 4;
/// How long a run or a group may take before the bench gives up.
const RUN_LIMIT: Duration = Duration::from_secs(300);

/// One attempt's script, for the model named `model`.
fn script(model: &ScriptedModel, name: &str, args: &Args) {
    let delay = Duration::from_millis(args.delay_ms);
    let mut replies: Vec<Reply> = (0..args.calls)
        .map(|n| Reply::tool("glob", json!({"pattern": format!("*{name}-{n}*")})).with_delay(delay))
        .collect();
    replies.push(Reply::text("done").with_delay(delay));
    model.script_model(name, replies);
}

fn group(model: &ScriptedModel, round: usize, args: &Args) -> CreateRun {
    let models: Vec<String> = (0..ATTEMPTS).map(|k| format!("group-{round}-{k}")).collect();
    for name in &models {
        script(model, name, args);
    }
    CreateRun { attempts: Some(ATTEMPTS as u32), attempt_models: Some(models), ..CreateRun::new("look around") }
}

fn single(model: &ScriptedModel, round: usize, args: &Args) -> CreateRun {
    let name = format!("single-{round}");
    script(model, &name, args);
    CreateRun { model: Some(ModelSpec { name: Some(name), ..Default::default() }), ..CreateRun::new("look around") }
}

/// Where a run's (or a group's attempts') time went, in seconds from the
/// submission, the latest attempt's: claimed (`run.started`), its sandbox
/// ready (`sandbox.ready`), its first model call answered (the first
/// `step.finished`), ended. For a group, each the latest over its attempts.
async fn phases(sql: &tokio_postgres::Client, id: Uuid) -> anyhow::Result<[f64; 4]> {
    let row = sql
        .query_one(
            "WITH a AS (
                 SELECT (SELECT min(e.at) FROM events e WHERE e.run_id = r.id AND e.kind = 'run.started') AS claimed,
                        (SELECT min(e.at) FROM events e WHERE e.run_id = r.id AND e.kind = 'sandbox.ready') AS ready,
                        (SELECT min(e.at) FROM events e WHERE e.run_id = r.id AND e.kind = 'step.finished') AS step
                 FROM runs r WHERE r.id = $1 OR r.group_run_id = $1)
             SELECT EXTRACT(EPOCH FROM max(a.claimed) - g.created_at)::float8,
                    EXTRACT(EPOCH FROM max(a.ready) - g.created_at)::float8,
                    EXTRACT(EPOCH FROM max(a.step) - g.created_at)::float8,
                    EXTRACT(EPOCH FROM g.finished_at - g.created_at)::float8
             FROM a, runs g WHERE g.id = $1 GROUP BY g.created_at, g.finished_at",
            &[&id],
        )
        .await?;
    let get = |i: usize| -> anyhow::Result<f64> { Ok(row.try_get::<_, Option<f64>>(i)?.unwrap_or(f64::NAN)) };
    Ok([get(0)?, get(1)?, get(2)?, get(3)?])
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let kiln = kiln_binary(args.kiln.as_deref())?;
    let (db_url, _store) = database().await?;
    let model = ScriptedModel::start(Vec::new()).await?;
    let api = Server::kiln_serve(&kiln, &db_url, &without_quotas()).await?;
    let slots = [("KILN_WORKER_MAX_SESSIONS", ATTEMPTS.to_string())];
    let worker = Worker::start(&kiln, &db_url, &model.openai_base_url(), &slots).await?;
    let sql = connect(&db_url).await?;
    println!(
        "attempts: {ATTEMPTS} attempts vs 1 run, {} tool calls + an answer each, model delay {} ms, {} rounds; \
         {} serve + worker ({ATTEMPTS} slots)",
        args.calls,
        args.delay_ms,
        args.rounds,
        kiln.display()
    );
    // Warm-up (not counted): the first sandbox starts, the first prepared
    // statements, for both kinds.
    time_run(&api, &sql, &single(&model, usize::MAX, &args), RUN_LIMIT).await?;
    time_run(&api, &sql, &group(&model, usize::MAX, &args), RUN_LIMIT).await?;
    let (mut groups, mut singles, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut group_phases, mut single_phases) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        let mut this = [0.0; 2];
        for group_first in [round % 2 == 0, round % 2 != 0] {
            let (spec, label) = match group_first {
                true => (group(&model, round, &args), format!("group of {ATTEMPTS}")),
                false => (single(&model, round, &args), "one run".to_owned()),
            };
            let (took, id) = time_run(&api, &sql, &spec, RUN_LIMIT).await?;
            let took = took.as_secs_f64();
            let p = phases(&sql, id).await?;
            println!(
                "  round {round} {label:<11} {took:.2} s  (latest attempt: claimed {:.2}, sandbox ready {:.2}, \
                 first step {:.2}, ended {:.2})",
                p[0], p[1], p[2], p[3]
            );
            let (times, phases) =
                if group_first { (&mut groups, &mut group_phases) } else { (&mut singles, &mut single_phases) };
            times.push(took);
            phases.push(p);
            this[usize::from(!group_first)] = took;
        }
        ratios.push(this[0] / this[1]);
    }
    for (label, ps) in [("group of 4", &group_phases), ("one run", &single_phases)] {
        let col = |i: usize| ps.iter().map(|p: &[f64; 4]| p[i]).collect::<Vec<_>>();
        println!(
            "{label:<11} medians: claimed {} s, sandbox ready {} s, first step {} s, ended {} s",
            median_range(&col(0), 2),
            median_range(&col(1), 2),
            median_range(&col(2), 2),
            median_range(&col(3), 2)
        );
    }
    let ratio = kiln_bench::median(&groups) / kiln_bench::median(&singles);
    println!("median group of {ATTEMPTS}  {} s", median_range(&groups, 2));
    println!("median one run      {} s", median_range(&singles, 2));
    println!("per-round ratio     {}", median_range(&ratios, 3));
    println!("group / one run  {ratio:.3}x  (goal <= 1.3x)");
    worker.stop().await;
    drop(api);
    kiln_bench::drop_databases().await?;
    Ok(())
}
