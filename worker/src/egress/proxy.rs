//! The egress proxy for one session: an HTTP/1 forward proxy (absolute
//! `http://` URLs) and `CONNECT` tunnels, listening where only that
//! session's sandbox can reach it.
//!
//! Every request is judged by name first (the policy's [`Layers`]), then by
//! address (the proxy resolves the name itself and vets every address, see
//! `resolve`), and only then is anything connected, to exactly the vetted
//! addresses. A tunnel must open with a TLS ClientHello whose server name is
//! the `CONNECT` host: a missing or different name (domain fronting) is
//! refused before the upstream is dialled. Plain HTTP requests are judged
//! one by one, so a redirect to another host is a new request, judged
//! again; a path rule judges the path normalised (`egress::path`), and the
//! origin is sent the path in that form. The proxy dials origins directly: it never relays to another
//! proxy, whatever its own environment says. HTTP parsing is hyper's.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use kiln_protocol::egress::{self, Layers, normalize_host};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use super::client_hello;
use super::log::{NetworkLog, Refusal};
use super::resolve::AddressRules;

/// How long a client has to send a request's head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest request head accepted (hyper's read buffer).
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// How long dialling an origin may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

type Body = BoxBody<Bytes, hyper::Error>;
type Tunnel = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What one session's proxy judges by.
pub struct ProxyContext {
    pub layers: Layers,
    pub addresses: Arc<AddressRules>,
    pub log: Arc<NetworkLog>,
    /// The sandbox's address on the session's network: connections from
    /// any other address are closed unanswered. `None`: any (tests of the
    /// proxy alone).
    pub client: Option<IpAddr>,
    /// Connections open at once, at most.
    pub permits: Arc<Semaphore>,
    /// What events call the layer of the phase's own policy: `run` (the
    /// agent phase: the run's `sandbox.egress`) or `setup` (an
    /// environment's `setup_sandbox.egress`).
    pub phase_layer: &'static str,
}

/// Serves `listener` until the returned task is aborted (dropping it stops
/// every connection too: they live in the accept loop's `JoinSet`).
pub fn spawn(listener: TcpListener, ctx: Arc<ProxyContext>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(serve(listener, ctx))
}

async fn serve(listener: TcpListener, ctx: Arc<ProxyContext>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of descriptors, most likely: wait rather than spin.
                        tracing::warn!(error = %e, "egress proxy: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                if ctx.client.is_some_and(|c| c != peer.ip()) {
                    tracing::warn!(%peer, "egress proxy: a connection from an address not the session's; closed");
                    continue;
                }
                let Ok(permit) = ctx.permits.clone().try_acquire_owned() else {
                    ctx.log.denied(Refusal { host: "", port: 0, method: None, layer: "proxy", rule: "too many connections at once".into() });
                    continue;
                };
                connections.spawn(connection(stream, ctx.clone(), permit));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// One client connection: HTTP/1 requests until it closes, or a tunnel.
async fn connection(stream: TcpStream, ctx: Arc<ProxyContext>, _permit: OwnedSemaphorePermit) {
    // A CONNECT's tunnel runs here once hyper hands the connection over, so
    // that it stays in this task (bounded by the permit, stopped with the
    // proxy).
    let tunnel: Arc<Mutex<Option<Tunnel>>> = Arc::default();
    let slot = tunnel.clone();
    let service = service_fn(move |req| {
        let (ctx, slot) = (ctx.clone(), slot.clone());
        async move { Ok::<_, Infallible>(handle(&ctx, req, &slot).await) }
    });
    let served = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await;
    if let Err(e) = served {
        tracing::debug!(error = %e, "egress proxy: client connection ended");
    }
    let tunnel = tunnel.lock().unwrap_or_else(PoisonError::into_inner).take();
    if let Some(tunnel) = tunnel {
        tunnel.await;
    }
}

async fn handle(ctx: &Arc<ProxyContext>, req: Request<Incoming>, slot: &Mutex<Option<Tunnel>>) -> Response<Body> {
    if req.method() == Method::CONNECT { connect(ctx, req, slot).await } else { forward(ctx, req).await }
}

/// What was asked for, for refusals.
struct Target {
    host: String,
    port: u16,
    method: Option<String>,
}

impl Target {
    fn refuse(&self, ctx: &ProxyContext, layer: &'static str, rule: String) -> Response<Body> {
        let body = format!("kiln egress proxy: refused {}:{} ({layer}: {rule})\n", self.host, self.port);
        ctx.log.denied(Refusal { host: &self.host, port: self.port, method: self.method.as_deref(), layer, rule });
        text(StatusCode::FORBIDDEN, body)
    }

    /// Names, then addresses: the vetted addresses, or the refusal.
    async fn judge(&self, ctx: &ProxyContext, path: Option<&str>) -> Result<Vec<SocketAddr>, Response<Body>> {
        let http = self.method.as_deref().zip(path);
        let req = egress::Request { host: &self.host, port: self.port, http };
        if let Err(denial) = ctx.layers.check(&req) {
            let layer = if denial.layer == "run" { ctx.phase_layer } else { denial.layer };
            return Err(self.refuse(ctx, layer, denial.rule));
        }
        ctx.addresses.resolve(&self.host, self.port).await.map_err(|e| self.refuse(ctx, "proxy", e.to_string()))
    }
}

async fn connect(ctx: &Arc<ProxyContext>, req: Request<Incoming>, slot: &Mutex<Option<Tunnel>>) -> Response<Body> {
    let Some((host, Some(port))) = req.uri().authority().map(|a| (normalize_host(a.host()), a.port_u16())) else {
        return text(StatusCode::BAD_REQUEST, "kiln egress proxy: CONNECT needs host:port\n".into());
    };
    let target = Target { host, port, method: None };
    let addrs = match target.judge(ctx, None).await {
        Ok(addrs) => addrs,
        Err(refused) => return refused,
    };
    let ctx = ctx.clone();
    let tunnel: Tunnel = Box::pin(async move {
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => tunnel(&ctx, TokioIo::new(upgraded), target, addrs).await,
            Err(e) => tracing::debug!(error = %e, "egress proxy: CONNECT upgrade failed"),
        }
    });
    *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(tunnel);
    Response::new(empty())
}

/// Checks the ClientHello's server name against the CONNECT host, then
/// dials and relays.
async fn tunnel<C>(ctx: &ProxyContext, mut client: C, target: Target, addrs: Vec<SocketAddr>)
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let hello = match client_hello::read(&mut client).await {
        Ok(hello) => hello,
        Err(e) => {
            target.refuse(ctx, "proxy", format!("tls: {e}"));
            return;
        }
    };
    match hello.server_name.as_deref().map(normalize_host) {
        Some(name) if name == target.host => {}
        Some(name) => {
            // Named after what the client asked the server for: that is
            // where it was trying to go.
            let rule = format!("tls: server name differs from the CONNECT host {}", target.host);
            Target { host: name, ..target }.refuse(ctx, "proxy", rule);
            return;
        }
        None => {
            target.refuse(ctx, "proxy", "tls: no server name (SNI)".into());
            return;
        }
    }
    let Some(mut upstream) = dial(&addrs).await else { return };
    ctx.log.allowed(&target.host, target.port);
    if upstream.write_all(&hello.bytes).await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional_with_sizes(&mut client, &mut upstream, RELAY_BUFFER, RELAY_BUFFER).await;
}

/// Each direction's copy buffer in a tunnel. tokio's default (8 KiB) makes
/// a bulk download one read and one write per 8 KiB through the proxy,
/// the hop a sandbox's traffic takes beside the direct path (issue 33:
/// 100 MB at 0.72× of direct); 64 KiB per direction moves it in an eighth
/// of the system calls, for 128 KiB per open tunnel.
const RELAY_BUFFER: usize = 64 * 1024;

/// The first of `addrs` that answers.
async fn dial(addrs: &[SocketAddr]) -> Option<TcpStream> {
    for addr in addrs {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Some(stream);
            }
            Ok(Err(e)) => tracing::debug!(%addr, error = %e, "egress proxy: dial failed"),
            Err(_) => tracing::debug!(%addr, "egress proxy: dial timed out"),
        }
    }
    None
}

/// A plain-HTTP request in absolute form, judged and sent on.
async fn forward(ctx: &ProxyContext, req: Request<Incoming>) -> Response<Body> {
    let uri = req.uri();
    let (Some("http"), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return text(
            StatusCode::BAD_REQUEST,
            "kiln egress proxy: only absolute http:// URLs here; HTTPS goes through CONNECT\n".into(),
        );
    };
    let target = Target {
        host: normalize_host(authority.host()),
        port: authority.port_u16().unwrap_or(80),
        method: Some(req.method().to_string()),
    };
    // The origin picks its site by the Host header: it must name the host judged.
    if let Some(named) = req.headers().get(header::HOST) {
        let named = named.to_str().ok().and_then(|h| h.parse::<hyper::http::uri::Authority>().ok());
        if named.is_none_or(|a| normalize_host(a.host()) != target.host) {
            return target.refuse(ctx, "proxy", "the Host header names another host than the URL".into());
        }
    }
    let path = uri.path().to_owned();
    let addrs = match target.judge(ctx, Some(&path)).await {
        Ok(addrs) => addrs,
        Err(refused) => return refused,
    };
    let Some(upstream) = dial(&addrs).await else {
        return text(StatusCode::BAD_GATEWAY, format!("kiln egress proxy: could not reach {}\n", target.host));
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(upstream)).await {
        Ok(pair) => pair,
        Err(_) => return text(StatusCode::BAD_GATEWAY, "kiln egress proxy: upstream handshake failed\n".into()),
    };
    // Drives the upstream connection; it ends when the response body has
    // been read or dropped (the client going away drops it).
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let authority = authority.clone();
    let (mut parts, body) = req.into_parts();
    parts.uri = match origin_form(&parts.uri).parse() {
        Ok(uri) => uri,
        Err(_) => return text(StatusCode::BAD_REQUEST, "kiln egress proxy: bad request target\n".into()),
    };
    strip_hop_by_hop(&mut parts.headers);
    if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
        parts.headers.insert(header::HOST, host);
    }
    match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(response) => {
            ctx.log.allowed(&target.host, target.port);
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, body.boxed())
        }
        Err(_) => text(StatusCode::BAD_GATEWAY, "kiln egress proxy: upstream failed\n".into()),
    }
}

/// The request target sent to the origin: the path as path rules judged
/// it (normalised: the same resource to any server that follows RFC 3986,
/// and no server normalises it further into another), and the query as
/// sent. A path that does not normalise was judged by no path rule (one
/// would have refused it) and goes as sent.
fn origin_form(uri: &hyper::Uri) -> String {
    let path = egress::path::normalize(uri.path()).unwrap_or_else(|_| uri.path().to_owned());
    match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path,
    }
}

/// Headers about one connection, not the request, are not passed on
/// (RFC 9110 §7.6.1), nor the client's proxy credentials.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|n| n.trim().to_ascii_lowercase()))
        .filter(|n| !n.is_empty())
        .collect();
    for name in named {
        headers.remove(name.as_str());
    }
    for name in ["connection", "proxy-connection", "keep-alive", "proxy-authorization", "te", "trailer", "upgrade"] {
        headers.remove(name);
    }
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)).map_err(|never| match never {}).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

fn empty() -> Body {
    Full::new(Bytes::new()).map_err(|never| match never {}).boxed()
}
