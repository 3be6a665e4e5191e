//! Git on the worker's side, authenticated with the GitHub token through
//! git's environment (`GIT_CONFIG_*`), never the command line, the remote
//! URL or any file: the clone uploaded into the sandbox carries no secret.

use std::path::Path;
use std::time::Duration;

use base64::Engine;
use base64::prelude::BASE64_STANDARD;
use tokio::process::Command;

use super::GithubError;

/// Upper bound on one git command (clone or push of a large repository).
const GIT_TIMEOUT: Duration = Duration::from_secs(300);

/// Who Kiln's commits are by.
const AUTHOR_NAME: &str = "Kiln";
const AUTHOR_EMAIL: &str = "kiln@users.noreply.github.com";

/// How git reaches the repository.
pub struct GitAuth<'a> {
    /// The repository's URL (clone and push both use it).
    pub url: &'a str,
    pub token: Option<&'a str>,
}

/// Runs git, returning its stdout.
pub async fn git(args: &[&str], cwd: Option<&Path>, auth: &GitAuth<'_>) -> Result<String, GithubError> {
    let mut cmd = Command::new("git");
    cmd.args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_ALLOW_PROTOCOL", "https:http")
        // The worker's own git configuration (credential helpers, hooks,
        // URL rewrites) has no say in what Kiln pushes.
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", AUTHOR_NAME)
        .env("GIT_AUTHOR_EMAIL", AUTHOR_EMAIL)
        .env("GIT_COMMITTER_NAME", AUTHOR_NAME)
        .env("GIT_COMMITTER_EMAIL", AUTHOR_EMAIL)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    // Hooks in a repository the agent could have touched must not run here.
    let mut config: Vec<(String, String)> = vec![("core.hooksPath".into(), "/dev/null".into())];
    if let (Some(token), Some(origin)) = (auth.token, http_origin(auth.url)) {
        // Scoped to the repository's host, so a redirect elsewhere does not
        // carry the token.
        config.push((format!("http.{origin}/.extraHeader"), format!("Authorization: Basic {}", basic(token))));
    }
    cmd.env("GIT_CONFIG_COUNT", config.len().to_string());
    for (i, (k, v)) in config.iter().enumerate() {
        cmd.env(format!("GIT_CONFIG_KEY_{i}"), k).env(format!("GIT_CONFIG_VALUE_{i}"), v);
    }
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let verb = args.first().copied().unwrap_or("git");
    let out = tokio::time::timeout(GIT_TIMEOUT, cmd.output())
        .await
        .map_err(|_| GithubError::Git(format!("git {verb} timed out")))?
        .map_err(|e| GithubError::Git(format!("running git {verb}: {e}")))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(GithubError::Git(format!("git {verb} failed: {}", stderr.trim())));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Pushes `HEAD` (the run's one commit on its base) to `branch` without
/// ever replacing someone else's commits there: the push carries a lease
/// that the branch does not exist yet, never `--force`. Delivery is at least
/// once, so an earlier attempt of the same run may have pushed already and
/// then failed (opening the PR, recording it): a branch that holds the same
/// change on the same base is that push and is kept as it is. Anything else
/// there (a commit pushed on top, a branch of that name made by someone
/// else) fails the delivery rather than being overwritten.
pub async fn push_new_branch(dir: &Path, branch: &str, auth: &GitAuth<'_>) -> Result<(), GithubError> {
    let d = Some(dir);
    let remote_ref = format!("refs/heads/{branch}");
    let listed = git(&["ls-remote", "origin", &remote_ref], d, auth).await?;
    if !listed.is_empty() {
        git(&["fetch", "--quiet", "--no-tags", "origin", &remote_ref], d, auth).await?;
        // Same tree and same parents: the commit an earlier attempt pushed
        // (its timestamp, so its id, may differ from the one just made).
        let theirs = git(&["rev-parse", "FETCH_HEAD^{tree}", "FETCH_HEAD^@"], d, auth).await?;
        let ours = git(&["rev-parse", "HEAD^{tree}", "HEAD^@"], d, auth).await?;
        return if theirs == ours { Ok(()) } else { Err(branch_taken(branch)) };
    }
    // An empty expected value: the push only creates the branch. If it
    // appeared since `ls-remote`, git refuses with "stale info".
    let lease = format!("--force-with-lease={remote_ref}:");
    match git(&["push", "--quiet", &lease, "origin", &format!("HEAD:{remote_ref}")], d, auth).await {
        Err(GithubError::Git(e)) if e.contains("stale info") => Err(branch_taken(branch)),
        other => other.map(|_| ()),
    }
}

fn branch_taken(branch: &str) -> GithubError {
    GithubError::Delivery(format!(
        "branch {branch} already exists with commits this run did not make; Kiln does not overwrite it"
    ))
}

/// `scheme://host[:port]` of an http(s) URL; `None` for other schemes.
fn http_origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if scheme != "https" && scheme != "http" {
        return None;
    }
    let host = rest.split(['/', '?', '#']).next()?;
    // Userinfo in the URL would put a different identity in the origin.
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    Some(format!("{scheme}://{host}"))
}

/// `base64("x-access-token:TOKEN")`, GitHub's HTTP basic form of a token.
pub fn basic(token: &str) -> String {
    BASE64_STANDARD.encode(format!("x-access-token:{token}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_auth_is_githubs_token_form() {
        assert_eq!(basic("t"), "eC1hY2Nlc3MtdG9rZW46dA==");
    }

    #[test]
    fn origins_are_scheme_and_host() {
        assert_eq!(http_origin("https://github.com/o/r.git").as_deref(), Some("https://github.com"));
        assert_eq!(http_origin("http://u@ghe.local:8080/o/r").as_deref(), Some("http://ghe.local:8080"));
        assert_eq!(http_origin("file:///tmp/r.git"), None);
    }
}
