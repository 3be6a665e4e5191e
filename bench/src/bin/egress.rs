//! The egress proxy's cost on the path a sandbox's request takes: a real
//! sandbox (`Sandbox::start` with the deployment's egress settings, as a
//! run's sandbox is started) alone on its session's `internal` network,
//! its proxy served for it as a run serves it (`sandbox::serve_egress`,
//! allowlist mode, one rule: `allowed.test:8443`), downloading over HTTPS
//! from a server the benchmark owns (`kiln_tests::outside`, in a container
//! on a network this benchmark creates) through a CONNECT tunnel.
//!
//! The baseline is the same download done the best plain way: the same
//! client in the same container reaching the same server with no proxy,
//! the server attached to the session's network for it (the sandbox has
//! no other route). Each sample is one fresh connection: TCP (and the
//! CONNECT), TLS handshake, request, the whole body; timed by the client
//! inside the container (the exec that starts it is outside the figure).
//! Samples alternate (A B, then B A), after one unmeasured download of
//! each. No traffic leaves the machine.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use bollard::Docker;
use bollard::models::{NetworkConnectRequest, NetworkDisconnectRequest};
use clap::Parser;
use kiln_protocol::egress::{EgressMode, EgressPolicy, HostRule};
use kiln_protocol::{EventBody, SandboxSpec};
use kiln_tests::outside::{HTTPS_PORT, Outside};
use kiln_worker::egress::resolve::{parse_hosts, parse_ranges};
use kiln_worker::egress::{AddressRules, EgressSettings, Phase};
use kiln_worker::sandbox::{Backend, Owner, Sandbox, SandboxConfig};
use uuid::Uuid;

#[derive(Parser)]
#[command(about = "A sandbox's HTTPS download through Kiln's egress proxy vs the same download direct")]
struct Args {
    /// Bytes per download, comma-separated.
    #[arg(long, default_value = "1000000,100000000", value_delimiter = ',')]
    bytes: Vec<u64>,
    /// Downloads each way, per size.
    #[arg(long, default_value_t = 20)]
    samples: usize,
    /// The toolbox binary copied into the sandbox (default: `kiln-toolbox`
    /// next to this executable, else `KILN_TOOLBOX_PATH`).
    #[arg(long)]
    toolbox: Option<std::path::PathBuf>,
    /// The sandbox image.
    #[arg(long, default_value = "kiln-sandbox:latest")]
    image: String,
    /// OCI runtime for the sandbox (e.g. `runsc`); default: the engine's.
    #[arg(long)]
    runtime: Option<String>,
}

/// The name the proxy knows the server by (`KILN_EGRESS_HOSTS`), the one
/// name the allowlist lets through; also the TLS name both ways.
const HOST: &str = "allowed.test";

/// The client, run with the sandbox's own `python3`: `proxy` opens a
/// CONNECT tunnel through `HTTPS_PROXY` (the sandbox's environment, as any
/// tool reads it), `direct` connects to the server's address; then TLS
/// (certificate not checked: the test server's is self-signed), one GET of
/// `/bytes/N` read to its end. Prints the seconds it took.
const CLIENT: &str = r#"
import os, socket, ssl, sys, time
way, host, ip, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ctx = ssl._create_unverified_context()
buf = bytearray(1 << 20)
def head(s):
    data = b''
    while b'\r\n\r\n' not in data:
        chunk = s.recv(4096)
        if not chunk: raise SystemExit('closed in the head')
        data += chunk
    return data.split(b'\r\n\r\n', 1)
start = time.perf_counter()
if way == 'proxy':
    proxy = os.environ['HTTPS_PROXY'].split('//', 1)[1].rstrip('/').rsplit(':', 1)
    s = socket.create_connection((proxy[0], int(proxy[1])))
    s.sendall(('CONNECT %s:8443 HTTP/1.1\r\nHost: %s:8443\r\n\r\n' % (host, host)).encode())
    status, rest = head(s)
    if b' 200' not in status.split(b'\r\n')[0] or rest: raise SystemExit('tunnel: %r' % status)
else:
    s = socket.create_connection((ip, 8443))
t = ctx.wrap_socket(s, server_hostname=host)
t.sendall(('GET /bytes/%d HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' % (n, host)).encode())
status, body = head(t)
if b' 200' not in status.split(b'\r\n')[0]: raise SystemExit('status: %r' % status)
got = len(body)
while got < n:
    k = t.recv_into(buf)
    if not k: break
    got += k
took = time.perf_counter() - start
if got != n: raise SystemExit('got %d of %d bytes' % (got, n))
print('%.6f' % took)
"#;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let docker = Docker::connect_with_local_defaults().context("connecting to Docker")?;
    let outside = Outside::start().await;
    let result = bench(&args, &docker, &outside).await;
    outside.stop().await;
    let figures = result?;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("egress, {} samples each way per size, alternated; load average {}", args.samples, load.trim());
    for f in figures {
        f.print();
    }
    Ok(())
}

/// The deployment's settings: allowlist, one host on the HTTPS port, the
/// server's network allowed as an operator allows an internal registry.
fn settings(outside: &Outside) -> anyhow::Result<EgressSettings> {
    Ok(EgressSettings {
        deployment: EgressPolicy {
            mode: EgressMode::Allowlist,
            allow: Some(vec![HostRule::host(HOST, vec![HTTPS_PORT])]),
        },
        addresses: Arc::new(AddressRules {
            allow_ranges: parse_ranges(&outside.subnet).map_err(anyhow::Error::msg)?,
            deny_ranges: Vec::new(),
            hosts: parse_hosts(&format!("{HOST}={}", outside.ip)).map_err(anyhow::Error::msg)?,
        }),
        ..EgressSettings::default()
    })
}

/// The sandbox a run asking for `egress: allowlist` gets.
fn sandbox_config(args: &Args, outside: &Outside) -> anyhow::Result<SandboxConfig> {
    let toolbox = match &args.toolbox {
        Some(path) => Some(path.clone()),
        None => {
            let here = std::env::current_exe()?.with_file_name("kiln-toolbox");
            here.is_file().then_some(here)
        }
    };
    let deployment = SandboxConfig {
        image: args.image.clone(),
        runtime: args.runtime.clone(),
        toolbox_path: toolbox,
        egress: Arc::new(settings(outside)?),
        ..SandboxConfig::default()
    };
    let spec =
        SandboxSpec { egress: Some(EgressPolicy { mode: EgressMode::Allowlist, allow: None }), ..Default::default() };
    deployment.narrowed(&spec).map_err(anyhow::Error::msg)
}

async fn bench(args: &Args, docker: &Docker, outside: &Outside) -> anyhow::Result<Vec<Figure>> {
    let config = sandbox_config(args, outside)?;
    let owner = Owner {
        run_id: Uuid::new_v4(),
        session_id: Uuid::new_v4(),
        worker: format!("bench-{}", Uuid::new_v4().simple()),
    };
    let sandbox = Sandbox::start(docker, &config, &owner).await?;
    let result = serve_and_measure(args, docker, &config, &owner, &sandbox, outside).await;
    sandbox.remove().await;
    leave_no_network(docker, &config, owner.session_id, outside).await;
    result
}

/// Removes the session's network as a session's end does. The server this
/// benchmark attached to it is taken off first: the engine removes no
/// network with a container on it, and the worker's path (which expects
/// only the sandbox there) would leave it behind.
async fn leave_no_network(docker: &Docker, config: &SandboxConfig, session: Uuid, outside: &Outside) {
    let network = kiln_worker::sandbox::docker::network::name(session);
    let server = NetworkDisconnectRequest { container: outside.network.clone(), force: Some(true) };
    if let Err(e) = docker.disconnect_network(&network, server).await {
        // Never attached (the run failed before), or already gone.
        eprintln!("taking the server off the session's network: {e}");
    }
    Backend::from(docker).remove_session_network(&config.egress.host_firewall, session).await;
    match docker.inspect_network(&network, None).await {
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {}
        _ => eprintln!("the session's network {network} is still on the engine"),
    }
}

async fn serve_and_measure(
    args: &Args,
    docker: &Docker,
    config: &SandboxConfig,
    owner: &Owner,
    sandbox: &Sandbox,
    outside: &Outside,
) -> anyhow::Result<Vec<Figure>> {
    let layers = config.egress_layers();
    let session = owner.session_id;
    let proxy =
        kiln_worker::sandbox::serve_egress(docker, &config.egress, layers, Phase::Agent, session, sandbox.id(), None)
            .await?
            .context("the sandbox is not on its session's network")?;
    // The baseline's route: the server on the sandbox's own network. (The
    // server's container bears its network's name, `kiln_tests::outside`.)
    let network = kiln_worker::sandbox::docker::network::name(owner.session_id);
    let connect = NetworkConnectRequest { container: outside.network.clone(), ..Default::default() };
    docker.connect_network(&network, connect).await.context("attaching the server to the session's network")?;
    let server = server_address(docker, &outside.network, &network).await?;
    let mut figures = Vec::new();
    for &bytes in &args.bytes {
        figures.push(measure(sandbox, &server, bytes, args.samples).await?);
    }
    // The proxy saw the tunnels, and refused nothing.
    let decisions = proxy.log.take();
    proxy.stop().await;
    let allowed = decisions.iter().any(|e| matches!(e, EventBody::NetworkAllowed { host, .. } if host == HOST));
    let denied = decisions.iter().filter(|e| matches!(e, EventBody::NetworkDenied { .. })).count();
    anyhow::ensure!(allowed && denied == 0, "the proxy's decisions: {decisions:?}");
    Ok(figures)
}

/// The server's address on `network`.
async fn server_address(docker: &Docker, container: &str, network: &str) -> anyhow::Result<String> {
    let inspected = docker.inspect_container(container, None).await?;
    let networks = inspected.network_settings.and_then(|s| s.networks).unwrap_or_default();
    let ip = networks.get(network).and_then(|n| n.ip_address.clone()).filter(|ip| !ip.is_empty());
    ip.context("the server has no address on the session's network")
}

/// One download as the sandbox's client makes it: seconds, in the
/// container's clock.
async fn download(sandbox: &Sandbox, way: &str, server: &str, bytes: u64) -> anyhow::Result<f64> {
    let command = format!("python3 - {way} {HOST} {server} {bytes} <<'PY'\n{CLIENT}\nPY");
    let out = sandbox.exec(&command, Duration::from_secs(600), 64 * 1024, |_| {}).await?;
    let text = &out.output;
    anyhow::ensure!(out.exit_code == Some(0), "{way} download of {bytes}: exit {:?}: {text}", out.exit_code);
    text.trim().parse::<f64>().with_context(|| format!("{way}: {text:?}"))
}

struct Figure {
    bytes: u64,
    proxy: Vec<f64>,
    direct: Vec<f64>,
}

async fn measure(sandbox: &Sandbox, server: &str, bytes: u64, samples: usize) -> anyhow::Result<Figure> {
    download(sandbox, "proxy", server, bytes).await?;
    download(sandbox, "direct", server, bytes).await?;
    let mut figure = Figure { bytes, proxy: Vec::new(), direct: Vec::new() };
    for i in 0..samples {
        let ways = if i % 2 == 0 { ["proxy", "direct"] } else { ["direct", "proxy"] };
        for way in ways {
            let took = download(sandbox, way, server, bytes).await?;
            if way == "proxy" { &mut figure.proxy } else { &mut figure.direct }.push(took);
        }
    }
    Ok(figure)
}

fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)]
}

impl Figure {
    fn print(&self) {
        let mb = self.bytes as f64 / 1e6;
        let line = |name: &str, v: &[f64]| {
            let (p50, p95) = (quantile(v, 0.5), quantile(v, 0.95));
            println!(
                "  {mb:>5.0} MB {name:<28} p50 {:>9.2} ms ({:>7.1} MB/s)  p95 {:>9.2} ms  n={}",
                p50 * 1e3,
                mb / p50,
                p95 * 1e3,
                v.len()
            );
            p50
        };
        let p = line("via Kiln's proxy (CONNECT)", &self.proxy);
        let d = line("direct, same network", &self.direct);
        println!(
            "  {mb:>5.0} MB throughput proxy/direct: {:.2}x (goal >= 0.8); time proxy/direct: {:.2}x",
            d / p,
            p / d
        );
    }
}
