//! Connecting to a remote MCP server (streamable HTTP). The worker is the
//! client: the headers the operator configured (credentials) are added
//! here and go nowhere else.

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
    let transport = StreamableHttpClientTransport::with_client(http.clone(), transport_config);
    match tokio::time::timeout(timeout, handler.serve(transport)).await {
        Ok(Ok(client)) => Ok(Live { client, process: None }),
        Ok(Err(e)) => Err(connect_error(e.to_string())),
        Err(_) => Err(ServerError::Timeout { server: name.to_owned(), timeout }),
    }
}
