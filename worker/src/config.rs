//! What a worker needs to know, gathered by the `kiln` binary from the
//! environment.

use std::time::Duration;

use crate::sandbox::SandboxConfig;

// The model endpoints are part of what a worker is configured with; they
// are defined with the providers that use them.
pub use crate::providers::{ProviderEndpoints, Providers};

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
