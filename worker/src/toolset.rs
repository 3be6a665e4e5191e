//! The tools an agent is offered while it runs: the built-in ones and the
//! run's MCP tools, whose list a server may change mid-run. The loop reads
//! [`Toolset::current`] once per step (after [`Toolset::refresh`]): a
//! registry that stays the same object, so the same bytes go to the model,
//! until an MCP server's list really changed. A run's sub-agents share
//! their parent's set: the same servers and connections.

use std::sync::{Arc, PoisonError, RwLock};

use crate::mcp::McpTools;
use crate::tools::Registry;

pub struct Toolset {
    builtin: Registry,
    mcp: Option<McpTools>,
    current: RwLock<Arc<Registry>>,
}

impl Toolset {
    /// Exactly these tools, for the whole run.
    pub fn fixed(tools: Registry) -> Self {
        Toolset { current: RwLock::new(Arc::new(tools.clone())), builtin: tools, mcp: None }
    }

    /// `builtin` and the run's MCP tools, as they change.
    pub fn with_mcp(builtin: Registry, mcp: McpTools) -> Self {
        let current = RwLock::new(Arc::new(builtin.with(mcp.tools())));
        Toolset { builtin, mcp: Some(mcp), current }
    }

    /// The tools as they are now.
    pub fn current(&self) -> Arc<Registry> {
        self.current.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Takes in what the MCP servers changed since the last call (lists
    /// their tools again); nothing to do costs an atomic load per server.
    pub async fn refresh(&self) {
        let Some(mcp) = &self.mcp else { return };
        if mcp.refresh().await {
            let tools = Arc::new(self.builtin.with(mcp.tools()));
            *self.current.write().unwrap_or_else(PoisonError::into_inner) = tools;
        }
    }
}

impl From<Registry> for Toolset {
    fn from(tools: Registry) -> Self {
        Toolset::fixed(tools)
    }
}
