//! Kiln's HTTP API: runs, their events over SSE, health.
//!
//! [`router`] builds the axum app from an [`AppState`]; the `kiln` binary
//! and the tests serve it the same way.

mod access;
pub mod auth;
mod deadline;
mod error;
mod event_reads;
mod extract;
pub mod feed;
pub mod github;
mod http2_idle;
pub mod limits;
pub mod metrics;
pub mod notice_router;
pub mod openapi;
pub mod page_reads;
mod routes;
pub mod serve;
pub mod stream_token;
pub mod web;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use kiln_store::{Quota, Store};
use secrecy::{SecretSlice, SecretString};

pub use auth::{AuthConfig, Authenticator};
pub use error::ApiError;
pub use github::GithubWebhookConfig;
pub use jsonwebtoken::Algorithm;
pub use serve::{HttpTimeouts, serve};

/// Largest request body accepted, in bytes. A prompt is capped at 64 Ki
/// characters (`kiln_protocol::input::PROMPT`); this fits one of ASCII and
/// the rest of the JSON, and nothing more. (A prompt of 64 Ki characters
/// that are each escaped as `\uXXXX` in JSON does not fit: 413.)
pub const DEFAULT_MAX_BODY_BYTES: usize = 256 * 1024;

/// How long a stream token is valid by default: long enough to open (and
/// reopen) an event stream, short enough that one found in a log is stale.
pub const DEFAULT_STREAM_TOKEN_TTL: Duration = Duration::from_secs(5 * 60);

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub auth: Arc<Authenticator>,
    /// Wakes the reader of a followed run (`feeds`) when the run has new
    /// events.
    pub notices: Arc<notice_router::NoticeRouter>,
    pub settings: Arc<ApiSettings>,
    /// GitHub webhook settings; `None` disables the webhook route.
    pub github: Option<Arc<GithubWebhookConfig>>,
    /// Open SSE streams per subject on this instance.
    pub sse: Arc<limits::SseGauge>,
    /// One reader per followed run, shared by its SSE streams.
    pub feeds: Arc<feed::Feeds>,
    /// The feeds' reads of the table, gathered into few statements.
    pub page_reads: Arc<page_reads::PageReads>,
    /// Fired when the process shuts down: SSE streams end so the server can
    /// drain (clients reconnect elsewhere and resume with `Last-Event-ID`).
    pub shutdown: tokio_util::sync::CancellationToken,
    /// Serves `GET /metrics`; `None` answers it 404.
    pub metrics: Option<Arc<metrics::Exporter>>,
}

impl AppState {
    /// The state of one API instance on `store`: no SSE streams open yet,
    /// no metrics exporter (set `metrics` to serve `/metrics`).
    pub fn new(
        store: Store,
        auth: Authenticator,
        settings: ApiSettings,
        github: Option<GithubWebhookConfig>,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Self {
        let page_bytes = event_reads::page_bytes(&settings);
        AppState {
            notices: Arc::new(notice_router::NoticeRouter::new(store.listener())),
            page_reads: Arc::new(page_reads::PageReads::new(store.clone(), page_bytes)),
            store,
            auth: Arc::new(auth),
            settings: Arc::new(settings),
            github: github.map(Arc::new),
            sse: Default::default(),
            feeds: Default::default(),
            shutdown,
            metrics: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ApiSettings {
    pub max_body_bytes: usize,
    /// Interval of `: keep-alive` comments on idle SSE streams.
    pub sse_keep_alive: Duration,
    /// How often an SSE stream re-reads the table even without a
    /// notification (covers notifications lost while LISTEN reconnects).
    pub sse_poll: Duration,
    /// Per-subject run quota (active runs, creations per minute).
    pub quota: Quota,
    /// SSE streams one subject may hold open on one instance.
    pub max_sse_per_subject: usize,
    /// `/metrics` re-reads runs by status from the database at most this
    /// often (one grouped count over the runs table).
    pub metrics_refresh: Duration,
    /// The deployment's callback secret (`KILN_CALLBACK_SECRET`), from which
    /// each subject's callback key is derived (`GET /v1/callback-key`).
    /// `None`: callbacks are off and runs naming a `callback_url` are refused.
    pub callback_secret: Option<SecretSlice<u8>>,
    /// How long a stream token (`POST /v1/runs/{id}/stream-token`) is valid.
    pub stream_token_ttl: Duration,
    /// The bearer token `/metrics` on the API's listener asks for
    /// (`KILN_METRICS_TOKEN`). `None`: the API's listener serves no metrics
    /// (a listener of their own may, see `metrics::listener_router`).
    pub metrics_token: Option<SecretString>,
    /// Where a run's `repo.url` may lead, as far as the API can tell without
    /// DNS (`KILN_ALLOW_PRIVATE_REPOS`, `KILN_ALLOW_GIT_PROTOCOLS`).
    pub repo_rules: kiln_protocol::repo_url::RepoRules,
    /// How long a request may take to arrive and be answered (an event
    /// stream: until its headers); beyond it, 408.
    pub request_timeout: Duration,
    /// An event stream ends after this long; the client resumes with
    /// `Last-Event-ID` (from any instance), so nobody holds one forever.
    pub sse_max_duration: Duration,
    /// Connection limits: header read, stalled writes.
    pub connection: HttpTimeouts,
    /// Bytes of events one read of the events table loads (a JSON page, an
    /// SSE catch-up batch, a feed read), besides the count limit; a read
    /// always loads at least one event.
    pub event_page_bytes: usize,
    /// The deployment's key for environment secrets (`KILN_SECRETS_KEY`).
    /// `None`: environments with secrets are refused (422).
    pub secrets_key: Option<Arc<kiln_store::secrets::SecretsKey>>,
    /// The sub-agent kinds a run's `agents` may name (`KILN_AGENT_KINDS`,
    /// which workers read too); the built-in ones by default.
    pub agent_kinds: Arc<kiln_protocol::agents::AgentKinds>,
    /// The images an environment may name (`KILN_ENVIRONMENT_IMAGES`,
    /// which workers read too); the deployment's sandbox image by default.
    pub environment_images: Arc<kiln_protocol::image_name::ImagePatterns>,
    /// The most attempts a run may ask for (`KILN_MAX_ATTEMPTS`, at most
    /// the protocol's 4); 422 beyond.
    pub max_attempts: u32,
    /// The hosts `deliver.git` may push to (`KILN_GIT_CREDENTIALS`'s keys,
    /// lower case), when this process was given the file: a run naming
    /// another is refused (422). `None`: only the workers know them, and
    /// such a run's push fails there.
    pub git_hosts: Option<std::sync::Arc<std::collections::BTreeSet<String>>>,
}

/// Default of [`ApiSettings::event_page_bytes`]: 2 MiB.
pub const DEFAULT_EVENT_PAGE_BYTES: usize = 2 * 1024 * 1024;

impl Default for ApiSettings {
    fn default() -> Self {
        ApiSettings {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            sse_keep_alive: Duration::from_secs(15),
            sse_poll: Duration::from_secs(2),
            quota: Quota { max_active_runs: 20, max_runs_per_minute: 60 },
            max_sse_per_subject: 32,
            metrics_refresh: Duration::from_secs(10),
            callback_secret: None,
            stream_token_ttl: DEFAULT_STREAM_TOKEN_TTL,
            metrics_token: None,
            repo_rules: kiln_protocol::repo_url::RepoRules::default(),
            request_timeout: Duration::from_secs(30),
            sse_max_duration: Duration::from_secs(30 * 60),
            connection: HttpTimeouts::default(),
            event_page_bytes: DEFAULT_EVENT_PAGE_BYTES,
            secrets_key: None,
            agent_kinds: Default::default(),
            environment_images: Default::default(),
            max_attempts: kiln_protocol::input::ATTEMPTS.max,
            git_hosts: None,
        }
    }
}

pub fn router(state: AppState) -> Router {
    let max_body = state.settings.max_body_bytes;
    Router::new()
        .merge(routes::health::routes())
        .merge(web::routes())
        .merge(metrics::routes())
        .nest("/v1", routes::v1())
        // Beside the routes, not among them: the document lists every route.
        .route("/v1/openapi.json", axum::routing::get(openapi::serve))
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::from_fn_with_state(state.settings.request_timeout, deadline::within))
        // Outermost: the access log, the request span and the metrics
        // (`access`), which see the deadline's 408 too.
        .layer(axum::middleware::from_fn(access::access))
        .with_state(state)
}
