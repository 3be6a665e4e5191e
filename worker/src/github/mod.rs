//! Reporting GitHub-triggered runs back to GitHub (issue 5, delivery half).
//!
//! The API side (`api/src/github`) turns a webhook into a queued run and a
//! `github_runs` row. Here the worker:
//! - checks, before anything else, that the sender may push to the
//!   repository (asked of GitHub: an author association or a label says
//!   nothing about it), and ends the run with the reason if not ([`policy`]);
//! - acknowledges the trigger when it takes the run (👀 on the comment, or a
//!   "working on it" comment for a label), once per run;
//! - clones the repository on the worker's side with the token (from the
//!   configured GitHub's URL for it, never a host the payload names) and uploads
//!   the tree into the sandbox ([`checkout`]); the token never enters the
//!   container;
//! - delivers the run's change as every run's is captured (`crate::capture`,
//!   kept in `run_changes`): one capture path for every trigger;
//! - after the terminal event, delivers ([`deliver_finished`]): a branch, a
//!   pull request and an issue comment, or a comment with the reason. Its
//!   outcome is a `delivery.*` event; it never changes the run's result.
//! - reports a group of attempts a comment asked for (`/kiln --attempts
//!   N`) once: a summary of its attempts when they have all ended, and the
//!   pull request of the chosen one once one is chosen ([`groups`]);
//! - delivers every other owed delivery ([`serve_pending_deliveries`]): runs
//!   cancelled while queued, runs the reaper failed, retries asked for with
//!   `POST /v1/runs/{id}/deliver`, deliveries a dead worker left (`owed`).

mod auth;
mod client;
mod comment;
mod delivery;
mod git;
mod groups;
mod owed;
mod policy;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kiln_protocol::Run;
use kiln_store::{Store, StoreError};
use tokio_util::sync::CancellationToken;

pub use auth::Credentials;
pub use client::RetryPolicy;
pub use policy::{DeliveryPolicy, Permission, web_url_for};

use crate::context::WorkerContext;
use crate::sandbox::SandboxError;

#[derive(Debug, thiserror::Error)]
pub enum GithubError {
    #[error("GitHub configuration: {0}")]
    Config(String),
    #[error("{what}: {error}")]
    Http { what: String, error: String },
    #[error("{what} answered {status}: {message}")]
    Status { what: String, status: u16, message: String },
    #[error("{what}: unexpected answer: {error}")]
    Decode { what: String, error: String },
    #[error("{0}")]
    Git(String),
    #[error("{0}")]
    Sandbox(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Delivery(String),
    #[error(transparent)]
    Checkout(SandboxError),
}

/// How a worker talks to GitHub.
#[derive(Debug, Clone)]
pub struct GithubSettings {
    /// `https://api.github.com`, or a GitHub Enterprise `/api/v3` URL.
    pub api_url: String,
    /// Where the repositories are (`https://github.com`, a GitHub
    /// Enterprise host): the only place git sends the token to.
    pub web_url: String,
    pub credentials: Credentials,
    /// Where the API is reachable for people, to link runs from GitHub
    /// (`{public_url}/v1/runs/{id}`); without it comments name the run id.
    pub public_url: Option<String>,
    pub retry: RetryPolicy,
    /// How often to look for owed deliveries no worker is making (runs
    /// cancelled while queued, `POST /v1/runs/{id}/deliver` retries, …).
    pub request_poll: Duration,
    /// Who may have runs worked on, and what lands on GitHub.
    pub policy: DeliveryPolicy,
}

/// A worker's GitHub connection. Cheap to clone; clones share the
/// installation-token cache. Its `Debug` prints no token (they are held as
/// secrets in `auth`).
#[derive(Debug, Clone)]
pub struct Github {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: client::GithubClient,
    auth: auth::Auth,
    public_url: Option<String>,
    web_url: String,
    request_poll: Duration,
    policy: DeliveryPolicy,
}

impl Github {
    pub fn new(settings: GithubSettings) -> Result<Self, GithubError> {
        let client = client::GithubClient::new(&settings.api_url, settings.retry)?;
        Ok(Github {
            inner: Arc::new(Inner {
                client,
                auth: auth::Auth::new(settings.credentials),
                public_url: settings.public_url.map(|u| u.trim_end_matches('/').to_owned()),
                web_url: settings.web_url.trim_end_matches('/').to_owned(),
                request_poll: settings.request_poll,
                policy: settings.policy,
            }),
        })
    }

    /// `text` with every token (and its git basic-auth form) masked: error
    /// text from git or GitHub ends up in events, comments and logs.
    async fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for secret in self.inner.auth.secrets().await {
            if !secret.is_empty() {
                out = out.replace(&secret, "***").replace(&git::basic(&secret), "***");
            }
        }
        out
    }

    /// How a comment points at run `id`.
    fn run_link(&self, id: uuid::Uuid) -> String {
        match &self.inner.public_url {
            Some(base) => format!("[`{id}`]({base}/v1/runs/{id})"),
            None => format!("`{id}`"),
        }
    }
}

/// The run's checkout on the worker's side, for a run a webhook started
/// (`crate::origin` decides): checks the sender may push to the repository
/// (else the run fails with the reason, having touched nothing of the
/// repository), acknowledges the trigger (in the background) and checks the
/// repository out with the token into `dest`. `None`: the run has no GitHub
/// origin row (e.g. made before it), clone as usual.
pub async fn checkout(
    github: &Github,
    ctx: &WorkerContext,
    run: &Run,
    dest: &Path,
) -> Option<Result<(), SandboxError>> {
    let origin = match ctx.store.github_origin(run.id).await {
        Ok(Some(origin)) => origin,
        Ok(None) => return None,
        Err(e) => return Some(Err(SandboxError::Workspace(format!("reading the run's GitHub origin: {e}")))),
    };
    if let Err(e) = delivery::admit(github, &origin).await {
        return Some(Err(SandboxError::Workspace(github.redact(&e.to_string()).await)));
    }
    // A group's attempts acknowledge the trigger once, as the group.
    delivery::spawn_ack(github.clone(), ctx.store.clone(), run.group_run_id.unwrap_or(run.id), origin.clone());
    let limits = ctx.config.clone_settings();
    let result = delivery::checkout(github, &ctx.store, run, &origin, dest, &limits).await;
    Some(result)
}

/// After the terminal event: reports the run on GitHub (`crate::delivery`
/// decides). If this worker dies first, the delivery stays owed and another
/// worker makes it.
pub async fn deliver_finished(github: &Github, store: &Store, run: &Run) {
    // An attempt owes nothing of its own; its end may have ended its group
    // or made the group's choice, whose report is owed now.
    owed::deliver_owed(github, store, Some(run.group_run_id.unwrap_or(run.id))).await;
}

/// Makes owed deliveries no worker is making (see [`owed`]) until
/// `shutdown`, polling when there are none.
pub async fn serve_pending_deliveries(github: Github, store: Store, shutdown: CancellationToken) {
    owed::serve(&github, &store, github.inner.request_poll, &shutdown).await;
}
