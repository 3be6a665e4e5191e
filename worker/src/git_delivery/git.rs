//! Git on the worker's side for `deliver.git`, with none of the worker's
//! or the repository's configuration (no system or global config, no
//! hooks, no credential helpers, no prompts). The remote's credentials
//! reach git only through its environment (`GIT_CONFIG_*`): never the URL,
//! the command line, a file or a log line.

use std::path::Path;
use std::time::Duration;

use tokio::process::Command;

use super::DeliveryError;
use super::credentials::Credential;

/// Upper bound on one git command (a large push).
const GIT_TIMEOUT: Duration = Duration::from_secs(300);
/// How much of git's stderr an error keeps.
const MAX_ERROR_CHARS: usize = 2000;

/// Who the commit is by.
pub struct Author<'a> {
    pub name: &'a str,
    pub email: &'a str,
}

/// How git reaches the remote: the vetted addresses it must connect to and
/// the credential sent there only.
pub struct RemoteAccess<'a> {
    /// `scheme://host[:port]` the `Authorization` header is scoped to.
    pub origin: String,
    /// `http.curloptResolve` pinning the host to the vetted addresses.
    pub pinned: Option<String>,
    pub credential: &'a Credential,
}

/// Runs git in `dir`; `remote`: the command talks to the remote.
pub async fn git(
    dir: &Path,
    args: &[&str],
    remote: Option<&RemoteAccess<'_>>,
    author: Option<&Author<'_>>,
) -> Result<String, DeliveryError> {
    let mut cmd = Command::new("git");
    cmd.args(args)
        .current_dir(dir)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_ALLOW_PROTOCOL", "https:http")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env_remove("GIT_ASKPASS")
        .env_remove("SSH_ASKPASS")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    if let Some(a) = author {
        for who in ["AUTHOR", "COMMITTER"] {
            cmd.env(format!("GIT_{who}_NAME"), a.name).env(format!("GIT_{who}_EMAIL"), a.email);
        }
    }
    let config = config(remote);
    cmd.env("GIT_CONFIG_COUNT", config.len().to_string());
    for (i, (k, v)) in config.iter().enumerate() {
        cmd.env(format!("GIT_CONFIG_KEY_{i}"), k).env(format!("GIT_CONFIG_VALUE_{i}"), v);
    }
    let verb = args.first().copied().unwrap_or("git");
    let out = tokio::time::timeout(GIT_TIMEOUT, cmd.output())
        .await
        .map_err(|_| DeliveryError::Git(format!("git {verb} timed out")))?
        .map_err(|e| DeliveryError::Git(format!("running git {verb}: {e}")))?;
    if !out.status.success() {
        let stderr: String = String::from_utf8_lossy(&out.stderr).trim().chars().take(MAX_ERROR_CHARS).collect();
        return Err(DeliveryError::Git(format!("git {verb} failed: {stderr}")));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Configuration git runs with instead of anyone's own.
fn config(remote: Option<&RemoteAccess<'_>>) -> Vec<(String, String)> {
    let mut config: Vec<(String, String)> = [
        ("core.hooksPath", "/dev/null"),
        // An empty value clears every credential helper configured so far.
        ("credential.helper", ""),
        // A redirect would take the request (and git would re-send the
        // header only within the origin) somewhere not vetted.
        ("http.followRedirects", "false"),
        ("protocol.file.allow", "never"),
        ("core.fsmonitor", "false"),
        ("commit.gpgSign", "false"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    if let Some(r) = remote {
        // Scoped to the remote's origin: no other host ever gets it.
        config.push((format!("http.{}/.extraHeader", r.origin), r.credential.basic_header()));
        if let Some(pin) = &r.pinned {
            config.push(("http.curloptResolve".into(), pin.clone()));
        }
    }
    config
}
