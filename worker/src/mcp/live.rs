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
        let had: HashMap<String, String> =
            tools.iter().map(|t| (t.remote_name().to_owned(), t.name().to_owned())).collect();
        let others: Vec<String> = self
            .servers
            .iter()
            .filter(|s| !Arc::ptr_eq(&s.server, &served.server))
            .flat_map(|s| {
                let tools = s.tools.lock().unwrap_or_else(PoisonError::into_inner);
                tools.iter().map(|t| t.name().to_owned()).collect::<Vec<_>>()
            })
            .collect();
        let remote: Vec<&str> = listed.iter().map(|l| l.name.as_ref()).collect();
        let taken = self.reserved.iter().chain(&others).map(String::as_str);
        let names = names_again(served.server.name(), &remote, &had, taken);
        *tools =
            listed.iter().zip(names).map(|(l, name)| Arc::new(McpTool::new(name, l, served.server.clone()))).collect();
    }
}

/// The names of `server`'s tools `listed` again: those it `had` (remote
/// name to name) keep theirs; a new one is named by the usual rules
/// without taking one of `taken` (the built-in tools' and the other
/// servers') or of the names kept.
fn names_again<'a>(
    server: &str,
    listed: &[&str],
    had: &'a HashMap<String, String>,
    taken: impl Iterator<Item = &'a str>,
) -> Vec<String> {
    let kept = listed.iter().filter_map(|remote| had.get(*remote)).map(String::as_str);
    let mut namer = Namer::reserving(taken.chain(kept));
    listed.iter().map(|remote| had.get(*remote).cloned().unwrap_or_else(|| namer.name(server, remote))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_listed_again_keep_their_names_and_new_ones_take_none_in_use() {
        let mut first = Namer::reserving(["bash"]);
        let listed = ["a.b", "a/b", "c"];
        let names: Vec<String> = listed.iter().map(|t| first.name("s", t)).collect();
        assert_eq!(names[0], "mcp__s__a_b");
        let had: HashMap<String, String> = listed.iter().map(|t| (*t).to_owned()).zip(names.iter().cloned()).collect();

        // `a.b` went, `a/b` stayed (with its hashed name), `a_b` came: it
        // may take the freed plain name, never a kept one.
        let again = names_again("s", &["a/b", "a_b", "c"], &had, ["bash", "mcp__other__x"].into_iter());
        assert_eq!(again[0], names[1]);
        assert_eq!(again[1], "mcp__s__a_b");
        assert_eq!(again[2], "mcp__s__c");
        // The same list again: the same names.
        assert_eq!(names_again("s", &listed, &had, ["bash"].into_iter()), names);
        // A new tool whose plain name another server's tool has is cut.
        let clash = names_again("s", &["d"], &HashMap::new(), ["mcp__s__d"].into_iter());
        assert!(clash[0].starts_with("mcp__s__d_") && clash[0].len() == "mcp__s__d_".len() + 8, "{clash:?}");
    }
}
