//! The MCP servers a run's environment adds to the operator's: those of
//! the environment the run names (from the store, remote servers' headers
//! opened with the deployment's key) or of its repository's
//! `.kiln/environment.toml` (servers in the sandbox only). A server that
//! cannot be had (headers that do not open) is missing from the run and
//! told to the model, not a failed run.

use std::collections::BTreeMap;

use kiln_protocol::Run;
use kiln_protocol::mcp::{McpServerSpec, McpServerView, check_server_name};
use kiln_store::StoreError;
use kiln_store::secrets::Sealed;

use super::Source;
use crate::context::WorkerContext;
use crate::db_retry;
use crate::mcp::{EnvironmentServers, ServerConfig};

/// The servers of the run's environment: the one it names (whether or not
/// its sandbox is prepared now: a follow-up in a kept container uses them
/// too), else those of the repository's file when `source` read one.
pub async fn servers_of(
    ctx: &WorkerContext,
    run: &Run,
    source: Option<&Source<'_>>,
) -> Result<EnvironmentServers, StoreError> {
    let allow_private = ctx.config.mcp.allow_private;
    if let Some(name) = &run.environment {
        let Some(stored) = db_retry::with_retry(|| ctx.store.environment_of_run(run.id, name)).await? else {
            // The run fails when its sandbox is prepared, or its container
            // outlived the environment: no servers either way.
            return Ok(EnvironmentServers::default());
        };
        if stored.environment.mcp_servers.is_empty() {
            return Ok(EnvironmentServers::default());
        }
        let owner = db_retry::with_retry(|| ctx.store.run_owner(run.id)).await?.unwrap_or_default();
        let mut out = EnvironmentServers::default();
        for (server, view) in &stored.environment.mcp_servers {
            let headers = match (view.header_names.is_empty(), stored.mcp_headers_sealed.get(server)) {
                (true, _) => Ok(BTreeMap::new()),
                (false, None) => Err("its headers are not stored".to_owned()),
                (false, Some(sealed)) => match &ctx.config.secrets_key {
                    Some(key) => key
                        .open(&Sealed::mcp_headers(&owner, stored.environment.id, server), sealed)
                        .map_err(|_| "its headers do not open with this worker's KILN_SECRETS_KEY".to_owned()),
                    None => Err("it has headers, and this worker has no KILN_SECRETS_KEY to open them".to_owned()),
                },
            };
            let made = headers.and_then(|h| ServerConfig::tenant(spec_of(view), h, allow_private));
            add(&mut out, server, made);
        }
        return Ok(out);
    }
    let mut out = EnvironmentServers::default();
    if let Some(Source::Repository(spec)) = source {
        for (server, spec) in &spec.mcp_servers {
            add(&mut out, server, ServerConfig::tenant(spec.clone(), BTreeMap::new(), allow_private));
        }
    }
    Ok(out)
}

/// Adds `server` to the run's servers, or to the unusable ones with why.
/// Its name is checked again: a row stored before the rule on server names
/// may hold one whose tools' names would be ambiguous.
fn add(out: &mut EnvironmentServers, server: &str, made: Result<ServerConfig, String>) {
    match check_server_name(server).and(made) {
        Ok(config) => {
            out.servers.insert(server.to_owned(), config);
        }
        Err(why) => {
            tracing::warn!(server, reason = %why, "an environment's MCP server is unusable");
            out.unusable.insert(server.to_owned(), format!("the environment's MCP server is unusable: {why}"));
        }
    }
}

/// A stored server as the rules take it (headers apart).
fn spec_of(view: &McpServerView) -> McpServerSpec {
    McpServerSpec {
        url: view.url.clone(),
        headers: None,
        command: view.command.clone(),
        args: view.args.clone(),
        env: view.env.clone(),
        cwd: view.cwd.clone(),
        timeout_s: Some(view.timeout_s),
    }
}
