//! `deliver.git` (issue 28): a run's change pushed to a branch of any git
//! remote, as one commit on the run's base, by a worker after the run's
//! end — never from the sandbox. The change is the one the capture stored
//! (the session's cumulative change, so a follow-up's commit still sits on
//! a commit the remote's repository has); the base is fetched again from
//! the run's `repo.url` with the same checks as any clone; the remote gets
//! the same address checks as `repo.url`, and only a host the operator
//! listed in `KILN_GIT_CREDENTIALS` is pushed to (checked before anything
//! connects). The push is owed in the database with the run's end (a
//! group's with its choice), claimed with a lease by any worker and
//! retried with backoff ([`owed`]); each attempt's outcome is a
//! `delivery.*` event; none changes the run's result.

pub mod credentials;
mod git;
pub mod owed;
mod push;

use kiln_protocol::changes::ChangeScope;
use kiln_protocol::deliver::{GitDelivery, credentials_key, default_message};
use kiln_protocol::repo_url::{RepoHost, RepoUrl};
use std::time::Duration;

use kiln_protocol::Run;

use self::credentials::Credential;
use self::git::{Author, RemoteAccess};
use crate::context::WorkerContext;
use crate::net_guard::{HostRef, resolve_vetted};

/// Who the commit is by when the run names nobody.
const DEFAULT_AUTHOR: Author<'static> = Author { name: "Kiln", email: "kiln@localhost" };

#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    #[error("refused: {0}")]
    Refused(String),
    #[error("nothing to deliver: {0}")]
    Nothing(String),
    #[error("fetching the run's base: {0}")]
    Base(String),
    #[error("the run's patch does not apply to its base: {0}")]
    Apply(String),
    #[error("branch {0} already exists with commits this run did not make; Kiln does not overwrite it")]
    BranchTaken(String),
    #[error("{0}")]
    Git(String),
    #[error("on the worker: {0}")]
    Io(String),
    #[error("reading the run's change: {0}")]
    Store(#[from] kiln_store::StoreError),
}

impl DeliveryError {
    /// Whether trying again later may succeed: git could not reach the
    /// remote or it answered with an error (down, 5xx, a network error),
    /// the base could not be fetched, the worker's disk or the database
    /// failed. Not a refusal, a change that does not apply, or a taken
    /// branch: those stay as they are.
    fn may_pass(&self) -> bool {
        matches!(self, DeliveryError::Git(_) | DeliveryError::Base(_) | DeliveryError::Io(_) | DeliveryError::Store(_))
    }
}

/// How a failed push is retried (`KILN_GIT_DELIVERY_ATTEMPTS`,
/// `KILN_GIT_DELIVERY_RETRY_S`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GitDeliverySettings {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// The wait after the first failed attempt; doubled after each further
    /// one (with jitter), up to `max_delay`.
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl Default for GitDeliverySettings {
    fn default() -> Self {
        GitDeliverySettings {
            max_attempts: DEFAULT_ATTEMPTS,
            base_delay: Duration::from_secs(DEFAULT_RETRY_S),
            max_delay: Duration::from_secs(3600),
        }
    }
}

/// Default of `KILN_GIT_DELIVERY_ATTEMPTS`.
pub const DEFAULT_ATTEMPTS: u32 = 6;
/// Default of `KILN_GIT_DELIVERY_RETRY_S`.
pub const DEFAULT_RETRY_S: u64 = 30;

impl GitDeliverySettings {
    /// The wait before attempt `failed + 1`, after `failed` attempts
    /// failed; `None` once they are all spent.
    fn retry_after(&self, failed: u32) -> Option<Duration> {
        if failed >= self.max_attempts {
            return None;
        }
        crate::retry::Policy::attempts(self.max_attempts, self.base_delay, self.max_delay).backoff(failed, None)
    }
}

/// What one attempt at a push came to.
enum Attempt {
    Pushed(Pushed),
    /// The run asked for no `deliver.git`.
    NotAsked,
    /// Failed; `error` has the credentials redacted.
    Failed {
        error: String,
        may_pass: bool,
    },
}

/// What was pushed.
struct Pushed {
    branch: String,
    commit: String,
    remote: String,
}

/// Whether `run` is owed a push when it ends: it asked for `deliver.git`
/// and is not a group of attempts (whose push waits for its choice).
pub fn asked(run: &Run) -> bool {
    run.attempts.is_none() && run.deliver.as_ref().is_some_and(|d| d.git.is_some())
}

/// One attempt at pushing `run`'s stored change, if it asked for
/// `deliver.git`.
async fn attempt(ctx: &WorkerContext, run: &Run) -> Attempt {
    let Some(spec) = run.deliver.as_ref().and_then(|d| d.git.as_ref()) else { return Attempt::NotAsked };
    let mut secrets = Vec::new();
    match deliver(ctx, run, spec, &mut secrets).await {
        Ok(p) => Attempt::Pushed(p),
        Err(e) => Attempt::Failed { error: redact(&e.to_string(), &secrets), may_pass: e.may_pass() },
    }
}

async fn deliver(
    ctx: &WorkerContext,
    run: &Run,
    spec: &GitDelivery,
    secrets: &mut Vec<String>,
) -> Result<Pushed, DeliveryError> {
    let url = spec.validate().map_err(|e| DeliveryError::Refused(e.to_string()))?;
    ctx.config.repo_rules.check(&url).map_err(|e| DeliveryError::Refused(format!("deliver.git.url: {e}")))?;
    // Before anything resolves or connects: the operator decides where the
    // worker pushes.
    let key = credentials_key(&url);
    let credential = ctx.config.git_credentials.get(&key).ok_or_else(|| {
        DeliveryError::Refused(format!("this deployment has no credentials for {key} (KILN_GIT_CREDENTIALS)"))
    })?;
    secrets.extend(credential.secrets());
    let change = ctx.store.run_patch(run.id, ChangeScope::Session).await?;
    let Some(change) = change else { return Err(DeliveryError::Nothing("the run's change was not captured".into())) };
    if change.too_large {
        return Err(DeliveryError::Nothing("the run's change was too large to keep (KILN_MAX_PATCH_MB)".into()));
    }
    let patch = change.patch.unwrap_or_default();
    if patch.is_empty() {
        return Err(DeliveryError::Nothing("the run changed no files".into()));
    }
    let dir = tempfile::tempdir().map_err(|e| DeliveryError::Io(e.to_string()))?;
    let repo = dir.path().join("repo");
    fetch_base(ctx, run, change.base_commit.as_deref(), &repo).await?;
    let author = Author {
        name: spec.author_name.as_deref().unwrap_or(DEFAULT_AUTHOR.name),
        email: spec.author_email.as_deref().unwrap_or(DEFAULT_AUTHOR.email),
    };
    let message = spec.message.clone().unwrap_or_else(|| default_message(&run.prompt));
    let commit = push::commit_patch(&repo, change.base_commit.as_deref(), &patch, &message, &author).await?;
    let access = remote_access(ctx, &url, credential).await?;
    let commit = push::push_new_branch(&repo, &url.normalized, &spec.branch, &commit, &access).await?;
    Ok(Pushed { branch: spec.branch.clone(), commit, remote: url.normalized.clone() })
}

/// A fresh repository holding the run's base commit: cloned again from the
/// run's `repo.url` (never the sandbox's `.git`), or empty for a run
/// without a repository.
async fn fetch_base(
    ctx: &WorkerContext,
    run: &Run,
    base: Option<&str>,
    dest: &std::path::Path,
) -> Result<(), DeliveryError> {
    let Some(commit) = base else {
        std::fs::create_dir_all(dest).map_err(|e| DeliveryError::Io(e.to_string()))?;
        git::git(dest, &["init", "--quiet"], None, None).await?;
        return Ok(());
    };
    let repo = run.repo.as_ref().ok_or_else(|| DeliveryError::Base("the run names no repository".into()))?;
    crate::sandbox::repo_clone::clone_repo(&repo.url, Some(commit), dest, &ctx.config.clone_settings())
        .await
        .map_err(|e| DeliveryError::Base(e.to_string()))
}

/// Resolves and vets the remote's host (as for a clone: public addresses
/// unless `KILN_ALLOW_PRIVATE_REPOS`) and pins git to those addresses.
async fn remote_access<'a>(
    ctx: &WorkerContext,
    url: &RepoUrl,
    credential: &'a Credential,
) -> Result<RemoteAccess<'a>, DeliveryError> {
    let (host_ref, name) = match &url.host {
        Some(RepoHost::Ip(ip)) => (HostRef::Ip(*ip), None),
        Some(RepoHost::Name(name)) => (HostRef::Name(name), Some(name.as_str())),
        None => return Err(DeliveryError::Refused("deliver.git.url names no host".into())),
    };
    let addrs = resolve_vetted(host_ref, url.port, ctx.config.repo_rules.allow_private)
        .await
        .map_err(|e| DeliveryError::Refused(format!("deliver.git.url: {e}")))?;
    let pinned = name.map(|name| {
        let list: Vec<String> = addrs
            .iter()
            .map(|a| match a.ip() {
                std::net::IpAddr::V4(ip) => ip.to_string(),
                std::net::IpAddr::V6(ip) => format!("[{ip}]"),
            })
            .collect();
        format!("{name}:{}:{}", url.port, list.join(","))
    });
    let origin = origin(&url.normalized)
        .ok_or_else(|| DeliveryError::Refused("deliver.git.url is not an http(s) URL".into()))?;
    Ok(RemoteAccess { origin, pinned, credential })
}

/// `scheme://host[:port]` of a normalised http(s) URL.
fn origin(normalized: &str) -> Option<String> {
    let parsed = url::Url::parse(normalized).ok()?;
    Some(parsed.origin().ascii_serialization())
}

/// Removes every form of the credential from text bound for an event.
fn redact(text: &str, secrets: &[String]) -> String {
    secrets.iter().filter(|s| !s.is_empty()).fold(text.to_owned(), |t, s| t.replace(s.as_str(), "[redacted]"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_drop_the_path_and_keep_a_port() {
        assert_eq!(origin("http://127.0.0.1:8080/r.git").as_deref(), Some("http://127.0.0.1:8080"));
        assert_eq!(origin("https://git.example.com/o/r").as_deref(), Some("https://git.example.com"));
    }

    #[test]
    fn redaction_removes_every_secret() {
        assert_eq!(redact("a tok b dG9r", &["tok".into(), "dG9r".into()]), "a [redacted] b [redacted]");
    }
}
