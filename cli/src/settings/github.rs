//! GitHub: the webhooks the API takes, and how a worker reports back.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use secrecy::{ExposeSecret, SecretString};

/// GitHub webhooks. The route is disabled unless a secret is set.
#[derive(Debug, Clone, Args)]
pub struct GithubArgs {
    /// Secret of the GitHub webhook (the hook's "Secret" field). Unset: the
    /// webhook route refuses every delivery.
    #[arg(long, env = "KILN_GITHUB_WEBHOOK_SECRET", hide_env_values = true)]
    pub github_webhook_secret: Option<SecretString>,
    /// Login people mention to ask for a run (`@kiln …`, `/kiln …`); also
    /// Kiln's own account, whose comments never trigger runs.
    #[arg(long, env = "KILN_GITHUB_BOT_HANDLE", default_value = "kiln")]
    pub github_bot_handle: String,
    /// Login of the account the workers' KILN_GITHUB_TOKEN posts as, when
    /// that is a person or machine user other than the handle: its comments
    /// never trigger runs. (An App's `handle[bot]` is recognised already.)
    #[arg(long, env = "KILN_GITHUB_BOT_LOGIN")]
    pub github_bot_login: Option<String>,
    /// Issue label that asks for a run.
    #[arg(long, env = "KILN_GITHUB_LABEL", default_value = "kiln")]
    pub github_label: String,
    /// Subject that owns webhook-created runs (a token with this `sub` sees them).
    #[arg(long, env = "KILN_GITHUB_OWNER_SUB", default_value = "github")]
    pub github_owner_sub: String,
    /// Environments for GitHub runs, per repository: `owner/repo=name`
    /// pairs separated by commas, each naming an environment of the owner
    /// subject (KILN_GITHUB_OWNER_SUB). A repository not listed uses its
    /// `.kiln/environment.toml`, if any.
    #[arg(long, env = "KILN_GITHUB_ENVIRONMENTS", default_value = "")]
    pub github_environments: String,
    /// A group of attempts asked for on GitHub (`/kiln --attempts N`)
    /// opens its pull request at once with the first attempt to succeed,
    /// instead of commenting a summary and waiting for `/kiln select K`.
    #[arg(long, env = "KILN_GITHUB_ATTEMPTS_TAKE_FIRST", default_value_t = false, action = clap::ArgAction::Set)]
    pub github_attempts_take_first: bool,
}

impl GithubArgs {
    /// The webhook configuration, or `None` when no secret is set.
    pub fn webhook_config(&self) -> anyhow::Result<Option<kiln_api::GithubWebhookConfig>> {
        let Some(secret) = &self.github_webhook_secret else {
            return Ok(None);
        };
        let config = kiln_api::GithubWebhookConfig::new(
            secret.expose_secret().as_bytes(),
            &self.github_bot_handle,
            &self.github_label,
            &self.github_owner_sub,
        )?;
        let config = match &self.github_bot_login {
            Some(login) => config.posting_as(login)?,
            None => config,
        };
        let environments = kiln_api::github::RepositoryEnvironments::parse(&self.github_environments)?;
        Ok(Some(config.with_environments(environments).taking_first_success(self.github_attempts_take_first)))
    }
}

/// How a worker reports GitHub-triggered runs back to GitHub: a token, or a
/// GitHub App. Without either, such runs still run but nothing is reported.
#[derive(Debug, Clone, Args)]
pub struct GithubDeliveryArgs {
    /// GitHub's REST API (GitHub Enterprise: `https://HOST/api/v3`).
    #[arg(long, env = "KILN_GITHUB_API_URL", default_value = "https://api.github.com")]
    pub github_api_url: String,
    /// Where GitHub serves the repositories (git and web), the only host the
    /// token is sent to for git. Default: from KILN_GITHUB_API_URL
    /// (`api.github.com` → `https://github.com`, `HOST/api/v3` → `HOST`).
    #[arg(long, env = "KILN_GITHUB_WEB_URL")]
    pub github_web_url: Option<String>,
    /// The least access to the repository (write, maintain or admin) the
    /// person who asked must have for a run to be worked on; checked through
    /// GitHub's API before any work.
    #[arg(long, env = "KILN_GITHUB_MIN_PERMISSION", default_value = "write")]
    pub github_min_permission: String,
    /// Open pull requests as drafts.
    #[arg(long, env = "KILN_GITHUB_DRAFT_PULL_REQUESTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub github_draft_pull_requests: bool,
    /// Push changes under `.github/` (workflows, which run with the
    /// repository's secrets). Off: such runs comment instead of pushing.
    #[arg(long, env = "KILN_GITHUB_ALLOW_WORKFLOW_CHANGES", default_value_t = false)]
    pub github_allow_workflow_changes: bool,
    /// A token with contents, issues and pull requests read/write.
    #[arg(long, env = "KILN_GITHUB_TOKEN", hide_env_values = true)]
    pub github_token: Option<SecretString>,
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

impl GithubDeliveryArgs {
    /// The worker's GitHub connection, or `None` when none is configured.
    pub fn github(&self) -> anyhow::Result<Option<kiln_worker::github::Github>> {
        use kiln_worker::github::{
            Credentials, DeliveryPolicy, Github, GithubSettings, Permission, RetryPolicy, web_url_for,
        };
        let token = self.github_token.as_ref().map(|t| t.expose_secret().trim());
        let credentials = match (token, &self.github_app_id, &self.github_app_private_key) {
            (Some(_), Some(_), _) => bail!("set either KILN_GITHUB_TOKEN or KILN_GITHUB_APP_ID, not both"),
            (Some(""), None, _) => bail!("KILN_GITHUB_TOKEN is empty"),
            (Some(token), None, _) => Credentials::Token(token.into()),
            (None, Some(id), Some(path)) => {
                let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
                Credentials::app(id, &pem)?
            }
            (None, Some(_), None) => bail!("KILN_GITHUB_APP_ID needs KILN_GITHUB_APP_PRIVATE_KEY (a PEM file)"),
            (None, None, Some(_)) => bail!("KILN_GITHUB_APP_PRIVATE_KEY needs KILN_GITHUB_APP_ID"),
            (None, None, None) => return Ok(None),
        };
        let policy = DeliveryPolicy {
            min_permission: Permission::parse(&self.github_min_permission)?,
            draft_pull_requests: self.github_draft_pull_requests,
            allow_workflow_changes: self.github_allow_workflow_changes,
        };
        let web_url = match &self.github_web_url {
            Some(url) if !(url.starts_with("https://") || url.starts_with("http://")) => {
                bail!("KILN_GITHUB_WEB_URL must be an http(s) URL, not {url:?}")
            }
            Some(url) => url.clone(),
            None => web_url_for(&self.github_api_url),
        };
        let settings = GithubSettings {
            api_url: self.github_api_url.clone(),
            web_url,
            credentials,
            public_url: self.public_url.clone(),
            retry: RetryPolicy::default(),
            request_poll: Duration::from_secs(2),
            policy,
        };
        Ok(Some(Github::new(settings)?))
    }
}
