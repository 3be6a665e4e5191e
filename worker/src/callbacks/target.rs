//! Where a callback may go. The URL is the user's, so a worker must not be
//! a way into the network it sits in: the host is resolved here, every
//! address it resolves to must be a public one (unless the deployment allows
//! private targets), and the request is then pinned to exactly those
//! addresses, so a second lookup cannot hand the connection somewhere else
//! (DNS rebinding).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use url::{Host, Url};

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
    let (domain, addrs) = match url.host() {
        None => return Err(TargetError::Url("no host".into())),
        Some(Host::Ipv4(ip)) => (None, vec![SocketAddr::new(IpAddr::V4(ip), port)]),
        Some(Host::Ipv6(ip)) => (None, vec![SocketAddr::new(IpAddr::V6(ip), port)]),
        Some(Host::Domain(name)) => {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((name, port))
                .await
                .map_err(|e| TargetError::Resolve { host: name.to_owned(), error: e.to_string() })?
                .collect();
            if addrs.is_empty() {
                return Err(TargetError::Resolve { host: name.to_owned(), error: "no addresses".into() });
            }
            (Some(name.to_owned()), addrs)
        }
    };
    if !allow_private {
        // Every address, not just the first: the client may try any of them.
        for addr in &addrs {
            if let Some(kind) = non_public_kind(addr.ip()) {
                let host = url.host_str().unwrap_or_default().to_owned();
                return Err(TargetError::NotPublic { host, addr: addr.ip(), kind });
            }
        }
    }
    Ok(Target { url, domain, addrs })
}

/// What kind of non-public address `ip` is, or `None` for a public one.
/// Covers loopback, private (RFC 1918, unique local), link-local (cloud
/// metadata services live at 169.254.169.254 and fd00:ec2::254), carrier-grade
/// NAT (Alibaba's metadata at 100.100.100.200), and everything reserved.
pub fn non_public_kind(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_kind(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            // ::ffff:127.0.0.1 reaches 127.0.0.1.
            Some(v4) => v4_kind(v4),
            None => v6_kind(v6),
        },
    }
}

fn v4_kind(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_private() {
        Some("private")
    } else if ip.is_link_local() {
        Some("link-local")
    } else if ip.is_unspecified() || a == 0 {
        Some("unspecified")
    } else if a == 100 && (64..128).contains(&b) {
        Some("shared (carrier-grade NAT)")
    } else if ip.is_multicast()
        || ip.is_broadcast()
        || a >= 240
        || ip.is_documentation()
        // Benchmarking (198.18.0.0/15) and IETF protocol assignments (192.0.0.0/24).
        || (a == 198 && (18..20).contains(&b))
        || (a == 192 && b == 0 && ip.octets()[2] == 0)
    {
        Some("reserved")
    } else {
        None
    }
}

fn v6_kind(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unspecified() {
        Some("unspecified")
    } else if ip.is_unique_local() {
        Some("private")
    } else if ip.is_unicast_link_local() || (first & 0xffc0) == 0xfec0 {
        // fec0::/10: the deprecated site-local range, still private in practice.
        Some("link-local")
    } else if ip.is_multicast() || first == 0x2001 && ip.segments()[1] == 0xdb8 {
        Some("reserved")
    } else if first == 0x64 && ip.segments()[1] == 0xff9b {
        // NAT64 (64:ff9b::/96) embeds an IPv4 address; judge that one.
        let [.., c, d] = ip.segments();
        let v4 = Ipv4Addr::new((c >> 8) as u8, c as u8, (d >> 8) as u8, d as u8);
        v4_kind(v4)
    } else if (first & 0xe000) != 0x2000 {
        // Outside 2000::/3, the only globally routed unicast space.
        Some("reserved")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(s: &str) -> Option<&'static str> {
        non_public_kind(s.parse().unwrap())
    }

    #[test]
    fn internal_addresses_are_not_public() {
        for (ip, expected) in [
            ("127.0.0.1", "loopback"),
            ("127.8.9.10", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "link-local"),
            ("100.100.100.200", "shared (carrier-grade NAT)"),
            ("0.0.0.0", "unspecified"),
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("fd00:ec2::254", "private"),
            ("fe80::1", "link-local"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.0.0.1", "private"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
        ] {
            assert_eq!(kind(ip), Some(expected), "{ip}");
        }
        for ip in ["224.0.0.1", "255.255.255.255", "240.0.0.1", "192.0.2.1", "198.18.0.1", "ff02::1", "2001:db8::1"] {
            assert_eq!(kind(ip), Some("reserved"), "{ip}");
        }
    }

    #[test]
    fn public_addresses_are_public() {
        for ip in ["1.1.1.1", "8.8.8.8", "93.184.216.34", "100.128.0.1", "2606:4700:4700::1111", "64:ff9b::808:808"] {
            assert_eq!(kind(ip), None, "{ip}");
        }
    }

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
