//! MCP tools: the operator's MCP servers (through the official Rust SDK
//! `rmcp`), remote (streamable HTTP, `remote`) or started inside the
//! session's sandbox (stdio, `stdio`), whose tools a run gets beside the
//! built-in ones.
//!
//! At session start [`open`] connects to the servers the run may use (the
//! operator's `KILN_MCP_SERVERS` and its environment's (`tenant`), narrowed
//! by the run's `mcp`), lists their
//! tools and names them `mcp__<server>__<tool>` (`names`). Each becomes a
//! [`Tool`] (`tool`) in the run's registry, so `allowed_tools`, the
//! approval gate, batching, budgets, output caps and events treat it as
//! any other tool. A server that cannot be reached is not a failed run:
//! the model is told which servers are missing and why, and a call that
//! fails later is a tool error it sees. A server's tools are listed again
//! when it says they changed or was connected again (`live`).

pub mod config;
mod live;
pub mod names;
mod remote;
mod result;
mod server;
mod stdio;
mod tenant;
mod tool;

use std::sync::Arc;

use kiln_protocol::Run;

pub use config::{ConfigError, McpConfig, ServerConfig, Transport};
pub use live::McpTools;
pub use server::MAX_RESPONSE_BYTES;
use server::Server;
pub use tenant::EnvironmentServers;

use crate::sandbox::Sandbox;
use crate::tools::Registry;

/// A run's MCP tools, and what the model should know about the servers
/// that are missing.
#[derive(Default)]
pub struct McpSession {
    pub tools: McpTools,
    /// One line per server the run asked for but does not get.
    pub problems: Vec<String>,
}

impl McpSession {
    /// Told to the model before its first step; `None` when all is well.
    pub fn notice(&self) -> Option<String> {
        (!self.problems.is_empty()).then(|| {
            format!(
                "[kiln] Some MCP servers are unavailable in this run, so their tools are missing:\n{}",
                self.problems.join("\n")
            )
        })
    }
}

/// Connects to the servers `run` may use (the operator's `config` and its
/// `environment`'s; starting those that run in `sandbox`) and lists their
/// tools, all at once; `builtin` holds the names MCP tools must not take.
pub async fn open(
    config: &McpConfig,
    environment: EnvironmentServers,
    run: &Run,
    builtin: &Registry,
    sandbox: &Sandbox,
) -> McpSession {
    let (config, mut problems, wanted) = environment.joined(config, run.mcp.as_deref());
    let mut session = connect(&config, wanted.as_deref(), builtin, sandbox).await;
    problems.append(&mut session.problems);
    session.problems = problems;
    session
}

/// Connects to the servers named in `wanted` (all of `config`'s when
/// `None`) and lists their tools, all at once. The servers stop (those in
/// the sandbox are killed) when the session's tools are dropped.
pub async fn connect(
    config: &McpConfig,
    wanted: Option<&[String]>,
    builtin: &Registry,
    sandbox: &Sandbox,
) -> McpSession {
    let mut session = McpSession::default();
    let wanted: Vec<&str> = match wanted {
        Some(names) => names.iter().map(String::as_str).collect(),
        None => config.servers.keys().map(String::as_str).collect(),
    };
    let mut servers = Vec::new();
    for name in wanted {
        match config.servers.get(name) {
            Some(server) => match Server::new(name, server.clone(), sandbox) {
                Ok(server) => servers.push(Arc::new(server)),
                Err(e) => session.problems.push(format!("- {name}: {e}")),
            },
            None => session.problems.push(format!("- {name}: no MCP server of that name is configured")),
        }
    }
    // Each server's change count before it is listed: a change during the
    // listing is listed again before the first step that follows it.
    let listed = futures::future::join_all(servers.iter().map(|s| async { (s.changes(), s.list_tools().await) })).await;
    let mut named = Vec::new();
    for (server, (seen, tools)) in servers.into_iter().zip(listed) {
        match tools {
            Ok(tools) => {
                tracing::info!(server = %server.name(), tools = tools.len(), "MCP server connected");
                named.push((server, seen, tools));
            }
            Err(e) => {
                tracing::warn!(server = %server.name(), error = %e, "MCP server unavailable");
                session.problems.push(format!("- {}: {e}", server.name()));
            }
        }
    }
    session.tools = McpTools::new(builtin, named);
    session
}
