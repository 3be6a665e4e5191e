//! `kiln`: one binary for the API, the worker, the local all-in-one and the
//! client.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use kiln_cli::app::{Kiln, open_store};
use kiln_cli::client::Decision;
use kiln_cli::commands::{self, Connection};
use kiln_cli::render::Mode;
use kiln_cli::settings::{ApiOptions, CallbackArgs, DbArgs, RepoArgs, WorkerOptions};
use kiln_cli::up::UpArgs;
use kiln_protocol::changes::ChangeScope;
use kiln_protocol::{ApprovalMode, CreateRun, RepoSpec, RunStatus};
use secrecy::{ExposeSecret, SecretString};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// jemalloc rather than glibc's malloc: an idle event stream is a
/// connection holding hyper's two 8 KiB buffers, of which only the first
/// page of each is ever written (the request, the response's head).
/// jemalloc keeps 8 KiB blocks page-aligned with their bookkeeping
/// elsewhere, so the untouched page of each stays out of memory; glibc
/// puts a header before every block, and a thousand streams cost about
/// half as much again (bench/README.md, issue 33).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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
        api: ApiOptions,
        #[command(flatten)]
        callbacks: CallbackArgs,
        #[command(flatten)]
        repos: RepoArgs,
    },
    /// Claim and drive runs.
    Worker {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        worker: WorkerOptions,
        #[command(flatten)]
        callbacks: CallbackArgs,
        #[command(flatten)]
        repos: RepoArgs,
    },
    /// Local all-in-one: start what is missing (Postgres, sandbox image),
    /// then the API and a worker in this process.
    Up(UpArgs),
    /// Stop what `kiln up` started for its state directory (kiln up itself,
    /// its sandboxes, its Postgres); --reset also deletes the local data.
    Down(kiln_cli::up::down::DownArgs),
    /// Apply database migrations.
    Migrate {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Print a bearer token signed with KILN_JWT_SECRET (or, when that is
    /// not set, with `kiln up`'s secret in the state directory).
    Token {
        /// Subject: the owner of the runs made with this token.
        #[arg(long)]
        sub: String,
        /// Lifetime, e.g. 30m, 1h, 7d. The API accepts a token up to 5 s past
        /// its expiry (leeway for clock skew between machines).
        #[arg(long, default_value = "1h", value_parser = parse_duration)]
        ttl: Duration,
        /// The API's signing secret.
        #[arg(long, env = "KILN_JWT_SECRET", hide_env_values = true)]
        jwt_secret: Option<SecretString>,
        /// Where `kiln up` keeps its state (its secret is `jwt-secret` there).
        #[arg(long, env = "KILN_STATE_DIR", default_value = ".kiln")]
        state_dir: PathBuf,
    },
    /// Submit a run to a running Kiln and optionally follow it.
    Run(RunArgs),
    /// Choose attempt K of a group of attempts as its result: the group's
    /// change (`kiln diff`, `kiln apply`) is attempt K's from then on.
    Select {
        /// The group's id, as `kiln run --attempts` printed it.
        #[arg(value_parser = parse_run_id)]
        run: Uuid,
        /// Which attempt, 1 for the first.
        #[arg(value_parser = clap::value_parser!(u32).range(1..=4))]
        attempt: u32,
        #[command(flatten)]
        connection: Connection,
    },
    /// Send a message to a run: a working run reads it before its next
    /// model call (steering); a finished run gets a follow-up run in its
    /// session.
    Say {
        /// The run's id, as `kiln run` and `kiln runs` print it.
        #[arg(value_parser = parse_run_id)]
        run: Uuid,
        /// What to tell the agent, in plain words.
        text: String,
        /// Then show the run the message went to until it ends; exit 0 if
        /// it succeeds, 1 if not.
        #[arg(long)]
        follow: bool,
        /// Print the API's answer (`disposition` and the run) as JSON; with
        /// --follow, one JSON object per event.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        connection: Connection,
    },
    /// Your environments: how a run's sandbox is prepared (image, setup
    /// script cached after the first run, variables, secrets).
    Env(kiln_cli::env_command::EnvArgs),
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
        /// The run's id, as `kiln run` and `kiln runs` print it.
        #[arg(value_parser = parse_run_id)]
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
        /// The run's id, as `kiln run` and `kiln runs` print it.
        #[arg(value_parser = parse_run_id)]
        run: Uuid,
        #[command(flatten)]
        connection: Connection,
    },
    /// Show a run's change: the patch (coloured on a terminal, exactly
    /// what `git apply` takes when piped), or its diffstat, or as JSON.
    Diff {
        /// The run's id, as `kiln run` and `kiln runs` print it.
        #[arg(value_parser = parse_run_id)]
        run: Uuid,
        /// A diffstat: one line per file, then the totals.
        #[arg(long, conflicts_with = "json")]
        stat: bool,
        /// The change's summary as the API's JSON (files, lines, base commit).
        #[arg(long)]
        json: bool,
        /// The session's change so far (from its first run's base), not only this run's.
        #[arg(long)]
        session: bool,
        /// For a group of attempts: attempt K's change (1 for the first).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4))]
        attempt: Option<u32>,
        #[command(flatten)]
        connection: Connection,
    },
    /// Apply a run's change to a local checkout (three-way, staged). The
    /// checkout is left untouched if any file conflicts.
    Apply {
        /// The run's id, as `kiln run` and `kiln runs` print it.
        #[arg(value_parser = parse_run_id)]
        run: Uuid,
        /// The checkout (default: the current directory).
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// The session's change so far (from its first run's base), not only this run's.
        #[arg(long)]
        session: bool,
        /// For a group of attempts: attempt K's change (1 for the first).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4))]
        attempt: Option<u32>,
        #[command(flatten)]
        connection: Connection,
    },
    /// Approve (or with --deny, refuse) a tool call waiting for approval.
    Approve {
        /// The run's id, as `kiln run` and `kiln runs` print it.
        #[arg(value_parser = parse_run_id)]
        run: Uuid,
        /// The call's id, as `approval.requested` (and `kiln logs`) shows it.
        call: String,
        /// Refuse the call instead: it does not run, and the model is told
        /// it was denied (with --reason, why), so it can try another way.
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

fn parse_run_id(s: &str) -> Result<Uuid, String> {
    Uuid::try_parse(s.trim()).map_err(|_| {
        format!(
            "{s:?} is not a run id: ids look like 0192f4c1-7a3e-7c1d-9a4b-3f1e2d4c5b6a (see `{} runs`)",
            kiln_cli::invocation::kiln()
        )
    })
}

fn scope(session: bool) -> ChangeScope {
    if session { ChangeScope::Session } else { ChangeScope::Run }
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

/// `kiln run`'s arguments.
#[derive(clap::Args)]
struct RunArgs {
    /// What the agent should do, in plain words.
    #[arg(long)]
    prompt: String,
    /// Repository to clone into the sandbox: a URL, or a directory on
    /// this machine (sent as file://, for a Kiln on the same machine such as `kiln up`).
    /// Without it the run starts in an empty workspace.
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
    /// Run the task as this many attempts at once (1 to 4), each in its
    /// own sandbox; choose one with `kiln select RUN K`.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4))]
    attempts: Option<u32>,
    /// The model of each attempt, in order (repeat the flag).
    #[arg(long = "attempt-model")]
    attempt_models: Vec<String>,
    /// Continue the session of this finished run instead of starting a
    /// new one: the prompt is its follow-up, with the conversation and
    /// (while its container lives) the workspace kept. The session's
    /// settings stay; the flags that choose them cannot be given.
    #[arg(long, value_name = "RUN", value_parser = parse_run_id, conflicts_with_all = ["repo", "git_ref", "approval", "attempts", "attempt_models"])]
    session: Option<Uuid>,
    #[command(flatten)]
    options: kiln_cli::run_options::RunOptions,
    #[command(flatten)]
    connection: Connection,
}

#[tokio::main]
async fn main() -> ExitCode {
    // reqwest is built without a default TLS backend; pick ring's.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    let code = match dispatch(cli.command).await {
        Ok(code) => code,
        Err(e) => {
            // An error can quote the server's answer: printed cleaned, like its events.
            eprintln!("kiln: error: {}", kiln_cli::render::printable::printable(&format!("{e:#}")));
            if e.is::<commands::UsageError>() { ExitCode::from(2) } else { ExitCode::FAILURE }
        }
    };
    // Spans still buffered go out before the process ends.
    kiln_cli::telemetry::shutdown().await;
    code
}

async fn dispatch(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve { db, api, callbacks, repos } => serve(db, api, callbacks, repos).await,
        Command::Worker { db, worker, callbacks, repos } => work(db, worker, callbacks, repos).await,
        Command::Migrate { db } => migrate(db).await,
        Command::Token { sub, ttl, jwt_secret, state_dir } => token(&sub, ttl, jwt_secret, &state_dir),
        Command::Run(args) => run(args).await,
        Command::Say { run, text, follow, json, connection } => {
            kiln_cli::say::say(&connection.client()?, run, &text, follow, json).await
        }
        Command::Env(args) => kiln_cli::env_command::env(args).await,
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
        Command::Select { run, attempt, connection } => {
            kiln_cli::attempts::select(&connection.client()?, run, attempt).await
        }
        Command::Diff { run, stat, json, session, attempt, connection } => {
            let view = diff_view(stat, json);
            let client = connection.client()?;
            let run = kiln_cli::attempts::resolve(&client, run, attempt).await?;
            commands::diff(&client, run, view, scope(session)).await
        }
        Command::Apply { run, dir, session, attempt, connection } => {
            let client = connection.client()?;
            let run = kiln_cli::attempts::resolve(&client, run, attempt).await?;
            commands::apply(&client, run, &dir, scope(session)).await
        }
        Command::Up(args) => {
            // Quiet: the banner's line to paste stays on screen; RUST_LOG
            // asks for more (`info` shows every HTTP request).
            if !args.print_env {
                init_tracing("warn");
            }
            kiln_cli::up::up(args, shutdown_signal()).await
        }
        Command::Down(args) => kiln_cli::up::down::down(args).await,
    }
}

/// `kiln migrate`: applies the migrations the database lacks.
async fn migrate(db: DbArgs) -> anyhow::Result<ExitCode> {
    init_tracing("info");
    open_store(db.url()?.expose_secret(), 1).await?;
    println!("migrations applied");
    Ok(ExitCode::SUCCESS)
}

/// `kiln token`: prints a token for `sub`, signed with the given secret or
/// the local one.
fn token(sub: &str, ttl: Duration, jwt_secret: Option<SecretString>, state_dir: &Path) -> anyhow::Result<ExitCode> {
    let secret = match jwt_secret {
        Some(secret) => secret,
        None => kiln_cli::local::read_local_secret(state_dir)?,
    };
    println!("{}", kiln_api::auth::mint_hs256(secret.expose_secret().as_bytes(), sub, ttl)?);
    Ok(ExitCode::SUCCESS)
}

/// What `kiln diff` shows: `--json` wins over `--stat`.
fn diff_view(stat: bool, json: bool) -> commands::DiffView {
    match (stat, json) {
        (_, true) => commands::DiffView::Json,
        (true, false) => commands::DiffView::Stat,
        (false, false) => commands::DiffView::Patch,
    }
}

/// `kiln serve`: the API until a shutdown signal.
async fn serve(db: DbArgs, api: ApiOptions, callbacks: CallbackArgs, repos: RepoArgs) -> anyhow::Result<ExitCode> {
    init_tracing("info");
    // Settings are checked before the database is touched.
    let api = api.parts(&callbacks, &repos)?;
    let store = open_store(db.url()?.expose_secret(), db.db_pool_size).await?;
    let webhooks = api.github.is_some();
    let running = Kiln::new(store).api(api).start(shutdown_signal()).await?;
    if let Some(addr) = running.api_addr() {
        tracing::info!(%addr, github_webhooks = webhooks, "API listening");
    }
    if let Some(addr) = running.api_metrics_addr() {
        tracing::info!(%addr, "API metrics at /metrics (no token)");
    }
    running.stopped().await?;
    Ok(ExitCode::SUCCESS)
}

/// `kiln worker`: claims and drives runs until a shutdown signal.
async fn work(db: DbArgs, worker: WorkerOptions, callbacks: CallbackArgs, repos: RepoArgs) -> anyhow::Result<ExitCode> {
    init_tracing("info");
    let parts = worker.parts(&callbacks, &repos)?;
    let store = open_store(db.url()?.expose_secret(), db.db_pool_size).await?;
    let shutdown = shutdown_signal();
    if let Some(listen) = worker.worker.metrics_listen {
        let addr = kiln_cli::telemetry::serve_metrics(listen, shutdown.clone()).await?;
        tracing::info!(%addr, "worker metrics at /metrics");
    }
    Kiln::new(store).worker(parts).start(shutdown).await?.stopped().await?;
    Ok(ExitCode::SUCCESS)
}

/// `kiln run`: a follow-up in a session, or a new run (or group of attempts).
async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let RunArgs {
        prompt,
        repo,
        git_ref,
        approval,
        follow,
        json,
        attempts,
        attempt_models,
        session,
        options,
        connection,
    } = args;
    if let Some(session_of) = session {
        if options.any() {
            return Err(commands::UsageError(
                "--session continues a session with its own settings: --environment, --egress, --allow, \
                 --mcp, --agents, --max-steps and --max-cost cannot be given with it"
                    .into(),
            )
            .into());
        }
        return kiln_cli::say::follow_up(&connection.client()?, session_of, &prompt, follow, json).await;
    }
    let repo = match repo {
        Some(given) => Some(RepoSpec { url: kiln_cli::repo_arg::repo_url(&given)?, git_ref }),
        None => None,
    };
    let attempt_models = (!attempt_models.is_empty()).then_some(attempt_models);
    let mut spec = CreateRun { prompt, repo, approval, attempts, attempt_models, ..Default::default() };
    options.apply(&mut spec).map_err(|e| commands::UsageError(e.0))?;
    let client = connection.client()?;
    let (code, id) = commands::run(&client, &spec, follow, json).await?;
    if attempts.is_some() && follow && !json {
        kiln_cli::attempts::choose_hint(&client, id).await;
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// The client commands a person types: each of their flags and
    /// arguments says what it does in `--help`.
    #[test]
    fn every_flag_of_the_client_commands_has_help() {
        let cli = Cli::command();
        let clients = ["run", "say", "env", "runs", "logs", "cancel", "diff", "apply", "approve"];
        let mut missing = Vec::new();
        let mut stack: Vec<(String, &clap::Command)> = cli
            .get_subcommands()
            .filter(|c| clients.contains(&c.get_name()))
            .map(|c| (c.get_name().to_owned(), c))
            .collect();
        while let Some((path, command)) = stack.pop() {
            for arg in command.get_arguments() {
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("kiln {path} {}", arg.get_id()));
                }
            }
            stack.extend(command.get_subcommands().map(|c| (format!("{path} {}", c.get_name()), c)));
        }
        assert!(missing.is_empty(), "no help: {missing:?}");
    }
}
