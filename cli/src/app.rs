//! Startup: one builder assembles the API and the worker from their parts,
//! the same way for `serve` (the API), `worker` (a worker), `up` (both) and
//! the tests (both, and more workers). The parts come from the settings
//! (`crate::settings::{ApiOptions, WorkerOptions}`) or, in tests, are made
//! directly.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use kiln_api::{ApiSettings, AppState, Authenticator, GithubWebhookConfig};
use kiln_store::Store;
use kiln_worker::providers::pricing::PriceTable;
use kiln_worker::tools::Registry;
use kiln_worker::{ProviderEndpoints, Providers, Worker, WorkerConfig, WorkerContext};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What the API is started from, every setting checked.
pub struct ApiParts {
    pub auth: Authenticator,
    pub settings: ApiSettings,
    /// `None`: the GitHub webhook route refuses every delivery.
    pub github: Option<GithubWebhookConfig>,
    /// Port 0 picks a free one ([`ApiServer::addr`] says which).
    pub listen: SocketAddr,
    /// A listener of the metrics' own: `/metrics` without a token
    /// (`KILN_API_METRICS_LISTEN`); `None`: none.
    pub metrics_listen: Option<SocketAddr>,
}

/// What a worker is started from, every setting checked.
#[derive(Debug, Clone)]
pub struct WorkerParts {
    pub config: WorkerConfig,
    pub endpoints: ProviderEndpoints,
    pub prices: PriceTable,
}

/// One process's share of Kiln against one database: the API, a worker, or
/// both.
pub struct Kiln {
    store: Store,
    api: Option<ApiParts>,
    worker: Option<WorkerParts>,
}

/// What [`Kiln::start`] started; it runs until the shutdown token fires.
pub struct Running {
    pub api: Option<ApiServer>,
    pub worker: Option<JoinHandle<()>>,
}

/// A running API server.
pub struct ApiServer {
    pub addr: SocketAddr,
    /// The metrics listener's address (`KILN_API_METRICS_LISTEN`).
    pub metrics_addr: Option<SocketAddr>,
    pub handle: JoinHandle<std::io::Result<()>>,
}

impl Kiln {
    pub fn new(store: Store) -> Self {
        Kiln { store, api: None, worker: None }
    }

    /// Also serve the API.
    pub fn api(self, parts: ApiParts) -> Self {
        Kiln { api: Some(parts), ..self }
    }

    /// Also run a worker.
    pub fn worker(self, parts: WorkerParts) -> Self {
        Kiln { worker: Some(parts), ..self }
    }

    /// Binds the API and starts the worker (after checking that Docker
    /// answers); both stop when `shutdown` fires.
    pub async fn start(self, shutdown: CancellationToken) -> anyhow::Result<Running> {
        let api = match self.api {
            Some(parts) => Some(start_api(self.store.clone(), parts, shutdown.clone()).await?),
            None => None,
        };
        let worker = match self.worker {
            Some(parts) => Some(start_worker(self.store, parts, shutdown).await?),
            None => None,
        };
        Ok(Running { api, worker })
    }
}

impl Running {
    /// The API's address, when it serves one.
    pub fn api_addr(&self) -> Option<SocketAddr> {
        self.api.as_ref().map(|api| api.addr)
    }

    /// The address of the API's own metrics listener, when it serves one.
    pub fn api_metrics_addr(&self) -> Option<SocketAddr> {
        self.api.as_ref().and_then(|api| api.metrics_addr)
    }

    /// Waits until the worker and then the API have stopped (after the
    /// shutdown token fired); an error the API server ended with.
    pub async fn stopped(self) -> anyhow::Result<()> {
        if let Some(worker) = self.worker {
            worker.await?;
        }
        if let Some(api) = self.api {
            api.handle.await??;
        }
        Ok(())
    }
}

async fn start_api(store: Store, parts: ApiParts, shutdown: CancellationToken) -> anyhow::Result<ApiServer> {
    let ApiParts { auth, settings, github, listen, metrics_listen } = parts;
    let listener = TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    let addr = listener.local_addr()?;
    let prometheus = crate::telemetry::prometheus();
    let render: kiln_api::metrics::Render = Arc::new(move || prometheus.render());
    let metrics = Some(Arc::new(kiln_api::metrics::Exporter::new(render, settings.metrics_refresh)));
    let state = AppState { metrics, ..AppState::new(store, auth, settings, github, shutdown.clone()) };
    let timeouts = state.settings.connection;
    let metrics_addr = match metrics_listen {
        Some(at) => {
            let listener =
                TcpListener::bind(at).await.with_context(|| format!("binding the API metrics listener {at}"))?;
            let metrics_addr = listener.local_addr()?;
            let app = kiln_api::metrics::listener_router(state.clone());
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                if let Err(e) = kiln_api::serve(listener, app, timeouts, shutdown).await {
                    tracing::warn!(error = %e, "the API metrics listener stopped");
                }
            });
            Some(metrics_addr)
        }
        None => None,
    };
    let app = kiln_api::router(state);
    let handle = tokio::spawn(kiln_api::serve(listener, app, timeouts, shutdown));
    Ok(ApiServer { addr, metrics_addr, handle })
}

async fn start_worker(store: Store, parts: WorkerParts, shutdown: CancellationToken) -> anyhow::Result<JoinHandle<()>> {
    let WorkerParts { config, endpoints, prices } = parts;
    let docker = bollard::Docker::connect_with_local_defaults().context("connecting to Docker")?;
    docker.ping().await.context("the Docker engine does not answer")?;
    let sandboxes = kiln_worker::sandbox::Backend::from(&docker);
    // A runtime the engine lacks, or an engine that cannot bound a
    // sandbox's disk (unless told to run unbounded), would fail every run:
    // say so now.
    sandboxes.check(&config.sandbox).await.context("checking the sandbox backend")?;
    if let Some(runtime) = &config.sandbox.runtime {
        tracing::info!(%runtime, "sandboxes run under this OCI runtime");
    }
    let providers = Providers::new(endpoints).context("building the HTTP client")?;
    let listener = store.listener();
    // Owed GitHub deliveries no worker is making (runs cancelled while
    // queued, retries, deliveries a dead worker left), beside the claim loop.
    if let Some(github) = config.github.clone() {
        tokio::spawn(kiln_worker::github::serve_pending_deliveries(github, store.clone(), shutdown.clone()));
    }
    // Owed completion callbacks, whether or not GitHub is configured.
    if let Some(callbacks) = config.callbacks.clone() {
        tokio::spawn(kiln_worker::callbacks::serve(callbacks, store.clone(), listener.clone(), shutdown.clone()));
    }
    if let Some(keep) = config.event_retention {
        tokio::spawn(kiln_worker::retention::serve(store.clone(), keep, shutdown.clone()));
    }
    let presence = kiln_worker::presence::Presence::new(store.clone(), config.worker_id.clone());
    let environment_pools = Arc::new(kiln_worker::sandbox::environment_pools::EnvironmentPools::new(
        &sandboxes,
        config.worker_id.clone(),
        config.environment_warm,
    ));
    let ctx = WorkerContext {
        store,
        sandboxes,
        config,
        providers,
        prices,
        tools: Registry::standard(),
        presence,
        environment_pools,
        capture_vouches: Default::default(),
        held_sandboxes: Default::default(),
    };
    let worker = Worker::new(ctx, listener);
    // Owed `deliver.git` pushes no worker is making (retries, pushes a dead
    // worker left, groups once chosen) are polled for beside the claim
    // loop. Without credentials too, so that such a push fails saying so.
    tokio::spawn(kiln_worker::git_delivery::owed::serve(worker.context(), shutdown.clone()));
    Ok(tokio::spawn(worker.run(shutdown)))
}

/// Connects and migrates.
pub async fn open_store(url: &str, pool_size: usize) -> anyhow::Result<Store> {
    let store = Store::connect(url, pool_size)?;
    store.migrate().await.context("migrating the database")?;
    Ok(store)
}
