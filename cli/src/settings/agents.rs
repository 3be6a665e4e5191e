//! The operator's sub-agent kinds (`KILN_AGENT_KINDS`). Read by the API,
//! which refuses runs naming a kind it does not know, and by workers, which
//! start the children: both must be given the same file.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use kiln_protocol::agents::AgentKinds;

#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// TOML file (JSON when its name ends in `.json`) of sub-agent kinds
    /// added to the built-in `general` and `explore` (a kind of the same
    /// name replaces a built-in one). See README, "Sub-agents".
    #[arg(long, env = "KILN_AGENT_KINDS")]
    pub agent_kinds: Option<PathBuf>,
}

impl AgentArgs {
    /// The deployment's kinds, checked; a file that is missing or invalid
    /// stops the process from starting.
    pub fn kinds(&self) -> anyhow::Result<Arc<AgentKinds>> {
        let Some(path) = &self.agent_kinds else { return Ok(Arc::new(AgentKinds::builtin())) };
        let text =
            std::fs::read_to_string(path).with_context(|| format!("KILN_AGENT_KINDS: reading {}", path.display()))?;
        let json = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"));
        let kinds = if json { AgentKinds::from_json(&text) } else { AgentKinds::from_toml(&text) };
        let kinds = kinds.with_context(|| format!("KILN_AGENT_KINDS: {}", path.display()))?;
        Ok(Arc::new(kinds))
    }
}
