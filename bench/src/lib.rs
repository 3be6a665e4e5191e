//! Shared pieces of Kiln's benchmarks: a fresh database, `kiln serve` and
//! baseline servers in processes of their own (so their memory is their
//! own), and percentile summaries.
//!
//! Benchmarks are command-line tools, not library code: failing loudly with
//! `anyhow` at the first error is what they should do.

pub mod sse_baseline;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rustix::process::{Pid, Signal, kill_process};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// HS256 secret shared by the API child and the benchmark's tokens.
pub const SECRET: &str = "bench-secret-0123456789abcdef0123456789";

/// A bearer token for `sub`, valid for a day.
pub fn token(sub: &str) -> anyhow::Result<String> {
    Ok(kiln_api::auth::mint_hs256(SECRET.as_bytes(), sub, Duration::from_secs(86_400))?)
}

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

/// The `kiln` binary the benchmarks run as users do: `explicit`, else
/// `target/release/kiln`, else `target/debug/kiln`.
pub fn kiln_binary(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    match explicit {
        Some(path) => Ok(path.to_owned()),
        None => ["target/release/kiln", "target/debug/kiln"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .context("no kiln binary: cargo build --release -p kiln-cli, or pass --kiln"),
    }
}

/// Submits `spec` to `api` as the subject `bench` and waits for the run's
/// end, read from the database every 10 ms: how long it took from the
/// submission, and the run's id. Anything but success, or no end within
/// `limit`, is an error.
pub async fn time_run(
    api: &Server,
    sql: &tokio_postgres::Client,
    spec: &kiln_protocol::CreateRun,
    limit: Duration,
) -> anyhow::Result<(Duration, uuid::Uuid)> {
    let http = http()?;
    let started = Instant::now();
    let response = http
        .post(format!("http://{}/v1/runs", api.addr))
        .bearer_auth(token("bench")?)
        .json(spec)
        .send()
        .await?
        .error_for_status()?;
    let created: serde_json::Value = response.json().await?;
    let id: uuid::Uuid = created["id"].as_str().context("no run id")?.parse()?;
    let deadline = started + limit;
    loop {
        let row = sql.query_one("SELECT status FROM runs WHERE id = $1", &[&id]).await?;
        match row.try_get::<_, &str>(0)? {
            "succeeded" => return Ok((started.elapsed(), id)),
            "failed" | "cancelled" | "timed_out" => bail!("run {id} did not succeed"),
            _ if Instant::now() > deadline => bail!("run {id} did not end in {limit:?}"),
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// `kiln serve`'s settings for a benchmark that submits many runs as one
/// subject: no per-subject quotas (nothing counted), everything else as
/// deployed.
pub fn without_quotas() -> [(&'static str, String); 2] {
    quotas("unlimited")
}

/// `kiln serve`'s two per-subject limits (active runs, runs a minute),
/// both `limit`: a number, or `unlimited`.
pub fn quotas(limit: &str) -> [(&'static str, String); 2] {
    [("KILN_MAX_ACTIVE_RUNS_PER_SUBJECT", limit.into()), ("KILN_MAX_RUNS_PER_MINUTE", limit.into())]
}

/// A server in a process of its own (so its memory is its own): `kiln
/// serve` itself, or a benchmark's baseline server (this same binary run
/// again).
pub struct Server {
    pub addr: std::net::SocketAddr,
    child: Child,
}

/// Set in the child process that serves a benchmark's baseline.
const BASELINE_DB: &str = "KILN_BENCH_BASELINE_DB";

impl Server {
    /// `kiln serve` on `db_url`, with the settings a deployment has unless
    /// `env` sets them (the benchmark's JWT secret, a free loopback port
    /// and `RUST_LOG` default to what they would be).
    pub async fn kiln_serve(kiln: &Path, db_url: &str, env: &[(&str, String)]) -> anyhow::Result<Server> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        let child = Command::new(kiln)
            .arg("serve")
            .env("DATABASE_URL", db_url)
            .env("KILN_LISTEN", addr.to_string())
            .env("KILN_JWT_SECRET", SECRET)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} serve", kiln.display()))?;
        let mut server = Server { addr, child };
        let http = http()?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = http.get(format!("http://{addr}/readyz")).send().await
                && r.status().is_success()
            {
                return Ok(server);
            }
            if let Some(status) = server.child.try_wait()? {
                bail!("kiln serve exited: {status}");
            }
            if Instant::now() > deadline {
                bail!("kiln serve was not ready within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// This executable again, as the baseline server on `db_url` (see
    /// [`baseline_child`]).
    pub async fn baseline(db_url: &str) -> anyhow::Result<Server> {
        let exe: PathBuf = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .env(BASELINE_DB, db_url)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting the baseline server")?;
        let stdout = child.stdout.take().context("child stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .context("the baseline server did not start in 30 s")??
            .context("the baseline server exited")?;
        let addr = line.strip_prefix("listening ").context("unexpected child output")?.parse()?;
        Ok(Server { addr, child })
    }

    pub fn pid(&self) -> anyhow::Result<u32> {
        self.child.id().context("the server has exited")
    }

    /// CPU time the server process has used so far (user + system).
    pub fn cpu_time(&self) -> anyhow::Result<Duration> {
        process_cpu_time(self.pid()?)
    }

    /// Resident memory of the server process.
    pub fn rss_bytes(&self) -> anyhow::Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?))?;
        let Some(line) = status.lines().find(|l| l.starts_with("VmRSS:")) else { bail!("no VmRSS") };
        let kib: u64 = line.split_whitespace().nth(1).context("VmRSS value")?.parse()?;
        Ok(kib * 1024)
    }
}

/// `kiln worker` in a process of its own, as users run it.
pub struct Worker {
    /// Its `KILN_WORKER_ID`.
    pub id: String,
    child: Child,
}

impl Worker {
    /// `kiln worker` on `db_url`, talking to the scripted model at
    /// `model_url` (OpenAI's protocol), with `env` over the settings every
    /// benchmark's worker has: a session's container goes with its run
    /// (`KILN_SANDBOX_IDLE_S=0`), so a benchmark leaves none behind and no
    /// idle containers pile up round after round. Returns once the worker
    /// holds its lock (and so claims).
    pub async fn start(kiln: &Path, db_url: &str, model_url: &str, env: &[(&str, String)]) -> anyhow::Result<Worker> {
        let id = format!("bench-{}", uuid::Uuid::new_v4().simple());
        let child = Command::new(kiln)
            .arg("worker")
            .env("DATABASE_URL", db_url)
            .env("KILN_WORKER_ID", &id)
            .env("KILN_MODEL_PROVIDER", "openai")
            .env("KILN_MODEL_BASE_URL", model_url)
            .env("OPENAI_API_KEY", "sk-bench")
            .env("KILN_MODEL", "scripted")
            .env("KILN_SANDBOX_IDLE_S", "0")
            .env("RUST_LOG", "warn")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting kiln worker")?;
        let mut worker = Worker { id, child };
        let sql = connect(db_url).await?;
        let deadline = Instant::now() + Duration::from_secs(60);
        let locked = "SELECT 1 FROM workers WHERE id = $1 AND lock_key IS NOT NULL";
        while sql.query_opt(locked, &[&worker.id]).await?.is_none() {
            if let Some(status) = worker.child.try_wait()? {
                bail!("kiln worker exited: {status}");
            }
            if Instant::now() > deadline {
                bail!("kiln worker {} did not take its lock in 60 s", worker.id);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(worker)
    }

    fn signal(&self, signal: Signal) -> anyhow::Result<()> {
        let pid = self.child.id().and_then(|id| Pid::from_raw(id as i32)).context("the worker has exited")?;
        kill_process(pid, signal)?;
        Ok(())
    }

    /// SIGKILL, as a crash: the worker cleans nothing up.
    pub async fn kill(mut self) -> anyhow::Result<()> {
        self.signal(Signal::KILL)?;
        self.child.wait().await?;
        Ok(())
    }

    /// SIGTERM, and waits (at most 60 s) for the worker's orderly stop,
    /// which removes its containers, warm ones included.
    pub async fn stop(mut self) {
        if self.signal(Signal::TERM).is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await;
        }
    }
}

/// In the baseline server's process (started by [`Server::baseline`]): its
/// database URL and a loopback listener, already announced to the parent.
/// `None` in the benchmark itself.
pub async fn baseline_child() -> anyhow::Result<Option<(String, tokio::net::TcpListener)>> {
    let Ok(db) = std::env::var(BASELINE_DB) else { return Ok(None) };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("listening {}", listener.local_addr()?);
    Ok(Some((db, listener)))
}

/// Median and range of `values`, e.g. `1234 (1100..1300)`.
pub fn median_range(values: &[f64], decimals: usize) -> String {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return "-".into();
    }
    let median = if v.len() % 2 == 1 { v[v.len() / 2] } else { (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0 };
    format!("{median:.decimals$} ({:.decimals$}..{:.decimals$})", v[0], v[v.len() - 1])
}

/// Median of `values` (NaN when empty).
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
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

/// Clock ticks per second of `/proc/<pid>/stat`'s times: `USER_HZ`, which
/// Linux fixes at 100 on every architecture it exposes to user space.
const USER_HZ: u64 = 100;

/// User + system CPU time of process `pid` so far, from `/proc/<pid>/stat`
/// (10 ms resolution: meant for rounds of seconds).
pub fn process_cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) is in parentheses and may hold spaces:
    // fields are counted after its closing one. utime and stime are
    // fields 14 and 15, the 12th and 13th after it.
    let rest = stat.rsplit_once(')').context("no command name in /proc/<pid>/stat")?.1;
    let mut fields = rest.split_whitespace().skip(11);
    let mut tick = || -> anyhow::Result<u64> { Ok(fields.next().context("short /proc/<pid>/stat")?.parse()?) };
    let ticks = tick()? + tick()?;
    Ok(Duration::from_millis(ticks * 1000 / USER_HZ))
}

/// CPU time used so far by every `postgres` process this machine shows
/// (the server's backends and its own processes), when the benchmark's
/// database runs here; zero when none is visible. Backends that exited
/// since are not counted: read it around a round whose connections stay
/// open (pools).
pub fn local_postgres_cpu_time() -> Duration {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Duration::ZERO };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == "postgres"))
        .filter_map(|pid| process_cpu_time(pid).ok())
        .sum()
}
