//! `kiln`: one binary for the API, the worker, the local all-in-one and the
//! client.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use kiln_cli::app::{open_store, start_api, start_worker};
use kiln_cli::client::{Decision, KilnClient};
use kiln_cli::commands::{self, Connection};
use kiln_cli::local;
use kiln_cli::render::Mode;
use kiln_cli::settings::{
    ApiArgs, AuthArgs, CallbackArgs, DbArgs, GithubArgs, GithubDeliveryArgs, ModelArgs, WorkerArgs,
};
use kiln_protocol::{ApprovalMode, CreateRun, RepoSpec, RunStatus};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[derive(Parser)]
#[command(name = "kiln", version, about = "Run coding agents remotely, in Docker sandboxes")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant, reason = "parsed once at startup and never moved around; size does not matter")]
enum Command {
    /// Serve the HTTP API.
    Serve {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        auth: AuthArgs,
        #[command(flatten)]
        api: ApiArgs,
        #[command(flatten)]
        github: GithubArgs,
        #[command(flatten)]
        callbacks: CallbackArgs,
    },
    /// Claim and drive runs.
    Worker {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        worker: WorkerArgs,
        #[command(flatten)]
        delivery: GithubDeliveryArgs,
        #[command(flatten)]
        callbacks: CallbackArgs,
    },
    /// Local all-in-one: start what is missing (Postgres, sandbox image),
    /// then the API and a worker in this process.
    Up {
        /// Then submit a demo run, follow it, and exit with its outcome.
        #[arg(long)]
        demo: bool,
        /// Where local state lives (Postgres password, JWT secret, demo repo).
        #[arg(long, env = "KILN_STATE_DIR", default_value = ".kiln")]
        state_dir: PathBuf,
        /// Port of the local Postgres cluster started when DATABASE_URL is unset.
        #[arg(long, env = "KILN_LOCAL_PG_PORT", default_value_t = local::DEFAULT_LOCAL_PG_PORT)]
        local_pg_port: u16,
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        auth: AuthArgs,
        #[command(flatten)]
        api: ApiArgs,
        #[command(flatten)]
        github: GithubArgs,
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        worker: WorkerArgs,
        #[command(flatten)]
        delivery: GithubDeliveryArgs,
        #[command(flatten)]
        callbacks: CallbackArgs,
    },
    /// Apply database migrations.
    Migrate {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Print a bearer token signed with KILN_JWT_SECRET.
    Token {
        /// Subject: the owner of the runs made with this token.
        #[arg(long)]
        sub: String,
        /// Lifetime, e.g. 30m, 1h, 7d.
        #[arg(long, default_value = "1h", value_parser = parse_duration)]
        ttl: Duration,
        #[arg(long, env = "KILN_JWT_SECRET", hide_env_values = true)]
        jwt_secret: String,
    },
    /// Submit a run to a running Kiln and optionally follow it.
    Run {
        #[arg(long)]
        prompt: String,
        /// Repository to clone into the sandbox.
        #[arg(long)]
        repo: Option<String>,
        /// Branch, tag or commit of the repository.
        #[arg(long = "ref")]
        git_ref: Option<String>,
        /// Which tool calls wait for `kiln approve`: never, mutating (bash, edit, write) or always.
        #[arg(long, value_parser = parse_approval)]
        approval: Option<ApprovalMode>,
        /// Show the events as they arrive (live progress on a terminal, plain
        /// lines otherwise); exit 0 if the run succeeds, 1 if not.
        #[arg(long)]
        follow: bool,
        /// Print one JSON object per event (`seq`, `kind`, `payload`), for
        /// scripts; without --follow, the run as the API returned it.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connection: Connection,
    },
    /// List your runs, newest first: id, status, age, cost, prompt.
    Runs {
        /// Only runs with this status (queued, running, awaiting_approval, succeeded, …).
        #[arg(long)]
        status: Option<RunStatus>,
        /// How many (1 to 200).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=200))]
        limit: u32,
        /// Print the API's run objects, one JSON object per line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connection: Connection,
    },
    /// Show a run's events from the start; exit 0 if it succeeded, 1 if it ended otherwise.
    Logs {
        run: Uuid,
        /// Keep following until the run ends (resuming after a dropped connection).
        #[arg(long)]
        follow: bool,
        /// Print one JSON object per event (`seq`, `kind`, `payload`), for scripts.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connection: Connection,
    },
    /// Cancel a run.
    Cancel {
        run: Uuid,
        #[command(flatten)]
        connection: Connection,
    },
    /// Approve (or with --deny, refuse) a tool call waiting for approval.
    Approve {
        run: Uuid,
        /// The call's id, as `approval.requested` (and `kiln logs`) shows it.
        call: String,
        #[arg(long)]
        deny: bool,
        /// Why; a denial's reason goes back to the model.
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        connection: Connection,
    },
}

fn parse_approval(s: &str) -> Result<ApprovalMode, String> {
    serde_json::from_value(serde_json::Value::String(s.to_owned()))
        .map_err(|_| format!("{s:?}: expected never, mutating or always"))
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a duration like 30m, 1h or 7d"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86_400,
        _ => return Err(format!("{s:?}: unit must be s, m, h or d")),
    };
    Ok(Duration::from_secs(secs))
}

/// Logs (and traces, with `OTEL_EXPORTER_OTLP_ENDPOINT`); see `telemetry`.
fn init_tracing(default: &str) {
    kiln_cli::telemetry::init(default);
}

/// Cancelled on Ctrl-C or SIGTERM.
fn shutdown_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
        tracing::info!("shutting down");
        t.cancel();
    });
    token
}

#[tokio::main]
async fn main() -> ExitCode {
    // reqwest is built without a default TLS backend; pick ring's.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    let code = match dispatch(cli.command).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kiln: error: {e:#}");
            ExitCode::FAILURE
        }
    };
    // Spans still buffered go out before the process ends.
    kiln_cli::telemetry::shutdown().await;
    code
}

async fn dispatch(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve { db, auth, api, github, callbacks } => {
            init_tracing("info");
            let auth = auth.authenticator()?;
            let github = github.webhook_config()?;
            // Settings are checked before the database is touched.
            let settings = kiln_api::ApiSettings { callbacks_enabled: callbacks.enabled()?, ..api.settings() };
            let store = open_store(db.url()?, db.db_pool_size).await?;
            let shutdown = shutdown_signal();
            let webhooks = github.is_some();
            let server = start_api(store, auth, settings, github, api.listen, shutdown).await?;
            tracing::info!(addr = %server.addr, github_webhooks = webhooks, "API listening");
            server.handle.await??;
            Ok(ExitCode::SUCCESS)
        }
        Command::Worker { db, model, worker, delivery, callbacks } => {
            init_tracing("info");
            if model.is_local() || model.is_scripted() {
                bail!(
                    "KILN_MODEL_PROVIDER={} is served by `kiln up`; for a separate worker, run the model server \
                     yourself and set KILN_MODEL_BASE_URL (see local-model/README.md)",
                    model.model_provider
                );
            }
            let mut config = worker.config(&model)?;
            config.github = delivery.github()?;
            config.callbacks = callbacks.settings()?;
            let store = open_store(db.url()?, db.db_pool_size).await?;
            let shutdown = shutdown_signal();
            if let Some(listen) = worker.metrics_listen {
                let addr = kiln_cli::telemetry::serve_metrics(listen, shutdown.clone()).await?;
                tracing::info!(%addr, "worker metrics at /metrics");
            }
            start_worker(store, config, model.endpoints()?, worker.prices()?, shutdown).await?.await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate { db } => {
            init_tracing("info");
            open_store(db.url()?, 1).await?;
            println!("migrations applied");
            Ok(ExitCode::SUCCESS)
        }
        Command::Token { sub, ttl, jwt_secret } => {
            println!("{}", kiln_api::auth::mint_hs256(jwt_secret.as_bytes(), &sub, ttl)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Run { prompt, repo, git_ref, approval, follow, json, connection } => {
            let spec =
                CreateRun { prompt, repo: repo.map(|url| RepoSpec { url, git_ref }), approval, ..Default::default() };
            commands::run(&connection.client()?, &spec, follow, json).await
        }
        Command::Runs { status, limit, json, connection } => {
            commands::runs(&connection.client()?, status, limit, json).await
        }
        Command::Logs { run, follow, json, connection } => {
            commands::watch(&connection.client()?, run, follow, Mode::choose(json)).await
        }
        Command::Cancel { run, connection } => commands::cancel(&connection.client()?, run).await,
        Command::Approve { run, call, deny, reason, connection } => {
            let decision = if deny { Decision::Deny } else { Decision::Approve };
            commands::approve(&connection.client()?, run, &call, decision, reason.as_deref()).await
        }
        Command::Up {
            demo,
            state_dir,
            local_pg_port,
            db,
            auth,
            api,
            github,
            model,
            mut worker,
            delivery,
            callbacks,
        } => {
            init_tracing(if demo { "warn" } else { "info" });
            up(demo, state_dir, local_pg_port, db, auth, api, github, model, &mut worker, delivery, callbacks).await
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn up(
    demo: bool,
    state_dir: PathBuf,
    local_pg_port: u16,
    db: DbArgs,
    auth: AuthArgs,
    api: ApiArgs,
    github: GithubArgs,
    mut model: ModelArgs,
    worker: &mut WorkerArgs,
    delivery: GithubDeliveryArgs,
    callbacks: CallbackArgs,
) -> anyhow::Result<ExitCode> {
    let github = github.webhook_config()?;
    let github_delivery = delivery.github()?;
    let callback_settings = callbacks.settings()?;
    let api_settings = kiln_api::ApiSettings { callbacks_enabled: callbacks.enabled()?, ..api.settings() };
    std::fs::create_dir_all(&state_dir).with_context(|| format!("creating {}", state_dir.display()))?;
    let url = match &db.database_url {
        Some(url) => url.clone(),
        None => local::ensure_local_postgres(&state_dir, local_pg_port).await?,
    };
    let store = open_store(&url, db.db_pool_size).await?;
    local::ensure_sandbox_image(&worker.sandbox_image).await?;
    let secret = match &auth.jwt_secret {
        Some(s) => s.clone(),
        None => local::read_or_create_secret(&state_dir.join("jwt-secret"))?,
    };
    let auth = AuthArgs { jwt_secret: Some(secret.clone()), ..auth };

    // The model: the one configured; else Kiln's local model (a tiny real
    // LLM served on this machine); or, with KILN_MODEL_PROVIDER=scripted,
    // the scripted demo model (a deterministic replay, not an LLM).
    let mut _scripted_model = None;
    let mut local_model = None;
    if model.is_scripted() {
        let scripted = kiln_scripted_model::ScriptedModel::start(kiln_scripted_model::demo_script()).await?;
        model.model_provider = "openai".into();
        model.model_base_url = Some(scripted.openai_base_url());
        model.model = "kiln-demo-script".into();
        eprintln!(
            "kiln: KILN_MODEL_PROVIDER=scripted: runs use Kiln's scripted demo model, a fixed replay of the\n\
             demo's script (deterministic, not a real LLM)."
        );
        _scripted_model = Some(scripted);
    } else if model.is_local() || !model.is_configured() {
        let options = model.local_model_options(&state_dir);
        let (what, caveat) = match &options.model {
            None => (
                "SmolLM2-135M-Instruct, a tiny demo model (135M parameters)".to_owned(),
                "A model this small shows the machinery (real streamed tool calls) but does no real work.\n  ",
            ),
            Some(path) => (path.display().to_string(), ""),
        };
        kiln_cli::local_model::ensure_installed(&options.dir).await?;
        let started = std::time::Instant::now();
        let server = kiln_cli::local_model::LocalModel::start_installed(options).await?;
        eprintln!(
            "kiln: {why}, so Kiln serves a local model on this CPU: {what},\n\
             \x20 with llama.cpp's server at {url} (started in {secs:.1} s; log: {log}).\n\
             \x20 {caveat}Answers are capped at {max} tokens (KILN_LOCAL_MODEL_MAX_TOKENS).\n\
             \x20 For a real model set OPENAI_API_KEY (and KILN_MODEL),\n\
             \x20 ANTHROPIC_API_KEY with KILN_MODEL_PROVIDER=anthropic, or KILN_MODEL_BASE_URL for Ollama, vLLM\n\
             \x20 or any OpenAI-compatible server.",
            why = if model.is_local() { "KILN_MODEL_PROVIDER=local" } else { "no model configured" },
            url = server.base_url(),
            secs = started.elapsed().as_secs_f64(),
            log = server.log_path().display(),
            max = model.local_model_max_tokens,
        );
        model.model_provider = "openai".into();
        model.model_base_url = Some(server.openai_base_url());
        model.anthropic_base_url = Some(server.anthropic_base_url());
        // Keys are only for the providers they belong to.
        model.openai_api_key = None;
        model.anthropic_api_key = None;
        model.model = server.model_name().to_owned();
        model.model_max_tokens = model.local_model_max_tokens;
        local_model = Some(server);
    }
    // `up` is the single-machine mode: local repositories are fair game.
    worker.allow_file_repos = true;
    // A new session should not wait for a container on one machine either.
    worker.sandbox_warm = worker.sandbox_warm.or(Some(2));
    let mut config = worker.config(&model)?;
    config.github = github_delivery;
    config.callbacks = callback_settings;
    let shutdown = shutdown_signal();
    let webhooks = github.is_some();
    let server =
        start_api(store.clone(), auth.authenticator()?, api_settings, github, api.listen, shutdown.clone()).await?;
    let worker_task = start_worker(store, config, model.endpoints()?, worker.prices()?, shutdown.clone()).await?;
    let base = format!("http://{}", server.addr);
    let token = kiln_api::auth::mint_hs256(secret.as_bytes(), "local", Duration::from_secs(7 * 86_400))?;
    eprintln!("kiln: API at {base}");
    if webhooks {
        eprintln!("kiln: GitHub webhooks at {base}/v1/webhooks/github");
    }
    eprintln!("kiln: token for subject \"local\" (7 days):\n  export KILN_URL={base} KILN_TOKEN={token}");

    if !demo {
        shutdown.cancelled().await;
        let _ = worker_task.await;
        let _ = server.handle.await;
        if let Some(local_model) = local_model {
            local_model.stop().await;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let repo = local::ensure_demo_repo(&state_dir).await?;
    let client = KilnClient::new(&base, &token)?;
    let repo = Some(kiln_protocol::RepoSpec { url: format!("file://{}", repo.display()), git_ref: None });
    let spec = if local_model.is_some() {
        // A task the tiny model can do: one tool call, then one answer.
        CreateRun {
            prompt: "Run `cat README.md` with bash, then reply with one sentence.".into(),
            repo,
            limits: Some(kiln_protocol::Limits { max_steps: Some(4), timeout_s: Some(600), ..Default::default() }),
            ..Default::default()
        }
    } else {
        CreateRun {
            prompt: "Look around the repository, add a NOTES.md that describes it, and check the result.".into(),
            repo,
            ..Default::default()
        }
    };
    let run = client.create_run(&spec).await?;
    eprintln!("kiln: demo run {} submitted; following its events\n", run.id);
    let code = commands::watch(&client, run.id, true, Mode::choose(false)).await?;
    let finished = client.get_run(run.id).await?;
    if finished.status == kiln_protocol::RunStatus::Succeeded {
        println!("\nkiln: the demo run succeeded ({}).", run.id);
    } else {
        println!("\nkiln: the demo run ended {}: {}", finished.status, finished.error.unwrap_or_default());
    }
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(15), worker_task).await;
    if let Some(local_model) = local_model {
        local_model.stop().await;
    }
    if code == ExitCode::SUCCESS { Ok(code) } else { bail!("the demo run did not succeed") }
}
