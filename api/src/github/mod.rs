//! GitHub webhooks: checking a delivery is GitHub's ([`signature`]),
//! deciding whether it asks Kiln for a run ([`events`]), and writing that
//! run's prompt ([`prompt`]). The route itself is `routes::webhooks`.

pub mod command;
pub mod events;
pub mod prompt;
pub mod signature;

pub use events::TriggerRules;
pub use signature::{SignatureError, WebhookSecret};

/// Longest accepted owner subject, as for a token's `sub`.
const MAX_OWNER_BYTES: usize = 256;

/// How this server takes GitHub webhooks. Without one, the webhook route
/// refuses every delivery.
#[derive(Debug, Clone)]
pub struct GithubWebhookConfig {
    pub secret: WebhookSecret,
    pub rules: TriggerRules,
    /// The subject that owns webhook-created runs: a token with this `sub`
    /// sees them through the runs API.
    pub owner: String,
    /// The environment (of `owner`) each repository's runs get.
    pub environments: RepositoryEnvironments,
    /// A group of attempts asked for on GitHub takes its first attempt to
    /// succeed and opens its pull request at once, rather than waiting for
    /// a choice (`KILN_GITHUB_ATTEMPTS_TAKE_FIRST`).
    pub take_first_success: bool,
}

/// `KILN_GITHUB_ENVIRONMENTS`: which of the GitHub owner subject's
/// environments a repository's runs are prepared with. A repository not
/// listed gets its own `.kiln/environment.toml`, if it has one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepositoryEnvironments {
    /// Repository full name, lower-cased (GitHub's names are not case
    /// sensitive) → environment name.
    by_repo: std::collections::BTreeMap<String, String>,
}

impl RepositoryEnvironments {
    /// Reads `owner/repo=environment` pairs separated by commas (spaces
    /// around either are ignored; an empty text is no mapping).
    pub fn parse(text: &str) -> Result<Self, GithubConfigError> {
        let mut by_repo = std::collections::BTreeMap::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = || GithubConfigError::Environments(pair.to_owned());
            let (repo, name) = pair.split_once('=').ok_or_else(bad)?;
            let (repo, name) = (repo.trim(), name.trim());
            let repo_ok = repo.split_once('/').is_some_and(|(owner, rest)| {
                let part = |s: &str| {
                    !s.is_empty()
                        && s.len() <= 100
                        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
                };
                part(owner) && part(rest)
            });
            if !repo_ok || !kiln_protocol::input::ENVIRONMENT_NAME.accepts(name) {
                return Err(bad());
            }
            if by_repo.insert(repo.to_ascii_lowercase(), name.to_owned()).is_some() {
                return Err(GithubConfigError::Environments(format!("{repo} is named twice")));
            }
        }
        Ok(RepositoryEnvironments { by_repo })
    }

    /// The environment runs of `repo_full_name` get, if one is set.
    pub fn of(&self, repo_full_name: &str) -> Option<&str> {
        self.by_repo.get(&repo_full_name.to_ascii_lowercase()).map(String::as_str)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GithubConfigError {
    #[error("KILN_GITHUB_WEBHOOK_SECRET must not be empty")]
    EmptySecret,
    #[error("KILN_GITHUB_BOT_HANDLE must be a GitHub login (letters, digits and hyphens), not {0:?}")]
    Handle(String),
    #[error("KILN_GITHUB_BOT_LOGIN must be a GitHub login (letters, digits and hyphens), not {0:?}")]
    BotLogin(String),
    #[error("KILN_GITHUB_LABEL must be 1 to 50 characters without control characters, not {0:?}")]
    Label(String),
    #[error("KILN_GITHUB_OWNER_SUB must be 1 to {MAX_OWNER_BYTES} bytes")]
    Owner,
    #[error(
        "KILN_GITHUB_ENVIRONMENTS must be comma-separated owner/repo=environment pairs (an environment name is \
         lower-case letters, digits, '.', '_' or '-'), each repository once; not {0:?}"
    )]
    Environments(String),
}

impl GithubWebhookConfig {
    /// `bot_handle` is the login people mention (`@kiln`, a leading `@` is
    /// dropped); `label` the issue label that asks for a run; `owner` the
    /// subject that owns the runs.
    pub fn new(secret: &[u8], bot_handle: &str, label: &str, owner: &str) -> Result<Self, GithubConfigError> {
        let secret = WebhookSecret::new(secret).map_err(|_| GithubConfigError::EmptySecret)?;
        let rules = TriggerRules::new(bot_handle, label)?;
        if owner.is_empty() || owner.len() > MAX_OWNER_BYTES {
            return Err(GithubConfigError::Owner);
        }
        Ok(GithubWebhookConfig {
            secret,
            rules,
            owner: owner.to_owned(),
            environments: Default::default(),
            take_first_success: false,
        })
    }

    /// Runs of the repositories in `environments` get those environments.
    pub fn with_environments(self, environments: RepositoryEnvironments) -> Self {
        GithubWebhookConfig { environments, ..self }
    }

    /// Groups of attempts take their first attempt to succeed (`true`) or
    /// wait for a choice (`false`, the default).
    pub fn taking_first_success(self, take_first_success: bool) -> Self {
        GithubWebhookConfig { take_first_success, ..self }
    }

    /// Also ignores comments by `login`, the account Kiln's GitHub token
    /// posts as when it is neither the handle nor a bot: Kiln's reports
    /// quote run text, and must never start a run of their own.
    pub fn posting_as(self, login: &str) -> Result<Self, GithubConfigError> {
        Ok(GithubWebhookConfig { rules: self.rules.posting_as(login)?, ..self })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_environments_are_pairs_and_repositories_match_in_any_case() {
        let map = RepositoryEnvironments::parse(" acme/widget=node , Acme/API.v2 = py-3.12 ").unwrap();
        assert_eq!(map.of("ACME/Widget"), Some("node"));
        assert_eq!(map.of("acme/api.v2"), Some("py-3.12"));
        assert_eq!(map.of("acme/other"), None);
        assert_eq!(RepositoryEnvironments::parse("").unwrap(), RepositoryEnvironments::default());
        for bad in ["acme/widget", "widget=node", "acme/widget=Node", "a/b/c=x", "acme/w=x,ACME/W=y", "a b/c=x"] {
            assert!(RepositoryEnvironments::parse(bad).is_err(), "{bad}");
        }
    }
}
