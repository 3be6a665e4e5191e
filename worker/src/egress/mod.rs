//! Egress: a sandbox reaches only what its policy allows, through the
//! worker's own proxy, and every refusal is an event of the run.
//!
//! Where things are enforced:
//! - the sandbox sits alone on its session's `internal` Docker network
//!   (made by the sandbox's backend: `sandbox::docker::network`, where the
//!   backend also says where the proxy listens, [`ProxyRoute`]): no route out, no NAT, and a resolver that forwards
//!   nowhere, so it cannot reach anything by itself; it holds no capability
//!   to change its interfaces or routes;
//! - the only thing it can talk to is this proxy (`proxy`), which the
//!   worker runs for the session's current run, bound to that network's
//!   gateway address, and which judges every request by the policy
//!   (`kiln_protocol::egress`) and every address by `resolve`;
//! - decisions go to the run's stream through `log`;
//! - the host's own services, which the sandbox could reach at its
//!   gateway address, are closed to it by the host's firewall
//!   (`host_firewall`), where the worker may manage it.

pub mod client_hello;
pub mod host_firewall;
pub mod log;
pub mod proxy;
pub mod resolve;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use kiln_protocol::egress::{EgressMode, EgressPolicy, HostRule, Layers, PRESET_COMMON};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

pub use log::{NetworkLog, Redact};
use proxy::ProxyContext;
pub use resolve::AddressRules;

/// Where the sandbox's resolver forwards names it does not know: an
/// address from TEST-NET-1 (never routed), which the sandbox, having no
/// route beyond its own network, cannot reach either. Docker's embedded DNS
/// forwards from the container's own network namespace (only loopback
/// upstreams are dialled from the host's), so no query leaves.
pub const SANDBOX_DNS: &str = "192.0.2.1";

/// The deployment's egress settings.
#[derive(Debug, Clone)]
pub struct EgressSettings {
    /// The most any run gets (`KILN_EGRESS_MODE`, `KILN_EGRESS_ALLOW`).
    pub deployment: EgressPolicy,
    /// Which addresses names may resolve to, and static names.
    pub addresses: Arc<AddressRules>,
    /// The port the proxy listens on, on each session network's gateway.
    pub port: u16,
    /// Connections one session's proxy holds open at once.
    pub max_connections: usize,
    /// The host's firewall rules closing the host to each session's
    /// sandbox (`KILN_EGRESS_HOST_FIREWALL`).
    pub host_firewall: Arc<host_firewall::HostFirewall>,
}

impl Default for EgressSettings {
    fn default() -> Self {
        EgressSettings {
            deployment: EgressPolicy { mode: EgressMode::None, allow: Some(preset_common()) },
            addresses: Arc::default(),
            port: 3128,
            max_connections: 256,
            host_firewall: Arc::default(),
        }
    }
}

/// The `@common` preset as rules.
pub fn preset_common() -> Vec<HostRule> {
    PRESET_COMMON.iter().map(|h| HostRule::host(h, vec![443])).collect()
}

/// Parses the operator's list: `host`, `host:port`, `*.host`, and `@common`
/// for the preset, comma-separated.
pub fn parse_allow(list: &str) -> Result<Vec<HostRule>, String> {
    let mut rules = Vec::new();
    for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        match item {
            "@common" => rules.extend(preset_common()),
            _ if item.starts_with('@') => return Err(format!("{item:?}: the only preset is @common")),
            _ => rules.push(HostRule::parse_short(item)?),
        }
    }
    Ok(rules)
}

/// The proxy settings a sandbox's commands see (for convenience: the
/// network, not these, is what makes the proxy the only way out).
pub fn proxy_env(proxy: SocketAddr) -> Vec<String> {
    let url = format!("http://{proxy}");
    let no_proxy = "localhost,127.0.0.1,::1";
    let mut env = Vec::new();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "npm_config_proxy", "npm_config_https_proxy"]
    {
        env.push(format!("{name}={url}"));
    }
    env.push(format!("NO_PROXY={no_proxy}"));
    env.push(format!("no_proxy={no_proxy}"));
    // pip, git and curl read the variables above; pip's own names too.
    env.push(format!("PIP_PROXY={url}"));
    env
}

/// Which phase of a run a proxy serves: an environment's setup, or the
/// agent's work. Each has its own policy, named so in events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Setup,
    Agent,
}

impl Phase {
    /// The `layer` of a refusal by the phase's own policy.
    pub fn layer(self) -> &'static str {
        match self {
            Phase::Setup => "setup",
            Phase::Agent => "run",
        }
    }
}

/// A session's proxy, serving while this lives.
pub struct SessionProxy {
    task: tokio::task::JoinHandle<()>,
    pub log: Arc<NetworkLog>,
    pub addr: SocketAddr,
}

impl Drop for SessionProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SessionProxy {
    /// Stops serving and waits until the listener is closed, so that the
    /// next phase's proxy can listen on the same address at once.
    pub async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }

    /// Listens on `listen` for the sandbox at `client`, judging by `layers`
    /// (the agent phase's: refusals by the run's policy say `run`).
    pub async fn start(
        settings: &EgressSettings,
        layers: Layers,
        listen: SocketAddr,
        client: Option<IpAddr>,
    ) -> io::Result<SessionProxy> {
        Self::start_for(settings, layers, Phase::Agent, listen, client, None).await
    }

    /// [`SessionProxy::start`] for `phase`; `redact` masks what its
    /// decisions show (in events and logs).
    pub async fn start_for(
        settings: &EgressSettings,
        layers: Layers,
        phase: Phase,
        listen: SocketAddr,
        client: Option<IpAddr>,
        redact: Option<Redact>,
    ) -> io::Result<SessionProxy> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let log = Arc::new(redact.map_or_else(NetworkLog::default, NetworkLog::redacting));
        let ctx = ProxyContext {
            layers,
            addresses: settings.addresses.clone(),
            log: log.clone(),
            client,
            permits: Arc::new(Semaphore::new(settings.max_connections)),
            phase_layer: phase.layer(),
        };
        let task = proxy::spawn(listener, Arc::new(ctx));
        Ok(SessionProxy { task, log, addr })
    }
}

/// Where a sandbox's egress proxy listens and whom it answers, as the
/// sandbox's backend places it (`SandboxBackend::proxy_route`; Docker: the
/// session network's gateway and the sandbox's address on that network).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyRoute {
    /// The address the proxy listens on (its port is the deployment's).
    pub listen: IpAddr,
    /// The one address it answers.
    pub client: IpAddr,
}

/// The proxy for one sandbox in `phase`, judging by `layers`, on the route
/// its backend gave; `redact` masks its decisions wherever they are shown
/// (the setup phase's, whose sandbox holds the environment's secrets).
pub async fn serve(
    settings: &EgressSettings,
    layers: Layers,
    phase: Phase,
    route: ProxyRoute,
    redact: Option<Redact>,
) -> Result<SessionProxy, ServeError> {
    let listen = SocketAddr::new(route.listen, settings.port);
    SessionProxy::start_for(settings, layers, phase, listen, Some(route.client), redact)
        .await
        .map_err(|error| ServeError::Listen { listen, error })
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Most likely: this worker is not in the engine host's network
    /// namespace, where the gateway address is.
    #[error(
        "listening on {listen}: {error} (the worker must share the Docker host's network; see docs/deployment.md, Egress)"
    )]
    Listen { listen: SocketAddr, error: io::Error },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operators_list_takes_the_preset_and_more() {
        let rules = parse_allow("@common, registry.internal:8443, *.corp.example").unwrap();
        assert_eq!(rules.len(), PRESET_COMMON.len() + 2);
        assert!(rules.iter().any(|r| r.host == "pypi.org" && r.ports == [443]));
        assert!(parse_allow("@everything").is_err());
        assert!(parse_allow("http://x").is_err());
    }
}
