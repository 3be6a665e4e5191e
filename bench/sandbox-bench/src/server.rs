//! The egress figures' far end: a web server in a container on an
//! `internal` Docker network this benchmark creates (as the egress tests'
//! `kiln_tests::outside` does), so no traffic leaves the machine. The
//! worker's proxy, on the host, reaches it directly. `GET /bytes/N`
//! streams N bytes.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig, NetworkCreateRequest};
use bollard::query_parameters::{CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder};
use uuid::Uuid;

pub const PORT: u16 = 8080;

const SERVER: &str = r#"
import http.server
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def log_message(self, *a): pass
    def do_GET(self):
        left = int(self.path.rsplit('/', 1)[1]) if self.path.startswith('/bytes/') else 0
        self.send_response(200); self.send_header('Content-Length', str(left)); self.end_headers()
        chunk = b'x' * 65536
        while left > 0:
            self.wfile.write(chunk[:min(left, 65536)]); left -= 65536
http.server.ThreadingHTTPServer(('', 8080), H).serve_forever()
"#;

/// The server, its network, its address and its network's range.
pub struct Server {
    docker: Docker,
    network: String,
    container: String,
    pub ip: IpAddr,
    pub subnet: String,
}

impl Server {
    /// Creates the network, starts the server in `image` on it and waits
    /// until it listens.
    pub async fn start(docker: &Docker, image: &str) -> anyhow::Result<Server> {
        let name = format!("kiln-bench-server-{}", Uuid::new_v4().simple());
        let labels = HashMap::from([("dev.kiln.bench".to_owned(), "egress".to_owned())]);
        docker
            .create_network(NetworkCreateRequest {
                name: name.clone(),
                driver: Some("bridge".into()),
                internal: Some(true),
                labels: Some(labels.clone()),
                ..Default::default()
            })
            .await
            .context("creating the server's network")?;
        let mut server = Server {
            docker: docker.clone(),
            network: name.clone(),
            container: name,
            ip: [0, 0, 0, 0].into(),
            subnet: String::new(),
        };
        if let Err(e) = server.run(image, labels).await {
            server.stop().await;
            return Err(e);
        }
        Ok(server)
    }

    async fn run(&mut self, image: &str, labels: HashMap<String, String>) -> anyhow::Result<()> {
        let body = ContainerCreateBody {
            image: Some(image.into()),
            user: Some("1000:1000".into()),
            cmd: Some(vec!["python3".into(), "-c".into(), SERVER.into()]),
            labels: Some(labels),
            host_config: Some(HostConfig {
                network_mode: Some(self.network.clone()),
                cap_drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::new().name(&self.container).build();
        self.docker.create_container(Some(options), body).await.context("creating the server")?;
        self.docker.start_container(&self.container, None).await.context("starting the server")?;
        let info = self.docker.inspect_network(&self.network, None).await?;
        self.subnet = info
            .ipam
            .and_then(|i| i.config)
            .and_then(|c| c.into_iter().find_map(|c| c.subnet))
            .context("the network's subnet")?;
        let inspected = self.docker.inspect_container(&self.container, None).await?;
        self.ip = inspected
            .network_settings
            .and_then(|s| s.networks)
            .and_then(|n| n.get(&self.network).and_then(|e| e.ip_address.clone()))
            .context("the server's address")?
            .parse()?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while tokio::net::TcpStream::connect((self.ip, PORT)).await.is_err() {
            if Instant::now() > deadline {
                bail!("the server never listened on {PORT}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Removes the server and its network.
    pub async fn stop(self) {
        let options = RemoveContainerOptionsBuilder::new().force(true).v(true).build();
        let _ = self.docker.remove_container(&self.container, Some(options)).await;
        let _ = self.docker.remove_network(&self.network).await;
    }
}
