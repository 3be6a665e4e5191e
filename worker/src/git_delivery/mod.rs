//! `deliver.git` (issue 28): a run's change pushed to a branch of any git
//! remote, as one commit on the run's base, by the worker after the run's
//! end — never from the sandbox. The change is the one the capture stored
//! (the session's cumulative change, so a follow-up's commit still sits on
//! a commit the remote's repository has); the base is fetched again from
//! the run's `repo.url` with the same checks as any clone; the remote gets
//! the same address checks as `repo.url`, and only a host the operator
//! listed in `KILN_GIT_CREDENTIALS` is pushed to (checked before anything
//! connects). The outcome is a `delivery.succeeded` / `delivery.failed`
//! event; it never changes the run's result. A group of attempts is
//! pushed once one is chosen, by whichever worker claims it ([`groups`]).

pub mod credentials;
mod git;
pub mod groups;
mod push;

use kiln_protocol::changes::ChangeScope;
use kiln_protocol::deliver::{GitDelivery, credentials_key, default_message};
use kiln_protocol::repo_url::{RepoHost, RepoUrl};
use kiln_protocol::{EventBody, Run};

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

/// What was pushed.
struct Pushed {
    branch: String,
    commit: String,
    remote: String,
}

/// Whether `run` is owed a push when it ends: it asked for `deliver.git`
/// and is not a group of attempts (whose push waits for its choice,
/// `groups`).
pub fn asked(run: &Run) -> bool {
    run.attempts.is_none() && run.deliver.as_ref().is_some_and(|d| d.git.is_some())
}

/// Delivers a run that has ended and asked for `deliver.git` ([`asked`]),
/// and records the outcome as an event after the terminal one.
pub async fn deliver_finished(ctx: &WorkerContext, run: &Run) {
    let Some(event) = outcome(ctx, run).await else { return };
    if let Err(e) = crate::db_retry::with_retry(|| ctx.store.append_after_end(run.id, &event)).await {
        tracing::warn!(run_id = %run.id, error = %e, "recording the git delivery's outcome failed");
    }
}

/// Pushes `run`'s stored change if it asked for `deliver.git`: the event
/// that says how it went, credentials redacted. `None`: nothing was asked.
async fn outcome(ctx: &WorkerContext, run: &Run) -> Option<EventBody> {
    let spec = run.deliver.as_ref().and_then(|d| d.git.as_ref())?;
    let mut secrets = Vec::new();
    Some(match deliver(ctx, run, spec, &mut secrets).await {
        Ok(p) => {
            tracing::info!(run_id = %run.id, branch = %p.branch, commit = %p.commit, "pushed the run's change");
            EventBody::DeliverySucceeded {
                pull_request: None,
                comment: None,
                branch: Some(p.branch),
                commit: Some(p.commit),
                remote: Some(p.remote),
            }
        }
        Err(e) => {
            let error = redact(&e.to_string(), &secrets);
            tracing::warn!(run_id = %run.id, %error, "delivering the run's change to git failed");
            EventBody::DeliveryFailed { error }
        }
    })
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
