//! The Docker backend: one container per sandbox, driven through the
//! Docker API (bollard), the engine local or remote. The only
//! [`SandboxBackend`] today.
//!
//! A sandbox is a container whose main process is an idle `sleep` as root
//! (see [`container`]), with the toolbox's capabilities and no others, the
//! limits of its [`SandboxConfig`], the disk bound of [`disk`] and no
//! network unless it has egress (its session's `internal` network, see
//! [`network`]) or the deployment allows `bridge`. Execs are
//! `docker exec`s, files go in and out through the archive API. Its image
//! store is the engine's images ([`images`]); the egress proxy listens on
//! the session network's gateway ([`network`]).

mod container;
pub mod disk;
mod events;
mod exec;
mod images;
pub mod loop_disk;
pub mod network;
pub mod pids;
pub mod runtime;
pub mod toolbox_mount;

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use bollard::Docker;
use bollard::query_parameters::{
    DownloadFromContainerOptionsBuilder, RenameContainerOptionsBuilder, UploadToContainerOptionsBuilder,
};
use futures::StreamExt;
use uuid::Uuid;

use super::backend::{
    Backend, BackendError, CreateSpec, Exec, ExecSpec, ExecStatus, Found, Managed, Provenance, SandboxBackend, Stopped,
    TarStream,
};
use super::stops::StopFeed;
use super::{SandboxConfig, SandboxError};
use crate::egress::ProxyRoute;
use crate::egress::host_firewall::HostFirewall;
use disk::DiskPlan;
use toolbox_mount::ToolboxPlan;

/// Sandboxes as Docker containers on one engine.
#[derive(Debug, Clone)]
pub struct DockerBackend {
    docker: Docker,
    /// The engine's news of sandboxes stopping, subscribed to when a
    /// toolbox first listens: one subscription however many do.
    events: Arc<OnceLock<events::Subscription>>,
    /// The engine's runtimes, asked for at the first sandbox made.
    runtimes: Arc<tokio::sync::OnceCell<runtime::Runtimes>>,
}

impl DockerBackend {
    pub fn new(docker: Docker) -> Self {
        DockerBackend { docker, events: Arc::default(), runtimes: Arc::default() }
    }

    /// Whether sandboxes like `config` run under gVisor, as the engine's
    /// runtime for them says.
    async fn is_gvisor(&self, config: &SandboxConfig) -> Result<bool, BackendError> {
        let runtimes = self.runtimes.get_or_try_init(|| runtime::Runtimes::of(&self.docker)).await?;
        Ok(runtimes.is_gvisor(config.runtime.as_deref()))
    }
}

impl From<&Docker> for Backend {
    fn from(docker: &Docker) -> Self {
        Backend::new(DockerBackend::new(docker.clone()))
    }
}

impl From<Docker> for Backend {
    fn from(docker: Docker) -> Self {
        Backend::new(DockerBackend::new(docker))
    }
}

/// The engine's words, sorted into what callers act on.
impl From<bollard::errors::Error> for BackendError {
    fn from(e: bollard::errors::Error) -> Self {
        let said = format!("docker: {e}");
        match &e {
            bollard::errors::Error::DockerResponseServerError { message, .. }
                if message.contains("OCI runtime exec failed") =>
            {
                BackendError::ExecRefused { said }
            }
            bollard::errors::Error::DockerResponseServerError { status_code: 404, .. } => {
                BackendError::NotFound { said }
            }
            bollard::errors::Error::DockerResponseServerError { status_code: 409, message }
                if message.contains("is already in use") =>
            {
                BackendError::NameTaken { said }
            }
            _ => BackendError::Engine { said },
        }
    }
}

impl SandboxConfig {
    /// How sandboxes' disk is bounded on this engine: probed the first time
    /// it is asked for, then remembered.
    pub async fn disk_plan(&self, docker: &Docker) -> Result<&DiskPlan, SandboxError> {
        Ok(plan(self, docker).await?)
    }

    /// Whether sandboxes get the worker's toolbox bound or copied: probed
    /// the first time it is asked for, then remembered.
    pub async fn toolbox_plan(&self, docker: &Docker) -> Result<&ToolboxPlan, SandboxError> {
        Ok(toolbox_plan(self, docker).await?)
    }
}

/// Both plans a sandbox is made by, probed at the first sandbox (or the
/// start-up check): the disk's, then the toolbox's.
async fn plans<'a>(
    config: &'a SandboxConfig,
    docker: &Docker,
) -> Result<(&'a DiskPlan, &'a ToolboxPlan), BackendError> {
    Ok((plan(config, docker).await?, toolbox_plan(config, docker).await?))
}

async fn toolbox_plan<'a>(config: &'a SandboxConfig, docker: &Docker) -> Result<&'a ToolboxPlan, BackendError> {
    config.toolbox_plan.get_or_try_init(|| toolbox_mount::probe(docker, config)).await
}

async fn plan<'a>(config: &'a SandboxConfig, docker: &Docker) -> Result<&'a DiskPlan, BackendError> {
    config
        .disk_plan
        .get_or_try_init(|| async {
            let plan = disk::probe(docker, config).await?;
            tracing::info!(
                mechanism = plan.mechanism.as_str(),
                disk_mb = config.disk_mb,
                home = ?plan.home,
                image_volumes = ?plan.image_volumes,
                "sandbox disk bound"
            );
            if plan.mechanism == disk::DiskMechanism::Tmpfs
                && let Some(why) = &plan.loop_refused
            {
                tracing::warn!(
                    reason = %why,
                    "sandbox workspaces live in RAM (tmpfs): a loop-mounted disk image is not possible here, \
                     and every sandbox's memory limit is raised by its disk bound"
                );
            }
            Ok(plan)
        })
        .await
}

#[async_trait]
impl SandboxBackend for DockerBackend {
    async fn create(&self, spec: &CreateSpec<'_>) -> Result<String, BackendError> {
        let (plan, toolbox) = plans(spec.config, &self.docker).await?;
        let gvisor = self.is_gvisor(spec.config).await?;
        container::create(&self.docker, spec, plan, toolbox, gvisor).await
    }

    async fn find(&self, name: &str) -> Result<Option<Found>, BackendError> {
        let info = match self.docker.inspect_container(name, None).await {
            Ok(info) => info,
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let networks = info.network_settings.and_then(|n| n.networks).unwrap_or_default();
        Ok(Some(Found {
            id: info.id.unwrap_or_else(|| name.to_owned()),
            running: info.state.and_then(|s| s.running).unwrap_or(false),
            egress_of: networks.keys().filter_map(|n| network::session_of(n)).collect(),
        }))
    }

    async fn stopped(&self, id: &str) -> Result<Option<Stopped>, BackendError> {
        let state = match self.docker.inspect_container(id, None).await {
            Ok(info) => info.state.unwrap_or_default(),
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {
                return Ok(Some(Stopped { removed: true, ..Stopped::default() }));
            }
            Err(e) => return Err(e.into()),
        };
        if state.running.unwrap_or(false) {
            return Ok(None);
        }
        Ok(Some(Stopped { exit_code: state.exit_code, oom_killed: state.oom_killed.unwrap_or(false), removed: false }))
    }

    /// The engine's events (see [`events`]), subscribed to once, on the
    /// runtime of the first toolbox that listens.
    fn stop_feed(&self) -> Option<StopFeed> {
        Some(self.events.get_or_init(|| events::subscribe(self.docker.clone())).hub.subscribe())
    }

    async fn rename(&self, id: &str, name: &str) -> Result<(), BackendError> {
        let options = RenameContainerOptionsBuilder::new().name(name).build();
        Ok(self.docker.rename_container(id, options).await?)
    }

    async fn exec(&self, id: &str, spec: &ExecSpec<'_>) -> Result<Exec, BackendError> {
        exec::attached(&self.docker, id, spec).await
    }

    async fn exec_detached(&self, id: &str, spec: &ExecSpec<'_>) -> Result<String, BackendError> {
        exec::detached(&self.docker, id, spec).await
    }

    async fn exec_status(&self, _id: &str, exec: &str) -> Result<ExecStatus, BackendError> {
        let state = self.docker.inspect_exec(exec).await?;
        Ok(ExecStatus { running: state.running, exit_code: state.exit_code })
    }

    async fn put_archive(&self, id: &str, dir: &str, tar: TarStream) -> Result<(), BackendError> {
        let options = UploadToContainerOptionsBuilder::new().path(dir).build();
        Ok(self.docker.upload_to_container(id, Some(options), bollard::body_try_stream(tar)).await?)
    }

    /// One made here has the worker's binary bound exactly when the plan
    /// says so: nothing to ask on the cold start's path. Only a found one's
    /// mounts are asked of the engine (see [`toolbox_mount::adopted_is_bound`]).
    async fn install_toolbox(
        &self,
        id: &str,
        binary: &[u8],
        config: &SandboxConfig,
        provenance: Provenance,
    ) -> Result<(), BackendError> {
        let ours = toolbox_plan(config, &self.docker).await?.dir.as_deref();
        let bound = match provenance {
            Provenance::Made => ours.is_some(),
            Provenance::Found => toolbox_mount::adopted_is_bound(&self.docker, id, ours).await?,
        };
        if bound {
            return Ok(());
        }
        crate::sandbox::toolbox_binary::copy_in(self, id, binary).await
    }

    async fn get_archive(&self, id: &str, path: &str, cap: usize) -> Result<Option<Vec<u8>>, BackendError> {
        let options = DownloadFromContainerOptionsBuilder::new().path(path).build();
        let mut stream = self.docker.download_from_container(id, Some(options));
        let mut tarball = Vec::new();
        while let Some(chunk) = stream.next().await {
            tarball.extend_from_slice(&chunk?);
            if tarball.len() > cap {
                return Ok(None);
            }
        }
        Ok(Some(tarball))
    }

    async fn remove(&self, id: &str) {
        container::remove_container(&self.docker, id).await;
    }

    async fn list_managed(&self) -> Result<Vec<Managed>, BackendError> {
        container::list_managed(&self.docker).await
    }

    async fn remove_session_network(&self, firewall: &HostFirewall, session_id: Uuid) {
        network::remove(&self.docker, firewall, session_id).await;
    }

    async fn proxy_route(&self, id: &str, session_id: Uuid) -> Result<Option<ProxyRoute>, BackendError> {
        let Some(client) = network::address_of(&self.docker, id, session_id).await? else { return Ok(None) };
        let Some(net) = network::find(&self.docker, session_id).await? else { return Ok(None) };
        Ok(Some(ProxyRoute { listen: net.gateway.into(), client }))
    }

    /// The runtime is one the engine has; the disk bound can be had (a
    /// missing image is not fatal: the first sandbox probes).
    async fn check(&self, config: &SandboxConfig) -> Result<(), BackendError> {
        runtime::check(&self.docker, config.runtime.as_deref()).await?;
        match plans(config, &self.docker).await {
            Ok(_) => Ok(()),
            Err(BackendError::ImageMissing(image)) => {
                tracing::warn!(%image, "the sandbox image is missing; the disk bound is probed when it is there");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    async fn engine_id(&self) -> Option<String> {
        match self.docker.info().await {
            Ok(info) => info.id.filter(|id| !id.is_empty()),
            Err(e) => {
                tracing::warn!(error = %e, "asking Docker for its engine id failed");
                None
            }
        }
    }

    /// Loop disks of containers removed without Kiln.
    async fn sweep_leftovers(&self, config: &SandboxConfig) -> usize {
        loop_disk::sweep(&self.docker, &config.disk_dir, DISK_GRACE).await
    }

    async fn kept_home(&self, config: &SandboxConfig) -> Result<Option<String>, BackendError> {
        Ok(plan(config, &self.docker).await?.home.clone())
    }
}

/// A loop disk younger than this may be one whose container is still
/// being created (the disk is made first).
const DISK_GRACE: std::time::Duration = std::time::Duration::from_secs(120);
