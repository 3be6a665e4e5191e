//! Test harness for Kiln's end-to-end tests: a fresh database per test, the
//! real API on a free port, a real worker driving real Docker containers,
//! and the scripted model server in place of an LLM.
//!
//! The harness may use `expect`: a broken harness should fail the test loudly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use eventsource_stream::Eventsource;
use futures::StreamExt;
use kiln_cli::app::{ApiParts, Kiln, WorkerParts, open_store};
use kiln_scripted_model::{Reply, ScriptedModel};
use kiln_store::Store;
use kiln_worker::providers::pricing::{ModelPrice, PriceTable};
use kiln_worker::sandbox::SandboxConfig;
use kiln_worker::{ProviderEndpoints, ProviderKind, WorkerConfig};
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub use kiln_scripted_model;

pub mod browser;
pub mod changes;
pub mod fake_github;
pub mod git_repo;
pub mod github_kiln;
pub mod kiln_bin;
pub mod leftovers;
pub mod logs;
pub mod mcp_demo;
pub mod netcut;
pub mod outside;
pub mod pg;
mod runs;
pub mod worker_process;

pub use runs::{Event, outcome};

pub const SECRET: &str = "test-secret-0123456789abcdef0123456789";

/// Admin connection for creating test databases.
pub fn admin_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://kiln:kiln@127.0.0.1:5432/kiln".into())
}

/// Creates an empty database and returns its URL.
pub async fn fresh_database() -> String {
    fresh_database_on(&admin_url()).await
}

/// Creates an empty database on the server of `admin` and returns its URL.
pub async fn fresh_database_on(admin: &str) -> String {
    let admin = admin.to_owned();
    let (client, conn) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
        .await
        .expect("connect to Postgres (is DATABASE_URL right? .ci/run starts one)");
    tokio::spawn(conn);
    // The creation time in the name lets scripts/drop-stale-test-databases.sh
    // tell an old run's database from one a run beside it is about to use.
    let created =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default();
    let name = format!("kiln_test_{created}_{}", Uuid::new_v4().simple());
    client.execute(&format!("CREATE DATABASE {name}"), &[]).await.expect("create test database");
    let mut config: tokio_postgres::Config = admin.parse().expect("DATABASE_URL parses");
    config.dbname(&name);
    // Rebuild a URL from the parsed parts (the password may be absent).
    let user = config.get_user().unwrap_or("postgres").to_owned();
    let password = config.get_password().map(|p| String::from_utf8_lossy(p).into_owned());
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    match password {
        Some(p) => format!("postgres://{user}:{p}@{host}:{port}/{name}"),
        None => format!("postgres://{user}@{host}:{port}/{name}"),
    }
}

/// Checks the tokens [`token`] mints.
pub fn authenticator() -> kiln_api::Authenticator {
    kiln_api::Authenticator::new(&kiln_api::AuthConfig::Hs256 { secret: SECRET.as_bytes().to_vec().into() }, None, None)
        .unwrap()
}

pub fn token(sub: &str) -> String {
    kiln_api::auth::mint_hs256(SECRET.as_bytes(), sub, Duration::from_secs(3600)).unwrap()
}

/// The account Kiln's GitHub token posts as in the harness: a machine user
/// other than the handle (`KILN_GITHUB_BOT_LOGIN`).
pub const GITHUB_BOT_LOGIN: &str = "kiln-ops";

/// A model the harness's workers price like Claude Sonnet, cache prices
/// included ($3 in, $15 out, $0.30 cache read, $3.75 cache write per
/// million tokens); the scripted model answers to any name.
pub const CACHE_PRICED_MODEL: &str = "scripted-sonnet";

pub struct Options {
    /// API settings; the harness shortens the keep-alive interval to 1 s.
    pub api: kiln_api::ApiSettings,
    pub script: Vec<Reply>,
    pub provider: ProviderKind,
    pub worker: bool,
    pub lease: Duration,
    /// Admin URL of the Postgres server to use (default: `DATABASE_URL`).
    pub postgres: Option<String>,
    /// GitHub webhook secret; `None` leaves the webhook route disabled.
    /// The other webhook settings take `kiln serve`'s defaults (handle and
    /// label `kiln`, runs owned by `github`).
    pub github_secret: Option<String>,
    /// `KILN_GITHUB_ENVIRONMENTS` of the webhook (with `github_secret`).
    pub github_environments: String,
    /// `KILN_GITHUB_ATTEMPTS_TAKE_FIRST` of the webhook (with `github_secret`).
    pub github_take_first: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            api: kiln_api::ApiSettings {
                sse_keep_alive: Duration::from_secs(1),
                // As the workers' `worker_config`: tests clone from loopback.
                repo_rules: kiln_protocol::repo_url::RepoRules { allow_private: true, allow_git_protocols: false },
                environment_images: std::sync::Arc::new(sandbox_image_only()),
                ..Default::default()
            },
            script: Vec::new(),
            provider: ProviderKind::OpenAi,
            worker: true,
            lease: Duration::from_secs(10),
            postgres: None,
            github_secret: None,
            github_environments: String::new(),
            github_take_first: false,
        }
    }
}

/// One Kiln (API + optional worker) against a fresh database.
pub struct TestApp {
    pub addr: SocketAddr,
    pub db_url: String,
    pub store: Store,
    pub model: ScriptedModel,
    pub http: reqwest::Client,
    pub shutdown: CancellationToken,
    /// Ids of the workers started for this app (in this process or as
    /// processes): what they leave in Docker is removed when it drops.
    workers: std::sync::Mutex<Vec<String>>,
    /// The runtime this app's in-process workers run on, every task they
    /// spawn included. A runtime of their own, because when the app drops
    /// they must stop before the harness looks for what they left: on the
    /// test's runtime they would go on (another thread of it) or resume
    /// (the test's thread, once `Drop` returns), refilling a warm pool or
    /// creating a session's container after the look. Shutting this one
    /// down drops them all.
    worker_runtime: std::sync::Mutex<Option<tokio::runtime::Runtime>>,
}

impl TestApp {
    pub async fn spawn(options: Options) -> TestApp {
        let _ = rustls::crypto::ring::default_provider().install_default();
        show_logs_if_it_fails();
        let db_url = fresh_database_on(options.postgres.as_deref().unwrap_or(&admin_url())).await;
        let store = open_store(&db_url, 8).await.expect("migrate");
        let model = ScriptedModel::start(options.script).await.expect("scripted model");
        let shutdown = CancellationToken::new();
        let github = options
            .github_secret
            .map(|secret| kiln_api::GithubWebhookConfig::new(secret.as_bytes(), "kiln", "kiln", "github").unwrap())
            .map(|config| config.posting_as(GITHUB_BOT_LOGIN).unwrap())
            .map(|config| {
                let environments = kiln_api::github::RepositoryEnvironments::parse(&options.github_environments);
                config.with_environments(environments.unwrap()).taking_first_success(options.github_take_first)
            });
        let addr = Self::start_api_on(&store, options.api.clone(), github, shutdown.clone()).await;
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let app = TestApp {
            addr,
            db_url,
            store,
            model,
            http,
            shutdown,
            workers: Default::default(),
            worker_runtime: Default::default(),
        };
        if options.worker {
            app.start_worker(worker_config(options.provider, options.lease)).await;
        }
        app
    }

    /// Starts a worker against this app's database and scripted model.
    pub async fn start_worker(&self, config: WorkerConfig) {
        self.start_worker_until(config, self.shutdown.clone()).await;
    }

    /// Starts a worker that stops when `shutdown` fires (or the app drops);
    /// the handle finishes when the worker has exited.
    pub async fn start_worker_until(&self, config: WorkerConfig, shutdown: CancellationToken) -> JoinHandle<()> {
        self.start_worker_on(self.store.clone(), config, shutdown).await
    }

    /// Like [`TestApp::start_worker_until`], with a connection pool of the
    /// worker's own (as a separate worker process would have).
    pub async fn start_worker_on(
        &self,
        store: Store,
        config: WorkerConfig,
        shutdown: CancellationToken,
    ) -> JoinHandle<()> {
        let endpoints = ProviderEndpoints {
            openai_base_url: Some(self.model.openai_base_url()),
            openai_api_key: Some("sk-test-openai".into()),
            anthropic_base_url: Some(self.model.anthropic_base_url()),
            anthropic_api_key: Some("sk-ant-test".into()),
            read_timeout: None,
        };
        let mut prices = PriceTable::empty();
        // A price for the scripted model so cost budgets can be tested: $1
        // per million tokens in and out.
        prices.insert("scripted", ModelPrice { input: 1.0, output: 1.0, cache_read: None, cache_write: None });
        prices.insert(
            CACHE_PRICED_MODEL,
            ModelPrice { input: 3.0, output: 15.0, cache_read: Some(0.3), cache_write: Some(3.75) },
        );
        let runtime = self.worker_runtime();
        // The app's shutdown also stops this worker.
        let app_shutdown = self.shutdown.clone();
        let token = shutdown.clone();
        runtime.spawn(async move {
            app_shutdown.cancelled().await;
            token.cancel();
        });
        self.owns_worker(&config.worker_id);
        let parts = WorkerParts { config, endpoints, prices };
        // Started on the workers' runtime, so that everything it spawns
        // runs there.
        let running = runtime
            .spawn(async move { Kiln::new(store).worker(parts).start(shutdown).await })
            .await
            .expect("the worker's start")
            .expect("start worker");
        running.worker.expect("a worker")
    }

    /// The runtime of this app's workers (made with the first): two
    /// threads, as `kiln worker` has at least.
    fn worker_runtime(&self) -> tokio::runtime::Handle {
        let mut runtime = self.worker_runtime.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        runtime
            .get_or_insert_with(|| {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("test-workers")
                    .enable_all()
                    .build()
                    .expect("a runtime for the test's workers")
            })
            .handle()
            .clone()
    }

    async fn start_api_on(
        store: &Store,
        settings: kiln_api::ApiSettings,
        github: Option<kiln_api::GithubWebhookConfig>,
        shutdown: CancellationToken,
    ) -> SocketAddr {
        let listen = "127.0.0.1:0".parse().unwrap();
        let parts = ApiParts { auth: authenticator(), settings, github, listen, metrics_listen: None };
        let running = Kiln::new(store.clone()).api(parts).start(shutdown).await.unwrap();
        running.api_addr().expect("an API")
    }

    /// A second API instance on the same database (GitHub webhooks disabled).
    pub async fn second_api(&self) -> SocketAddr {
        Self::start_api_on(&self.store, Options::default().api, None, self.shutdown.clone()).await
    }

    /// A second API instance with settings of its own.
    pub async fn second_api_with(&self, settings: kiln_api::ApiSettings) -> SocketAddr {
        Self::start_api_on(&self.store, settings, None, self.shutdown.clone()).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// POSTs `body` as `sub`; the status and the JSON answer (`Null` if none).
    pub async fn post_json(&self, sub: &str, path: &str, body: Value) -> (u16, Value) {
        let r = self.http.post(self.url(path)).bearer_auth(token(sub)).json(&body).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn create_run(&self, sub: &str, body: Value) -> Value {
        let r = self.http.post(self.url("/v1/runs")).bearer_auth(token(sub)).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 201, "create run");
        r.json().await.unwrap()
    }

    /// Sends `text` to the run's session as `owner` (a follow-up run, or
    /// a message to the running one): the answer, a 201's.
    pub async fn send_message(&self, owner: &str, run_id: Uuid, text: &str) -> Value {
        let path = format!("/v1/runs/{run_id}/messages");
        let body = serde_json::json!({ "text": text });
        let r = self.http.post(self.url(&path)).bearer_auth(token(owner)).json(&body).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 201);
        r.json().await.unwrap()
    }

    pub async fn get_run(&self, sub: &str, id: &str) -> Value {
        let r = self.http.get(self.url(&format!("/v1/runs/{id}"))).bearer_auth(token(sub)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.json().await.unwrap()
    }

    /// Reads the run's events over SSE from `addr` until the terminal event
    /// (or `max` events), starting after `last_event_id`.
    pub async fn sse(&self, addr: SocketAddr, sub: &str, run: &str, last_event_id: Option<i64>, max: usize) -> Vec<Ev> {
        self.read_sse(addr, sub, run, last_event_id, max, |_: &Ev| false).await
    }

    /// Like [`TestApp::sse`], also stopping after the first event `stop` accepts.
    pub async fn sse_until(
        &self,
        addr: SocketAddr,
        sub: &str,
        run: &str,
        last_event_id: Option<i64>,
        max: usize,
        stop: impl Fn(&Ev) -> bool,
    ) -> Vec<Ev> {
        self.read_sse(addr, sub, run, last_event_id, max, stop).await
    }

    /// Reads the run's events over SSE, each made a `T`, until the
    /// terminal event, `max` events or the first `stop` accepts.
    pub(crate) async fn read_sse<T: From<Ev>>(
        &self,
        addr: SocketAddr,
        sub: &str,
        run: &str,
        last_event_id: Option<i64>,
        max: usize,
        stop: impl Fn(&T) -> bool,
    ) -> Vec<T> {
        let mut req = self
            .http
            .get(format!("http://{addr}/v1/runs/{run}/events"))
            .bearer_auth(token(sub))
            .header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id.to_string());
        }
        let response = req.send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert!(response.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
        let mut stream = response.bytes_stream().eventsource();
        let mut out = Vec::new();
        let mut seen: Vec<String> = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(120);
        while out.len() < max {
            let next = tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), stream.next())
                .await
                .unwrap_or_else(|_| {
                    // What came before the stall says where the run stopped.
                    panic!("SSE stream stalled for 120 s; the events so far: {seen:?}")
                });
            let Some(item) = next else { break };
            let ev = item.expect("valid SSE");
            let e = Ev {
                seq: ev.id.parse().expect("numeric id"),
                kind: ev.event,
                data: serde_json::from_str(&ev.data).expect("JSON data"),
            };
            let terminal = kiln_protocol::event::is_terminal_kind(&e.kind);
            seen.push(e.kind.clone());
            let item = T::from(e);
            let stopped = terminal || stop(&item);
            out.push(item);
            if stopped {
                break;
            }
        }
        out
    }

    /// Follows the run to its end on this app's API.
    pub async fn events_to_end(&self, sub: &str, run: &str) -> Vec<Ev> {
        self.sse(self.addr, sub, run, None, usize::MAX).await
    }

    /// Ids of containers of the run's session (or made for the run).
    pub async fn containers_of(&self, run: impl std::fmt::Display) -> Vec<String> {
        let run: Uuid = run.to_string().parse().unwrap();
        let row = self.sql().await.query_one("SELECT session_id FROM runs WHERE id = $1", &[&run]).await.unwrap();
        let session: Uuid = row.get(0);
        let docker = bollard::Docker::connect_with_local_defaults().unwrap();
        kiln_worker::sandbox::list_managed(&docker)
            .await
            .unwrap()
            .into_iter()
            .filter(|c| c.session == Some(session) || c.run == Some(run))
            .map(|c| c.id)
            .collect()
    }

    /// Returns once `n` statements on this test's database wait for a lock
    /// (a write queued behind a transaction the test holds open): proof
    /// that they wait, where a fixed sleep would only give them time.
    pub async fn until_waiting_on_locks(&self, n: i64) {
        let sql = self.sql().await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let waiting: i64 = sql
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if waiting == n {
                return;
            }
            assert!(Instant::now() < deadline, "{waiting} statements wait for a lock, not {n}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A raw SQL connection to this test's database.
    pub async fn sql(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.db_url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        client
    }
}

/// Sends the test process's logs (the API's and workers', at info; `RUST_LOG`
/// overrides) to the test's captured output, which the runner prints only
/// when the test fails: a failure in CI then says what the worker was doing.
/// A test that captures logs itself ([`logs::Logs::capture`]) installs its
/// subscriber first, and this one stands aside.
fn show_logs_if_it_fails() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(false).with_test_writer().try_init();
}

impl TestApp {
    /// Records that the worker `id` works for this app: its containers go
    /// when the app drops.
    pub fn owns_worker(&self, id: &str) {
        self.workers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(id.to_owned());
    }

    /// The worker ids recorded by [`TestApp::owns_worker`].
    pub fn worker_ids(&self) -> Vec<String> {
        self.workers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

impl Drop for TestApp {
    /// Stops the app's workers and removes what they left in Docker (see
    /// [`leftovers`]): a test that ends, or fails, mid-run leaves nothing
    /// running behind it. Bounded: it never hangs the test.
    fn drop(&mut self) {
        self.shutdown.cancel();
        let runtime = self.worker_runtime.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        let workers = self.worker_ids();
        if workers.is_empty() && runtime.is_none() {
            return;
        }
        let done = leftovers::clean_up(runtime, self.db_url.clone(), workers);
        if !done.removed.is_empty() {
            eprintln!("test harness: removed what the test's workers left: {:?}", done.removed);
        }
        if let Some(why) = done.unfinished {
            eprintln!("test harness: could not show that the test's workers left nothing: {why}");
        }
    }
}

/// Runs `cmd` in `container` as the container's own user (root without
/// capabilities in a sandbox: it can read the workspace and write `/tmp`);
/// its exit code and output (stdout and stderr together).
pub async fn docker_exec(container: &str, cmd: &[&str]) -> (i64, String) {
    use bollard::exec::{CreateExecOptions, StartExecResults};
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let options = CreateExecOptions {
        cmd: Some(cmd.to_vec()),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        ..Default::default()
    };
    let exec = docker.create_exec(container, options).await.unwrap();
    let mut text = String::new();
    if let StartExecResults::Attached { mut output, .. } = docker.start_exec(&exec.id, None).await.unwrap() {
        while let Some(chunk) = output.next().await {
            text.push_str(&chunk.unwrap().to_string());
        }
    }
    // The output ends a moment before the engine records the exit.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state = docker.inspect_exec(&exec.id).await.unwrap();
        if state.running == Some(false) {
            return (state.exit_code.unwrap_or(-1), text);
        }
        assert!(Instant::now() < deadline, "{cmd:?} in {container} did not finish");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The test machine's sandbox image (`KILN_SANDBOX_IMAGE`).
pub fn sandbox_image() -> String {
    std::env::var("KILN_SANDBOX_IMAGE").unwrap_or_else(|_| "kiln-sandbox:latest".into())
}

/// The OCI runtime the tests' sandboxes run under: the engine's default,
/// or `KILN_TEST_SANDBOX_RUNTIME` (`.ci/run` runs the sandbox suites a
/// second time with `runsc`, gVisor).
pub fn sandbox_runtime() -> Option<String> {
    std::env::var(SANDBOX_RUNTIME_ENV).ok().filter(|r| !r.is_empty())
}

/// The switch [`sandbox_runtime`] reads.
pub const SANDBOX_RUNTIME_ENV: &str = "KILN_TEST_SANDBOX_RUNTIME";

/// `KILN_ENVIRONMENT_IMAGES` as a deployment that sets none has it: the
/// sandbox image only.
pub fn sandbox_image_only() -> kiln_protocol::image_name::ImagePatterns {
    kiln_protocol::image_name::ImagePatterns::parse(&sandbox_image()).expect("KILN_SANDBOX_IMAGE is an image name")
}

pub fn worker_config(provider: ProviderKind, lease: Duration) -> WorkerConfig {
    WorkerConfig {
        worker_id: format!("test-{}", Uuid::new_v4().simple()),
        concurrency: 2,
        // Tests that need a session's container to outlive its run say so.
        sandbox_idle: Duration::ZERO,
        warm_pool: 0,
        lease,
        dead_worker_check: Some(kiln_worker::config::DEFAULT_DEAD_WORKER_CHECK),
        poll_interval: Duration::from_millis(500),
        sandbox: SandboxConfig { image: sandbox_image(), runtime: sandbox_runtime(), ..SandboxConfig::default() },
        default_provider: provider,
        default_model: "scripted".into(),
        default_max_tokens: 1024,
        context_window: 128_000,
        compaction_threshold: 0.8,
        allow_file_repos: true,
        // Tests clone from loopback (file://, the fake GitHub's smart HTTP);
        // the tests of the guard turn this off.
        repo_rules: kiln_protocol::repo_url::RepoRules { allow_private: true, allow_git_protocols: false },
        max_repo_mb: kiln_worker::config::DEFAULT_MAX_REPO_MB,
        claim_on_end: true,
        shutdown_grace: Duration::from_secs(5),
        event_retention: None,
        github: None,
        callbacks: None,
        max_tool_calls_per_step: kiln_worker::config::DEFAULT_MAX_TOOL_CALLS_PER_STEP,
        subagents: Default::default(),
        prompt_cache: true,
        secrets_key: None,
        environment_cache: Default::default(),
        // Like `warm_pool`: tests that want warm containers say so.
        environment_warm: kiln_worker::sandbox::environment_pools::WarmSettings {
            per_environment: 0,
            max_containers: 4,
        },
        mcp: Default::default(),
        git_credentials: Default::default(),
        git_delivery: Default::default(),
        max_event_bytes_per_run: kiln_worker::config::DEFAULT_MAX_EVENT_BYTES_PER_RUN,
        max_patch_bytes: kiln_worker::config::DEFAULT_MAX_PATCH_MB * 1024 * 1024,
        environment_images: std::sync::Arc::new(sandbox_image_only()),
    }
}

/// One SSE event as a client saw it, its payload as JSON (for tests of the
/// wire contract; behaviour tests read [`Event`]s).
#[derive(Debug, Clone)]
pub struct Ev {
    pub seq: i64,
    pub kind: String,
    pub data: Value,
}

/// What every form of a seen event has: its id and its kind.
pub trait Seen {
    fn seq(&self) -> i64;
    fn kind(&self) -> &str;
}

impl Seen for Ev {
    fn seq(&self) -> i64 {
        self.seq
    }
    fn kind(&self) -> &str {
        &self.kind
    }
}

pub fn kinds<E: Seen>(events: &[E]) -> Vec<&str> {
    events.iter().map(Seen::kind).collect()
}

/// Asserts ids are 1..=n with no gap or repeat.
pub fn assert_dense<E: Seen>(events: &[E], from: i64) {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq(), from + i as i64, "event ids must be dense: {:?}", kinds(events));
    }
}
