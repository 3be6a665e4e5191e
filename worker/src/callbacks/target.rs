//! Where a callback may go. The URL is the user's, so a worker must not be
//! a way into the network it sits in: the host is resolved here, every
//! address it resolves to must be a public one (unless the deployment allows
//! private targets), and the request is then pinned to exactly those
//! addresses, so a second lookup cannot hand the connection somewhere else
//! (DNS rebinding). The vetting is `crate::net_guard`'s, shared with
//! repository clones.

use std::net::{IpAddr, SocketAddr};

use url::{Host, Url};

use crate::net_guard::{GuardError, HostRef, resolve_vetted};

/// A vetted target: connect to `addrs` for `url`.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: Url,
    /// The host name to pin, when the URL names one (not an IP literal).
    pub domain: Option<String>,
    pub addrs: Vec<SocketAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("callback_url is not a usable http(s) URL: {0}")]
    Url(String),
    #[error("could not resolve {host}: {error}")]
    Resolve { host: String, error: String },
    /// The message names the kind of address, not the address: it is shown
    /// to the user, who must not learn the internal network's layout from it.
    #[error(
        "refused to call {host}: it resolves to a {kind} address; callbacks only go to public addresses unless \
         the deployment sets KILN_CALLBACK_ALLOW_PRIVATE=true"
    )]
    NotPublic { host: String, addr: IpAddr, kind: &'static str },
}

impl TargetError {
    /// Whether a later attempt could fare better (a failed lookup may be
    /// transient; a refused address or a bad URL is not).
    pub fn is_transient(&self) -> bool {
        matches!(self, TargetError::Resolve { .. })
    }
}

/// Parses, resolves and vets `raw`.
pub async fn resolve(raw: &str, allow_private: bool) -> Result<Target, TargetError> {
    let url = Url::parse(raw).map_err(|e| TargetError::Url(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(TargetError::Url(format!("scheme {} is not http(s)", url.scheme())));
    }
    let port = url.port_or_known_default().ok_or_else(|| TargetError::Url("no port".into()))?;
    let (domain, host) = match url.host() {
        None => return Err(TargetError::Url("no host".into())),
        Some(Host::Ipv4(ip)) => (None, HostRef::Ip(IpAddr::V4(ip))),
        Some(Host::Ipv6(ip)) => (None, HostRef::Ip(IpAddr::V6(ip))),
        Some(Host::Domain(name)) => (Some(name.to_owned()), HostRef::Name(name)),
    };
    let addrs = resolve_vetted(host, port, allow_private).await.map_err(|e| match e {
        GuardError::Resolve { host, error } => TargetError::Resolve { host, error },
        GuardError::NotPublic { addr, kind, .. } => {
            TargetError::NotPublic { host: url.host_str().unwrap_or_default().to_owned(), addr, kind }
        }
    })?;
    Ok(Target { url, domain, addrs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn loopback_targets_are_refused_unless_allowed() {
        for url in ["http://127.0.0.1:9/x", "http://[::1]:9/x", "http://localhost:9/x", "http://[::ffff:7f00:1]/"] {
            let err = resolve(url, false).await.unwrap_err();
            assert!(matches!(err, TargetError::NotPublic { kind: "loopback", .. }), "{url}: {err}");
            assert!(err.to_string().contains("KILN_CALLBACK_ALLOW_PRIVATE"), "{err}");
        }
        let target = resolve("http://localhost:9/x", true).await.unwrap();
        assert_eq!(target.domain.as_deref(), Some("localhost"));
        assert!(target.addrs.iter().all(|a| a.ip().is_loopback() && a.port() == 9));
    }
}
