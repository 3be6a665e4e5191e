//! Configuration from flags and the environment (clap's `env` feature: every
//! option can be set either way, and `--help` lists the variable). Secrets
//! are read from the environment and never printed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use kiln_api::Algorithm;
use kiln_worker::providers::pricing::PriceTable;
use kiln_worker::sandbox::SandboxConfig;
use kiln_worker::{ProviderEndpoints, ProviderKind, WorkerConfig};

#[derive(Debug, Clone, Args)]
pub struct DbArgs {
    /// Postgres connection URL. `kiln up` starts a local cluster when unset.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Connections in this process's pool.
    #[arg(long, env = "KILN_DB_POOL_SIZE", default_value_t = 16)]
    pub db_pool_size: usize,
}

impl DbArgs {
    pub fn url(&self) -> anyhow::Result<&str> {
        self.database_url.as_deref().context("DATABASE_URL is not set (e.g. postgres://user:pass@127.0.0.1:5432/kiln)")
    }
}

#[derive(Debug, Clone, Args)]
pub struct AuthArgs {
    /// HS256 secret for bearer tokens (at least 32 bytes).
    #[arg(long, env = "KILN_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,
    /// PEM file of an RS256 or EdDSA public key, instead of a secret.
    #[arg(long, env = "KILN_JWT_PUBLIC_KEY")]
    pub jwt_public_key: Option<PathBuf>,
    /// Algorithm of the public key: RS256 or EdDSA.
    #[arg(long, env = "KILN_JWT_ALGORITHM", default_value = "RS256")]
    pub jwt_algorithm: String,
    /// Required `iss` claim, if set.
    #[arg(long, env = "KILN_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,
    /// Required `aud` claim, if set.
    #[arg(long, env = "KILN_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,
}

impl AuthArgs {
    pub fn authenticator(&self) -> anyhow::Result<kiln_api::Authenticator> {
        let config = match (&self.jwt_public_key, &self.jwt_secret) {
            (Some(path), _) => {
                let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
                let algorithm = match self.jwt_algorithm.as_str() {
                    "RS256" => Algorithm::RS256,
                    "EdDSA" => Algorithm::EdDSA,
                    other => bail!("KILN_JWT_ALGORITHM must be RS256 or EdDSA, not {other:?}"),
                };
                kiln_api::AuthConfig::PublicKey { algorithm, pem }
            }
            (None, Some(secret)) => kiln_api::AuthConfig::Hs256 { secret: secret.as_bytes().to_vec() },
            (None, None) => bail!("set KILN_JWT_SECRET (HS256) or KILN_JWT_PUBLIC_KEY"),
        };
        Ok(kiln_api::Authenticator::new(&config, self.jwt_issuer.as_deref(), self.jwt_audience.as_deref())?)
    }
}

#[derive(Debug, Clone, Args)]
pub struct ApiArgs {
    /// Address the API listens on.
    #[arg(long, env = "KILN_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Largest request body, in bytes.
    #[arg(long, env = "KILN_MAX_BODY_BYTES", default_value_t = kiln_api::DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// Runs one subject may have queued or running at once (429 beyond).
    #[arg(long, env = "KILN_MAX_ACTIVE_RUNS_PER_SUBJECT", default_value_t = 20)]
    pub max_active_runs_per_subject: i64,
    /// Runs one subject may create per minute (429 with Retry-After beyond).
    #[arg(long, env = "KILN_MAX_RUNS_PER_MINUTE", default_value_t = 60)]
    pub max_runs_per_minute: i64,
    /// Event streams one subject may hold open on one API instance.
    #[arg(long, env = "KILN_MAX_SSE_PER_SUBJECT", default_value_t = 32)]
    pub max_sse_per_subject: usize,
    /// Seconds `/metrics` reuses its database read (runs by status, queue
    /// depth and age); one grouped count over the runs table per refresh.
    #[arg(long, env = "KILN_METRICS_REFRESH_S", default_value_t = 10)]
    pub metrics_refresh_s: u64,
    /// Seconds a request may take to arrive and be answered (408 beyond);
    /// for an event stream, until its headers.
    #[arg(long, env = "KILN_HTTP_REQUEST_TIMEOUT_S", default_value_t = 30)]
    pub http_request_timeout_s: u64,
    /// Seconds a client may take to send a request's headers (and an idle
    /// keep-alive connection may stay open).
    #[arg(long, env = "KILN_HTTP_HEADER_TIMEOUT_S", default_value_t = 30)]
    pub http_header_timeout_s: u64,
    /// Seconds a response may wait for a client that takes no bytes before
    /// its connection is closed (a stalled event stream resumes with
    /// `Last-Event-ID`).
    #[arg(long, env = "KILN_HTTP_WRITE_STALL_S", default_value_t = 120)]
    pub http_write_stall_s: u64,
    /// Seconds an event stream stays open; then it ends and the client
    /// resumes with `Last-Event-ID` (EventSource does so by itself).
    #[arg(long, env = "KILN_SSE_MAX_S", default_value_t = 1800)]
    pub sse_max_s: u64,
}

impl ApiArgs {
    pub fn settings(&self) -> kiln_api::ApiSettings {
        kiln_api::ApiSettings {
            max_body_bytes: self.max_body_bytes,
            quota: kiln_store::Quota {
                max_active_runs: self.max_active_runs_per_subject.max(1),
                max_runs_per_minute: self.max_runs_per_minute.max(1),
            },
            max_sse_per_subject: self.max_sse_per_subject.max(1),
            metrics_refresh: std::time::Duration::from_secs(self.metrics_refresh_s),
            request_timeout: seconds(self.http_request_timeout_s),
            sse_max_duration: seconds(self.sse_max_s),
            connection: kiln_api::HttpTimeouts {
                header_read: seconds(self.http_header_timeout_s),
                write_stall: seconds(self.http_write_stall_s),
            },
            ..Default::default()
        }
    }
}

/// A limit in whole seconds; 0 would refuse everything, so it means 1.
fn seconds(s: u64) -> std::time::Duration {
    std::time::Duration::from_secs(s.max(1))
}

/// GitHub webhooks. The route is disabled unless a secret is set.
#[derive(Clone, Args)]
pub struct GithubArgs {
    /// Secret of the GitHub webhook (the hook's "Secret" field). Unset: the
    /// webhook route refuses every delivery.
    #[arg(long, env = "KILN_GITHUB_WEBHOOK_SECRET", hide_env_values = true)]
    pub github_webhook_secret: Option<String>,
    /// Login people mention to ask for a run (`@kiln …`, `/kiln …`); also
    /// Kiln's own account, whose comments never trigger runs.
    #[arg(long, env = "KILN_GITHUB_BOT_HANDLE", default_value = "kiln")]
    pub github_bot_handle: String,
    /// Issue label that asks for a run.
    #[arg(long, env = "KILN_GITHUB_LABEL", default_value = "kiln")]
    pub github_label: String,
    /// Subject that owns webhook-created runs (a token with this `sub` sees them).
    #[arg(long, env = "KILN_GITHUB_OWNER_SUB", default_value = "github")]
    pub github_owner_sub: String,
}

impl std::fmt::Debug for GithubArgs {
    // Never print the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GithubArgs")
            .field("github_webhook_secret", &self.github_webhook_secret.as_ref().map(|_| "<redacted>"))
            .field("github_bot_handle", &self.github_bot_handle)
            .field("github_label", &self.github_label)
            .field("github_owner_sub", &self.github_owner_sub)
            .finish()
    }
}

impl GithubArgs {
    /// The webhook configuration, or `None` when no secret is set.
    pub fn webhook_config(&self) -> anyhow::Result<Option<kiln_api::GithubWebhookConfig>> {
        let Some(secret) = &self.github_webhook_secret else {
            return Ok(None);
        };
        let config = kiln_api::GithubWebhookConfig::new(
            secret.as_bytes(),
            &self.github_bot_handle,
            &self.github_label,
            &self.github_owner_sub,
        )?;
        Ok(Some(config))
    }
}

#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// `openai` (Chat Completions; also vLLM, Ollama, llama.cpp), `openai-responses` or `anthropic`.
    #[arg(long, env = "KILN_MODEL_PROVIDER", default_value = "openai")]
    pub model_provider: String,
    /// Base URL of the provider's API (OpenAI style: up to `/v1`).
    #[arg(long, env = "KILN_MODEL_BASE_URL")]
    pub model_base_url: Option<String>,
    /// Model name sent to the provider.
    #[arg(long, env = "KILN_MODEL", default_value = "gpt-4o-mini")]
    pub model: String,
    /// Seconds to wait for the next bytes of a model response before the
    /// attempt fails and is retried.
    #[arg(long, env = "KILN_MODEL_READ_TIMEOUT_S", default_value_t = 300)]
    pub model_read_timeout_s: u64,
    /// Output token limit per model call.
    #[arg(long, env = "KILN_MODEL_MAX_TOKENS", default_value_t = 4096)]
    pub model_max_tokens: u32,
    /// The model's context window in tokens (a run's `model.context_window` overrides it).
    #[arg(long, env = "KILN_MODEL_CONTEXT_TOKENS", default_value_t = 128_000)]
    pub model_context_tokens: u32,
    /// Share of the context window a step's input may reach before older messages are summarised.
    #[arg(long, env = "KILN_COMPACTION_THRESHOLD", default_value_t = 0.8)]
    pub compaction_threshold: f64,
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub openai_api_key: Option<String>,
    #[arg(long, env = "ANTHROPIC_API_KEY", hide_env_values = true)]
    pub anthropic_api_key: Option<String>,
    /// Anthropic's base URL, when `KILN_MODEL_BASE_URL` names the OpenAI one.
    #[arg(long, env = "KILN_ANTHROPIC_BASE_URL")]
    pub anthropic_base_url: Option<String>,
    /// Local model (`KILN_MODEL_PROVIDER=local`, and `kiln up` with no model
    /// configured): a GGUF file to serve instead of the bundled SmolLM2-135M.
    #[arg(long, env = "KILN_LOCAL_MODEL")]
    pub local_model: Option<PathBuf>,
    /// Local model: port on 127.0.0.1 (default: a free one).
    #[arg(long, env = "KILN_LOCAL_MODEL_PORT")]
    pub local_model_port: Option<u16>,
    /// Local model: chat template. `kiln` (Kiln's tool-calling template for
    /// ChatML models), `model` (the GGUF file's own) or a Jinja file.
    #[arg(long, env = "KILN_LOCAL_MODEL_TEMPLATE", default_value = "kiln")]
    pub local_model_template: String,
    /// Local model: output token limit per model call.
    #[arg(long, env = "KILN_LOCAL_MODEL_MAX_TOKENS", default_value_t = crate::local_model::DEFAULT_MAX_TOKENS)]
    pub local_model_max_tokens: u32,
}

impl ModelArgs {
    pub fn provider(&self) -> anyhow::Result<ProviderKind> {
        ProviderKind::parse(&self.model_provider).with_context(|| {
            format!("KILN_MODEL_PROVIDER must be openai, openai-responses or anthropic, not {:?}", self.model_provider)
        })
    }

    /// True when the user configured a model of their own.
    pub fn is_configured(&self) -> bool {
        self.model_base_url.is_some() || self.openai_api_key.is_some() || self.anthropic_api_key.is_some()
    }

    /// `KILN_MODEL_PROVIDER=local`: Kiln serves a local model itself.
    pub fn is_local(&self) -> bool {
        self.model_provider == "local"
    }

    /// `KILN_MODEL_PROVIDER=scripted`: the scripted demo model (a fixed replay).
    pub fn is_scripted(&self) -> bool {
        self.model_provider == "scripted"
    }

    /// Where and what the local model serves, with its state under `state_dir`.
    pub fn local_model_options(&self, state_dir: &std::path::Path) -> crate::local_model::Options {
        crate::local_model::Options {
            model: self.local_model.clone(),
            template: crate::local_model::Template::parse(&self.local_model_template),
            port: self.local_model_port,
            ..crate::local_model::Options::new(state_dir)
        }
    }

    pub fn endpoints(&self) -> anyhow::Result<ProviderEndpoints> {
        let kind = self.provider()?;
        // KILN_MODEL_BASE_URL belongs to the selected provider.
        let (openai_base_url, anthropic_base_url) = match kind {
            ProviderKind::OpenAi | ProviderKind::OpenAiResponses => {
                (self.model_base_url.clone(), self.anthropic_base_url.clone())
            }
            ProviderKind::Anthropic => (None, self.model_base_url.clone().or(self.anthropic_base_url.clone())),
        };
        Ok(ProviderEndpoints {
            openai_base_url,
            openai_api_key: self.openai_api_key.clone().map(Into::into),
            anthropic_base_url,
            anthropic_api_key: self.anthropic_api_key.clone().map(Into::into),
            read_timeout: Some(std::time::Duration::from_secs(self.model_read_timeout_s.max(1))),
        })
    }
}

#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// Name of this worker in leases and container labels (default: host and pid).
    #[arg(long, env = "KILN_WORKER_ID")]
    pub worker_id: Option<String>,
    /// Sessions (runs, each with its sandbox) this worker drives at once; it
    /// claims runs only while it has a free slot.
    #[arg(long = "max-sessions", env = "KILN_WORKER_MAX_SESSIONS", default_value_t = 4)]
    pub concurrency: usize,
    /// Seconds a session's container stays after its last run ended, so a
    /// follow-up finds its workspace; 0 removes it when the run ends.
    #[arg(long, env = "KILN_SANDBOX_IDLE_S", default_value_t = 600)]
    pub sandbox_idle_s: u64,
    /// Started sandboxes kept ready for new sessions (default: 0, or 2 under `kiln up`).
    #[arg(long, env = "KILN_SANDBOX_WARM")]
    pub sandbox_warm: Option<usize>,
    /// Seconds a claim holds without a heartbeat.
    #[arg(long, env = "KILN_LEASE_S", default_value_t = 30)]
    pub lease_s: u64,
    /// Seconds between claim attempts when no notification arrives.
    #[arg(long, env = "KILN_POLL_S", default_value_t = 2)]
    pub poll_s: u64,
    /// Seconds running steps get to finish after SIGTERM.
    #[arg(long, env = "KILN_SHUTDOWN_GRACE_S", default_value_t = 30)]
    pub shutdown_grace_s: u64,
    /// Address for this worker's own `GET /metrics` (e.g. 0.0.0.0:9090);
    /// unset serves none. Under `kiln up` the API's `/metrics` already
    /// includes the worker.
    #[arg(long, env = "KILN_METRICS_LISTEN")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Sandbox image.
    #[arg(long, env = "KILN_SANDBOX_IMAGE", default_value = "kiln-sandbox:latest")]
    pub sandbox_image: String,
    /// Sandbox memory limit in MiB (no swap).
    #[arg(long, env = "KILN_SANDBOX_MEMORY_MB", default_value_t = 1024)]
    pub sandbox_memory_mb: i64,
    /// Sandbox CPU limit, in CPUs.
    #[arg(long, env = "KILN_SANDBOX_CPUS", default_value_t = 1.0)]
    pub sandbox_cpus: f64,
    /// Sandbox process limit.
    #[arg(long, env = "KILN_SANDBOX_PIDS", default_value_t = 256)]
    pub sandbox_pids: i64,
    /// Size of the sandbox's /tmp (a tmpfs), in MiB.
    #[arg(long, env = "KILN_SANDBOX_TMPFS_MB", default_value_t = 256)]
    pub sandbox_tmpfs_mb: u64,
    /// Open files per sandbox process (`nofile` ulimit).
    #[arg(long, env = "KILN_SANDBOX_NOFILE", default_value_t = 4096)]
    pub sandbox_nofile: i64,
    /// OCI runtime for sandboxes, e.g. `runsc` (gVisor); the engine's default otherwise.
    #[arg(long, env = "KILN_SANDBOX_RUNTIME")]
    pub sandbox_runtime: Option<String>,
    /// Let runs ask for `bridge` networking (`"sandbox": {"network": "bridge"}`); off: no run gets a network.
    #[arg(long, env = "KILN_SANDBOX_ALLOW_NETWORK", default_value_t = false)]
    pub sandbox_allow_network: bool,
    /// The kiln-toolbox binary copied into sandboxes; found next to `kiln` otherwise.
    #[arg(long, env = "KILN_TOOLBOX_PATH")]
    pub toolbox_path: Option<PathBuf>,
    /// JSON file of model prices (USD per million tokens); built-in defaults otherwise.
    #[arg(long, env = "KILN_PRICES_FILE")]
    pub prices_file: Option<PathBuf>,
    /// Days to keep the events of ended runs (all but the terminal event); 0 keeps them forever.
    #[arg(long, env = "KILN_EVENT_RETENTION_DAYS", default_value_t = 0)]
    pub event_retention_days: u64,
    /// Allow `file://` repository URLs (they read this host's disk).
    #[arg(long, env = "KILN_ALLOW_FILE_REPOS", default_value_t = false)]
    pub allow_file_repos: bool,
}

impl WorkerArgs {
    pub fn prices(&self) -> anyhow::Result<PriceTable> {
        match &self.prices_file {
            Some(path) => PriceTable::from_file(path).with_context(|| format!("reading {}", path.display())),
            None => Ok(PriceTable::default()),
        }
    }

    pub fn config(&self, model: &ModelArgs) -> anyhow::Result<WorkerConfig> {
        if self.concurrency == 0 {
            bail!("KILN_WORKER_MAX_SESSIONS must be at least 1");
        }
        if !(0.1..=1.0).contains(&model.compaction_threshold) {
            bail!("KILN_COMPACTION_THRESHOLD must be between 0.1 and 1");
        }
        if model.model_context_tokens < 1_000 {
            bail!("KILN_MODEL_CONTEXT_TOKENS must be at least 1000");
        }
        if self.lease_s < 3 {
            bail!("KILN_LEASE_S must be at least 3");
        }
        Ok(WorkerConfig {
            worker_id: self.worker_id.clone().unwrap_or_else(default_worker_id),
            concurrency: self.concurrency,
            sandbox_idle: Duration::from_secs(self.sandbox_idle_s),
            warm_pool: self.sandbox_warm.unwrap_or(0),
            lease: Duration::from_secs(self.lease_s),
            poll_interval: Duration::from_secs(self.poll_s.max(1)),
            sandbox: SandboxConfig {
                image: self.sandbox_image.clone(),
                memory_bytes: self.sandbox_memory_mb * 1024 * 1024,
                nano_cpus: (self.sandbox_cpus * 1e9) as i64,
                pids_limit: self.sandbox_pids,
                tmpfs_mb: self.sandbox_tmpfs_mb,
                nofile: self.sandbox_nofile,
                runtime: self.sandbox_runtime.clone(),
                allow_network: self.sandbox_allow_network,
                toolbox_path: self.toolbox_path.clone(),
                ..SandboxConfig::default()
            },
            default_provider: model.provider()?,
            default_model: model.model.clone(),
            default_max_tokens: model.model_max_tokens,
            context_window: model.model_context_tokens,
            compaction_threshold: model.compaction_threshold,
            allow_file_repos: self.allow_file_repos,
            shutdown_grace: Duration::from_secs(self.shutdown_grace_s),
            event_retention: (self.event_retention_days > 0)
                .then(|| Duration::from_secs(self.event_retention_days.saturating_mul(86_400))),
            // Set from `GithubDeliveryArgs` by the commands that deliver.
            github: None,
            // Set from `CallbackArgs` likewise.
            callbacks: None,
        })
    }
}

fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_owned()).unwrap_or_default();
    let host = if host.is_empty() { "worker".to_owned() } else { host };
    format!("{host}-{}-{:04x}", std::process::id(), rand::random::<u16>())
}

/// How a worker reports GitHub-triggered runs back to GitHub: a token, or a
/// GitHub App. Without either, such runs still run but nothing is reported.
#[derive(Clone, Args)]
pub struct GithubDeliveryArgs {
    /// GitHub's REST API (GitHub Enterprise: `https://HOST/api/v3`).
    #[arg(long, env = "KILN_GITHUB_API_URL", default_value = "https://api.github.com")]
    pub github_api_url: String,
    /// A token with contents, issues and pull requests read/write.
    #[arg(long, env = "KILN_GITHUB_TOKEN", hide_env_values = true)]
    pub github_token: Option<String>,
    /// The GitHub App's id (with KILN_GITHUB_APP_PRIVATE_KEY).
    #[arg(long, env = "KILN_GITHUB_APP_ID")]
    pub github_app_id: Option<String>,
    /// Path to the GitHub App's private key (PEM).
    #[arg(long, env = "KILN_GITHUB_APP_PRIVATE_KEY")]
    pub github_app_private_key: Option<PathBuf>,
    /// Where people reach this Kiln's API, to link runs from GitHub comments.
    #[arg(long, env = "KILN_PUBLIC_URL")]
    pub public_url: Option<String>,
}

impl std::fmt::Debug for GithubDeliveryArgs {
    // The token is a secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GithubDeliveryArgs")
            .field("github_api_url", &self.github_api_url)
            .field("github_app_id", &self.github_app_id)
            .finish_non_exhaustive()
    }
}

impl GithubDeliveryArgs {
    /// The worker's GitHub connection, or `None` when none is configured.
    pub fn github(&self) -> anyhow::Result<Option<kiln_worker::github::Github>> {
        use kiln_worker::github::{Credentials, Github, GithubSettings, RetryPolicy};
        let credentials = match (&self.github_token, &self.github_app_id, &self.github_app_private_key) {
            (Some(_), Some(_), _) => bail!("set either KILN_GITHUB_TOKEN or KILN_GITHUB_APP_ID, not both"),
            (Some(token), None, _) if token.trim().is_empty() => bail!("KILN_GITHUB_TOKEN is empty"),
            (Some(token), None, _) => Credentials::Token(token.trim().to_owned()),
            (None, Some(id), Some(path)) => {
                let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
                Credentials::app(id, &pem)?
            }
            (None, Some(_), None) => bail!("KILN_GITHUB_APP_ID needs KILN_GITHUB_APP_PRIVATE_KEY (a PEM file)"),
            (None, None, Some(_)) => bail!("KILN_GITHUB_APP_PRIVATE_KEY needs KILN_GITHUB_APP_ID"),
            (None, None, None) => return Ok(None),
        };
        let settings = GithubSettings {
            api_url: self.github_api_url.clone(),
            credentials,
            public_url: self.public_url.clone(),
            retry: RetryPolicy::default(),
            request_poll: Duration::from_secs(2),
        };
        Ok(Some(Github::new(settings)?))
    }
}

/// Completion callbacks (`callback_url` on a run). Both the API (which
/// refuses `callback_url` without a secret) and workers (which sign and
/// send) read these.
#[derive(Clone, Args)]
pub struct CallbackArgs {
    /// HMAC-SHA256 key callbacks are signed with (`X-Kiln-Signature-256`).
    /// Unset: runs naming a `callback_url` are refused with 422.
    #[arg(long, env = "KILN_CALLBACK_SECRET", hide_env_values = true)]
    pub callback_secret: Option<String>,
    /// Let callbacks reach loopback, private and link-local addresses (on-prem
    /// receivers, tests). Off: such targets are refused after DNS resolution.
    #[arg(long, env = "KILN_CALLBACK_ALLOW_PRIVATE", default_value_t = false)]
    pub callback_allow_private: bool,
    /// Attempts per callback, the first included (retried on connection
    /// errors, timeouts, 408, 429 and 5xx with exponential backoff).
    #[arg(long, env = "KILN_CALLBACK_MAX_ATTEMPTS", default_value_t = kiln_worker::callbacks::DEFAULT_MAX_ATTEMPTS)]
    pub callback_max_attempts: u32,
    /// Seconds one callback attempt may take.
    #[arg(long, env = "KILN_CALLBACK_TIMEOUT_S", default_value_t = 10)]
    pub callback_timeout_s: u64,
}

impl std::fmt::Debug for CallbackArgs {
    // Never print the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallbackArgs")
            .field("callback_secret", &self.callback_secret.as_ref().map(|_| "<redacted>"))
            .field("callback_allow_private", &self.callback_allow_private)
            .field("callback_max_attempts", &self.callback_max_attempts)
            .field("callback_timeout_s", &self.callback_timeout_s)
            .finish()
    }
}

impl CallbackArgs {
    /// The worker's callback settings, or `None` without a secret.
    pub fn settings(&self) -> anyhow::Result<Option<kiln_worker::callbacks::CallbackSettings>> {
        use kiln_worker::callbacks::{CallbackSecret, CallbackSettings};
        let Some(secret) = &self.callback_secret else { return Ok(None) };
        let secret = CallbackSecret::new(secret.as_bytes()).context("KILN_CALLBACK_SECRET is empty")?;
        if self.callback_max_attempts == 0 {
            bail!("KILN_CALLBACK_MAX_ATTEMPTS must be at least 1");
        }
        Ok(Some(CallbackSettings {
            allow_private: self.callback_allow_private,
            max_attempts: self.callback_max_attempts,
            timeout: Duration::from_secs(self.callback_timeout_s.max(1)),
            ..CallbackSettings::new(secret)
        }))
    }

    /// Whether the API may accept `callback_url` (a secret is set). An empty
    /// secret is a mistake, refused as the worker refuses it.
    pub fn enabled(&self) -> anyhow::Result<bool> {
        match self.callback_secret.as_deref() {
            None => Ok(false),
            Some("") => bail!("KILN_CALLBACK_SECRET is empty"),
            Some(_) => Ok(true),
        }
    }
}
