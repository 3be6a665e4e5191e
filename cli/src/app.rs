//! Wiring: build the API and the worker from settings, the same way for
//! `serve`, `worker`, `up` and the tests.

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

/// A running API server.
pub struct ApiServer {
    pub addr: SocketAddr,
    pub handle: JoinHandle<std::io::Result<()>>,
}

/// Binds `listen` (port 0 picks a free one) and serves the API until
/// `shutdown` fires. Without `github`, the GitHub webhook route refuses
/// every delivery.
pub async fn start_api(
    store: Store,
    auth: Authenticator,
    settings: ApiSettings,
    github: Option<GithubWebhookConfig>,
    listen: SocketAddr,
    shutdown: CancellationToken,
) -> anyhow::Result<ApiServer> {
    let listener = TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    let addr = listener.local_addr()?;
    let prometheus = crate::telemetry::prometheus();
    let render: kiln_api::metrics::Render = Arc::new(move || prometheus.render());
    let metrics = Some(Arc::new(kiln_api::metrics::Exporter::new(render, settings.metrics_refresh)));
    let state = AppState { metrics, ..AppState::new(store, auth, settings, github, shutdown.clone()) };
    let timeouts = state.settings.connection;
    let app = kiln_api::router(state);
    let handle = tokio::spawn(kiln_api::serve(listener, app, timeouts, shutdown));
    Ok(ApiServer { addr, handle })
}

/// Connects to Docker and starts a worker that runs until `shutdown` fires.
pub async fn start_worker(
    store: Store,
    config: WorkerConfig,
    endpoints: ProviderEndpoints,
    prices: PriceTable,
    shutdown: CancellationToken,
) -> anyhow::Result<JoinHandle<()>> {
    let docker = bollard::Docker::connect_with_local_defaults().context("connecting to Docker")?;
    docker.ping().await.context("the Docker engine does not answer")?;
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
    let ctx = WorkerContext { store, docker, config, providers, prices, tools: Registry::standard() };
    let worker = Worker::new(ctx, listener);
    Ok(tokio::spawn(worker.run(shutdown)))
}

/// Connects and migrates.
pub async fn open_store(url: &str, pool_size: usize) -> anyhow::Result<Store> {
    let store = Store::connect(url, pool_size)?;
    store.migrate().await.context("migrating the database")?;
    Ok(store)
}
