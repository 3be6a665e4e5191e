//! How the API checks bearer tokens.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use kiln_api::Algorithm;
use secrecy::{ExposeSecret, SecretString};

#[derive(Debug, Clone, Args)]
pub struct AuthArgs {
    /// HS256 secret for bearer tokens (at least 32 bytes).
    #[arg(long, env = "KILN_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<SecretString>,
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
    /// Key for stream tokens (`?access_token=` on the events route), at least
    /// 32 bytes. Unset: derived from KILN_JWT_SECRET; with a public key, a
    /// random key per process (set this when several API replicas serve).
    #[arg(long, env = "KILN_STREAM_TOKEN_SECRET", hide_env_values = true)]
    pub stream_token_secret: Option<SecretString>,
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
            (None, Some(secret)) => {
                kiln_api::AuthConfig::Hs256 { secret: secret.expose_secret().as_bytes().to_vec().into() }
            }
            (None, None) => bail!("set KILN_JWT_SECRET (HS256) or KILN_JWT_PUBLIC_KEY"),
        };
        let auth = kiln_api::Authenticator::new(&config, self.jwt_issuer.as_deref(), self.jwt_audience.as_deref())?;
        match &self.stream_token_secret {
            Some(key) => Ok(auth.with_stream_key(key.expose_secret().as_bytes())?),
            None => {
                if self.jwt_public_key.is_some() {
                    tracing::warn!(
                        "KILN_STREAM_TOKEN_SECRET is unset: stream tokens are checked only by the API process \
                         that minted them; set it when several API replicas serve"
                    );
                }
                Ok(auth)
            }
        }
    }
}
