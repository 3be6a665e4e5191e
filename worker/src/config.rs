//! What a worker needs to know, gathered by the `kiln` binary from the
//! environment.

use std::sync::Arc;
use std::time::Duration;

use crate::providers::ModelProvider;
use crate::providers::anthropic::Anthropic;
use crate::providers::openai_chat::OpenAiChat;
use crate::providers::openai_responses::OpenAiResponses;
use crate::sandbox::SandboxConfig;
use secrecy::{ExposeSecret, SecretString};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    /// OpenAI Chat Completions (and compatible servers).
    OpenAi,
    /// The OpenAI Responses API, at the same base URL and key as `OpenAi`.
    OpenAiResponses,
    Anthropic,
}

impl ProviderKind {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "openai" => Some(ProviderKind::OpenAi),
            "openai-responses" => Some(ProviderKind::OpenAiResponses),
            "anthropic" => Some(ProviderKind::Anthropic),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Names this process in leases and container labels.
    pub worker_id: String,
    /// Sessions (runs, each with its sandbox) driven at once: the worker
    /// claims only while it has a free slot (`KILN_WORKER_MAX_SESSIONS`).
    pub concurrency: usize,
    /// How long a session's container stays after its last run ended, for
    /// follow-ups; zero: removed when the run ends.
    pub sandbox_idle: Duration,
    /// Started containers kept ready for new sessions.
    pub warm_pool: usize,
    /// How long a claim holds without a heartbeat.
    pub lease: Duration,
    /// Claim attempts without a notification (covers missed NOTIFYs).
    pub poll_interval: Duration,
    pub sandbox: SandboxConfig,
    pub default_provider: ProviderKind,
    pub default_model: String,
    pub default_max_tokens: u32,
    /// The model's context window in tokens (a run may name its own).
    pub context_window: u32,
    /// Share of the context window a step's input may reach before the
    /// older conversation is compacted.
    pub compaction_threshold: f64,
    /// Allow `file://` repository URLs (they read the worker's own disk).
    pub allow_file_repos: bool,
    /// How long running steps may take to finish after SIGTERM.
    pub shutdown_grace: Duration,
    /// Prune the events of runs that ended longer ago than this (all but the
    /// terminal event); `None` keeps them forever.
    pub event_retention: Option<Duration>,
    /// Reporting GitHub-triggered runs back to GitHub; `None`: such runs
    /// clone anonymously and nothing is reported.
    pub github: Option<crate::github::Github>,
    /// Delivering completion callbacks (`callback_url`); `None`: this worker
    /// leaves them to workers with `KILN_CALLBACK_SECRET`.
    pub callbacks: Option<crate::callbacks::CallbackSettings>,
}

impl WorkerConfig {
    pub fn heartbeat_interval(&self) -> Duration {
        self.lease / 3
    }
}

/// The model endpoints a worker can reach, built once.
#[derive(Clone)]
pub struct Providers {
    pub openai: Arc<dyn ModelProvider>,
    pub responses: Arc<dyn ModelProvider>,
    pub anthropic: Arc<dyn ModelProvider>,
}

/// Where each provider is and the keys for it. Keys are only ever sent to
/// these configured URLs, never to one named in a run.
#[derive(Debug, Clone, Default)]
pub struct ProviderEndpoints {
    pub openai_base_url: Option<String>,
    pub openai_api_key: Option<SecretString>,
    pub anthropic_base_url: Option<String>,
    pub anthropic_api_key: Option<SecretString>,
    /// Longest wait for the next bytes of a model response (the first
    /// included); a model that stalls longer fails the attempt, which is
    /// retried. `None`: [`DEFAULT_MODEL_READ_TIMEOUT`].
    pub read_timeout: Option<Duration>,
}

/// Default of [`ProviderEndpoints::read_timeout`]: long enough for a slow
/// local model reading a long prompt, short enough to notice a dead stream.
pub const DEFAULT_MODEL_READ_TIMEOUT: Duration = Duration::from_secs(300);

impl Providers {
    pub fn new(endpoints: ProviderEndpoints) -> Result<Self, reqwest::Error> {
        // reqwest is built without a TLS backend of its own choosing; make
        // sure one is installed (a no-op when the binary already did).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            // Between two chunks of a stream; a stalled stream fails and is retried.
            .read_timeout(endpoints.read_timeout.unwrap_or(DEFAULT_MODEL_READ_TIMEOUT))
            .build()?;
        let openai_base_url = endpoints.openai_base_url.unwrap_or_else(|| "https://api.openai.com/v1".into());
        let expose = |key: &Option<SecretString>| key.as_ref().map(|k| k.expose_secret().to_owned());
        let openai = OpenAiChat::new(client.clone(), openai_base_url.clone(), expose(&endpoints.openai_api_key));
        let responses = OpenAiResponses::new(client.clone(), openai_base_url, expose(&endpoints.openai_api_key));
        let mut anthropic = Anthropic::new(client, expose(&endpoints.anthropic_api_key));
        if let Some(url) = endpoints.anthropic_base_url {
            anthropic = anthropic.with_base_url(url);
        }
        Ok(Providers { openai: Arc::new(openai), responses: Arc::new(responses), anthropic: Arc::new(anthropic) })
    }

    pub fn get(&self, kind: ProviderKind) -> Arc<dyn ModelProvider> {
        match kind {
            ProviderKind::OpenAi => self.openai.clone(),
            ProviderKind::OpenAiResponses => self.responses.clone(),
            ProviderKind::Anthropic => self.anthropic.clone(),
        }
    }
}
