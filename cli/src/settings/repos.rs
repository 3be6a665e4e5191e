//! Where a run's repository may be cloned from. Both the API (which refuses
//! at submission what it can tell without DNS) and workers (which check
//! again after resolving the host) read these.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use kiln_protocol::image_name::ImagePatterns;
use kiln_protocol::repo_url::RepoRules;
use kiln_store::secrets::SecretsKey;
use kiln_worker::git_delivery::credentials::GitCredentials;
use secrecy::{ExposeSecret, SecretString};

#[derive(Debug, Clone, Args)]
pub struct RepoArgs {
    /// Let repository URLs reach loopback, private, link-local and reserved
    /// addresses (an internal git server, tests). Off: refused at submission
    /// for a literal address, by the worker after DNS for a host name.
    #[arg(long, env = "KILN_ALLOW_PRIVATE_REPOS", default_value_t = false)]
    pub allow_private_repos: bool,
    /// Let repository URLs use `git://` and ssh (`ssh://`, `user@host:path`).
    /// Off: https and http only (and file:// where KILN_ALLOW_FILE_REPOS).
    #[arg(long, env = "KILN_ALLOW_GIT_PROTOCOLS", default_value_t = false)]
    pub allow_git_protocols: bool,
    /// Key that environment secrets are encrypted with at rest: 64 hex
    /// digits (`openssl rand -hex 32`), the same on the API and every
    /// worker. Unset: environments with secrets are refused (422), and a
    /// worker fails runs whose environment has some.
    #[arg(long, env = "KILN_SECRETS_KEY", hide_env_values = true)]
    pub secrets_key: Option<SecretString>,
    /// The images an environment (API or a repository's
    /// `.kiln/environment.toml`) may start from, comma-separated:
    /// `repository[:tag]` or `repository@digest`, a trailing `*` matching
    /// any rest (`node:*`, `ghcr.io/acme/*`). Image ids, id prefixes and
    /// Kiln's own images (`kiln-env:*`) are refused whatever this says.
    /// Unset: the sandbox image (KILN_SANDBOX_IMAGE) only.
    #[arg(long, env = "KILN_ENVIRONMENT_IMAGES")]
    pub environment_images: Option<String>,
    /// The sandbox image as the API reads it: the default of
    /// KILN_ENVIRONMENT_IMAGES (a worker uses its own --sandbox-image).
    #[arg(long = "api-sandbox-image", hide = true, env = "KILN_SANDBOX_IMAGE", default_value = "kiln-sandbox:latest")]
    pub api_sandbox_image: String,
    /// JSON file of credentials for `deliver.git` remotes, by host
    /// (`{"git.example.com": {"username": "…", "token": "…"}}`; a key is
    /// `host:port` for a port other than the scheme's). A worker pushes only
    /// to a host listed; an API given the file too refuses a run naming
    /// another host at submission (422). See README, "Delivering to git".
    #[arg(long, env = "KILN_GIT_CREDENTIALS")]
    pub git_credentials: Option<PathBuf>,
    /// Read by both too (kept here so that `up`, which has both, parses it once).
    #[command(flatten)]
    pub agents: super::AgentArgs,
}

impl RepoArgs {
    pub fn rules(&self) -> RepoRules {
        RepoRules { allow_private: self.allow_private_repos, allow_git_protocols: self.allow_git_protocols }
    }

    /// The images environments may start from; `sandbox_image` when
    /// KILN_ENVIRONMENT_IMAGES is unset.
    pub fn environment_images(&self, sandbox_image: &str) -> anyhow::Result<Arc<ImagePatterns>> {
        let list = self.environment_images.as_deref().unwrap_or(sandbox_image);
        let patterns = ImagePatterns::parse(list).map_err(|e| anyhow::anyhow!("KILN_ENVIRONMENT_IMAGES: {e}"))?;
        Ok(Arc::new(patterns))
    }

    /// The `deliver.git` credentials (none without KILN_GIT_CREDENTIALS).
    pub fn git_credentials(&self) -> anyhow::Result<Arc<GitCredentials>> {
        Ok(Arc::new(match &self.git_credentials {
            Some(path) => GitCredentials::load(path)?,
            None => GitCredentials::default(),
        }))
    }

    /// The hosts `deliver.git` may push to, as the API checks them; `None`
    /// when this process was not given the credentials file.
    pub fn git_hosts(&self) -> anyhow::Result<Option<Arc<BTreeSet<String>>>> {
        if self.git_credentials.is_none() {
            return Ok(None);
        }
        Ok(Some(Arc::new(self.git_credentials()?.hosts().map(str::to_owned).collect())))
    }

    /// The environment secrets' key, checked.
    pub fn secrets_key(&self) -> anyhow::Result<Option<Arc<SecretsKey>>> {
        let Some(text) = &self.secrets_key else { return Ok(None) };
        let key = SecretsKey::from_hex(text.expose_secret()).context("KILN_SECRETS_KEY")?;
        Ok(Some(Arc::new(key)))
    }
}
