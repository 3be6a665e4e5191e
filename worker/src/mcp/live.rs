//! A run's MCP tools while it runs: the tools each server listed, named,
//! and listed again when the server says its list changed
//! (`notifications/tools/list_changed`) or was connected again (restarted,
//! for one in the sandbox). The agent loop asks for [`McpTools::refresh`]
//! before each model step: a server whose change count did not move costs
//! one atomic load, one that moved is listed once, however many changes it
//! sent.
//!
//! Names stay put: a tool the server still lists keeps the name it had, a
//! new one is named by the same rules as at the start (`names`) without
//! taking a name in use, and a removed one is gone (a call to it is the
//! registry's "unknown tool" error). Each server keeps at most
//! [`super::server::MAX_TOOLS`] tools, as at the start.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::names::Namer;
use super::server::Server;
use super::tool::McpTool;
use crate::tools::{Registry, Tool};

/// The MCP tools of one run, shared by its agents (a sub-agent uses its
/// parent's servers).
pub struct McpTools {
    /// The names MCP tools must not take (the built-in tools').
    reserved: Vec<String>,
    servers: Vec<Served>,
    /// Lets one refresh run at a time (a parent's children share this).
    refreshing: tokio::sync::Mutex<()>,
}

/// One server and what the run has of it.
struct Served {
    server: Arc<Server>,
    /// The server's change count when its tools were last listed.
    seen: AtomicU64,
    tools: Mutex<Vec<Arc<McpTool>>>,
}

impl Default for McpTools {
    fn default() -> Self {
        McpTools { reserved: Vec::new(), servers: Vec::new(), refreshing: tokio::sync::Mutex::new(()) }
    }
}

impl McpTools {
    /// The tools `listed` (per server: the server, its change count taken
    /// before listing, what it listed), named in that order; `builtin`
    /// holds the names they must not take.
    pub(super) fn new(builtin: &Registry, listed: Vec<(Arc<Server>, u64, Vec<rmcp::model::Tool>)>) -> Self {
        let reserved: Vec<String> = builtin.names().map(str::to_owned).collect();
        let mut namer = Namer::reserving(reserved.iter().map(String::as_str));
        let servers = listed
            .into_iter()
            .map(|(server, seen, tools)| {
                let tools = tools
                    .iter()
                    .map(|listed| {
                        let name = namer.name(server.name(), &listed.name);
                        Arc::new(McpTool::new(name, listed, server.clone()))
                    })
                    .collect();
                Served { server, seen: AtomicU64::new(seen), tools: Mutex::new(tools) }
            })
            .collect();
        McpTools { reserved, servers, refreshing: tokio::sync::Mutex::new(()) }
    }

    /// Every tool, server by server.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.servers
            .iter()
            .flat_map(|s| s.tools.lock().unwrap_or_else(PoisonError::into_inner).clone())
            .map(|t| t as Arc<dyn Tool>)
            .collect()
    }

    /// Lists the tools again of every server whose list changed since it
    /// was last listed; `true` when any was. A server that cannot be
    /// listed now keeps the tools it had (a call to one is then the
    /// server's error, which the model sees) until its next change.
    pub async fn refresh(&self) -> bool {
        if self.servers.iter().all(|s| s.server.changes() == s.seen.load(Ordering::Relaxed)) {
            return false;
        }
        let _one_at_a_time = self.refreshing.lock().await;
        let mut relisted = false;
        for served in &self.servers {
            let changes = served.server.changes();
            // `swap`: an agent that waited for another's refresh does not
            // list the same change again.
            if served.seen.swap(changes, Ordering::Relaxed) == changes {
                continue;
            }
            match served.server.list_tools().await {
                Ok(listed) => {
                    tracing::info!(server = %served.server.name(), tools = listed.len(), "MCP server's tools listed again");
                    self.replace(served, &listed);
                    relisted = true;
                }
                Err(e) => {
                    tracing::warn!(server = %served.server.name(), error = %e, "MCP server's tools could not be listed again");
                }
            }
        }
        relisted
    }

    /// Puts `listed` in place of `served`'s tools: a tool listed before
    /// keeps its name; a new one gets one no other tool has.
    fn replace(&self, served: &Served, listed: &[rmcp::model::Tool]) {
        let mut tools = served.tools.lock().unwrap_or_else(PoisonError::into_inner);
        let kept: HashMap<String, String> =
            tools.iter().map(|t| (t.remote_name().to_owned(), t.name().to_owned())).collect();
        // Taken: the built-in names, the other servers' tools', and the
        // names this server's tools keep.
        let others: Vec<String> = self
            .servers
            .iter()
            .filter(|s| !Arc::ptr_eq(&s.server, &served.server))
            .flat_map(|s| {
                s.tools
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .iter()
                    .map(|t| t.name().to_owned())
                    .collect::<Vec<_>>()
            })
            .collect();
        let still: Vec<&String> = listed.iter().filter_map(|l| kept.get(l.name.as_ref())).collect();
        let mut namer =
            Namer::reserving(self.reserved.iter().chain(&others).chain(still.iter().copied()).map(String::as_str));
        *tools = listed
            .iter()
            .map(|l| {
                let name =
                    kept.get(l.name.as_ref()).cloned().unwrap_or_else(|| namer.name(served.server.name(), &l.name));
                Arc::new(McpTool::new(name, l, served.server.clone()))
            })
            .collect();
    }
}
