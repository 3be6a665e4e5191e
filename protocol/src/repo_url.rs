//! What a run's `repo.url` may be, beyond its shape ([`crate::input::REPO_URL`]):
//! the worker clones it from its own network position, so the URL decides
//! where a worker connects. Checked without the network here (the API at
//! submission, the worker before it resolves the host); the worker checks
//! the resolved addresses again (`kiln_worker::net_guard`).

use std::net::IpAddr;

use url::{Host, Url};

use crate::address::non_public_kind;

/// How git would reach the repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepoScheme {
    Https,
    Http,
    /// `git://`: git's own unauthenticated protocol.
    Git,
    /// `ssh://…` or `user@host:path`.
    Ssh,
    /// `file://`: the worker's own disk.
    File,
}

/// A host as the URL names it: an address, or a name to resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepoHost {
    Ip(IpAddr),
    Name(String),
}

/// The parts of a `repo.url` that decide where git connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoUrl {
    pub scheme: RepoScheme,
    /// `None` only for `file://`.
    pub host: Option<RepoHost>,
    /// The port git connects to (the scheme's default when none is named).
    pub port: u16,
    /// The URL as git is to be given it: for http(s), as the URL parser
    /// normalised it (so git connects to the host that was vetted, not to
    /// its own reading of, say, `0x7f.1`).
    pub normalized: String,
}

/// What the deployment lets a repository URL reach.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RepoRules {
    /// Hosts on loopback, private, link-local and reserved addresses
    /// (`KILN_ALLOW_PRIVATE_REPOS`).
    pub allow_private: bool,
    /// `git://` and `ssh://` (and `user@host:path`) URLs
    /// (`KILN_ALLOW_GIT_PROTOCOLS`).
    pub allow_git_protocols: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RepoUrlError {
    /// Never echoes the URL: it may hold a secret.
    #[error(
        "repo.url must not carry credentials (user:password@); Kiln clones public repositories, and \
         GitHub-triggered runs authenticate with the GitHub App's token"
    )]
    Credentials,
    #[error("repo.url is not a URL git can use: {0}")]
    Malformed(String),
    #[error(
        "repo.url uses {0}://, which this deployment does not allow; only https and http are cloned unless the \
         deployment sets KILN_ALLOW_GIT_PROTOCOLS=true"
    )]
    Protocol(&'static str),
    #[error(
        "repo.url names a {0} address; repositories are cloned from public addresses only unless the deployment \
         sets KILN_ALLOW_PRIVATE_REPOS=true"
    )]
    NotPublic(&'static str),
}

impl RepoScheme {
    pub fn as_str(self) -> &'static str {
        match self {
            RepoScheme::Https => "https",
            RepoScheme::Http => "http",
            RepoScheme::Git => "git",
            RepoScheme::Ssh => "ssh",
            RepoScheme::File => "file",
        }
    }
}

/// Parses `raw` (already of [`crate::input::REPO_URL`]'s shape) and refuses
/// credentials in it. An ssh user name (`git@host:path`) is not a secret and
/// stays; a password never does.
pub fn parse_repo_url(raw: &str) -> Result<RepoUrl, RepoUrlError> {
    if !raw.contains("://") {
        return parse_scp_like(raw);
    }
    let url = Url::parse(raw).map_err(|e| RepoUrlError::Malformed(e.to_string()))?;
    let scheme = match url.scheme() {
        "https" => RepoScheme::Https,
        "http" => RepoScheme::Http,
        "git" => RepoScheme::Git,
        "ssh" => RepoScheme::Ssh,
        "file" => RepoScheme::File,
        other => return Err(RepoUrlError::Malformed(format!("scheme {other} is not one git is allowed to use"))),
    };
    if url.password().is_some() || (!url.username().is_empty() && scheme != RepoScheme::Ssh) {
        return Err(RepoUrlError::Credentials);
    }
    let host = match url.host() {
        None => None,
        Some(Host::Ipv4(ip)) => Some(RepoHost::Ip(IpAddr::V4(ip))),
        Some(Host::Ipv6(ip)) => Some(RepoHost::Ip(IpAddr::V6(ip))),
        // git:// and ssh:// are not special to the URL parser: their hosts
        // stay text, an address among them.
        Some(Host::Domain(name)) => Some(match name.parse::<IpAddr>() {
            Ok(ip) => RepoHost::Ip(ip),
            Err(_) => RepoHost::Name(name.to_ascii_lowercase()),
        }),
    };
    if host.is_none() && scheme != RepoScheme::File {
        return Err(RepoUrlError::Malformed("no host".into()));
    }
    let default_port = match scheme {
        RepoScheme::Https => 443,
        RepoScheme::Http => 80,
        RepoScheme::Git => 9418,
        RepoScheme::Ssh => 22,
        RepoScheme::File => 0,
    };
    let port = url.port().unwrap_or(default_port);
    let normalized = match scheme {
        RepoScheme::Https | RepoScheme::Http => url.to_string(),
        _ => raw.to_owned(),
    };
    Ok(RepoUrl { scheme, host, port, normalized })
}

/// `[user@]host:path`, git's scp-like ssh form.
fn parse_scp_like(raw: &str) -> Result<RepoUrl, RepoUrlError> {
    // The user is what comes before the first `@`, if that is before any
    // `/` (a path may hold `@`); `user:secret@` has no place here.
    let rest = match raw.split_once('@') {
        Some((user, _)) if user.contains(':') && !user.contains('/') => return Err(RepoUrlError::Credentials),
        Some((user, rest)) if !user.contains('/') => rest,
        _ => raw,
    };
    let host = match rest.strip_prefix('[') {
        // `[::1]:path`
        Some(bracketed) => bracketed.split_once(']').map(|(h, _)| h),
        None => rest.split_once(':').map(|(h, _)| h),
    };
    let host = host.ok_or_else(|| RepoUrlError::Malformed("no path".into()))?;
    if host.is_empty() {
        return Err(RepoUrlError::Malformed("no host".into()));
    }
    let host = match host.parse::<IpAddr>() {
        Ok(ip) => RepoHost::Ip(ip),
        Err(_) => RepoHost::Name(host.to_ascii_lowercase()),
    };
    Ok(RepoUrl { scheme: RepoScheme::Ssh, host: Some(host), port: 22, normalized: raw.to_owned() })
}

impl RepoRules {
    /// Whether `url` may be cloned, as far as can be told without DNS:
    /// the protocol, and a literal address.
    pub fn check(&self, url: &RepoUrl) -> Result<(), RepoUrlError> {
        if matches!(url.scheme, RepoScheme::Git | RepoScheme::Ssh) && !self.allow_git_protocols {
            return Err(RepoUrlError::Protocol(url.scheme.as_str()));
        }
        if let (Some(RepoHost::Ip(ip)), false) = (&url.host, self.allow_private)
            && let Some(kind) = non_public_kind(*ip)
        {
            return Err(RepoUrlError::NotPublic(kind));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_refused_and_an_ssh_user_name_is_not_one() {
        for raw in [
            "https://user:token@github.com/o/r.git",
            "https://token@github.com/o/r.git",
            "http://u:p@example.com/r",
            "git://u@example.com/r",
            "ssh://git:pw@example.com/r",
            "git:pw@example.com:o/r.git",
        ] {
            assert_eq!(parse_repo_url(raw), Err(RepoUrlError::Credentials), "{raw}");
        }
        assert!(!RepoUrlError::Credentials.to_string().contains("token@"));
        for raw in ["ssh://git@example.com/o/r.git", "git@github.com:o/r.git"] {
            let url = parse_repo_url(raw).unwrap();
            assert_eq!(url.scheme, RepoScheme::Ssh, "{raw}");
            assert!(matches!(url.host, Some(RepoHost::Name(_))), "{raw}");
        }
    }

    #[test]
    fn literal_internal_addresses_are_refused_unless_allowed() {
        let strict = RepoRules::default();
        let open = RepoRules { allow_private: true, allow_git_protocols: true };
        for (raw, kind) in [
            ("http://127.0.0.1:8080/r.git", "loopback"),
            ("https://10.1.2.3/r.git", "private"),
            ("http://[::1]/r", "loopback"),
            ("http://169.254.169.254/latest", "link-local"),
            // The URL parser reads the forms curl reads too.
            ("http://0x7f.1/r", "loopback"),
            ("http://2130706433/r", "loopback"),
        ] {
            let url = parse_repo_url(raw).unwrap();
            assert_eq!(strict.check(&url), Err(RepoUrlError::NotPublic(kind)), "{raw}");
            assert_eq!(open.check(&url), Ok(()), "{raw}");
        }
        let git = RepoRules { allow_git_protocols: true, ..RepoRules::default() };
        for raw in ["git://192.168.0.1/r", "ssh://git@10.0.0.1/r", "git@10.0.0.1:o/r.git", "git@[fd00::1]:o/r"] {
            assert_eq!(git.check(&parse_repo_url(raw).unwrap()), Err(RepoUrlError::NotPublic("private")), "{raw}");
        }
        let public = parse_repo_url("https://github.com/o/r.git").unwrap();
        assert_eq!(strict.check(&public), Ok(()));
        assert_eq!(public.port, 443);
        assert_eq!(public.host, Some(RepoHost::Name("github.com".into())));
    }

    #[test]
    fn git_and_ssh_need_the_setting() {
        let strict = RepoRules::default();
        for (raw, scheme) in [("git://example.com/r", "git"), ("ssh://example.com/r", "ssh"), ("git@x.org:o/r", "ssh")]
        {
            assert_eq!(strict.check(&parse_repo_url(raw).unwrap()), Err(RepoUrlError::Protocol(scheme)), "{raw}");
        }
    }
}
