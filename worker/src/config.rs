//! What a worker needs to know, gathered by the `kiln` binary from the
//! environment.

use std::time::Duration;

pub use crate::providers::kind::{ProviderKind, UnknownProvider};
use crate::sandbox::SandboxConfig;

// The model endpoints are part of what a worker is configured with; they
// are defined with the providers that use them.
pub use crate::providers::{ProviderEndpoints, Providers};

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
    /// How often to look for workers whose lock is free (they died) and hand
    /// their runs back at once (`KILN_DEAD_WORKER_CHECK_MS`); `None`: their
    /// runs wait for their leases to run out.
    pub dead_worker_check: Option<Duration>,
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
    /// Where repository URLs may lead (`KILN_ALLOW_PRIVATE_REPOS`,
    /// `KILN_ALLOW_GIT_PROTOCOLS`); the API checks the same at submission.
    pub repo_rules: kiln_protocol::repo_url::RepoRules,
    /// Largest checkout a run may bring into its sandbox, `.git` included,
    /// in MiB (`KILN_MAX_REPO_MB`).
    pub max_repo_mb: u64,
    /// A run's end claims the worker's next run in the same statement, and
    /// ends that meet share a statement (`handoff`, the store's end batch).
    /// Speed only: `false` ends each run on its own and leaves claiming to
    /// the claim loop, with the same results.
    pub claim_on_end: bool,
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
    /// Tool calls of one model message that run; the rest are answered
    /// with an error without running (`KILN_MAX_TOOL_CALLS_PER_STEP`).
    pub max_tool_calls_per_step: usize,
    /// Sub-agents: children at once, depth (`KILN_SUBAGENT_MAX_PARALLEL`, `KILN_SUBAGENT_MAX_DEPTH`).
    pub subagents: SubagentSettings,
    /// Bytes of events one run may store, over all its attempts; when they
    /// are spent the run fails (`KILN_MAX_EVENT_BYTES_PER_RUN`).
    pub max_event_bytes_per_run: u64,
    /// Largest patch of a run's change kept (`KILN_MAX_PATCH_MB`); a larger
    /// change keeps only its per-file summary, marked `too_large`.
    pub max_patch_bytes: u64,
    /// Ask providers to cache the prompt's stable prefix (Anthropic
    /// `cache_control` breakpoints, OpenAI `prompt_cache_key`); off for
    /// gateways that reject those fields (`KILN_PROMPT_CACHE`).
    pub prompt_cache: bool,
    /// The deployment's key for environment secrets (`KILN_SECRETS_KEY`);
    /// `None`: runs whose environment has secrets fail, saying so.
    pub secrets_key: Option<std::sync::Arc<kiln_store::secrets::SecretsKey>>,
    /// Bounds of the prepared-environment images on this worker's engine.
    pub environment_cache: crate::environment::cache::CacheBounds,
    /// Containers kept started from hot environments' prepared images
    /// (`KILN_ENVIRONMENT_WARM`, `KILN_ENVIRONMENT_WARM_MAX`).
    pub environment_warm: crate::sandbox::environment_pools::WarmSettings,
    /// The MCP servers runs may use (`KILN_MCP_SERVERS`); none by default.
    pub mcp: std::sync::Arc<crate::mcp::McpConfig>,
    /// The images an environment may start from (`KILN_ENVIRONMENT_IMAGES`;
    /// the sandbox image by default), checked again here for repository
    /// files and environments stored before the rule.
    pub environment_images: std::sync::Arc<kiln_protocol::image_name::ImagePatterns>,
    /// Credentials for `deliver.git` remotes, by host
    /// (`KILN_GIT_CREDENTIALS`); a host not listed is never pushed to.
    pub git_credentials: std::sync::Arc<crate::git_delivery::credentials::GitCredentials>,
    /// How a failed `deliver.git` push is retried
    /// (`KILN_GIT_DELIVERY_ATTEMPTS`, `KILN_GIT_DELIVERY_RETRY_S`).
    pub git_delivery: crate::git_delivery::GitDeliverySettings,
}

/// Default of [`WorkerConfig::dead_worker_check`].
pub const DEFAULT_DEAD_WORKER_CHECK: Duration = Duration::from_secs(1);
/// Default of [`WorkerConfig::max_tool_calls_per_step`].
pub const DEFAULT_MAX_TOOL_CALLS_PER_STEP: usize = 64;
/// Default of `KILN_MAX_PATCH_MB` ([`WorkerConfig::max_patch_bytes`]).
pub const DEFAULT_MAX_PATCH_MB: u64 = 20;
/// Default of [`WorkerConfig::max_event_bytes_per_run`]: 64 MiB.
pub const DEFAULT_MAX_EVENT_BYTES_PER_RUN: u64 = 64 * 1024 * 1024;
impl WorkerConfig {
    /// How this worker clones a run's repository.
    pub fn clone_settings(&self) -> crate::sandbox::repo_clone::CloneSettings {
        crate::sandbox::repo_clone::CloneSettings {
            rules: self.repo_rules,
            allow_file: self.allow_file_repos,
            max_bytes: self.max_repo_mb.saturating_mul(1024 * 1024),
        }
    }
}

/// `KILN_MAX_REPO_MB`'s default: a large monorepo fits, a zip bomb does not.
pub const DEFAULT_MAX_REPO_MB: u64 = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provider_kind_parses_back_from_its_name_and_nothing_else_parses() {
        for kind in ProviderKind::ALL {
            assert_eq!(kind.name().parse(), Ok(kind));
            assert_eq!(kind.to_string(), kind.name());
        }
        assert_eq!("local".parse::<ProviderKind>(), Err(UnknownProvider("local".into())));
        assert!("OpenAI".parse::<ProviderKind>().is_err());
    }

    /// What the API accepts as a run's `model.provider` (and documents as
    /// its enum) is exactly what the worker can serve.
    #[test]
    fn the_api_accepts_exactly_the_providers_the_worker_serves() {
        let served: Vec<&str> = ProviderKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(kiln_protocol::input::MODEL_PROVIDER.0, served.as_slice());
    }
}

/// The deployment's sub-agent settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SubagentSettings {
    /// Children of one run (its whole tree) that run at once; more wait.
    pub max_parallel: usize,
    /// How deep the tree may go: 1 lets the main run start children, which
    /// cannot start their own.
    pub max_depth: u32,
    /// The kinds a `task` call may start (`KILN_AGENT_KINDS` and the
    /// built-in ones); a run's `agents` narrows them.
    pub kinds: std::sync::Arc<kiln_protocol::agents::AgentKinds>,
}

/// Default of [`SubagentSettings::max_parallel`].
pub const DEFAULT_SUBAGENT_MAX_PARALLEL: usize = 4;
/// Default of [`SubagentSettings::max_depth`].
pub const DEFAULT_SUBAGENT_MAX_DEPTH: u32 = 1;

impl Default for SubagentSettings {
    fn default() -> Self {
        SubagentSettings {
            max_parallel: DEFAULT_SUBAGENT_MAX_PARALLEL,
            max_depth: DEFAULT_SUBAGENT_MAX_DEPTH,
            kinds: Default::default(),
        }
    }
}
