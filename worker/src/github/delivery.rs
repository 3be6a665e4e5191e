//! The delivery steps: acknowledge, check out, capture, deliver.

use std::path::Path;

use kiln_protocol::{Run, RunStatus};
use kiln_store::{DeliveryJob, GithubOrigin, Store};
use uuid::Uuid;

use super::client::NewPullRequest;
use super::comment::{inline, quote};
use super::git::{GitAuth, git, push_new_branch};
use super::policy::{self, check_login};
use super::{Github, GithubError};
use crate::sandbox::SandboxError;
use crate::sandbox::repo_clone::CloneSettings;

/// Acknowledges the trigger once per run, in the background so a slow
/// GitHub does not hold the run up. Marked first: a run retried after a
/// lost lease does not acknowledge again, and a failed acknowledgement is
/// only logged (the result comment still comes).
pub fn spawn_ack(github: Github, store: Store, run_id: Uuid, origin: GithubOrigin) {
    tokio::spawn(async move {
        match store.mark_github_acked(run_id).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::warn!(%run_id, error = %e, "recording the GitHub acknowledgement failed");
                return;
            }
        }
        let client = &github.inner.client;
        let result = async {
            let token = github.inner.auth.token(client, origin.installation_id, &origin.repo_full_name).await?;
            match origin.comment_id {
                Some(id) => client.react(&token, &origin.repo_full_name, id, "eyes").await,
                None => {
                    let body = format!("Kiln is working on it: run {}.", github.run_link(run_id));
                    client.comment(&token, &origin.repo_full_name, origin.issue_number, &body).await.map(|_| ())
                }
            }
        }
        .await;
        if let Err(e) = result {
            let error = github.redact(&e.to_string()).await;
            tracing::warn!(%run_id, %error, "acknowledging on GitHub failed");
        }
    });
}

/// Whether the run's sender may push to its repository, as GitHub says
/// (`KILN_GITHUB_MIN_PERMISSION`): an error with the reason if not. Asked
/// before any other work, so a reader's or triager's request gets no clone,
/// no acknowledgement and no push, only the failure comment.
pub async fn admit(github: &Github, origin: &GithubOrigin) -> Result<(), GithubError> {
    let min = github.inner.policy.min_permission;
    let (repo, sender) = (&origin.repo_full_name, &origin.sender_login);
    check_login(sender)?;
    let client = &github.inner.client;
    let token = github.inner.auth.token(client, origin.installation_id, repo).await?;
    let found = client.permission(&token, repo, sender).await?;
    if policy::allows(min, &found.permission, found.role_name.as_deref()) {
        return Ok(());
    }
    let role = found.role_name.as_deref().unwrap_or(&found.permission);
    Err(GithubError::Delivery(format!(
        "@{sender} has {role} access to {repo}; Kiln works only for people with {} access or more",
        min.as_str()
    )))
}

/// The run's repository URL on the configured GitHub (see
/// [`policy::repository_url`]).
fn repository_url(github: &Github, run: &Run, origin: &GithubOrigin) -> Result<String, GithubError> {
    let repo = run.repo.as_ref().ok_or_else(|| GithubError::Delivery("the GitHub run names no repository".into()))?;
    let url = policy::repository_url(&github.inner.web_url, &origin.repo_full_name, &repo.url)?;
    check_scheme(&url)?;
    Ok(url)
}

/// Clones the run's repository on the worker with the token into `dest`
/// (which must not exist) and records the base; the caller puts the tree
/// into the sandbox (as it is, or through the run's environment).
pub async fn checkout(
    github: &Github,
    store: &Store,
    run: &Run,
    origin: &GithubOrigin,
    dest: &Path,
    limits: &CloneSettings,
) -> Result<(), SandboxError> {
    match checkout_inner(github, store, run, origin, dest, limits).await {
        Ok(()) => Ok(()),
        // Too large is final and says which setting; kept as it is.
        Err(GithubError::Checkout(e @ SandboxError::RepoTooLarge { .. })) => Err(e),
        Err(e) => Err(SandboxError::Workspace(github.redact(&e.to_string()).await)),
    }
}

async fn checkout_inner(
    github: &Github,
    store: &Store,
    run: &Run,
    origin: &GithubOrigin,
    dest: &Path,
    limits: &CloneSettings,
) -> Result<(), GithubError> {
    let repo = run.repo.as_ref().ok_or_else(|| GithubError::Delivery("the GitHub run names no repository".into()))?;
    // Before the token is minted or used.
    let url = repository_url(github, run, origin)?;
    let client = &github.inner.client;
    let token = github.inner.auth.token(client, origin.installation_id, &origin.repo_full_name).await?;
    let git_ref = match origin.pr_number {
        // On a pull request's thread the run works on the PR's branch.
        Some(number) => Some(pull_request_branch(github, &token, origin, number).await?),
        None => repo.git_ref.clone(),
    };
    let dest_str = utf8(dest)?;
    let auth = GitAuth { url: &url, token: Some(&token) };
    // Nothing is checked out before the tree's size is known (a small pack
    // can hold a huge tree).
    let mut args = vec!["clone", "--quiet", "--no-tags", "--no-checkout", "--depth", "1"];
    if let Some(r) = git_ref.as_deref() {
        args.extend(["--branch", r]);
    }
    args.extend(["--", &url, dest_str]);
    git(&args, None, &auth).await?;
    // An attempt of a group starts from the group's base commit, once one
    // of them pinned it, however the branch moved since.
    let pinned = match run.group_run_id {
        Some(group) => store.group_base(group).await?,
        None => None,
    };
    if let Some(sha) = pinned.as_deref()
        && git(&["rev-parse", "HEAD"], Some(dest), &auth).await? != sha
    {
        git(&["fetch", "--quiet", "--no-tags", "--depth", "1", "origin", sha], Some(dest), &auth).await?;
    }
    crate::sandbox::repo_clone::checkout_within(dest, pinned.as_deref(), limits).await.map_err(|e| match e {
        SandboxError::RepoTooLarge { .. } => GithubError::Checkout(e),
        e => GithubError::Git(format!("checking out the clone: {e}")),
    })?;
    let sha = git(&["rev-parse", "HEAD"], Some(dest), &auth).await?;
    let branch = match git(&["symbolic-ref", "--quiet", "--short", "HEAD"], Some(dest), &auth).await {
        Ok(b) => b,
        Err(_) => git_ref.clone().unwrap_or_default(),
    };
    // A group's pull request is opened from the group's row.
    store.set_github_base(run.group_run_id.unwrap_or(run.id), &branch, &sha).await?;
    Ok(())
}

/// The branch of pull request `number`, which must be in the repository
/// itself: Kiln cannot push to forks.
async fn pull_request_branch(
    github: &Github,
    token: &str,
    origin: &GithubOrigin,
    number: i64,
) -> Result<String, GithubError> {
    let pr = github.inner.client.pull_request(token, &origin.repo_full_name, number).await?;
    match pr.head.repo {
        Some(head) if head.full_name.eq_ignore_ascii_case(&origin.repo_full_name) => Ok(pr.head.git_ref),
        _ => Err(GithubError::Delivery(format!("pull request #{number} comes from a fork; Kiln cannot push to forks"))),
    }
}

/// Reports the run; returns the pull request and comment URLs.
pub async fn deliver_job(
    github: &Github,
    store: &Store,
    job: &DeliveryJob,
) -> Result<(Option<String>, Option<String>), GithubError> {
    let client = &github.inner.client;
    let (run, origin) = (&job.run, &job.origin);
    let token = github.inner.auth.token(client, origin.installation_id, &origin.repo_full_name).await?;
    let link = github.run_link(run.id);
    let error = inline(run.error.as_deref().unwrap_or("no reason recorded"));
    let mut pr_url = job.pr_url.clone();
    let body = match run.status {
        RunStatus::Succeeded => match deliver_change(github, store, &token, job, summary(run)).await? {
            Opened::NoChange => {
                format!("Kiln run {link} finished without changing any files. Its answer:\n\n{}", quote(summary(run)))
            }
            Opened::PullRequest(url) => {
                pr_url = Some(url.clone());
                format!("Kiln opened a pull request with its changes: {url}\n\nRun {link}.")
            }
            Opened::Refused { workflow_paths } => refused_text(&format!("Kiln run {link}"), &workflow_paths),
        },
        RunStatus::Failed => format!("Kiln run {link} failed: {error}"),
        RunStatus::Cancelled => format!("Kiln run {link} was cancelled: {error}"),
        RunStatus::TimedOut => format!("Kiln run {link} timed out: {error}"),
        other => return Err(GithubError::Delivery(format!("the run is {other}, not finished"))),
    };
    let comment = client.comment(&token, &origin.repo_full_name, origin.issue_number, &body).await?;
    Ok((pr_url, Some(comment.html_url)))
}

/// What became of a run's changes.
pub(super) enum Opened {
    /// It changed no file.
    NoChange,
    /// Pushed, and this pull request opened (now, or by an earlier try).
    PullRequest(String),
    /// Not pushed: they touch `.github/` and that is not allowed.
    Refused { workflow_paths: Vec<String> },
}

/// Delivers `job`'s change (its captured patch), whose agent answered
/// `answer`: nothing if it is empty, else its pull request, opened unless
/// an earlier try did (and recorded).
pub(super) async fn deliver_change(
    github: &Github,
    store: &Store,
    token: &str,
    job: &DeliveryJob,
    answer: &str,
) -> Result<Opened, GithubError> {
    let patch =
        job.patch.as_deref().ok_or_else(|| {
            GithubError::Delivery(match job.patch_too_large {
                true => "the run's change is larger than this deployment keeps (KILN_MAX_PATCH_MB); it was not pushed"
                    .into(),
                false => "the run succeeded but its changes were not collected from the sandbox (see the worker's log)"
                    .into(),
            })
        })?;
    if patch.is_empty() {
        return Ok(Opened::NoChange);
    }
    if let Some(url) = &job.pr_url {
        return Ok(Opened::PullRequest(url.clone()));
    }
    let opened = open_pull_request(github, token, job, patch, answer).await?;
    if let Opened::PullRequest(url) = &opened {
        store.set_github_pr(job.run.id, url).await?;
    }
    Ok(opened)
}

/// What a comment says of changes under `.github/` that were not pushed;
/// `who` made them ("Kiln run …").
pub(super) fn refused_text(who: &str, workflow_paths: &[String]) -> String {
    format!(
        "{who} changed files under `.github/` ({}), where workflows run with the repository's secrets; its \
         changes were not pushed. (An operator can allow such changes with `KILN_GITHUB_ALLOW_WORKFLOW_CHANGES`.)",
        inline(&workflow_paths.join(", "))
    )
}

/// Applies the patch to a fresh worker-side clone at the run's base, commits
/// it on `kiln/issue-<n>-<run id>`, pushes, and opens the PR (a draft unless
/// configured otherwise). Changes under `.github/` are refused before
/// anything is pushed, unless allowed.
async fn open_pull_request(
    github: &Github,
    token: &str,
    job: &DeliveryJob,
    patch: &[u8],
    answer: &str,
) -> Result<Opened, GithubError> {
    let (run, origin) = (&job.run, &job.origin);
    let url = repository_url(github, run, origin)?;
    let (Some(base_ref), Some(base_sha)) = (job.base_ref.as_deref().filter(|r| !r.is_empty()), job.base_sha.as_deref())
    else {
        return Err(GithubError::Delivery("the workspace was not checked out on a branch; no base for a PR".into()));
    };
    let n = origin.issue_number;
    // The whole run id: its leading digits are a timestamp, shared by runs
    // started close together. At most 64 characters, all valid in a ref.
    let branch = format!("kiln/issue-{n}-{}", run.id.simple());
    let issue = github.inner.client.issue(token, &origin.repo_full_name, n).await?;

    let dir = tempfile::tempdir().map_err(|e| GithubError::Git(format!("creating a temporary directory: {e}")))?;
    let dest = dir.path().join("repo");
    let patch_file = dir.path().join("changes.patch");
    tokio::fs::write(&patch_file, patch).await.map_err(|e| GithubError::Git(format!("writing the patch: {e}")))?;
    let auth = GitAuth { url: &url, token: Some(token) };
    // The whole branch, not a shallow tip: the base commit may be behind it.
    git(
        &["clone", "--quiet", "--no-tags", "--single-branch", "--branch", base_ref, "--", &url, utf8(&dest)?],
        None,
        &auth,
    )
    .await?;
    let d = Some(dest.as_path());
    git(&["checkout", "--quiet", "-B", &branch, base_sha], d, &auth).await?;
    git(&["apply", "--index", "--whitespace=nowarn", utf8(&patch_file)?], d, &auth).await?;
    if !github.inner.policy.allow_workflow_changes {
        let workflow_paths = staged_workflow_paths(&dest, &auth).await?;
        if !workflow_paths.is_empty() {
            return Ok(Opened::Refused { workflow_paths });
        }
    }
    let message = format!(
        "Kiln: changes for #{n}: {}\n\nAsked for in {}#{n}; made by Kiln run {}.",
        issue.title, origin.repo_full_name, run.id
    );
    git(&["commit", "--quiet", "--no-verify", "-m", &message], d, &auth).await?;
    push_new_branch(&dest, &branch, &auth).await?;

    let body = pull_request_body(github, job, answer);
    let pr = NewPullRequest {
        title: &issue.title,
        head: &branch,
        base: base_ref,
        body: &body,
        draft: github.inner.policy.draft_pull_requests,
    };
    let created = github.inner.client.open_pull_request(token, &origin.repo_full_name, &pr).await?;
    Ok(Opened::PullRequest(created.html_url))
}

/// The files under `.github/` that the staged change touches: what git
/// says the patch changed (both sides of a rename), not what the patch's
/// text claims.
async fn staged_workflow_paths(dest: &Path, auth: &GitAuth<'_>) -> Result<Vec<String>, GithubError> {
    let changed = git(&["diff", "--cached", "--name-only", "--no-renames", "-z"], Some(dest), auth).await?;
    Ok(policy::workflow_paths(&changed))
}

/// The pull request's description: the agent's answer, the run, and the
/// issue it fixes (or the pull request it was asked for in).
fn pull_request_body(github: &Github, job: &DeliveryJob, answer: &str) -> String {
    let (run, origin) = (&job.run, &job.origin);
    let mut body = format!("{}\n\n---\nMade by Kiln run {}", quote(answer), github.run_link(run.id));
    match origin.pr_number {
        Some(pr) => body.push_str(&format!(", asked for in #{pr}.")),
        None => body.push_str(&format!(".\n\nFixes #{}", origin.issue_number)),
    }
    body
}

/// The agent's final answer, as stored in the run's result.
pub(super) fn summary(run: &Run) -> &str {
    run.result.as_ref().and_then(|r| r.get("summary")).and_then(|s| s.as_str()).unwrap_or("")
}

/// GitHub repositories are reached over http(s) only. The webhook refuses
/// other clone URLs already; this keeps a `file://` URL (which would read the
/// worker's own disk with the worker's rights) out however a run got here.
fn check_scheme(url: &str) -> Result<(), GithubError> {
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return Err(GithubError::Delivery("GitHub repositories are cloned over http(s) only".into()));
    }
    Ok(())
}

fn utf8(path: &Path) -> Result<&str, GithubError> {
    path.to_str().ok_or_else(|| GithubError::Git("temporary path is not UTF-8".into()))
}
