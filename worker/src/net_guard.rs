//! Resolve, vet, pin: how the worker opens a connection a user named
//! (a completion callback, a repository to clone). The host is resolved
//! here, every address it resolves to must be public unless the deployment
//! allows private ones, and the caller then connects to exactly those
//! addresses, so a second lookup cannot send the connection somewhere else
//! (DNS rebinding). Which addresses are public is `kiln_protocol::address`,
//! shared with the API's checks at submission.

use std::net::{IpAddr, SocketAddr};

pub use kiln_protocol::address::non_public_kind;

/// A host as a URL names it.
#[derive(Debug, Clone, Copy)]
pub enum HostRef<'a> {
    Ip(IpAddr),
    Name(&'a str),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuardError {
    #[error("could not resolve {host}: {error}")]
    Resolve { host: String, error: String },
    /// Names the kind of address, never the address: the message reaches
    /// the user, who must not learn the internal network's layout from it.
    #[error("{host} resolves to a {kind} address")]
    NotPublic { host: String, addr: IpAddr, kind: &'static str },
}

/// The addresses to connect to for `host:port`, every one of them vetted.
pub async fn resolve_vetted(host: HostRef<'_>, port: u16, allow_private: bool) -> Result<Vec<SocketAddr>, GuardError> {
    let (name, addrs) = match host {
        HostRef::Ip(ip) => (ip.to_string(), vec![SocketAddr::new(ip, port)]),
        HostRef::Name(name) => {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((name, port))
                .await
                .map_err(|e| GuardError::Resolve { host: name.to_owned(), error: e.to_string() })?
                .collect();
            if addrs.is_empty() {
                return Err(GuardError::Resolve { host: name.to_owned(), error: "no addresses".into() });
            }
            (name.to_owned(), addrs)
        }
    };
    if !allow_private {
        // Every address, not just the first: the client may try any of them.
        for addr in &addrs {
            if let Some(kind) = non_public_kind(addr.ip()) {
                return Err(GuardError::NotPublic { host: name, addr: addr.ip(), kind });
            }
        }
    }
    Ok(addrs)
}
