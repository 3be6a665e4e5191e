//! Credentials for GitHub: a fixed token, or a GitHub App whose short-lived
//! installation tokens are minted on demand and cached until shortly before
//! they expire.

use std::collections::HashMap;

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use secrecy::{ExposeSecret, SecretString};
use serde::Serialize;
use tokio::sync::Mutex;

use super::GithubError;
use super::client::GithubClient;

/// Renew an installation token this long before GitHub expires it, so a
/// push that starts with it does not outlive it.
const RENEW_BEFORE_MIN: i64 = 5;

/// How Kiln authenticates to GitHub. Its `Debug` prints no secret (the
/// token is a `SecretString`; `EncodingKey` hides its key itself).
#[derive(Debug, Clone)]
pub enum Credentials {
    /// A personal access or installation token (`KILN_GITHUB_TOKEN`).
    Token(SecretString),
    /// A GitHub App (`KILN_GITHUB_APP_ID` and its private key, PEM).
    App { app_id: String, key: EncodingKey },
}

impl Credentials {
    /// An App from its id and PEM private key; checks the key parses.
    pub fn app(app_id: &str, pem: &[u8]) -> Result<Self, GithubError> {
        if app_id.trim().is_empty() {
            return Err(GithubError::Config("the GitHub App id is empty".into()));
        }
        let key = EncodingKey::from_rsa_pem(pem)
            .map_err(|e| GithubError::Config(format!("the GitHub App private key is not an RSA PEM key: {e}")))?;
        Ok(Credentials::App { app_id: app_id.trim().to_owned(), key })
    }
}

#[derive(Serialize)]
struct AppClaims<'a> {
    iat: i64,
    exp: i64,
    iss: &'a str,
}

/// An installation token and when it expires.
type Minted = (SecretString, DateTime<Utc>);

/// Hands out tokens, caching App installation tokens.
#[derive(Debug)]
pub struct Auth {
    credentials: Credentials,
    /// By installation and repository `owner/name`: each token is scoped to
    /// one repository.
    cache: Mutex<HashMap<(i64, String), Minted>>,
}

impl Auth {
    pub fn new(credentials: Credentials) -> Self {
        Auth { credentials, cache: Mutex::default() }
    }

    /// A token for acting on `repo` (`owner/name`) of `installation` (the
    /// webhook's; both ignored with a fixed token, which cannot be scoped).
    pub async fn token(
        &self,
        client: &GithubClient,
        installation: Option<i64>,
        repo: &str,
    ) -> Result<String, GithubError> {
        let (app_id, key) = match &self.credentials {
            Credentials::Token(t) => return Ok(t.expose_secret().to_owned()),
            Credentials::App { app_id, key } => (app_id, key),
        };
        let installation = installation.ok_or_else(|| {
            GithubError::Config(
                "the webhook named no GitHub App installation; set KILN_GITHUB_TOKEN for plain webhooks".into(),
            )
        })?;
        super::policy::check_full_name(repo)?;
        let name = repo.split_once('/').map_or(repo, |(_, name)| name);
        let cache_key = (installation, repo.to_ascii_lowercase());
        // Held across the exchange so concurrent runs mint one token.
        let mut cache = self.cache.lock().await;
        if let Some((token, expires)) = cache.get(&cache_key)
            && *expires - ChronoDuration::minutes(RENEW_BEFORE_MIN) > Utc::now()
        {
            return Ok(token.expose_secret().to_owned());
        }
        let jwt = app_jwt(app_id, key)?;
        let minted = client.installation_token(&jwt, installation, name).await?;
        cache.insert(cache_key, (minted.token.as_str().into(), minted.expires_at));
        Ok(minted.token)
    }
}

impl Auth {
    /// Every token this process holds, to scrub from messages.
    pub async fn secrets(&self) -> Vec<String> {
        let mut out: Vec<String> =
            self.cache.lock().await.values().map(|(t, _)| t.expose_secret().to_owned()).collect();
        if let Credentials::Token(t) = &self.credentials {
            out.push(t.expose_secret().to_owned());
        }
        out
    }
}

/// The App's own JWT (RS256, at most 10 minutes per GitHub). Backdated a
/// minute against clock drift, as GitHub recommends.
fn app_jwt(app_id: &str, key: &EncodingKey) -> Result<String, GithubError> {
    let now = Utc::now().timestamp();
    let claims = AppClaims { iat: now - 60, exp: now + 9 * 60, iss: app_id };
    jsonwebtoken::encode(&Header::new(Algorithm::RS256), &claims, key)
        .map_err(|e| GithubError::Config(format!("signing the GitHub App JWT: {e}")))
}
