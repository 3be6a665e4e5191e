//! A sandbox's egress proxy, placed where its backend routes the sandbox's
//! traffic (`SandboxBackend::proxy_route`): the egress module serves a
//! route and knows no engine.

use kiln_protocol::egress::Layers;
use uuid::Uuid;

use super::backend::{Backend, BackendError};
use crate::egress::{self, EgressSettings, Phase, Redact, SessionProxy};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The backend could not say where the sandbox's traffic goes.
    #[error(transparent)]
    Route(#[from] BackendError),
    #[error(transparent)]
    Serve(#[from] egress::ServeError),
}

/// The proxy for `sandbox` (the backend's handle), a sandbox of the session
/// `session_id` in `phase`, judging by `layers` and answering that sandbox
/// alone; `redact` masks what its decisions show. `None`: the sandbox is
/// not on the session's egress network (it has no egress).
pub async fn serve_egress(
    backend: impl Into<Backend>,
    settings: &EgressSettings,
    layers: Layers,
    phase: Phase,
    session_id: Uuid,
    sandbox: &str,
    redact: Option<Redact>,
) -> Result<Option<SessionProxy>, ServeError> {
    let Some(route) = backend.into().proxy_route(sandbox, session_id).await? else { return Ok(None) };
    let mode = layers.mode();
    let proxy = egress::serve(settings, layers, phase, route, redact).await?;
    tracing::info!(%session_id, container = sandbox, proxy = %proxy.addr, mode = mode.as_str(), "egress proxy serving");
    Ok(Some(proxy))
}
