//! A sandbox with egress as the worker gives a run one: on its session's
//! `internal` network, with the session's proxy on that network's gateway
//! (`sandbox::serve_egress`, the agent phase's), allowed to reach one
//! host, the benchmark's web server (`server`) on a Docker network it
//! creates. No traffic leaves the machine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bollard::Docker;
use kiln_protocol::egress::{EgressMode, EgressPolicy, HostRule};
use kiln_worker::egress::resolve::{parse_hosts, parse_ranges};
use kiln_worker::egress::{AddressRules, EgressSettings, Phase, SessionProxy};
use kiln_worker::sandbox::{Owner, Sandbox, SandboxConfig};

use crate::server::{PORT as HTTP_PORT, Server};
use crate::setup;

/// The name the proxy maps to the server.
pub const HOST: &str = "server.test";

/// The deployment's egress settings: an allowlist of [`HOST`] alone, the
/// server's network range allowed (as an operator allows an internal
/// registry), the host's firewall left alone (the library's default).
pub fn settings(outside: &Server) -> anyhow::Result<EgressSettings> {
    Ok(EgressSettings {
        deployment: policy(),
        addresses: Arc::new(AddressRules {
            allow_ranges: parse_ranges(&outside.subnet).map_err(anyhow::Error::msg)?,
            deny_ranges: Vec::new(),
            hosts: parse_hosts(&format!("{HOST}={}", outside.ip)).map_err(anyhow::Error::msg)?,
        }),
        ..EgressSettings::default()
    })
}

fn policy() -> EgressPolicy {
    EgressPolicy { mode: EgressMode::Allowlist, allow: Some(vec![HostRule::host(HOST, vec![HTTP_PORT])]) }
}

/// A session's sandbox on its egress network, and its proxy.
pub struct EgressSandbox {
    pub sandbox: Sandbox,
    proxy: SessionProxy,
    owner: Owner,
    settings: Arc<EgressSettings>,
}

impl EgressSandbox {
    /// Starts the sandbox of `config` with `settings` and the run's policy
    /// (the deployment's), then its proxy, as a run's start does.
    pub async fn start(docker: &Docker, config: &SandboxConfig, settings: Arc<EgressSettings>) -> anyhow::Result<Self> {
        let config = SandboxConfig { egress: settings.clone(), egress_run: Some(policy()), ..config.clone() };
        let owner = setup::owner();
        let sandbox = Sandbox::start(docker, &config, &owner).await?;
        let layers = config.egress_layers();
        let served = kiln_worker::sandbox::serve_egress(
            docker,
            &settings,
            layers,
            Phase::Agent,
            owner.session_id,
            sandbox.id(),
            None,
        )
        .await;
        let proxy = match served {
            Ok(Some(proxy)) => proxy,
            other => {
                sandbox.remove().await;
                kiln_worker::sandbox::docker::network::remove(docker, &settings.host_firewall, owner.session_id).await;
                bail!("no egress proxy for the sandbox: {:?}", other.map(|p| p.map(|p| p.addr)));
            }
        };
        Ok(EgressSandbox { sandbox, proxy, owner, settings })
    }

    /// `bytes` from the server through the proxy, read by Python's
    /// `urllib` (as pip fetches) in the sandbox: the whole `bash` call (the
    /// interpreter's start included), and the transfer's own time, from the
    /// request to the last byte, by the sandbox's clock.
    pub async fn fetch(&self, bytes: u64) -> anyhow::Result<(Duration, Duration)> {
        let script = format!(
            r#"python3 - <<'PY'
import time, urllib.request
start = time.perf_counter()
got = 0
with urllib.request.urlopen("http://{HOST}:{HTTP_PORT}/bytes/{bytes}", timeout=120) as r:
    while True:
        b = r.read(1 << 20)
        if not b:
            break
        got += len(b)
print(got, int((time.perf_counter() - start) * 1e6))
PY"#
        );
        let started = Instant::now();
        let out = setup::bash(&self.sandbox, &script, Duration::from_secs(300)).await?;
        let call = started.elapsed();
        let (got, micros) = out.trim().split_once(' ').context("the fetch's figures")?;
        anyhow::ensure!(got.parse::<u64>()? == bytes, "fetched {got} of {bytes} bytes: {out}");
        Ok((call, Duration::from_micros(micros.parse()?)))
    }

    /// Removes the sandbox, stops its proxy and removes its network.
    pub async fn remove(self, docker: &Docker) {
        self.sandbox.remove().await;
        self.proxy.stop().await;
        kiln_worker::sandbox::docker::network::remove(docker, &self.settings.host_firewall, self.owner.session_id)
            .await;
    }
}
