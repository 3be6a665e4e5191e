//! `kiln up`, the local all-in-one: start what is missing (Postgres, the
//! sandbox image, a model), then the API and a worker in this process;
//! with `--demo`, submit a demo run, follow it, and exit with its outcome.

mod banner;
mod demo;
pub mod down;
mod model;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use kiln_store::Store;
use secrecy::{ExposeSecret, SecretString};
use tokio_util::sync::CancellationToken;

use crate::app::{Kiln, open_store};
use crate::local;
use crate::settings::{ApiOptions, CallbackArgs, DbArgs, RepoArgs, WorkerOptions};
use crate::toolbox_build::SourceTree;
use model::ServedModel;

#[derive(Debug, Clone, Args)]
pub struct UpArgs {
    /// Then submit a demo run, follow it, and exit with its outcome.
    #[arg(long)]
    pub demo: bool,
    /// Print the `export KILN_URL=… KILN_TOKEN=…` line for the `kiln up`
    /// already running for this state directory (a fresh token, signed as
    /// its own are), and exit: `eval "$(kiln up --print-env)"`.
    #[arg(long, conflicts_with = "demo")]
    pub print_env: bool,
    /// Where local state lives (Postgres password, JWT secret, demo repo).
    #[arg(long, env = "KILN_STATE_DIR", default_value = ".kiln")]
    pub state_dir: PathBuf,
    /// Port of the local Postgres cluster started when DATABASE_URL is unset.
    #[arg(long, env = "KILN_LOCAL_PG_PORT", default_value_t = local::DEFAULT_LOCAL_PG_PORT)]
    pub local_pg_port: u16,
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub api: ApiOptions,
    #[command(flatten)]
    pub worker: WorkerOptions,
    #[command(flatten)]
    pub callbacks: CallbackArgs,
    #[command(flatten)]
    pub repos: RepoArgs,
}

/// Runs until `shutdown` fires, or with `--demo` until the demo run ends.
/// What it started (its containers, the model server, the Postgres cluster
/// if this call started it) stops with it.
pub async fn up(mut args: UpArgs, shutdown: CancellationToken) -> anyhow::Result<ExitCode> {
    if args.print_env {
        return banner::print_env(&args.state_dir, args.api.auth.jwt_secret.as_ref());
    }
    std::fs::create_dir_all(&args.state_dir).with_context(|| format!("creating {}", args.state_dir.display()))?;
    // A stable worker id per state directory: `kiln down` finds this
    // worker's containers by it, and a restarted `kiln up` takes back its
    // runs at once.
    if args.worker.worker.worker_id.is_none() {
        args.worker.worker.worker_id = Some(down::up_worker_id(&args.state_dir)?);
    }
    // Prepared environment images carry this state's own cache scope, so
    // `kiln down --reset` finds them (unless another scope was asked for).
    if args.worker.worker.environment_cache_scope == "default" {
        args.worker.worker.environment_cache_scope = down::up_cache_scope(&args.state_dir)?;
    }
    let pid_file = args.state_dir.join(down::PID_FILE);
    refuse_a_second_up(&args, &pid_file)?;
    std::fs::write(&pid_file, std::process::id().to_string())?;
    let (store, cluster) = match local_store(&args).await {
        Ok(both) => both,
        Err(e) => {
            let _ = std::fs::remove_file(&pid_file);
            return Err(e);
        }
    };
    let result = serve(&mut args, store, shutdown).await;
    // Whatever happened, leave nothing running that the user did not start.
    let worker_id = args.worker.worker.worker_id.clone().unwrap_or_default();
    match down::remove_containers(&worker_id).await {
        Ok(0) => {}
        Ok(n) => eprintln!("kiln: removed {n} sandbox container(s)"),
        Err(e) => eprintln!("kiln: removing sandbox containers failed: {e:#}"),
    }
    if let Some(cluster) = cluster {
        match cluster.stop().await {
            Ok(_) => eprintln!("kiln: stopped the local Postgres (data kept in {})", cluster.data().display()),
            Err(e) => eprintln!("kiln: stopping the local Postgres failed: {e:#}; `kiln down` stops it"),
        }
    }
    let _ = std::fs::remove_file(&pid_file);
    let _ = std::fs::remove_file(args.state_dir.join(banner::URL_FILE));
    result
}

/// Says so before anything starts when this state directory's `kiln up`
/// already runs, or something else holds the API's address.
fn refuse_a_second_up(args: &UpArgs, pid_file: &std::path::Path) -> anyhow::Result<()> {
    if let Some(pid) = std::fs::read_to_string(pid_file).ok().and_then(|t| t.trim().parse::<u32>().ok())
        && pid != std::process::id()
        && down::is_kiln(pid)
    {
        bail!(
            "kiln up is already running for {} (pid {pid}); use it, or stop it with Ctrl-C in its terminal or `{} down`",
            args.state_dir.display(),
            crate::invocation::kiln()
        );
    }
    let listen = args.api.api.listen;
    if let Err(e) = std::net::TcpListener::bind(listen) {
        bail!(
            "cannot listen on {listen} ({e}): another Kiln or another program is using it; stop it \
             (`{} down` stops a kiln up), or choose another address with KILN_LISTEN=127.0.0.1:8081",
            crate::invocation::kiln()
        );
    }
    Ok(())
}

async fn serve(args: &mut UpArgs, store: Store, shutdown: CancellationToken) -> anyhow::Result<ExitCode> {
    let secret = match &args.api.auth.jwt_secret {
        Some(s) => s.clone(),
        None => SecretString::from(local::read_or_create_secret(&args.state_dir.join(local::JWT_SECRET_FILE))?),
    };
    args.api.auth.jwt_secret = Some(secret.clone());
    // The API's settings are checked before anything starts.
    let api = args.api.parts(&args.callbacks, &args.repos)?;
    local::ensure_sandbox_image(&args.worker.worker.sandbox_image).await?;
    find_or_build_toolbox(args).await;
    // The worker reads the same KILN_AGENT_KINDS file as the API; with
    // sub-agents off (KILN_SUBAGENT_MAX_DEPTH=0) its runs show no `task`
    // tool, and the warm-up must not either, or the warm prefix ends there.
    let warm_kinds = match args.worker.worker.subagent_max_depth {
        0 => std::sync::Arc::new(kiln_protocol::agents::AgentKinds::none()),
        _ => api.settings.agent_kinds.clone(),
    };
    let served = ServedModel::start(&mut args.worker.model, &args.state_dir, warm_kinds).await?;
    // `up` is the single-machine mode: local repositories are fair game.
    args.worker.worker.allow_file_repos = true;
    // A new session should not wait for a container on one machine either.
    args.worker.worker.sandbox_warm = args.worker.worker.sandbox_warm.or(Some(2));
    let worker = args.worker.parts(&args.callbacks, &args.repos)?;
    let webhooks = api.github.is_some();
    let running = Kiln::new(store).api(api).worker(worker).start(shutdown.clone()).await?;
    let base = format!("http://{}", running.api_addr().context("the API did not start")?);
    let token = banner::token(&secret)?;
    banner::remember_url(&args.state_dir, &base)?;
    if webhooks {
        eprintln!("kiln: GitHub webhooks at {base}/v1/webhooks/github");
    }
    if !args.demo {
        // Last, so the line to paste is the last thing on the screen.
        banner::print(&base, &token, &args.state_dir);
        shutdown.cancelled().await;
        let _ = running.stopped().await;
        if let Some(served) = served {
            served.stop().await;
        }
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("kiln: API at {base}; the web view is at {base}/");
    let tiny_model = matches!(served, Some(ServedModel::Local(_)));
    let code = demo::run(&base, &token, &args.state_dir, tiny_model).await?;
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(15), running.stopped()).await;
    if let Some(served) = served {
        served.stop().await;
    }
    if code == ExitCode::SUCCESS { Ok(code) } else { bail!("the demo run did not succeed") }
}

/// From a source tree (`cargo run -- up`), builds the static toolbox (a
/// no-op when it is up to date) and hands it to the worker; a failure is
/// said and the worker looks for a toolbox as usual (an image's own, or
/// one exec per call). `KILN_TOOLBOX_PATH` / `--toolbox-path` win.
async fn find_or_build_toolbox(args: &mut UpArgs) {
    if args.worker.worker.toolbox_path.is_some() {
        return;
    }
    let Some(tree) = SourceTree::of_current_exe() else { return };
    eprintln!("kiln: building the sandbox toolbox (static kiln-toolbox) from {}", tree.workspace.display());
    match tree.build_static_toolbox().await {
        Ok(path) => args.worker.worker.toolbox_path = Some(path),
        Err(e) => eprintln!("kiln: {e}; sandboxes use a toolbox found elsewhere, or one docker exec per call"),
    }
}

/// The database at DATABASE_URL, or else the state directory's local
/// cluster, and that cluster when this call started it (to stop it after).
async fn local_store(args: &UpArgs) -> anyhow::Result<(Store, Option<local::LocalCluster>)> {
    if let Some(url) = &args.db.database_url {
        return Ok((open_store(url.expose_secret(), args.db.db_pool_size).await?, None));
    }
    let cluster = local::LocalCluster::of(&args.state_dir).await?;
    let (url, started) = cluster.start(args.local_pg_port).await?;
    let started = started.then_some(cluster);
    match open_store(&url, args.db.db_pool_size).await {
        Ok(store) => Ok((store, started)),
        Err(e) => {
            if let Some(cluster) = started {
                let _ = cluster.stop().await;
            }
            Err(e)
        }
    }
}
