//! One remote MCP server (streamable HTTP) as a run uses it: a connection
//! made at session start, shared by the server's tools, and made again on
//! the next call after it broke. The worker is the client: the headers the
//! operator configured (credentials) are added here and go nowhere else.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject, Tool};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ServiceError, ServiceExt};
use secrecy::ExposeSecret;
use tokio::sync::Mutex;

use super::config::ServerConfig;

/// Largest response body or SSE event taken from a server; a larger one is
/// refused by the transport and the call is an error the model sees.
pub const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;
/// Tools taken from one server; the rest are left out (and logged).
pub const MAX_TOOLS: usize = 128;

type Client = RunningService<RoleClient, ()>;

/// Why a server could not be used. Messages go to the model: they name the
/// server and what went wrong, never the configured headers.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("could not connect to the MCP server {server:?}: {reason}")]
    Connect { server: String, reason: String },
    #[error("the MCP server {server:?} did not answer within {} s", timeout.as_secs())]
    Timeout { server: String, timeout: Duration },
    #[error("the MCP server {server:?} failed: {reason}")]
    Call { server: String, reason: String },
}

/// A configured server and, once made, the connection to it.
pub struct RemoteServer {
    name: String,
    config: ServerConfig,
    http: reqwest::Client,
    /// `None` until connected, and again after the connection broke.
    client: Mutex<Option<Arc<Client>>>,
}

impl RemoteServer {
    pub fn new(name: &str, config: ServerConfig) -> Result<Self, RemoteError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .connect_timeout(config.timeout.min(Duration::from_secs(10)))
            // A redirect would carry the credentials to wherever it points.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| RemoteError::Connect { server: name.to_owned(), reason: e.to_string() })?;
        Ok(RemoteServer { name: name.to_owned(), config, http, client: Mutex::new(None) })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// Every tool the server lists (at most [`MAX_TOOLS`]).
    pub async fn list_tools(&self) -> Result<Vec<Tool>, RemoteError> {
        let client = self.client().await?;
        let listed = self.within(client.peer().list_all_tools()).await;
        let mut tools = self.settle(listed).await?;
        if tools.len() > MAX_TOOLS {
            tracing::warn!(server = %self.name, listed = tools.len(), kept = MAX_TOOLS, "MCP server lists too many tools");
            tools.truncate(MAX_TOOLS);
        }
        Ok(tools)
    }

    /// Calls `tool` with `arguments`.
    pub async fn call(&self, tool: &str, arguments: JsonObject) -> Result<CallToolResult, RemoteError> {
        let client = self.client().await?;
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let called = self.within(client.peer().call_tool(params)).await;
        self.settle(called).await
    }

    /// The connection, made now if there is none.
    async fn client(&self) -> Result<Arc<Client>, RemoteError> {
        let mut slot = self.client.lock().await;
        if let Some(client) = slot.as_ref() {
            return Ok(client.clone());
        }
        let client = Arc::new(self.connect().await?);
        *slot = Some(client.clone());
        Ok(client)
    }

    async fn connect(&self) -> Result<Client, RemoteError> {
        let connect_error = |reason: String| RemoteError::Connect { server: self.name.clone(), reason };
        let mut headers = HashMap::with_capacity(self.config.headers.len());
        for (name, value) in &self.config.headers {
            // Checked when the configuration was read.
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| connect_error(e.to_string()))?;
            let mut value = HeaderValue::from_str(value.expose_secret())
                .map_err(|_| connect_error(format!("the value of header {name} is not a valid header value")))?;
            // Never printed by Debug, and HTTP/2 keeps it out of its tables.
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        let transport_config = StreamableHttpClientTransportConfig::with_uri(self.config.url.as_str())
            .custom_headers(headers)
            .max_json_response_size(MAX_RESPONSE_BYTES)
            .max_sse_event_size(MAX_RESPONSE_BYTES);
        let transport = StreamableHttpClientTransport::with_client(self.http.clone(), transport_config);
        match tokio::time::timeout(self.config.timeout, ().serve(transport)).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(e)) => Err(connect_error(e.to_string())),
            Err(_) => Err(RemoteError::Timeout { server: self.name.clone(), timeout: self.config.timeout }),
        }
    }

    /// `work` within the server's timeout.
    async fn within<T>(
        &self,
        work: impl Future<Output = Result<T, ServiceError>>,
    ) -> Result<Result<T, ServiceError>, RemoteError> {
        tokio::time::timeout(self.config.timeout, work)
            .await
            .map_err(|_| RemoteError::Timeout { server: self.name.clone(), timeout: self.config.timeout })
    }

    /// The answer, or the error for the model; a connection that broke (or
    /// a call that timed out, which may have left it in any state) is
    /// dropped, so the next call connects again.
    async fn settle<T>(&self, answer: Result<Result<T, ServiceError>, RemoteError>) -> Result<T, RemoteError> {
        let error = match answer {
            Ok(Ok(value)) => return Ok(value),
            // The server answered with a JSON-RPC error: the connection is fine.
            Ok(Err(ServiceError::McpError(e))) => {
                return Err(RemoteError::Call { server: self.name.clone(), reason: e.message.to_string() });
            }
            Ok(Err(e)) => RemoteError::Call { server: self.name.clone(), reason: e.to_string() },
            Err(timeout) => timeout,
        };
        tracing::warn!(server = %self.name, error = %error, "MCP connection dropped; the next call connects again");
        self.client.lock().await.take();
        Err(error)
    }
}
