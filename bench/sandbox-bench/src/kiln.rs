//! Kiln as deployed, for benchmarks that go through the API and a worker:
//! `kiln serve` and `kiln worker`, each its own process, on one database,
//! with a bearer token from `kiln token`.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kiln_protocol::StoredEvent;
use serde_json::Value;
use tokio::process::{Child, Command};

/// The options of a benchmark that runs Kiln as deployed (flatten them into
/// its own with `#[command(flatten)]`).
#[derive(Debug, Clone, clap::Args)]
pub struct KilnArgs {
    /// The `kiln` binary (the toolbox is found next to it); default
    /// `target/release/kiln`, else `target/debug/kiln`.
    #[arg(long)]
    pub kiln: Option<PathBuf>,
    /// Admin URL of the Postgres server; a scratch database is created per run and dropped.
    #[arg(long, env = "DATABASE_URL", default_value = "postgres://kiln:kiln@127.0.0.1:5432/kiln")]
    pub database_url: String,
    #[arg(long, env = "KILN_SANDBOX_IMAGE", default_value = "kiln-sandbox:latest")]
    pub image: String,
}

impl KilnArgs {
    /// The `kiln` binary to run: `--kiln`, else the release build users
    /// run, else the debug one.
    pub fn binary(&self) -> anyhow::Result<PathBuf> {
        match &self.kiln {
            Some(path) => Ok(path.clone()),
            None => ["target/release/kiln", "target/debug/kiln"]
                .into_iter()
                .map(PathBuf::from)
                .find(|p| p.is_file())
                .context("no kiln binary: cargo build --release -p kiln-cli, or pass --kiln"),
        }
    }
}

/// The cargo profile `kiln` was built with, as far as its path tells
/// (`target/<profile>/kiln`, or `target/<triple>/<profile>/kiln`), so a
/// figure always says which build it measured.
pub fn build_profile(kiln: &Path) -> String {
    let dir = kiln.parent().and_then(|d| d.file_name()).map(|d| d.to_string_lossy().into_owned());
    let in_target = kiln.ancestors().any(|a| a.file_name().is_some_and(|n| n == "target"));
    match dir {
        Some(profile) if in_target => profile,
        _ => "unknown (not under target/)".to_owned(),
    }
}

/// Signs the benchmark's bearer token.
const JWT_SECRET: &str = "kiln-bench-secret-0123456789abcdef0123";

/// A running API and worker; both are killed on [`Kiln::stop`] or drop.
pub struct Kiln {
    api: Child,
    worker: Child,
    pub base: String,
    token: String,
    http: reqwest::Client,
}

impl Kiln {
    /// Migrates `db_url`, then starts the API and a worker with `env` on top
    /// of the database, listen address and JWT secret.
    pub async fn start(kiln: &Path, db_url: &str, env: &[(&str, String)]) -> anyhow::Result<Kiln> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let command = |sub: &str| {
            let mut cmd = Command::new(kiln);
            cmd.arg(sub)
                .env("DATABASE_URL", db_url)
                .env("KILN_LISTEN", format!("127.0.0.1:{port}"))
                .env("KILN_JWT_SECRET", JWT_SECRET)
                .env("RUST_LOG", "warn")
                // Each run's sandbox goes with its end, not after an idle
                // timer that outlives the worker.
                .env("KILN_SANDBOX_IDLE_S", "0")
                .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .kill_on_drop(true);
            cmd
        };
        let migrate = command("migrate").status().await.context("running kiln migrate")?;
        if !migrate.success() {
            bail!("kiln migrate failed: {migrate}");
        }
        let api = command("serve").spawn().context("starting kiln serve")?;
        let worker = command("worker").spawn().context("starting kiln worker")?;
        let out = Command::new(kiln)
            .args(["token", "--sub", "bench"])
            .env("KILN_JWT_SECRET", JWT_SECRET)
            .output()
            .await
            .context("running kiln token")?;
        if !out.status.success() {
            bail!("kiln token failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let token = String::from_utf8(out.stdout)?.trim().to_owned();
        let http = reqwest::Client::builder().no_proxy().build()?;
        let mut kiln = Kiln { api, worker, base: format!("http://127.0.0.1:{port}"), token, http };
        kiln.wait_listening().await?;
        Ok(kiln)
    }

    async fn wait_listening(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.http.get(format!("{}/v1/runs", self.base)).send().await.is_err() {
            self.check_alive()?;
            if Instant::now() > deadline {
                bail!("kiln serve did not listen on {} within a minute", self.base);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    fn check_alive(&mut self) -> anyhow::Result<()> {
        for (name, child) in [("serve", &mut self.api), ("worker", &mut self.worker)] {
            if let Some(status) = child.try_wait()? {
                bail!("kiln {name} exited ({status})");
            }
        }
        Ok(())
    }

    /// Submits a run (`POST /v1/runs` with `body`); its id.
    pub async fn submit(&self, body: &Value) -> anyhow::Result<String> {
        let run: Value = self
            .http
            .post(format!("{}/v1/runs", self.base))
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        Ok(run["id"].as_str().context("a run id")?.to_owned())
    }

    /// The run's events after `after`, one page.
    pub async fn events_after(&self, id: &str, after: i64) -> anyhow::Result<Vec<StoredEvent>> {
        let page: Value = self
            .http
            .get(format!("{}/v1/runs/{id}/events?after={after}", self.base))
            .bearer_auth(&self.token)
            .header("accept", "application/json")
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        Ok(serde_json::from_value(page["events"].clone())?)
    }

    /// Reads the run's events until its terminal event, calling `seen` on
    /// each page as it arrives (polled every `every`); fails when a process
    /// dies or after `limit`.
    pub async fn follow(
        &mut self,
        id: &str,
        every: Duration,
        limit: Duration,
        mut seen: impl AsyncFnMut(&[StoredEvent]) -> anyhow::Result<()>,
    ) -> anyhow::Result<Vec<StoredEvent>> {
        let deadline = Instant::now() + limit;
        let mut events: Vec<StoredEvent> = Vec::new();
        loop {
            let page = self.events_after(id, events.last().map_or(0, |e| e.seq)).await?;
            if !page.is_empty() {
                seen(&page).await?;
            }
            let ended = page.iter().any(|e| is_terminal(&e.kind));
            events.extend(page);
            if ended {
                return Ok(events);
            }
            self.check_alive()?;
            if Instant::now() > deadline {
                bail!("run {id} did not end within {limit:?}");
            }
            tokio::time::sleep(every).await;
        }
    }

    /// Stops both processes as an operator would (SIGTERM: the worker
    /// removes its sandboxes), killing what has not exited within 30 s.
    pub async fn stop(mut self) {
        for child in [&mut self.worker, &mut self.api] {
            if let Some(pid) = child.id() {
                let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status().await;
            }
            if tokio::time::timeout(Duration::from_secs(30), child.wait()).await.is_err() {
                let _ = child.kill().await;
            }
        }
    }
}

fn is_terminal(kind: &str) -> bool {
    matches!(kind, "run.succeeded" | "run.failed" | "run.cancelled" | "run.timed_out")
}
