//! Getting a session its container: the one it already has (a follow-up
//! run, or a run taken over from a dead worker), a warm one from the pool,
//! or a new one; and putting it to rest when a run ends.

use uuid::Uuid;

use super::backend::{Backend, BackendError, Provenance};
use super::pool::WarmPool;
use super::toolbox::ToolboxError;
use super::{Owner, Sandbox, SandboxConfig, SandboxError, session_container_name};

/// Where a run's sandbox came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The session's own container, with its workspace as the last run left it.
    Reused,
    /// Taken from the warm pool; the workspace is still to be brought in.
    Warm,
    /// Created for this run; the workspace is still to be brought in.
    New,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Reused => "reused",
            Origin::Warm => "warm",
            Origin::New => "new",
        }
    }
}

/// The session's container, from wherever it is quickest to get.
pub async fn acquire(
    backend: impl Into<Backend>,
    config: &SandboxConfig,
    pool: Option<&WarmPool>,
    owner: &Owner,
) -> Result<(Sandbox, Origin), SandboxError> {
    let backend = backend.into();
    if let Some(sandbox) = Sandbox::adopt(&backend, config, owner.session_id).await? {
        return Ok((sandbox, Origin::Reused));
    }
    if let Some(pool) = pool {
        while let Some(sandbox) = pool.take().await {
            match sandbox.bind_to_session(owner.session_id).await {
                Ok(()) => return Ok((sandbox, Origin::Warm)),
                Err(e) => {
                    tracing::warn!(container = %sandbox.id, error = %e, "binding a warm sandbox failed; dropping it");
                    sandbox.remove().await;
                }
            }
        }
    }
    match Sandbox::start(&backend, config, owner).await {
        Ok(sandbox) => Ok((sandbox, Origin::New)),
        // The session's name is taken: another attempt of this run (taken
        // over while the first was still creating the container) made it
        // in the meantime. It is the session's; adopt it.
        Err(SandboxError::Backend(BackendError::NameTaken { .. })) => {
            tracing::info!(session_id = %owner.session_id, "the session's container appeared while starting one; adopting it");
            match Sandbox::adopt(&backend, config, owner.session_id).await? {
                Some(sandbox) => Ok((sandbox, Origin::Reused)),
                None => Ok((Sandbox::start(&backend, config, owner).await?, Origin::New)),
            }
        }
        Err(e) => Err(e),
    }
}

/// Whether the session has a running container (which its next run
/// continues in).
pub async fn has_container(backend: impl Into<Backend>, session_id: Uuid) -> bool {
    match backend.into().find(&session_container_name(session_id)).await {
        Ok(found) => found.is_some_and(|f| f.running),
        Err(_) => false,
    }
}

/// The session's running container as the run left it (nothing reset, no
/// toolbox started), for a look inside after the run: the capture.
pub async fn running(backend: impl Into<Backend>, config: &SandboxConfig, session_id: Uuid) -> Option<Sandbox> {
    let backend = backend.into();
    let name = session_container_name(session_id);
    has_container(&backend, session_id).await.then(|| Sandbox::bound(backend, name, config))
}

/// After a run: with `keep`, the container stays for the session's next
/// run but nothing the run started keeps running in it; otherwise it goes.
/// Works by name, so it also covers a run dropped halfway through starting.
pub async fn after_run(backend: impl Into<Backend>, config: &SandboxConfig, session_id: Uuid, keep: bool) {
    let backend = backend.into();
    let name = session_container_name(session_id);
    let firewall = &config.egress.host_firewall;
    if !keep {
        backend.remove(&name).await;
        backend.remove_session_network(firewall, session_id).await;
        return;
    }
    let sandbox = Sandbox::bound(backend, name, config);
    match sandbox.kill_user_processes().await {
        Ok(()) => {}
        // Already removed (a checkout that failed removes it at once), or
        // never made (the run ended between making the session's network
        // and starting its container): the network has no one left.
        Err(ToolboxError::Backend(BackendError::NotFound { .. })) => {
            sandbox.backend.remove_session_network(firewall, session_id).await;
        }
        Err(e) => {
            tracing::warn!(%session_id, error = %e, "stopping the run's processes failed; removing the sandbox");
            sandbox.remove().await;
        }
    }
}

impl Sandbox {
    /// The session's running container, if there is one. Whatever an
    /// earlier run left running in it (including a call a dead worker never
    /// finished) is killed first; a stopped one is removed.
    async fn adopt(
        backend: &Backend,
        config: &SandboxConfig,
        session_id: Uuid,
    ) -> Result<Option<Sandbox>, SandboxError> {
        let Some(found) = backend.find(&session_container_name(session_id)).await? else { return Ok(None) };
        if !found.running {
            backend.remove(&found.id).await;
            return Ok(None);
        }
        // A run with egress needs the sandbox on its session's network; one
        // made without it cannot join it (a container without a network
        // cannot be given one), so it is replaced.
        let attached = found.egress_of.contains(&session_id);
        if config.wants_egress() && !attached {
            tracing::info!(%session_id, "the session's sandbox has no egress network; replacing it");
            backend.remove(&found.id).await;
            return Ok(None);
        }
        let mut sandbox = Sandbox::bound(backend.clone(), found.id, config);
        if let Err(e) = sandbox.kill_user_processes().await {
            tracing::warn!(container = %sandbox.id, error = %e, "could not reset the session's sandbox; replacing it");
            sandbox.remove().await;
            return Ok(None);
        }
        if let Err(e) = sandbox.start_toolbox(Provenance::Found).await {
            sandbox.remove().await;
            return Err(e);
        }
        Ok(Some(sandbox))
    }

    /// Names a warm container after the session: from now on it is that
    /// session's, and no other can take it (names are unique on an engine).
    async fn bind_to_session(&self, session_id: Uuid) -> Result<(), SandboxError> {
        Ok(self.backend.rename(&self.id, &session_container_name(session_id)).await?)
    }
}
