//! A small typed GitHub REST client: the handful of endpoints delivery
//! calls, with retries on server errors and rate limits.

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::GithubError;

/// GitHub's documented media type and API version.
const ACCEPT: &str = "application/vnd.github+json";
const API_VERSION: &str = "2022-11-28";
/// Longest error body quoted back in an error (GitHub's are short JSON).
const MAX_ERROR_BODY: usize = 500;

/// How often and how patiently to retry a GitHub call.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Tries in all, the first included.
    pub attempts: u32,
    /// Backoff before the second try; doubled for each further one.
    pub base_delay: Duration,
    /// Longest single wait, also for a rate limit's `retry-after`: a longer
    /// one gives up rather than hold a worker slot for an hour.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { attempts: 4, base_delay: Duration::from_millis(500), max_delay: Duration::from_secs(60) }
    }
}

#[derive(Debug, Clone)]
pub struct GithubClient {
    http: reqwest::Client,
    base: String,
    retry: RetryPolicy,
}

/// `GET /repos/{o}/{r}/issues/{n}`, as far as delivery reads it.
#[derive(Debug, Deserialize)]
pub struct Issue {
    pub title: String,
}

/// `GET /repos/{o}/{r}/pulls/{n}`.
#[derive(Debug, Deserialize)]
pub struct PullRequest {
    pub head: Branch,
}

#[derive(Debug, Deserialize)]
pub struct Branch {
    #[serde(rename = "ref")]
    pub git_ref: String,
    /// `None` when the head repository (a fork) was deleted.
    pub repo: Option<RepoName>,
}

#[derive(Debug, Deserialize)]
pub struct RepoName {
    pub full_name: String,
}

/// A created comment or pull request.
#[derive(Debug, Deserialize)]
pub struct Created {
    pub html_url: String,
}

/// `POST /app/installations/{id}/access_tokens`.
#[derive(Debug, Deserialize)]
pub struct InstallationToken {
    pub token: String,
    pub expires_at: chrono::DateTime<chrono::Utc>,
}

impl GithubClient {
    pub fn new(base: &str, retry: RetryPolicy) -> Result<Self, GithubError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .user_agent(concat!("kiln/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| GithubError::Config(format!("building the HTTP client: {e}")))?;
        Ok(GithubClient { http, base: base.trim_end_matches('/').to_owned(), retry })
    }

    pub async fn issue(&self, auth: &str, repo: &str, number: i64) -> Result<Issue, GithubError> {
        self.call(Method::GET, &format!("/repos/{repo}/issues/{number}"), auth, None).await
    }

    pub async fn pull_request(&self, auth: &str, repo: &str, number: i64) -> Result<PullRequest, GithubError> {
        self.call(Method::GET, &format!("/repos/{repo}/pulls/{number}"), auth, None).await
    }

    pub async fn react(&self, auth: &str, repo: &str, comment_id: i64, content: &str) -> Result<(), GithubError> {
        let path = format!("/repos/{repo}/issues/comments/{comment_id}/reactions");
        let _: Value = self.call(Method::POST, &path, auth, Some(json!({ "content": content }))).await?;
        Ok(())
    }

    pub async fn comment(&self, auth: &str, repo: &str, number: i64, body: &str) -> Result<Created, GithubError> {
        let path = format!("/repos/{repo}/issues/{number}/comments");
        self.call(Method::POST, &path, auth, Some(json!({ "body": body }))).await
    }

    pub async fn open_pull_request(
        &self,
        auth: &str,
        repo: &str,
        title: &str,
        head: &str,
        base: &str,
        body: &str,
    ) -> Result<Created, GithubError> {
        let payload = json!({ "title": title, "head": head, "base": base, "body": body });
        self.call(Method::POST, &format!("/repos/{repo}/pulls"), auth, Some(payload)).await
    }

    /// Exchanges an App JWT for an installation token.
    pub async fn installation_token(&self, jwt: &str, installation: i64) -> Result<InstallationToken, GithubError> {
        let path = format!("/app/installations/{installation}/access_tokens");
        self.call(Method::POST, &path, jwt, None).await
    }

    /// One call, retried on transport errors, 5xx and rate limits. `auth`
    /// is a bearer credential (installation token, PAT or App JWT).
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        auth: &str,
        body: Option<Value>,
    ) -> Result<T, GithubError> {
        let url = format!("{}{path}", self.base);
        let what = format!("{method} {path}");
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut request = self
                .http
                .request(method.clone(), &url)
                .bearer_auth(auth)
                .header("accept", ACCEPT)
                .header("x-github-api-version", API_VERSION);
            if let Some(b) = &body {
                request = request.json(b);
            }
            let wait = match request.send().await {
                Ok(response) if response.status().is_success() => {
                    return response.json::<T>().await.map_err(|e| GithubError::Decode { what, error: e.to_string() });
                }
                Ok(response) => {
                    let status = response.status();
                    let delay = retry_delay(status, response.headers(), self.backoff(attempt));
                    let text = response.text().await.unwrap_or_default();
                    let message: String = text.chars().take(MAX_ERROR_BODY).collect();
                    match delay {
                        Some(d) if attempt < self.retry.attempts && d <= self.retry.max_delay => {
                            tracing::warn!(%what, status = status.as_u16(), attempt, "GitHub call failed; retrying");
                            d
                        }
                        _ => return Err(GithubError::Status { what, status: status.as_u16(), message }),
                    }
                }
                Err(e) => {
                    // Without a response, only a connection that never got a
                    // request through is safe to retry; reqwest's timeouts
                    // and connect errors are, and GitHub's POSTs here are
                    // harmless to repeat at worst (a duplicate comment).
                    if attempt >= self.retry.attempts {
                        return Err(GithubError::Http { what, error: e.without_url().to_string() });
                    }
                    tracing::warn!(%what, error = %e.without_url(), attempt, "GitHub call failed; retrying");
                    self.backoff(attempt)
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    fn backoff(&self, attempt: u32) -> Duration {
        self.retry.base_delay.saturating_mul(1 << (attempt - 1).min(10)).min(self.retry.max_delay)
    }
}

/// How long to wait before retrying a failed status, or `None` for an
/// error retrying cannot fix. GitHub signals rate limits (primary and
/// secondary) with 403 or 429 plus `retry-after` or an exhausted
/// `x-ratelimit-remaining` and its `x-ratelimit-reset` epoch.
fn retry_delay(status: StatusCode, headers: &HeaderMap, backoff: Duration) -> Option<Duration> {
    if status.is_server_error() {
        return Some(backoff);
    }
    if status != StatusCode::FORBIDDEN && status != StatusCode::TOO_MANY_REQUESTS {
        return None;
    }
    let number = |name: &str| headers.get(name).and_then(|v: &HeaderValue| v.to_str().ok()?.trim().parse::<i64>().ok());
    if let Some(secs) = number("retry-after") {
        return Some(Duration::from_secs(secs.max(0).unsigned_abs()));
    }
    if number("x-ratelimit-remaining") == Some(0)
        && let Some(reset) = number("x-ratelimit-reset")
    {
        let secs = (reset - chrono::Utc::now().timestamp()).max(1);
        return Some(Duration::from_secs(secs.unsigned_abs()));
    }
    // A 429 without hints is still a rate limit; a bare 403 is a permission.
    (status == StatusCode::TOO_MANY_REQUESTS).then_some(backoff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delays_follow_githubs_hints() {
        let b = Duration::from_millis(7);
        let mut h = HeaderMap::new();
        assert_eq!(retry_delay(StatusCode::BAD_GATEWAY, &h, b), Some(b));
        assert_eq!(retry_delay(StatusCode::FORBIDDEN, &h, b), None);
        assert_eq!(retry_delay(StatusCode::NOT_FOUND, &h, b), None);
        assert_eq!(retry_delay(StatusCode::TOO_MANY_REQUESTS, &h, b), Some(b));
        h.insert("retry-after", HeaderValue::from_static("3"));
        assert_eq!(retry_delay(StatusCode::FORBIDDEN, &h, b), Some(Duration::from_secs(3)));
        let mut h = HeaderMap::new();
        h.insert("x-ratelimit-remaining", HeaderValue::from_static("0"));
        let reset = (chrono::Utc::now().timestamp() + 30).to_string();
        h.insert("x-ratelimit-reset", HeaderValue::from_str(&reset).unwrap());
        let d = retry_delay(StatusCode::FORBIDDEN, &h, b).unwrap();
        assert!(d >= Duration::from_secs(28) && d <= Duration::from_secs(30), "{d:?}");
    }
}
