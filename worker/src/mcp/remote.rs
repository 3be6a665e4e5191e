//! Connecting to a remote MCP server (streamable HTTP). The worker is the
//! client: the headers the operator (or the environment) configured
//! (credentials) are added here and go nowhere else.
//!
//! A tenant's server (one of an environment's) is at an address the tenant
//! chose, reached from the worker, outside any sandbox: its host is
//! resolved and vetted before each connection (no loopback, private or
//! link-local address unless `KILN_MCP_ALLOW_PRIVATE`) and the connection
//! pinned to the vetted addresses, so a second lookup cannot move it
//! (DNS rebinding).

use std::collections::HashMap;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use rmcp::ServiceExt;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use secrecy::ExposeSecret;

use super::config::RemoteConfig;
use super::server::{Handler, Live, MAX_RESPONSE_BYTES, ServerError};

/// The HTTP client a remote server's connections use.
pub(super) fn http_client(timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        // A redirect would carry the credentials to wherever it points.
        .redirect(reqwest::redirect::Policy::none())
        .build()
}

/// Connects (and initialises) within `timeout`.
pub(super) async fn connect(
    name: &str,
    config: &RemoteConfig,
    http: &reqwest::Client,
    handler: Handler,
    timeout: Duration,
) -> Result<Live, ServerError> {
    let connect_error = |reason: String| ServerError::Connect { server: name.to_owned(), reason };
    let mut headers = HashMap::with_capacity(config.headers.len());
    for (name, value) in &config.headers {
        // Checked when the configuration was read.
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| connect_error(e.to_string()))?;
        let mut value = HeaderValue::from_str(value.expose_secret())
            .map_err(|_| connect_error(format!("the value of header {name} is not a valid header value")))?;
        // Never printed by Debug, and HTTP/2 keeps it out of its tables.
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    let transport_config = StreamableHttpClientTransportConfig::with_uri(config.url.as_str())
        .custom_headers(headers)
        .max_json_response_size(MAX_RESPONSE_BYTES)
        .max_sse_event_size(MAX_RESPONSE_BYTES);
    let http = match config.vet {
        Some(allow_private) => pinned_client(&config.url, allow_private, timeout).await.map_err(connect_error)?,
        None => http.clone(),
    };
    let transport = StreamableHttpClientTransport::with_client(http, transport_config);
    match tokio::time::timeout(timeout, handler.serve(transport)).await {
        Ok(Ok(client)) => Ok(Live { client, process: None }),
        Ok(Err(e)) => Err(connect_error(e.to_string())),
        Err(_) => Err(ServerError::Timeout { server: name.to_owned(), timeout }),
    }
}

/// A client that reaches `url`'s host only at the addresses it resolves to
/// now, each of them vetted. The refusal names the kind of address, never
/// the address: it reaches the model and the run's owner.
async fn pinned_client(url: &url::Url, allow_private: bool, timeout: Duration) -> Result<reqwest::Client, String> {
    use crate::net_guard::{GuardError, HostRef, resolve_vetted};
    let port = url.port_or_known_default().unwrap_or(443);
    let (host, name) = match url.host() {
        Some(url::Host::Ipv4(ip)) => (HostRef::Ip(ip.into()), None),
        Some(url::Host::Ipv6(ip)) => (HostRef::Ip(ip.into()), None),
        Some(url::Host::Domain(name)) => (HostRef::Name(name), Some(name)),
        None => return Err("its url has no host".into()),
    };
    let addrs = resolve_vetted(host, port, allow_private).await.map_err(|e| match e {
        GuardError::NotPublic { kind, .. } => format!(
            "its url leads to a {kind} address, which this deployment does not let an environment's servers reach \
             (KILN_MCP_ALLOW_PRIVATE)"
        ),
        GuardError::Resolve { .. } => "its url's host could not be resolved".to_owned(),
    })?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        .redirect(reqwest::redirect::Policy::none())
        // No proxy from the worker's environment: the vetted addresses are
        // where the connection goes.
        .no_proxy();
    if let Some(name) = name {
        builder = builder.resolve_to_addrs(name, &addrs);
    }
    builder.build().map_err(|e| e.to_string())
}
