//! The phases that connect the run's sandbox: its network (the session's
//! egress proxy) and its tools (the built-in ones and the run's MCP
//! servers).

use kiln_protocol::Run;

use super::PhaseError;
use super::sandbox::Acquired;
use crate::context::WorkerContext;
use crate::egress::{self, SessionProxy};
use crate::event_sink::EventSink;
use crate::mcp::EnvironmentServers;
use crate::sandbox::Sandbox;
use crate::toolset::Toolset;

/// The session's egress proxy, if its sandbox is on the session's network;
/// it serves for as long as it is kept. It judges by this run's policy; a
/// sandbox left on the network by an earlier run gets a proxy too, so that
/// a run without egress sees its attempts refused (and recorded) rather
/// than unanswered.
pub async fn network(
    ctx: &WorkerContext,
    run: &Run,
    acquired: &Acquired,
    events: &mut EventSink,
) -> Result<Option<SessionProxy>, PhaseError> {
    let layers = acquired.config.egress_layers();
    let egress = &acquired.config.egress;
    let phase = egress::Phase::Agent;
    let sandbox = acquired.sandbox.id();
    let proxy = crate::sandbox::serve_egress(&ctx.sandboxes, egress, layers, phase, run.session_id, sandbox, None)
        .await
        .map_err(|e| PhaseError::failed(format!("could not start the egress proxy: {e}")))?;
    Ok(proxy.inspect(|p| events.attach_network_log(p.log.clone())))
}

/// The run's tools and what to tell the model before its first step.
pub struct Tools {
    pub tools: Toolset,
    pub notice: Option<String>,
}

/// The run's MCP tools, listed now (servers in the sandbox started now, and
/// stopped when the tools go); a server that is missing is told to the
/// model, not a failure.
pub async fn tools(
    ctx: &WorkerContext,
    run: &Run,
    sandbox: &Sandbox,
    environment_mcp: EnvironmentServers,
    notice: Option<String>,
) -> Tools {
    let mcp = crate::mcp::open(&ctx.config.mcp, environment_mcp, run, &ctx.tools, sandbox).await;
    let notice = match (notice, mcp.notice()) {
        (Some(a), Some(b)) => Some(format!("{a}\n\n{b}")),
        (a, b) => a.or(b),
    };
    // The `bash` tool says which shell this sandbox has (Kiln's image: bash).
    let builtin = ctx.tools.for_shell(sandbox.shell());
    Tools { tools: Toolset::with_mcp(builtin, mcp.tools), notice }
}
