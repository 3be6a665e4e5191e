//! One MCP server as a run uses it, whichever way it is reached: a
//! connection made at session start, shared by the server's tools, and
//! made again on the next call after it broke (for a server in the
//! sandbox: started again). Every answer is awaited within the server's
//! timeout, and every failure is an error the model can read.
//!
//! It also counts the changes to its tool list a run should pick up
//! ([`Server::changes`]): a `notifications/tools/list_changed` from the
//! server, and every connection made again after the first (a server
//! restarted in the sandbox may list other tools). `live` re-lists a server
//! whose count moved.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject, Tool};
use rmcp::service::{NotificationContext, RoleClient, RunningService};
use rmcp::{ClientHandler, ServiceError};
use tokio::sync::Mutex;

use super::config::{ServerConfig, Transport};
use super::{remote, stdio};
use crate::sandbox::{Sandbox, StdioHandle};

/// Largest response body, SSE event or stdio message taken from a server;
/// a larger one fails the call with an error the model sees.
pub const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;
/// Tools taken from one server; the rest are left out (and logged).
pub const MAX_TOOLS: usize = 128;

pub(super) type Client = RunningService<RoleClient, Handler>;

/// What the worker does with a server's requests and notifications: the
/// defaults (it offers the server nothing), except that a changed tool
/// list is counted, for the run to list the tools again before its next
/// step. A count, not a queue: a server that sends it in a loop costs one
/// atomic add each, and at most one re-listing per step.
#[derive(Clone)]
pub(super) struct Handler {
    changes: Arc<AtomicU64>,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.changes.fetch_add(1, Ordering::Relaxed);
    }
}

/// Why a server could not be used. Messages go to the model: they name the
/// server and what went wrong, never a remote server's headers.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("could not connect to the MCP server {server:?}: {reason}")]
    Connect { server: String, reason: String },
    #[error("the MCP server {server:?} did not answer within {} s", timeout.as_secs())]
    Timeout { server: String, timeout: Duration },
    #[error("the MCP server {server:?} failed: {reason}")]
    Call { server: String, reason: String },
}

/// How the server is reached.
enum Endpoint {
    Remote(reqwest::Client),
    /// Started in this sandbox.
    Stdio(Box<Sandbox>),
}

/// A live connection, and the process behind it for a server in the sandbox.
pub(super) struct Live {
    pub client: Client,
    pub process: Option<StdioHandle>,
}

/// A configured server and, once made, the connection to it.
pub struct Server {
    name: String,
    config: ServerConfig,
    endpoint: Endpoint,
    /// `None` until connected, and again after the connection broke.
    live: Mutex<Option<Arc<Live>>>,
    /// Changes to the tool list seen so far (see the module's comment).
    changes: Arc<AtomicU64>,
    /// Whether a connection was ever made (the next one is a change).
    connected: AtomicBool,
}

impl Server {
    /// A server of `config`; one in the sandbox runs in `sandbox`.
    pub fn new(name: &str, config: ServerConfig, sandbox: &Sandbox) -> Result<Self, ServerError> {
        let endpoint = match &config.transport {
            Transport::Remote(_) => Endpoint::Remote(
                remote::http_client(config.timeout)
                    .map_err(|e| ServerError::Connect { server: name.to_owned(), reason: e.to_string() })?,
            ),
            Transport::Stdio(_) => Endpoint::Stdio(Box::new(sandbox.clone())),
        };
        Ok(Server {
            name: name.to_owned(),
            config,
            endpoint,
            live: Mutex::new(None),
            changes: Arc::default(),
            connected: AtomicBool::new(false),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// How many changes to its tool list were seen: a run that listed its
    /// tools at one count lists them again once it moved.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }

    /// Every tool the server lists (at most [`MAX_TOOLS`]).
    pub async fn list_tools(&self) -> Result<Vec<Tool>, ServerError> {
        let live = self.live().await?;
        let listed = self.within(live.client.peer().list_all_tools()).await;
        let mut tools = self.settle(&live, listed).await?;
        if tools.len() > MAX_TOOLS {
            tracing::warn!(server = %self.name, listed = tools.len(), kept = MAX_TOOLS, "MCP server lists too many tools");
            tools.truncate(MAX_TOOLS);
        }
        Ok(tools)
    }

    /// Calls `tool` with `arguments`.
    pub async fn call(&self, tool: &str, arguments: JsonObject) -> Result<CallToolResult, ServerError> {
        let live = self.live().await?;
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let called = self.within(live.client.peer().call_tool(params)).await;
        self.settle(&live, called).await
    }

    /// The connection, made now if there is none.
    async fn live(&self) -> Result<Arc<Live>, ServerError> {
        let mut slot = self.live.lock().await;
        if let Some(live) = slot.as_ref() {
            return Ok(live.clone());
        }
        let handler = Handler { changes: self.changes.clone() };
        let made = match (&self.endpoint, &self.config.transport) {
            (Endpoint::Remote(http), Transport::Remote(remote)) => {
                remote::connect(&self.name, remote, http, handler, self.config.timeout).await
            }
            (Endpoint::Stdio(sandbox), Transport::Stdio(stdio)) => {
                stdio::start(&self.name, stdio, sandbox, handler, self.config.timeout).await
            }
            _ => Err(ServerError::Connect { server: self.name.clone(), reason: "misconfigured".into() }),
        };
        let live = Arc::new(made?);
        // A server connected again (restarted, for one in the sandbox) may
        // list other tools than it did.
        if self.connected.swap(true, Ordering::Relaxed) {
            self.changes.fetch_add(1, Ordering::Relaxed);
        }
        *slot = Some(live.clone());
        Ok(live)
    }

    /// `work` within the server's timeout.
    async fn within<T>(
        &self,
        work: impl Future<Output = Result<T, ServiceError>>,
    ) -> Result<Result<T, ServiceError>, ServerError> {
        tokio::time::timeout(self.config.timeout, work)
            .await
            .map_err(|_| ServerError::Timeout { server: self.name.clone(), timeout: self.config.timeout })
    }

    /// The answer, or the error for the model; a connection that broke (or
    /// a call that timed out, which may have left it in any state) is
    /// dropped, so the next call connects again (a server in the sandbox:
    /// is killed, and started again).
    async fn settle<T>(
        &self,
        live: &Arc<Live>,
        answer: Result<Result<T, ServiceError>, ServerError>,
    ) -> Result<T, ServerError> {
        let error = match answer {
            Ok(Ok(value)) => return Ok(value),
            // The server answered with a JSON-RPC error: the connection is fine.
            Ok(Err(ServiceError::McpError(e))) => {
                return Err(ServerError::Call { server: self.name.clone(), reason: e.message.to_string() });
            }
            Ok(Err(e)) => {
                let mut reason = e.to_string();
                if let Some(ending) = live.ending().await {
                    reason = format!("its process in the sandbox ended during the call: {ending}");
                }
                ServerError::Call { server: self.name.clone(), reason }
            }
            Err(timeout) => timeout,
        };
        tracing::warn!(server = %self.name, error = %error, "MCP connection dropped; the next call connects again");
        let mut slot = self.live.lock().await;
        if slot.as_ref().is_some_and(|l| Arc::ptr_eq(l, live)) {
            *slot = None;
        }
        Err(error)
    }
}

impl Live {
    /// How the server's process ended, for one in the sandbox that did.
    async fn ending(&self) -> Option<String> {
        self.process.as_ref()?.ending().await
    }
}
