//! Shared pieces of Kiln's benchmarks: a fresh database, the API in a child
//! process (so its memory is its own), and percentile summaries.
//!
//! Benchmarks are command-line tools, not library code: failing loudly with
//! `anyhow` at the first error is what they should do.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// HS256 secret shared by the API child and the benchmark's tokens.
pub const SECRET: &str = "bench-secret-0123456789abcdef0123456789";

/// A bearer token for `sub`, valid for a day.
pub fn token(sub: &str) -> anyhow::Result<String> {
    Ok(kiln_api::auth::mint_hs256(SECRET.as_bytes(), sub, Duration::from_secs(86_400))?)
}

/// Set in the child process that serves the API for a benchmark.
const CHILD_DB: &str = "KILN_BENCH_API_DB";

/// Latency summary of a sample.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub n: usize,
    pub p50: Duration,
    pub p95: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Summary {
    pub fn of(mut sample: Vec<Duration>) -> Summary {
        sample.sort();
        let at = |q: f64| {
            if sample.is_empty() {
                return Duration::ZERO;
            }
            let i = ((sample.len() as f64 - 1.0) * q).round() as usize;
            sample[i.min(sample.len() - 1)]
        };
        Summary { n: sample.len(), p50: at(0.5), p95: at(0.95), p99: at(0.99), max: at(1.0) }
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        write!(
            f,
            "n={} p50={:.2}ms p95={:.2}ms p99={:.2}ms max={:.2}ms",
            self.n,
            ms(self.p50),
            ms(self.p95),
            ms(self.p99),
            ms(self.max)
        )
    }
}

/// The API, served by this same binary in a child process.
pub struct ChildApi {
    pub addr: std::net::SocketAddr,
    child: Child,
}

impl ChildApi {
    /// Re-runs the current executable as an API server on `db_url`.
    pub async fn start(db_url: &str, pool_size: usize) -> anyhow::Result<ChildApi> {
        let exe: PathBuf = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .env(CHILD_DB, db_url)
            .env("KILN_BENCH_API_POOL", pool_size.to_string())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting the API child")?;
        let stdout = child.stdout.take().context("child stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .context("the API child did not start in 30 s")??
            .context("the API child exited")?;
        let addr = line.strip_prefix("listening ").context("unexpected child output")?.parse()?;
        Ok(ChildApi { addr, child })
    }

    pub fn pid(&self) -> anyhow::Result<u32> {
        self.child.id().context("the API child has exited")
    }

    /// Resident memory of the API process.
    pub fn rss_bytes(&self) -> anyhow::Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?))?;
        let Some(line) = status.lines().find(|l| l.starts_with("VmRSS:")) else { bail!("no VmRSS") };
        let kib: u64 = line.split_whitespace().nth(1).context("VmRSS value")?.parse()?;
        Ok(kib * 1024)
    }
}

/// Call first in `main`: in the API child, serves the API and never returns.
pub async fn serve_api_if_child() -> anyhow::Result<()> {
    let Ok(db) = std::env::var(CHILD_DB) else { return Ok(()) };
    let pool = std::env::var("KILN_BENCH_API_POOL").ok().and_then(|v| v.parse().ok()).unwrap_or(16);
    let store = kiln_store::Store::connect(&db, pool)?;
    let auth = kiln_api::Authenticator::new(
        &kiln_api::AuthConfig::Hs256 { secret: SECRET.as_bytes().to_vec().into() },
        None,
        None,
    )?;
    let settings = kiln_api::ApiSettings {
        quota: kiln_store::Quota { max_active_runs: i64::MAX, max_runs_per_minute: i64::MAX },
        max_sse_per_subject: usize::MAX,
        ..Default::default()
    };
    // As `kiln serve` wires it (cli/src/app.rs), minus GitHub and the
    // metrics exporter: Kiln's own accept loop with its connection timeouts.
    let shutdown = tokio_util::sync::CancellationToken::new();
    let timeouts = settings.connection;
    let state = kiln_api::AppState::new(store, auth, settings, None, shutdown.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("listening {}", listener.local_addr()?);
    kiln_api::serve(listener, kiln_api::router(state), timeouts, shutdown).await?;
    std::process::exit(0);
}

/// A migrated, empty database on `DATABASE_URL`'s server (default: the
/// test suite's).
pub async fn database() -> anyhow::Result<(String, kiln_store::Store)> {
    let admin = admin_url();
    let client = connect(&admin).await.context("connecting to DATABASE_URL")?;
    let name = format!("kiln_bench_{}", uuid::Uuid::new_v4().simple());
    client.execute(&format!("CREATE DATABASE {name}"), &[]).await?;
    // Same server and credentials, the new database.
    let Some((server, _)) = admin.rsplit_once('/') else { bail!("DATABASE_URL has no database name") };
    let url = format!("{server}/{name}");
    CREATED.lock().unwrap_or_else(|p| p.into_inner()).push(name);
    let store = kiln_store::Store::connect(&url, 16)?;
    store.migrate().await?;
    Ok((url, store))
}

/// Databases [`database`] made, for [`drop_databases`].
static CREATED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn admin_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://kiln:kiln@127.0.0.1:5432/kiln".into())
}

/// Drops the databases this benchmark made (call last).
pub async fn drop_databases() -> anyhow::Result<()> {
    let client = connect(&admin_url()).await?;
    let names = std::mem::take(&mut *CREATED.lock().unwrap_or_else(|p| p.into_inner()));
    for name in names {
        client.execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"), &[]).await?;
    }
    Ok(())
}

/// A plain connection (no pool), for baselines and setup.
pub async fn connect(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

/// Inserts `n` runs in `status` (with their sessions) in one statement.
pub async fn insert_runs(client: &tokio_postgres::Client, n: i64, status: &str) -> anyhow::Result<()> {
    client
        .execute(
            "WITH s AS (INSERT INTO sessions (id, owner) SELECT gen_random_uuid(), 'bench' FROM generate_series(1, $1::bigint)
                        RETURNING id)
             INSERT INTO runs (id, session_id, owner, status, prompt, finished_at)
             SELECT gen_random_uuid(), id, 'bench', $2::text, 'bench',
                    CASE WHEN $2::text IN ('queued', 'running') THEN NULL ELSE now() END
             FROM s",
            &[&n, &status],
        )
        .await?;
    Ok(())
}

pub fn http() -> anyhow::Result<reqwest::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Ok(reqwest::Client::builder().no_proxy().pool_max_idle_per_host(10_000).build()?)
}
