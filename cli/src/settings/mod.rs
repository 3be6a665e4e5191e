//! Configuration from flags and the environment (clap's `env` feature: every
//! option can be set either way, and `--help` lists the variable). Secrets
//! are read from the environment and held as `secrecy` types, whose `Debug`
//! never prints them.
//!
//! [`ApiOptions`] and [`WorkerOptions`] gather what the API and a worker are
//! configured by, and turn it into the checked parts `crate::app::Kiln`
//! starts, the same way for `serve`, `worker` and `up`.

mod agents;
mod api;
mod auth;
mod callbacks;
mod db;
mod github;
mod model;
mod repos;
mod worker;

use clap::Args;

pub use agents::AgentArgs;
pub use api::ApiArgs;
pub use auth::AuthArgs;
pub use callbacks::CallbackArgs;
pub use db::DbArgs;
pub use github::{GithubArgs, GithubDeliveryArgs};
pub use model::{ModelArgs, ModelSource};
pub use repos::RepoArgs;
pub use worker::WorkerArgs;

use crate::app::{ApiParts, WorkerParts};

/// What the API is configured by, besides the database and the callback
/// settings it shares with workers.
#[derive(Debug, Clone, Args)]
pub struct ApiOptions {
    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(flatten)]
    pub api: ApiArgs,
    #[command(flatten)]
    pub github: GithubArgs,
}

impl ApiOptions {
    /// Checks every setting and builds what the API is started from.
    pub fn parts(&self, callbacks: &CallbackArgs, repos: &RepoArgs) -> anyhow::Result<ApiParts> {
        Ok(ApiParts {
            auth: self.auth.authenticator()?,
            settings: kiln_api::ApiSettings {
                callback_secret: callbacks.secret()?,
                repo_rules: repos.rules(),
                secrets_key: repos.secrets_key()?,
                agent_kinds: repos.agents.kinds()?,
                environment_images: repos.environment_images(&repos.api_sandbox_image)?,
                git_hosts: repos.git_hosts()?,
                ..self.api.settings()
            },
            github: self.github.webhook_config()?,
            listen: self.api.listen,
            metrics_listen: self.api.api_metrics_listen,
        })
    }
}

/// What a worker is configured by, besides the database and the callback
/// settings it shares with the API.
#[derive(Debug, Clone, Args)]
pub struct WorkerOptions {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub worker: WorkerArgs,
    #[command(flatten)]
    pub delivery: GithubDeliveryArgs,
}

impl WorkerOptions {
    /// Checks every setting and builds what a worker is started from.
    pub fn parts(&self, callbacks: &CallbackArgs, repos: &RepoArgs) -> anyhow::Result<WorkerParts> {
        let config = self.worker.config(&self.model)?;
        let config = kiln_worker::WorkerConfig {
            github: self.delivery.github()?,
            callbacks: callbacks.settings()?,
            repo_rules: repos.rules(),
            secrets_key: repos.secrets_key()?,
            subagents: kiln_worker::config::SubagentSettings { kinds: repos.agents.kinds()?, ..config.subagents },
            environment_images: repos.environment_images(&config.sandbox.image)?,
            git_credentials: repos.git_credentials()?,
            ..config
        };
        Ok(WorkerParts { config, endpoints: self.model.endpoints()?, prices: self.worker.prices()? })
    }
}
