//! Where a run's change goes besides Kiln itself: `deliver.git` pushes it,
//! as one commit on the run's base, to a branch of any git remote (issue
//! 28). The worker pushes after the run's end, from its own side, with the
//! credentials its operator gives per host (`KILN_GIT_CREDENTIALS`); the
//! outcome is a `delivery.succeeded` / `delivery.failed` event.

use serde::{Deserialize, Serialize};

use std::net::IpAddr;

use url::Host;

use crate::input;
use crate::repo_url::{RepoHost, RepoScheme, RepoUrl};

/// Longest commit message, in characters.
pub const MAX_MESSAGE_CHARS: usize = 4000;
/// Longest author name or e-mail, in characters.
pub const MAX_AUTHOR_CHARS: usize = 200;
/// Longest branch name, in bytes.
pub const MAX_BRANCH_BYTES: usize = 200;
/// Longest remote URL, in characters.
pub const MAX_URL_CHARS: usize = 2048;

/// `deliver` on `POST /v1/runs`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Deliver {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<GitDelivery>,
}

/// Push the run's change as one commit on its base to `branch` of `url`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GitDelivery {
    /// An http(s) URL of the remote repository, without credentials.
    pub url: String,
    /// The branch to create; Kiln never overwrites one it did not push.
    pub branch: String,
    /// The commit's author (default: Kiln).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author_email: Option<String>,
    /// The commit message (default: the first line of the run's prompt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliverError {
    #[error("deliver.git.url: {0}")]
    Url(String),
    #[error(
        "deliver.git.branch must be 1 to {MAX_BRANCH_BYTES} bytes: '/'-separated names of letters, digits, '_' \
         and '-' with single dots inside (no leading, trailing or double dot, none ending in '.lock'), not \
         starting with '-'"
    )]
    Branch,
    #[error("deliver.git.{0} must be 1 to {MAX_AUTHOR_CHARS} characters without control characters, '<' or '>'")]
    Author(&'static str),
    #[error("deliver.git.message must be 1 to {MAX_MESSAGE_CHARS} characters without NUL")]
    Message,
}

impl GitDelivery {
    /// Checks everything that needs no network or deployment settings,
    /// each field with its rule of [`crate::input`] (which the OpenAPI
    /// document states too).
    pub fn validate(&self) -> Result<RepoUrl, DeliverError> {
        let url = remote_url(&self.url)?;
        if !input::DELIVER_BRANCH.accepts(&self.branch) {
            return Err(DeliverError::Branch);
        }
        for (field, value) in [("author_name", &self.author_name), ("author_email", &self.author_email)] {
            if value.as_deref().is_some_and(|v| !input::DELIVER_AUTHOR.accepts(v)) {
                return Err(DeliverError::Author(field));
            }
        }
        if self.message.as_deref().is_some_and(|m| !input::DELIVER_MESSAGE.accepts(m)) {
            return Err(DeliverError::Message);
        }
        Ok(url)
    }
}

/// The remote as git is to reach it: an http(s) URL of a host
/// ([`input::CALLBACK_URL`]'s shape; the credentials are an HTTP header),
/// never with credentials in it.
pub fn remote_url(raw: &str) -> Result<RepoUrl, DeliverError> {
    if !input::CALLBACK_URL.accepts(raw) {
        return Err(DeliverError::Url("must be an https:// or http:// URL of a host".into()));
    }
    let url = url::Url::parse(raw).map_err(|e| DeliverError::Url(format!("is not a URL git can use: {e}")))?;
    if url.password().is_some() || !url.username().is_empty() {
        return Err(DeliverError::Url(
            "must not carry credentials; the worker's operator gives them per host (KILN_GIT_CREDENTIALS)".into(),
        ));
    }
    let scheme = if url.scheme() == "https" { RepoScheme::Https } else { RepoScheme::Http };
    let host = match url.host() {
        Some(Host::Ipv4(ip)) => RepoHost::Ip(IpAddr::V4(ip)),
        Some(Host::Ipv6(ip)) => RepoHost::Ip(IpAddr::V6(ip)),
        Some(Host::Domain(name)) => RepoHost::Name(name.to_ascii_lowercase()),
        None => return Err(DeliverError::Url("must name a host".into())),
    };
    let port = url.port_or_known_default().unwrap_or(443);
    Ok(RepoUrl { scheme, host: Some(host), port, normalized: url.to_string() })
}

/// How the operator's credentials file names the remote's host: `host`
/// for the scheme's default port, `host:port` otherwise.
pub fn credentials_key(url: &RepoUrl) -> String {
    let host = match &url.host {
        Some(RepoHost::Ip(std::net::IpAddr::V6(ip))) => format!("[{ip}]"),
        Some(RepoHost::Ip(ip)) => ip.to_string(),
        Some(RepoHost::Name(name)) => name.clone(),
        None => String::new(),
    };
    let default_port = if url.scheme == RepoScheme::Https { 443 } else { 80 };
    if url.port == default_port { host } else { format!("{host}:{}", url.port) }
}

/// Whether `name` is a branch `deliver.git` may push ([`input::DELIVER_BRANCH`]:
/// within `git check-ref-format`'s rules, and no leading `-`).
pub fn valid_branch(name: &str) -> bool {
    input::DELIVER_BRANCH.accepts(name)
}

/// The commit message when the run names none: the prompt's first line,
/// bounded.
pub fn default_message(prompt: &str) -> String {
    let line = prompt.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("Kiln run");
    let mut m: String = line.chars().take(72).collect();
    if m.len() < line.len() {
        m.push('…');
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(url: &str, branch: &str) -> GitDelivery {
        GitDelivery { url: url.into(), branch: branch.into(), author_name: None, author_email: None, message: None }
    }

    #[test]
    fn branch_names_follow_check_ref_format() {
        for ok in ["kiln/run-1", "feature", "a.b/c_d", "v1.2.3", "x.locks", "lock/x.lok"] {
            assert!(valid_branch(ok), "{ok}");
        }
        for bad in [
            "",
            "-x",
            "/x",
            "x/",
            "x.",
            "a..b",
            "a@{b",
            "a//b",
            "a b",
            "a\tb",
            "a~1",
            "a^",
            "a:b",
            "a?",
            "a*",
            "a[",
            "a\\b",
            ".hidden",
            "a/.b",
            "x.lock",
            "a/b.lock/c",
            "@",
            "a\u{7f}",
        ] {
            assert!(!valid_branch(bad), "{bad:?}");
        }
        assert!(!valid_branch(&"a".repeat(MAX_BRANCH_BYTES + 1)));
    }

    #[test]
    fn remotes_are_http_urls_without_credentials() {
        assert!(spec("https://git.example.com/o/r.git", "b").validate().is_ok());
        for bad in ["https://u:t@git.example.com/r", "git://example.com/r", "file:///tmp/r", "ssh://git@h/r", "nope"] {
            assert!(matches!(spec(bad, "b").validate(), Err(DeliverError::Url(_))), "{bad}");
        }
        let e = spec("https://u:secret@h.example/r", "b").validate().unwrap_err().to_string();
        assert!(!e.contains("secret"), "{e}");
    }

    #[test]
    fn credentials_keys_name_the_port_only_when_not_the_default() {
        let key = |u: &str| credentials_key(&remote_url(u).unwrap());
        assert_eq!(key("https://Git.Example.com/r"), "git.example.com");
        assert_eq!(key("http://127.0.0.1:8080/r"), "127.0.0.1:8080");
        assert_eq!(key("https://h:443/r"), "h");
    }

    #[test]
    fn authors_and_messages_are_bounded() {
        let mut s = spec("https://h/r", "b");
        s.author_name = Some("Eve <x>".into());
        assert_eq!(s.validate().unwrap_err(), DeliverError::Author("author_name"));
        s.author_name = Some("Eve".into());
        s.author_email = Some("e\n@x".into());
        assert_eq!(s.validate().unwrap_err(), DeliverError::Author("author_email"));
        s.author_email = None;
        s.message = Some("m".repeat(MAX_MESSAGE_CHARS + 1));
        assert_eq!(s.validate().unwrap_err(), DeliverError::Message);
        assert_eq!(default_message("\n  fix the bug \nmore"), "fix the bug");
    }
}
