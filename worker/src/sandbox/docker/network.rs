//! A session's own Docker network (the Docker backend's part of egress): `internal` (the engine gives it no route
//! out and no NAT), holding the session's sandbox alone. The only thing on
//! it the sandbox can talk to is the network's gateway, the worker's host,
//! where the session's egress proxy listens.
//!
//! One network per session, not per worker, so that the listener a
//! connection arrives on says whose it is, and one sandbox can never reach
//! another's. The engine gives each network a subnet from its address
//! pools (`default-address-pools` in daemon.json sets how many there are).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

use bollard::Docker;
use bollard::models::NetworkCreateRequest;
use uuid::Uuid;

use crate::egress::EgressSettings;
use crate::egress::host_firewall::{BridgeRules, FirewallError, HostFirewall};
use crate::labels::{LABEL_MANAGED, LABEL_SESSION};

const PREFIX: &str = "kiln-egress-";

/// The session's network's name.
pub fn name(session_id: Uuid) -> String {
    format!("{PREFIX}{}", session_id.simple())
}

/// The session whose network `name` is, if it is one.
pub fn session_of(name: &str) -> Option<Uuid> {
    Uuid::try_parse(name.strip_prefix(PREFIX)?).ok()
}

/// What the host's interfaces of session networks start with: one firewall
/// rule on `kiln+` (docs/deployment.md) covers every session's network.
pub const BRIDGE_PREFIX: &str = "kiln";

/// The host-side bridge of the session's network: the prefix and the last
/// 11 hex digits of the id (interface names have at most 15 characters;
/// the end of a v7 id is its random part, its start a timestamp).
pub fn bridge_name(session_id: Uuid) -> String {
    let hex = session_id.simple().to_string();
    format!("{BRIDGE_PREFIX}{}", &hex[hex.len() - 11..])
}

/// The session's network and its gateway address (where the proxy listens).
#[derive(Debug, Clone)]
pub struct SessionNetwork {
    pub name: String,
    /// The engine's id of this network: the name is the session's and
    /// comes back with a follow-up's network; the id never does.
    pub id: String,
    pub gateway: Ipv4Addr,
    /// The IPv4 subnet its sandbox's address is from.
    pub subnet: String,
}

#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    #[error("docker: {0}")]
    Docker(#[from] bollard::errors::Error),
    #[error("the network {0} has no IPv4 gateway")]
    NoGateway(String),
    #[error("the engine gave no id for the network {0}")]
    NoId(String),
    #[error("closing the host to the network {network}'s sandbox: {error}")]
    HostFirewall { network: String, error: FirewallError },
}

/// The session's network, created if it does not exist yet, with the
/// host's firewall rules for it (see `host_firewall`: installed again for
/// a network that exists already, e.g. after a worker's restart). A network
/// this call made whose rules `KILN_EGRESS_HOST_FIREWALL=on` requires and
/// cannot get is removed again.
pub async fn ensure(
    docker: &Docker,
    settings: &EgressSettings,
    session_id: Uuid,
) -> Result<SessionNetwork, NetworkError> {
    let (net, made) = match find(docker, session_id).await? {
        Some(net) => (net, false),
        None => (create(docker, session_id).await?, true),
    };
    let rules = BridgeRules {
        network_id: firewall_key(&net),
        bridge: &bridge_name(session_id),
        subnet: &net.subnet,
        gateway: net.gateway,
        port: settings.port,
    };
    if let Err(error) = settings.host_firewall.protect(&rules).await {
        if made {
            remove(docker, &settings.host_firewall, session_id).await;
        }
        return Err(NetworkError::HostFirewall { network: net.name, error });
    }
    // Rules a predecessor of the same name left on this bridge (a worker
    // that died between removing the network and its rules) are not this
    // network's: they go now, and only they.
    settings.host_firewall.unprotect_others_on(&rules).await;
    Ok(net)
}

/// What a network's host firewall rules are found by: its id, which no
/// other network ever has. Its name would also find the rules of the
/// network a follow-up of the same session makes after it.
fn firewall_key(net: &SessionNetwork) -> &str {
    &net.id
}

/// Removes the host firewall rules of `net`, that network alone: a
/// successor of the same name keeps its own.
pub async fn unprotect(firewall: &HostFirewall, net: &SessionNetwork) {
    firewall.unprotect(firewall_key(net)).await;
}

async fn create(docker: &Docker, session_id: Uuid) -> Result<SessionNetwork, NetworkError> {
    let name = name(session_id);
    let request = NetworkCreateRequest {
        name: name.clone(),
        driver: Some("bridge".into()),
        internal: Some(true),
        enable_ipv6: Some(false),
        options: Some(HashMap::from([("com.docker.network.bridge.name".to_owned(), bridge_name(session_id))])),
        labels: Some(HashMap::from([
            (LABEL_MANAGED.to_owned(), "true".to_owned()),
            (LABEL_SESSION.to_owned(), session_id.to_string()),
        ])),
        ..Default::default()
    };
    // Engines before API 1.44 accept a second network of the same name
    // unless asked not to; looking first (above) is what keeps them one.
    docker.create_network(request).await?;
    find(docker, session_id).await?.ok_or_else(|| NetworkError::NoGateway(name))
}

/// The session's network, if it exists.
pub async fn find(docker: &Docker, session_id: Uuid) -> Result<Option<SessionNetwork>, NetworkError> {
    let name = name(session_id);
    let inspected = match docker.inspect_network(&name, None).await {
        Ok(n) => n,
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let id = inspected.id.clone().filter(|id| !id.is_empty()).ok_or_else(|| NetworkError::NoId(name.clone()))?;
    let (gateway, subnet) = inspected
        .ipam
        .and_then(|ipam| ipam.config)
        .unwrap_or_default()
        .iter()
        .find_map(|c| Some((c.gateway.as_deref()?.parse::<Ipv4Addr>().ok()?, c.subnet.clone()?)))
        .ok_or_else(|| NetworkError::NoGateway(name.clone()))?;
    Ok(Some(SessionNetwork { name, id, gateway, subnet }))
}

/// The address `container` has on the session's network, if it is on it.
pub async fn address_of(docker: &Docker, container: &str, session_id: Uuid) -> Result<Option<IpAddr>, NetworkError> {
    let info = docker.inspect_container(container, None).await?;
    let networks = info.network_settings.and_then(|s| s.networks).unwrap_or_default();
    Ok(networks.get(&name(session_id)).and_then(|e| e.ip_address.as_deref()?.parse().ok()))
}

/// Removes the session's network, then its host firewall rules; gone
/// already is fine. The engine refuses while a container is still
/// attached: the caller removes the container first. A network that stays
/// keeps its rules (its sandbox must not reach the host meanwhile).
///
/// The network is removed by its id and its rules by that id too: a
/// follow-up of the session may make the network again at any moment (the
/// reaper racing a just-claimed run), and the successor and its rules are
/// never touched.
pub async fn remove(docker: &Docker, firewall: &HostFirewall, session_id: Uuid) {
    let id = match docker.inspect_network(&name(session_id), None).await {
        Ok(inspected) => inspected.id.unwrap_or_default(),
        // Never made (most runs have no egress), or removed by another
        // path, which took its rules along; rules of a network removed by
        // hand are swept when a worker starts or stops.
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => return,
        Err(e) => {
            tracing::warn!(%session_id, error = %e, "finding the session's egress network to remove it failed");
            return;
        }
    };
    if id.is_empty() {
        tracing::warn!(%session_id, "the engine gave no id for the session's egress network; not removed");
        return;
    }
    match docker.remove_network(&id).await {
        Ok(()) => firewall.unprotect(&id).await,
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {}
        Err(e) => tracing::warn!(%session_id, error = %e, "removing the session's egress network failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bridge_names_fit_an_interface_name_and_differ_for_ids_of_the_same_moment() {
        let a = Uuid::now_v7();
        let b = Uuid::now_v7();
        assert!(bridge_name(a).len() <= 15 && bridge_name(a).starts_with(BRIDGE_PREFIX));
        assert_ne!(bridge_name(a), bridge_name(b));
    }

    #[test]
    fn a_session_network_names_its_session_and_no_other_network_does() {
        let session = Uuid::now_v7();
        assert_eq!(session_of(&name(session)), Some(session));
        assert_eq!(session_of("bridge"), None);
        assert_eq!(session_of("kiln-egress-x"), None);
    }
}
