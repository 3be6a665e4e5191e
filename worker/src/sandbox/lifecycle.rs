//! Getting a session its container: the one it already has (a follow-up
//! run, or a run taken over from a dead worker), a warm one from the pool,
//! or a new one; and putting it to rest when a run ends.

use bollard::Docker;
use bollard::query_parameters::RenameContainerOptionsBuilder;
use uuid::Uuid;

use super::pool::WarmPool;
use super::toolbox::ToolboxError;
use super::{Owner, Sandbox, SandboxConfig, SandboxError, remove_container, session_container_name};

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
    docker: &Docker,
    config: &SandboxConfig,
    pool: Option<&WarmPool>,
    owner: &Owner,
) -> Result<(Sandbox, Origin), SandboxError> {
    if let Some(sandbox) = Sandbox::adopt(docker, config, owner.session_id).await? {
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
    match Sandbox::start(docker, config, owner).await {
        Ok(sandbox) => Ok((sandbox, Origin::New)),
        // The session's name is taken: another attempt of this run (taken
        // over while the first was still creating the container) made it
        // in the meantime. It is the session's; adopt it.
        Err(SandboxError::Docker(bollard::errors::Error::DockerResponseServerError { status_code: 409, message }))
            if message.contains("is already in use") =>
        {
            tracing::info!(session_id = %owner.session_id, "the session's container appeared while starting one; adopting it");
            match Sandbox::adopt(docker, config, owner.session_id).await? {
                Some(sandbox) => Ok((sandbox, Origin::Reused)),
                None => Ok((Sandbox::start(docker, config, owner).await?, Origin::New)),
            }
        }
        Err(e) => Err(e),
    }
}

/// Whether the session has a running container (which its next run
/// continues in).
pub async fn has_container(docker: &Docker, session_id: Uuid) -> bool {
    match docker.inspect_container(&session_container_name(session_id), None).await {
        Ok(info) => info.state.and_then(|s| s.running).unwrap_or(false),
        Err(_) => false,
    }
}

/// The session's running container as the run left it (nothing reset, no
/// toolbox started), for a look inside after the run: the capture.
pub async fn running(docker: &Docker, config: &SandboxConfig, session_id: Uuid) -> Option<Sandbox> {
    has_container(docker, session_id).await.then(|| Sandbox {
        docker: docker.clone(),
        id: session_container_name(session_id),
        config: config.clone(),
        toolbox: Default::default(),
    })
}

/// After a run: with `keep`, the container stays for the session's next
/// run but nothing the run started keeps running in it; otherwise it goes.
/// Works by name, so it also covers a run dropped halfway through starting.
pub async fn after_run(docker: &Docker, config: &SandboxConfig, session_id: Uuid, keep: bool) {
    let name = session_container_name(session_id);
    if !keep {
        remove_container(docker, &name).await;
        crate::egress::network::remove(docker, &config.egress.host_firewall, session_id).await;
        return;
    }
    let sandbox = Sandbox { docker: docker.clone(), id: name, config: config.clone(), toolbox: Default::default() };
    match sandbox.kill_user_processes().await {
        Ok(()) => {}
        // Already removed (a checkout that failed removes it at once), or
        // never made (the run ended between making the session's network
        // and starting its container): the network has no one left.
        Err(ToolboxError::Docker(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. })) => {
            crate::egress::network::remove(docker, &config.egress.host_firewall, session_id).await;
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
    async fn adopt(docker: &Docker, config: &SandboxConfig, session_id: Uuid) -> Result<Option<Sandbox>, SandboxError> {
        let name = session_container_name(session_id);
        let info = match docker.inspect_container(&name, None).await {
            Ok(info) => info,
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let id = info.id.unwrap_or(name);
        if !info.state.and_then(|s| s.running).unwrap_or(false) {
            remove_container(docker, &id).await;
            return Ok(None);
        }
        // A run with egress needs the sandbox on its session's network; one
        // made without it cannot join it (a container without a network
        // cannot be given one), so it is replaced.
        let attached = info
            .network_settings
            .and_then(|n| n.networks)
            .is_some_and(|n| n.contains_key(&crate::egress::network::name(session_id)));
        if config.wants_egress() && !attached {
            tracing::info!(%session_id, "the session's sandbox has no egress network; replacing it");
            remove_container(docker, &id).await;
            return Ok(None);
        }
        let mut sandbox = Sandbox { docker: docker.clone(), id, config: config.clone(), toolbox: Default::default() };
        if let Err(e) = sandbox.kill_user_processes().await {
            tracing::warn!(container = %sandbox.id, error = %e, "could not reset the session's sandbox; replacing it");
            sandbox.remove().await;
            return Ok(None);
        }
        if let Err(e) = sandbox.start_toolbox().await {
            sandbox.remove().await;
            return Err(e);
        }
        Ok(Some(sandbox))
    }

    /// Names a warm container after the session: from now on it is that
    /// session's, and no other can take it (names are unique on an engine).
    async fn bind_to_session(&self, session_id: Uuid) -> Result<(), SandboxError> {
        let options = RenameContainerOptionsBuilder::new().name(&session_container_name(session_id)).build();
        self.docker.rename_container(&self.id, options).await?;
        Ok(())
    }
}
