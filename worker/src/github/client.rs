//! A small typed GitHub REST client: the handful of endpoints delivery
//! calls, with retries on server errors and rate limits.

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::GithubError;
use crate::retry::{self, Policy, RetryAfter, Verdict};

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

impl RetryPolicy {
    fn policy(&self) -> Policy {
        Policy::attempts(self.attempts, self.base_delay, self.max_delay)
            .honouring(RetryAfter::GiveUpOver(self.max_delay))
    }
}

#[derive(Debug, Clone)]
pub struct GithubClient {
    http: reqwest::Client,
    base: String,
    retry: Policy,
}

/// A failed call and what it says about calling again.
struct Failure {
    error: GithubError,
    verdict: Verdict,
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

/// `GET /repos/{o}/{r}/collaborators/{user}/permission`.
#[derive(Debug, Deserialize)]
pub struct CollaboratorPermission {
    /// `admin`, `write`, `read` or `none` (maintain folded into write,
    /// triage into read).
    pub permission: String,
    /// The finer role: `admin`, `maintain`, `write`, `triage`, `read`, or a
    /// custom role's name.
    #[serde(default)]
    pub role_name: Option<String>,
}

/// `POST /repos/{o}/{r}/pulls`.
#[derive(Debug)]
pub struct NewPullRequest<'a> {
    pub title: &'a str,
    /// The branch with the changes (`owner:branch` when in another repository).
    pub head: &'a str,
    pub base: &'a str,
    pub body: &'a str,
    pub draft: bool,
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
        Ok(GithubClient { http, base: base.trim_end_matches('/').to_owned(), retry: retry.policy() })
    }

    pub async fn issue(&self, auth: &str, repo: &str, number: i64) -> Result<Issue, GithubError> {
        self.call(Method::GET, &format!("/repos/{repo}/issues/{number}"), auth, None).await
    }

    pub async fn pull_request(&self, auth: &str, repo: &str, number: i64) -> Result<PullRequest, GithubError> {
        self.call(Method::GET, &format!("/repos/{repo}/pulls/{number}"), auth, None).await
    }

    pub async fn permission(&self, auth: &str, repo: &str, user: &str) -> Result<CollaboratorPermission, GithubError> {
        self.call(Method::GET, &format!("/repos/{repo}/collaborators/{user}/permission"), auth, None).await
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
        pr: &NewPullRequest<'_>,
    ) -> Result<Created, GithubError> {
        let payload =
            json!({ "title": pr.title, "head": pr.head, "base": pr.base, "body": pr.body, "draft": pr.draft });
        self.call(Method::POST, &format!("/repos/{repo}/pulls"), auth, Some(payload)).await
    }

    /// Exchanges an App JWT for an installation token good for `repo` (the
    /// name, without its owner) only, with only what delivery needs: push a
    /// branch, open a pull request, comment and react. GitHub refuses (422)
    /// when `repo` is not one of the installation's repositories, so a
    /// webhook naming another installation gets no token for it.
    pub async fn installation_token(
        &self,
        jwt: &str,
        installation: i64,
        repo: &str,
    ) -> Result<InstallationToken, GithubError> {
        let path = format!("/app/installations/{installation}/access_tokens");
        let body = json!({
            "repositories": [repo],
            "permissions": { "contents": "write", "pull_requests": "write", "issues": "write", "metadata": "read" },
        });
        self.call(Method::POST, &path, jwt, Some(body)).await
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
        let result = retry::retry(
            &self.retry,
            || self.call_once(&method, &url, &what, auth, body.as_ref()),
            |failure: &Failure| failure.verdict,
            |failure, attempt, _| match &failure.error {
                GithubError::Status { status, .. } => {
                    tracing::warn!(%what, status, attempt, "GitHub call failed; retrying");
                }
                error => tracing::warn!(%what, %error, attempt, "GitHub call failed; retrying"),
            },
        )
        .await;
        result.map_err(|failure| failure.error)
    }

    async fn call_once<T: DeserializeOwned>(
        &self,
        method: &Method,
        url: &str,
        what: &str,
        auth: &str,
        body: Option<&Value>,
    ) -> Result<T, Failure> {
        let mut request = self
            .http
            .request(method.clone(), url)
            .bearer_auth(auth)
            .header("accept", ACCEPT)
            .header("x-github-api-version", API_VERSION);
        if let Some(b) = body {
            request = request.json(b);
        }
        let what = what.to_owned();
        match request.send().await {
            Ok(response) if response.status().is_success() => response.json::<T>().await.map_err(|e| Failure {
                error: GithubError::Decode { what, error: e.to_string() },
                verdict: Verdict::GiveUp,
            }),
            Ok(response) => {
                let status = response.status();
                let verdict = retry_verdict(status, response.headers());
                let text = response.text().await.unwrap_or_default();
                let message: String = text.chars().take(MAX_ERROR_BODY).collect();
                Err(Failure { error: GithubError::Status { what, status: status.as_u16(), message }, verdict })
            }
            // Without a response, only a connection that never got a
            // request through is safe to retry; reqwest's timeouts and
            // connect errors are, and GitHub's POSTs here are harmless to
            // repeat at worst (a duplicate comment).
            Err(e) => Err(Failure {
                error: GithubError::Http { what, error: e.without_url().to_string() },
                verdict: Verdict::Retry,
            }),
        }
    }
}

/// Whether (and how soon) to retry a failed status. GitHub signals rate
/// limits (primary and secondary) with 403 or 429 plus `retry-after` or an
/// exhausted `x-ratelimit-remaining` and its `x-ratelimit-reset` epoch.
fn retry_verdict(status: StatusCode, headers: &HeaderMap) -> Verdict {
    if status.is_server_error() {
        return Verdict::Retry;
    }
    if status != StatusCode::FORBIDDEN && status != StatusCode::TOO_MANY_REQUESTS {
        return Verdict::GiveUp;
    }
    let number = |name: &str| headers.get(name).and_then(|v: &HeaderValue| v.to_str().ok()?.trim().parse::<i64>().ok());
    if let Some(secs) = number("retry-after") {
        return Verdict::RetryAfter(Duration::from_secs(secs.max(0).unsigned_abs()));
    }
    if number("x-ratelimit-remaining") == Some(0)
        && let Some(reset) = number("x-ratelimit-reset")
    {
        let secs = (reset - chrono::Utc::now().timestamp()).max(1);
        return Verdict::RetryAfter(Duration::from_secs(secs.unsigned_abs()));
    }
    // A 429 without hints is still a rate limit; a bare 403 is a permission.
    Verdict::retry_if(status == StatusCode::TOO_MANY_REQUESTS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delays_follow_githubs_hints() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_verdict(StatusCode::BAD_GATEWAY, &h), Verdict::Retry);
        assert_eq!(retry_verdict(StatusCode::FORBIDDEN, &h), Verdict::GiveUp);
        assert_eq!(retry_verdict(StatusCode::NOT_FOUND, &h), Verdict::GiveUp);
        assert_eq!(retry_verdict(StatusCode::TOO_MANY_REQUESTS, &h), Verdict::Retry);
        h.insert("retry-after", HeaderValue::from_static("3"));
        assert_eq!(retry_verdict(StatusCode::FORBIDDEN, &h), Verdict::RetryAfter(Duration::from_secs(3)));
        let mut h = HeaderMap::new();
        h.insert("x-ratelimit-remaining", HeaderValue::from_static("0"));
        let reset = (chrono::Utc::now().timestamp() + 30).to_string();
        h.insert("x-ratelimit-reset", HeaderValue::from_str(&reset).unwrap());
        let Verdict::RetryAfter(d) = retry_verdict(StatusCode::FORBIDDEN, &h) else { panic!("no wait") };
        assert!(d >= Duration::from_secs(28) && d <= Duration::from_secs(30), "{d:?}");
    }
}
