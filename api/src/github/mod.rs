//! GitHub webhooks: checking a delivery is GitHub's ([`signature`]),
//! deciding whether it asks Kiln for a run ([`events`]), and writing that
//! run's prompt ([`prompt`]). The route itself is `routes::webhooks`.

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
        Ok(GithubWebhookConfig { secret, rules, owner: owner.to_owned() })
    }

    /// Also ignores comments by `login`, the account Kiln's GitHub token
    /// posts as when it is neither the handle nor a bot: Kiln's reports
    /// quote run text, and must never start a run of their own.
    pub fn posting_as(self, login: &str) -> Result<Self, GithubConfigError> {
        Ok(GithubWebhookConfig { rules: self.rules.posting_as(login)?, ..self })
    }
}
