//! The local model's prompt cache (issue 19): the demo run of `kiln up`
//! (SmolLM2-135M on llama.cpp's server, the demo repository, "Run `cat
//! README.md` with bash, then reply with one sentence.") through `kiln
//! serve` and `kiln worker`, on a server whose cache was warmed with the
//! runs' common prefix when it started (as `kiln up` starts it) and on one
//! that was not. Server starts alternate, warm and cold.
//!
//! Figures: the first step's wall time (its `step.started` to its
//! `step.finished`) and the prompt tokens the server processed for each
//! step, by its own count (`llamacpp:prompt_tokens_total` at `/metrics`,
//! read as each `step.finished` arrives).
//!
//! Needs the local model installed (`.kiln/local-model`, as `kiln up` or
//! `scripts/test` install it) and Docker with the sandbox image.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use kiln_bench_sandbox::kiln::{Kiln, KilnArgs, build_profile};
use kiln_bench_sandbox::setup;
use kiln_cli::local_model::{self, LocalModel};
use serde_json::json;

const PROMPT: &str = "Run `cat README.md` with bash, then reply with one sentence.";

#[derive(Parser)]
#[command(about = "Demo run on the local model: first step and prompt tokens per step, warm vs cold server")]
struct Args {
    #[command(flatten)]
    kiln: KilnArgs,
    /// Kiln's state directory holding `local-model/`.
    #[arg(long, default_value = ".kiln")]
    state_dir: PathBuf,
    /// Rounds; each starts a warm and a cold server, in alternating order
    /// (an even number runs each order as often).
    #[arg(long, default_value_t = 4)]
    rounds: usize,
}

/// One demo run's figures.
struct Figures {
    /// Prompt tokens the warm-up made the server process (0 when cold).
    warm_up_tokens: f64,
    first_step: Duration,
    /// Prompt tokens processed for each step, in order.
    prompt_tokens: Vec<f64>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let kiln = args.kiln.binary()?;
    println!("kiln: {} ({} build)", kiln.display(), build_profile(&kiln));
    let install = args.state_dir.join("local-model");
    if !local_model::is_installed(&install) {
        bail!("the local model is not installed in {} (kiln up installs it)", install.display());
    }
    let repo_dir = tempfile_dir()?;
    let repo = kiln_cli::local::ensure_demo_repo(&repo_dir).await?;
    let repo_url = format!("file://{}", repo.display());
    let mut warm = Vec::new();
    let mut cold = Vec::new();
    for round in 0..args.rounds {
        let order = if round % 2 == 0 { [true, false] } else { [false, true] };
        for warmed in order {
            let figures = one_run(&args, &repo_url, warmed).await;
            let figures = match figures {
                Ok(f) => f,
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&repo_dir);
                    return Err(e);
                }
            };
            eprintln!(
                "round {round}: {}: warm-up {:.0} tokens, first step {:.1} s, prompt tokens per step {:?}",
                if warmed { "warm" } else { "cold" },
                figures.warm_up_tokens,
                figures.first_step.as_secs_f64(),
                figures.prompt_tokens
            );
            if warmed { warm.push(figures) } else { cold.push(figures) }
        }
    }
    let _ = std::fs::remove_dir_all(&repo_dir);
    report(&args, &warm, &cold);
    Ok(())
}

/// The median (of the two middle values for an even count) and the range.
fn median_range(runs: &[Figures], f: impl Fn(&Figures) -> f64) -> (f64, f64, f64) {
    let mut v: Vec<f64> = runs.iter().map(f).collect();
    v.sort_by(f64::total_cmp);
    let (Some(&low), Some(&high)) = (v.first(), v.last()) else { return (f64::NAN, f64::NAN, f64::NAN) };
    let mid = v.len() / 2;
    let median = if v.len() % 2 == 1 { v[mid] } else { (v[mid - 1] + v[mid]) / 2.0 };
    (median, low, high)
}

fn report(args: &Args, warm: &[Figures], cold: &[Figures]) {
    let first_step = |f: &Figures| f.first_step.as_secs_f64();
    println!("demo run on the local model, {} rounds, warm and cold server starts alternated:", args.rounds);
    for (name, runs) in [("warm server (Kiln)", warm), ("cold server (baseline)", cold)] {
        let (median, low, high) = median_range(runs, first_step);
        println!(
            "{name:24} first step {median:>5.1} s (median; {low:.1}..{high:.1})   first-step prompt tokens {:>5.0}   \
             per step, each run: {:?}",
            median_range(runs, |f| f.prompt_tokens.first().copied().unwrap_or(0.0)).0,
            runs.iter().map(|f| f.prompt_tokens.clone()).collect::<Vec<_>>()
        );
    }
    let per_round: Vec<String> =
        warm.iter().zip(cold).map(|(w, c)| format!("{:.2}", first_step(w) / first_step(c))).collect();
    let ratio = median_range(warm, first_step).0 / median_range(cold, first_step).0;
    println!("first step, warm / cold: {ratio:.2}x (medians; per round {})", per_round.join(", "));
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("kiln-local-warm-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

async fn one_run(args: &Args, repo_url: &str, warm: bool) -> anyhow::Result<Figures> {
    let log = std::env::temp_dir().join(format!("kiln-local-warm-{}.log", std::process::id()));
    let options = local_model::Options { warm, log: Some(log.clone()), ..local_model::Options::new(&args.state_dir) };
    let server = LocalModel::start_installed(options).await?;
    let (db_url, db_name) = setup::scratch_database(&args.kiln.database_url, "kiln_local_warm_bench").await?;
    let result = demo_run(args, &db_url, &server, repo_url).await;
    setup::drop_database(&args.kiln.database_url, &db_name).await;
    server.stop().await;
    let _ = std::fs::remove_file(log);
    result
}

async fn demo_run(args: &Args, db_url: &str, server: &LocalModel, repo_url: &str) -> anyhow::Result<Figures> {
    let http = reqwest::Client::builder().no_proxy().build()?;
    let metrics = format!("{}/metrics", server.base_url());
    let processed = async || -> anyhow::Result<f64> {
        let text = http.get(&metrics).send().await?.error_for_status()?.text().await?;
        let value = text
            .lines()
            .find_map(|l| l.strip_prefix("llamacpp:prompt_tokens_total "))
            .context("no llamacpp:prompt_tokens_total at /metrics")?;
        Ok(value.trim().parse()?)
    };
    let warm_up_tokens = processed().await?;
    let env = [
        ("KILN_MODEL_PROVIDER", "openai".to_owned()),
        ("KILN_MODEL_BASE_URL", server.openai_base_url()),
        ("KILN_MODEL", server.model_name().to_owned()),
        ("KILN_MODEL_MAX_TOKENS", local_model::DEFAULT_MAX_TOKENS.to_string()),
        ("KILN_ALLOW_FILE_REPOS", "true".to_owned()),
        ("KILN_SANDBOX_IMAGE", args.kiln.image.clone()),
        ("KILN_SANDBOX_WARM", "0".to_owned()),
    ];
    let mut kiln = Kiln::start(&args.kiln.binary()?, db_url, &env).await?;
    let body = json!({
        "prompt": PROMPT,
        "repo": {"url": repo_url},
        "limits": {"max_steps": 4, "timeout_s": 600},
        "model": {"temperature": 0.0},
    });
    let mut prompt_tokens = Vec::new();
    let mut last = warm_up_tokens;
    let result = async {
        let id = kiln.submit(&body).await?;
        kiln.follow(&id, Duration::from_millis(100), Duration::from_secs(900), async |page| {
            for _ in page.iter().filter(|e| e.kind == "step.finished") {
                let now = processed().await?;
                prompt_tokens.push(now - last);
                last = now;
            }
            Ok(())
        })
        .await
    }
    .await;
    kiln.stop().await;
    let events = result?;
    let at = |kind: &str| events.iter().find(|e| e.kind == kind).map(|e| e.at).context("no first step");
    let first_step = (at("step.finished")? - at("step.started")?).to_std()?;
    Ok(Figures { warm_up_tokens, first_step, prompt_tokens })
}
