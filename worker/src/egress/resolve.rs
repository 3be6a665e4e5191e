//! Resolve and vet: the proxy looks a name up itself (the sandbox has no
//! resolver), refuses it if any address it resolves to is not one the
//! deployment lets sandboxes reach, and hands back exactly the addresses it
//! vetted, which are the only ones the proxy then connects to (no second
//! lookup, so no DNS rebinding between the check and the connection).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use kiln_protocol::address::non_public_kind;

/// Who may be reached, after resolving.
#[derive(Debug, Clone, Default)]
pub struct AddressRules {
    /// Non-public ranges the operator lets sandboxes reach anyway (an
    /// internal registry, or a test's own network).
    pub allow_ranges: Vec<IpNet>,
    /// Ranges never reached, whatever else says: the deployment's own
    /// public addresses (its API, its load balancer).
    pub deny_ranges: Vec<IpNet>,
    /// Names answered here before DNS (lower-case): split-horizon names,
    /// and the tests' made-up ones.
    pub hosts: HashMap<String, Vec<IpAddr>>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("could not resolve the name")]
    Resolve,
    /// Names the kind of address, not the address: the event reaches the
    /// run's owner, who need not learn the internal network's layout.
    #[error("resolves to a {0} address")]
    NotPublic(&'static str),
    #[error("resolves to one of the deployment's own addresses")]
    Denied,
}

impl AddressRules {
    /// Whether `ip` may be reached: never in a denied range; otherwise a
    /// public address, or one in an allowed range.
    pub fn vet(&self, ip: IpAddr) -> Result<(), Refused> {
        let ip = canonical(ip);
        if self.deny_ranges.iter().any(|r| r.contains(&ip)) {
            return Err(Refused::Denied);
        }
        match non_public_kind(ip) {
            Some(_) if self.allow_ranges.iter().any(|r| r.contains(&ip)) => Ok(()),
            Some(kind) => Err(Refused::NotPublic(kind)),
            None => Ok(()),
        }
    }

    /// The vetted addresses of `host:port`; every address the name has
    /// must pass, not just the first (a client could be steered to any).
    pub async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, Refused> {
        let ips: Vec<IpAddr> = if let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            vec![ip]
        } else if let Some(ips) = self.hosts.get(host) {
            ips.clone()
        } else {
            tokio::net::lookup_host((host, port)).await.map_err(|_| Refused::Resolve)?.map(|a| a.ip()).collect()
        };
        if ips.is_empty() {
            return Err(Refused::Resolve);
        }
        for ip in &ips {
            self.vet(*ip)?;
        }
        Ok(ips.into_iter().map(|ip| SocketAddr::new(canonical(ip), port)).collect())
    }
}

/// `::ffff:a.b.c.d` is a.b.c.d: ranges are written in IPv4.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Parses `name=ip[,name=ip…]` (a name may repeat for several addresses).
pub fn parse_hosts(s: &str) -> Result<HashMap<String, Vec<IpAddr>>, String> {
    let mut hosts: HashMap<String, Vec<IpAddr>> = HashMap::new();
    for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, ip) = entry.split_once('=').ok_or_else(|| format!("{entry:?}: expected name=ip"))?;
        let ip: IpAddr = ip.trim().parse().map_err(|_| format!("{entry:?}: bad address"))?;
        hosts.entry(kiln_protocol::egress::normalize_host(name.trim())).or_default().push(ip);
    }
    Ok(hosts)
}

/// Parses a comma-separated list of CIDR ranges.
pub fn parse_ranges(s: &str) -> Result<Vec<IpNet>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|r| r.parse::<IpNet>().map_err(|_| format!("{r:?} is not a CIDR range")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_address_is_vetted_and_ranges_decide() {
        let rules = AddressRules {
            allow_ranges: parse_ranges("10.9.0.0/16").unwrap(),
            deny_ranges: parse_ranges("10.9.9.0/24, 203.0.113.7/32").unwrap(),
            hosts: parse_hosts(
                "ok.test=10.9.1.1, mixed.test=10.9.1.2, mixed.test=127.0.0.1, meta.test=169.254.169.254",
            )
            .unwrap(),
        };
        assert_eq!(rules.resolve("ok.test", 80).await, Ok(vec!["10.9.1.1:80".parse().unwrap()]));
        assert_eq!(rules.resolve("mixed.test", 80).await, Err(Refused::NotPublic("loopback")));
        assert_eq!(rules.resolve("meta.test", 80).await, Err(Refused::NotPublic("link-local")));
        assert_eq!(rules.resolve("10.9.9.1", 80).await, Err(Refused::Denied));
        assert_eq!(rules.resolve("203.0.113.7", 443).await, Err(Refused::Denied));
        assert_eq!(rules.resolve("::ffff:127.0.0.1", 80).await, Err(Refused::NotPublic("loopback")));
        assert_eq!(rules.resolve("[::ffff:10.9.1.1]", 80).await, Ok(vec!["10.9.1.1:80".parse().unwrap()]));
        assert!(parse_hosts("nonsense").is_err());
        assert!(parse_ranges("10.0.0.0/33").is_err());
    }
}
