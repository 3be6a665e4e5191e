//! Completion callbacks: the secret they are signed with and how they are sent.

use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use secrecy::{ExposeSecret, SecretString};

/// Completion callbacks (`callback_url` on a run). Both the API (which
/// refuses `callback_url` without a secret) and workers (which sign and
/// send) read these.
#[derive(Debug, Clone, Args)]
pub struct CallbackArgs {
    /// HMAC-SHA256 key callbacks are signed with (`X-Kiln-Signature-256`).
    /// Unset: runs naming a `callback_url` are refused with 422.
    #[arg(long, env = "KILN_CALLBACK_SECRET", hide_env_values = true)]
    pub callback_secret: Option<SecretString>,
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

impl CallbackArgs {
    /// The worker's callback settings, or `None` without a secret.
    pub fn settings(&self) -> anyhow::Result<Option<kiln_worker::callbacks::CallbackSettings>> {
        use kiln_worker::callbacks::{CallbackSecret, CallbackSettings};
        let Some(secret) = &self.callback_secret else { return Ok(None) };
        let secret = CallbackSecret::new(secret.expose_secret().as_bytes()).context("KILN_CALLBACK_SECRET is empty")?;
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

    /// The API's copy of the secret: it accepts `callback_url` only with one,
    /// and derives from it the key each subject verifies its callbacks with.
    /// An empty secret is a mistake, refused as the worker refuses it.
    pub fn secret(&self) -> anyhow::Result<Option<secrecy::SecretSlice<u8>>> {
        match self.callback_secret.as_ref().map(ExposeSecret::expose_secret) {
            None => Ok(None),
            Some("") => bail!("KILN_CALLBACK_SECRET is empty"),
            Some(secret) => Ok(Some(secret.as_bytes().to_vec().into())),
        }
    }
}
