//! Starting an MCP server inside the session's sandbox and speaking MCP
//! over its stdin and stdout (rmcp's `transport-async-rw`). The process is
//! the sandbox's (see `crate::sandbox::stdio`): the command user, the
//! sandbox's limits and network policy, no secrets. Its messages are
//! bounded like a remote server's responses.

use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::transport::async_rw::AsyncRwTransport;

use super::config::StdioConfig;
use super::server::{Handler, Live, MAX_RESPONSE_BYTES, ServerError};
use crate::sandbox::Sandbox;

/// Starts the server and initialises the session with it, within `timeout`.
pub(super) async fn start(
    name: &str,
    config: &StdioConfig,
    sandbox: &Sandbox,
    handler: Handler,
    timeout: Duration,
) -> Result<Live, ServerError> {
    let connect_error = |reason: String| ServerError::Connect { server: name.to_owned(), reason };
    let argv: Vec<String> = std::iter::once(config.command.clone()).chain(config.args.iter().cloned()).collect();
    let process = sandbox
        .start_stdio(&argv, &config.env, &config.cwd, MAX_RESPONSE_BYTES)
        .await
        .map_err(|e| connect_error(format!("could not start it in the sandbox: {e}")))?;
    let transport =
        AsyncRwTransport::new_client(process.stdout, process.stdin).with_max_line_length(MAX_RESPONSE_BYTES + 1);
    let handle = process.handle;
    match tokio::time::timeout(timeout, handler.serve(transport)).await {
        Ok(Ok(client)) => {
            tracing::debug!(server = name, pid = ?handle.pid(), "MCP server started in the sandbox");
            Ok(Live { client, process: Some(handle) })
        }
        Ok(Err(e)) => {
            let reason = match handle.ending().await {
                Some(ending) => format!("its process in the sandbox ended: {ending}"),
                None => e.to_string(),
            };
            Err(connect_error(reason))
        }
        // Dropping the handle kills what did start.
        Err(_) => Err(ServerError::Timeout { server: name.to_owned(), timeout }),
    }
}
