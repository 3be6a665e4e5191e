//! "The internet" for egress tests: a web server in a container the test
//! starts, on an `internal` Docker network the test creates, so that no
//! test traffic ever leaves the machine. The worker's proxy (on the host)
//! reaches it directly; names such as `allowed.test` are mapped to its
//! address through the proxy's static hosts (`KILN_EGRESS_HOSTS`), and its
//! network's range is allowed (`KILN_EGRESS_ALLOW_RANGES`), as an operator
//! would allow an internal registry.
//!
//! [`Outside::start`] serves HTTP on 8080 and HTTPS on 8443 (a self-signed
//! certificate for `allowed.test`): `GET /redirect?to=URL` answers 302 to
//! URL, `GET /bytes/N` streams N bytes, anything else says who it is and
//! the path. [`Outside::start_index`] is a package index instead.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig, NetworkCreateRequest};
use bollard::query_parameters::{CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder};

pub const HTTP_PORT: u16 = 8080;
pub const HTTPS_PORT: u16 = 8443;

/// A throwaway self-signed certificate and key for `allowed.test` (P-256,
/// valid until 2126): generated once with openssl; nothing trusts it.
const CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBnTCCAUSgAwIBAgIUVEIGh8bsrufrRyo5gXbDnask6/IwCgYIKoZIzj0EAwIw
FzEVMBMGA1UEAwwMYWxsb3dlZC50ZXN0MCAXDTI2MTIwMTE0MjI0OFoYDzIxMjYx
MTA3MTQyMjQ4WjAXMRUwEwYDVQQDDAxhbGxvd2VkLnRlc3QwWTATBgcqhkjOPQIB
BggqhkjOPQMBBwNCAAQa3Z+jffPklzqvHYS2e6nNsrUDZA/oNoxraiYZ5rwBvuno
9QduRVYWJLRBJUvJZbKQZq1r5omLLvm4fG9n1UlNo2wwajAdBgNVHQ4EFgQUdECr
l+HyLo8eLJhhf716qN0Il1UwHwYDVR0jBBgwFoAUdECrl+HyLo8eLJhhf716qN0I
l1UwDwYDVR0TAQH/BAUwAwEB/zAXBgNVHREEEDAOggxhbGxvd2VkLnRlc3QwCgYI
KoZIzj0EAwIDRwAwRAIgR12sPiWfyOW3Q+Z8cOEp3vGQaRLm3tYpbzECz8ndQjkC
IBizOqDyqwaAkEJ4oBqDehBNEw5QnA0u/3KQ6sBYo+j2
-----END CERTIFICATE-----
";
const KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgHyJjaWo1/nAl2jG5
vZbYzpTWAWCLFT1NmkyT5bw++sChRANCAAQa3Z+jffPklzqvHYS2e6nNsrUDZA/o
NoxraiYZ5rwBvuno9QduRVYWJLRBJUvJZbKQZq1r5omLLvm4fG9n1UlN
-----END PRIVATE KEY-----
";

const SERVER: &str = r#"
import http.server, os, ssl, threading, urllib.parse
open('/tmp/c.pem', 'w').write(os.environ['CERT'])
open('/tmp/k.pem', 'w').write(os.environ['KEY'])
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def log_message(self, *a): pass
    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        n = int(self.headers.get('Content-Length') or 0)
        if n: self.rfile.read(n)
        if url.path == '/redirect':
            to = urllib.parse.parse_qs(url.query)['to'][0]
            self.send_response(302); self.send_header('Location', to); self.send_header('Content-Length', '0'); self.end_headers(); return
        if url.path.startswith('/bytes/'):
            left = int(url.path[7:])
            self.send_response(200); self.send_header('Content-Length', str(left)); self.end_headers()
            chunk = b'x' * 65536
            while left > 0:
                self.wfile.write(chunk[:min(left, 65536)]); left -= 65536
            return
        body = ('outside says ' + self.command + ' ' + self.path).encode()
        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers(); self.wfile.write(body)
    do_POST = do_GET
    do_HEAD = do_GET
plain = http.server.ThreadingHTTPServer(('', 8080), H)
tls = http.server.ThreadingHTTPServer(('', 8443), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); ctx.load_cert_chain('/tmp/c.pem', '/tmp/k.pem')
tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
threading.Thread(target=tls.serve_forever, daemon=True).start()
plain.serve_forever()
"#;

/// A PEP 503 "simple" index on 8080 holding one wheel it builds at start:
/// `kilnpkg` 1.0, whose module says [`INDEX_GREETING`]. Served by
/// `http.server` from a directory, as `python3 -m http.server` would.
const INDEX: &str = r#"
import functools, hashlib, http.server, os, zipfile
root = '/tmp/index'
os.makedirs(root + '/simple/kilnpkg')
wheel = 'kilnpkg-1.0-py3-none-any.whl'
files = {
    'kilnpkg/__init__.py': 'GREETING = %r\n' % os.environ['GREETING'],
    'kilnpkg-1.0.dist-info/METADATA': 'Metadata-Version: 2.1\nName: kilnpkg\nVersion: 1.0\n',
    'kilnpkg-1.0.dist-info/WHEEL': 'Wheel-Version: 1.0\nGenerator: kiln-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n',
}
record = ''.join('%s,,\n' % name for name in files) + 'kilnpkg-1.0.dist-info/RECORD,,\n'
with zipfile.ZipFile(root + '/simple/kilnpkg/' + wheel, 'w') as z:
    for name, text in files.items():
        z.writestr(name, text)
    z.writestr('kilnpkg-1.0.dist-info/RECORD', record)
digest = hashlib.sha256(open(root + '/simple/kilnpkg/' + wheel, 'rb').read()).hexdigest()
open(root + '/simple/index.html', 'w').write('<a href="kilnpkg/">kilnpkg</a>\n')
open(root + '/simple/kilnpkg/index.html', 'w').write('<a href="%s#sha256=%s">%s</a>\n' % (wheel, digest, wheel))
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=root)
http.server.ThreadingHTTPServer(('', 8080), handler).serve_forever()
"#;

/// What the index's package says when imported.
pub const INDEX_GREETING: &str = "installed from the test index";

pub struct Outside {
    docker: Docker,
    pub network: String,
    container: String,
    /// The server's address on the test's network.
    pub ip: IpAddr,
    /// The test network's range, to allow at the proxy.
    pub subnet: String,
}

impl Outside {
    pub async fn start() -> Outside {
        Self::serve(SERVER, vec![format!("CERT={CERT}"), format!("KEY={KEY}")], &[HTTP_PORT, HTTPS_PORT]).await
    }

    /// A package index (see [`INDEX`]) on [`HTTP_PORT`].
    pub async fn start_index() -> Outside {
        Self::serve(INDEX, vec![format!("GREETING={INDEX_GREETING}")], &[HTTP_PORT]).await
    }

    async fn serve(script: &str, env: Vec<String>, ports: &[u16]) -> Outside {
        let docker = Docker::connect_with_local_defaults().expect("docker");
        let tag = uuid::Uuid::new_v4().simple().to_string();
        let network = format!("kiln-test-outside-{tag}");
        docker
            .create_network(NetworkCreateRequest {
                name: network.clone(),
                driver: Some("bridge".into()),
                internal: Some(true),
                labels: Some(HashMap::from([("dev.kiln.test".to_owned(), "egress".to_owned())])),
                ..Default::default()
            })
            .await
            .expect("create the test network");
        let container = format!("kiln-test-outside-{tag}");
        let body = ContainerCreateBody {
            image: Some("kiln-sandbox:latest".into()),
            user: Some("1000:1000".into()),
            cmd: Some(vec!["python3".into(), "-c".into(), script.into()]),
            env: Some(env),
            labels: Some(HashMap::from([("dev.kiln.test".to_owned(), "egress".to_owned())])),
            host_config: Some(HostConfig {
                network_mode: Some(network.clone()),
                cap_drop: Some(vec!["ALL".into()]),
                tmpfs: Some(HashMap::from([("/tmp".to_owned(), "rw,size=16m".to_owned())])),
                ..Default::default()
            }),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::new().name(&container).build();
        docker.create_container(Some(options), body).await.expect("create the test server");
        docker.start_container(&container, None).await.expect("start the test server");
        let info = docker.inspect_network(&network, None).await.expect("inspect the test network");
        let subnet =
            info.ipam.and_then(|i| i.config).and_then(|c| c.into_iter().find_map(|c| c.subnet)).expect("subnet");
        let inspected = docker.inspect_container(&container, None).await.expect("inspect the test server");
        let ip = inspected
            .network_settings
            .and_then(|s| s.networks)
            .and_then(|n| n.get(&network).and_then(|e| e.ip_address.clone()))
            .and_then(|ip| ip.parse().ok())
            .expect("the server's address");
        let outside = Outside { docker, network, container, ip, subnet };
        outside.wait_ready(ports).await;
        outside
    }

    pub fn http(&self) -> SocketAddr {
        SocketAddr::new(self.ip, HTTP_PORT)
    }

    /// Until the ports answer (python takes a moment to start).
    async fn wait_ready(&self, ports: &[u16]) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for &port in ports {
            while tokio::net::TcpStream::connect((self.ip, port)).await.is_err() {
                assert!(Instant::now() < deadline, "the test server never listened on {port}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// Removes the server and its network.
    pub async fn stop(self) {
        remove(&self.docker, &self.container, &self.network).await;
    }
}

async fn remove(docker: &Docker, container: &str, network: &str) {
    let options = RemoveContainerOptionsBuilder::new().force(true).v(true).build();
    let _ = docker.remove_container(container, Some(options)).await;
    let _ = docker.remove_network(network).await;
}

/// A test that fails still removes what it started (a thread of its own:
/// `Drop` cannot wait on the test's runtime).
impl Drop for Outside {
    fn drop(&mut self) {
        let (docker, container, network) = (self.docker.clone(), self.container.clone(), self.network.clone());
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() {
                rt.block_on(remove(&docker, &container, &network));
            }
        })
        .join();
    }
}
