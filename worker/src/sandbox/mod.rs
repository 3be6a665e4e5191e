//! One sandbox per session, behind a backend (see `backend`; Docker is
//! the one implementation, in `docker`).
//!
//! A session's sandbox is named after the session (`kiln-session-<id>`),
//! so any worker on the engine finds it again: a follow-up run or a run
//! taken over from a dead worker continues in the same workspace. It stays
//! after a run ends until the session has been idle for a while (see
//! `lifecycle`). Warm sandboxes (`pool`) are started ahead of need and
//! renamed when a session takes one.
//!
//! Commands run as an unprivileged user with no capabilities,
//! `no-new-privileges`, pids/memory/CPU/disk limits (see `docker::disk`) and no
//! network. Only the toolbox runs as root, with `CAP_SETUID`, `CAP_SETGID`
//! and `CAP_KILL` alone, so that commands cannot reach it (see `toolbox`). The workspace
//! enters and leaves through the backend's archives, so the worker can drive a
//! remote engine; credentials never enter the sandbox.

pub mod backend;
pub mod docker;
mod egress_route;
pub mod environment_pools;
mod exec;
mod files;
pub mod held;
pub mod image_store;
pub mod lifecycle;
pub mod pool;
pub mod repo_clone;
mod stdio;
pub mod stops;

pub mod toolbox;
mod toolbox_binary;
mod toolbox_capture;
mod toolbox_reader;
mod toolbox_session;
mod toolbox_watch;
pub mod workspace;

use std::path::PathBuf;
use std::sync::Arc;

use kiln_protocol::egress::{EgressMode, EgressPolicy, Layers};
use kiln_protocol::{NetworkMode, SandboxSpec};

use crate::egress::EgressSettings;
use backend::{BackendError, CreateSpec, Provenance, Purpose};
use disk::{DiskError, DiskMode, DiskPlan};
use docker::network::NetworkError;
use docker::toolbox_mount::ToolboxPlan;
use uuid::Uuid;

pub use backend::{Backend, ImageStore, Managed, SandboxBackend};
pub use docker::{DockerBackend, disk, loop_disk, runtime};
pub use egress_route::{ServeError, serve_egress};

pub use exec::ExecOutput;
pub(crate) use exec::RawOutput;
pub use files::{FileError, FilePage};
pub use stdio::{StdioHandle, StdioProcess};
// One bounded head-and-tail buffer, shared with the toolbox.
pub use kiln_toolbox::output::HeadTail;
pub use toolbox::{OutputSink, ToolboxError};
pub use toolbox_binary::PATH_ENV as TOOLBOX_PATH_ENV;
pub use toolbox_binary::{static_binary_in as static_toolbox_in, static_target as static_toolbox_target};
use toolbox_session::ToolboxState;

/// Where the session's files live inside the container.
pub const WORKSPACE: &str = "/workspace";
pub use crate::labels::{LABEL_MANAGED, LABEL_POOL, LABEL_RUN, LABEL_SESSION, LABEL_WORKER};
/// Name prefixes: the session's container, and warm ones.
const SESSION_PREFIX: &str = "kiln-session-";
pub const WARM_PREFIX: &str = "kiln-warm-";
/// Containers that run an environment's setup for one run (see
/// `crate::environment`); labelled with the run, so the reaper removes
/// one whose run is over.
const SETUP_PREFIX: &str = "kiln-setup-";

/// The container name that binds a container to its session.
pub fn session_container_name(session_id: Uuid) -> String {
    format!("{SESSION_PREFIX}{}", session_id.simple())
}

/// The session a container belongs to, from its name (`/kiln-session-…`).
pub fn session_of_name(name: &str) -> Option<Uuid> {
    Uuid::try_parse(name.trim_start_matches('/').strip_prefix(SESSION_PREFIX)?).ok()
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// What the backend said (`docker: …`).
    #[error(transparent)]
    Backend(BackendError),
    #[error("sandbox image {0:?} is missing; build it with sandbox-images/build-offline.sh")]
    ImageMissing(String),
    // Said as it is: callers already say it was about the workspace.
    #[error("{0}")]
    Workspace(String),
    /// The checkout (or its clone) is larger than the deployment allows.
    /// Final: the same repository is as large on any worker.
    #[error("the repository is larger than this deployment's limit of {limit_mb} MB for a checkout (KILN_MAX_REPO_MB)")]
    RepoTooLarge { limit_mb: u64 },
    /// The repository URL is one this worker does not clone; says why.
    #[error("{0}")]
    RepoRefused(String),
    /// git failed; what it said is in the worker's log, not here (it would
    /// tell a tenant probing the network what it found).
    #[error("could not clone the repository")]
    CloneFailed,
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("toolbox: {0}")]
    Toolbox(#[from] ToolboxError),
    /// The image lacks a program every sandbox needs. Final: the same image
    /// lacks it on any worker.
    #[error(
        "the sandbox image {image:?} has no {missing}, which Kiln runs every command with; use an image that has it"
    )]
    ImageLacks { image: String, missing: String },
    /// A command Kiln itself runs (a capture, a restore) needs a shell, and
    /// the image has neither bash nor sh.
    #[error("the sandbox image {image:?} has no shell (neither bash nor sh), which this needs")]
    NoShell { image: String },
    /// The toolbox does not run in the image and it has no shell: no tool
    /// could work. Final, like `ImageLacks`.
    #[error(
        "the sandbox image {image:?} has no shell (neither bash nor sh) and the Kiln toolbox did not start in it \
         ({why}), so no tool could run; use an image with a shell, or give the worker the static toolbox \
         (KILN_TOOLBOX_PATH)"
    )]
    NothingRuns { image: String, why: String },
    #[error(transparent)]
    Disk(#[from] DiskError),
    #[error("egress network: {0}")]
    Network(#[from] NetworkError),
    /// A warm container's preparation (a prepared environment's restore)
    /// failed; what it printed.
    #[error("preparing a warm sandbox failed: {0}")]
    Prepare(String),
}

/// Where loop disks live unless `KILN_SANDBOX_DISK_DIR` says otherwise.
pub const DEFAULT_DISK_DIR: &str = "/var/lib/kiln/sandbox-disks";

/// Resource limits and image of a sandbox.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    pub image: String,
    pub memory_bytes: i64,
    /// CPU quota in units of 1e-9 CPUs.
    pub nano_cpus: i64,
    pub pids_limit: i64,
    /// `uid:gid` commands run as.
    pub user: String,
    /// Attach the default bridge network. Off by default.
    pub network: bool,
    /// Size of the tmpfs mounted on `/tmp`, in MiB: filling it fails the
    /// writer, not the host's disk.
    pub tmpfs_mb: u64,
    /// Open files per process (soft and hard `nofile` ulimit).
    pub nofile: i64,
    /// OCI runtime, e.g. `runsc` for gVisor; `None`: the engine's default.
    pub runtime: Option<String>,
    /// Runs may ask for `bridge` networking (`KILN_SANDBOX_ALLOW_NETWORK`).
    pub allow_network: bool,
    /// The toolbox binary to copy into containers; `None`: look for it
    /// (`KILN_TOOLBOX_PATH`, then next to the executable).
    pub toolbox_path: Option<PathBuf>,
    /// Where the worker keeps the toolbox binary it binds read-only into
    /// every sandbox (`KILN_TOOLBOX_MOUNT_DIR`); `None`: copy it into each.
    pub toolbox_mount_dir: Option<PathBuf>,
    /// What a session may write, in MiB: `/workspace` and the rest of the
    /// writable filesystem (see `disk` for how, per engine).
    pub disk_mb: u64,
    /// How the disk is bounded (`KILN_SANDBOX_DISK_MODE`).
    pub disk_mode: DiskMode,
    /// Where the `loop` mechanism keeps sandboxes' disk images
    /// (`KILN_SANDBOX_DISK_DIR`).
    pub disk_dir: PathBuf,
    /// The engine probe's plan, made once (at worker start, or by the first
    /// container) and shared by every clone of this config.
    pub disk_plan: Arc<tokio::sync::OnceCell<DiskPlan>>,
    /// The toolbox's plan (bound or copied), made beside the disk plan and
    /// shared alike.
    pub toolbox_plan: Arc<tokio::sync::OnceCell<ToolboxPlan>>,
    /// The deployment's egress policy and proxy settings.
    pub egress: Arc<EgressSettings>,
    /// The run's own egress policy (see [`SandboxConfig::egress_layers`]).
    pub egress_run: Option<EgressPolicy>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            image: "kiln-sandbox:latest".into(),
            memory_bytes: 1024 * 1024 * 1024,
            nano_cpus: 1_000_000_000,
            pids_limit: 256,
            user: "1000:1000".into(),
            network: false,
            tmpfs_mb: 256,
            nofile: 4096,
            runtime: None,
            allow_network: false,
            toolbox_path: None,
            toolbox_mount_dir: Some(docker::toolbox_mount::DEFAULT_DIR.into()),
            disk_mb: 1024,
            disk_mode: DiskMode::Auto,
            disk_dir: DEFAULT_DISK_DIR.into(),
            disk_plan: Arc::default(),
            toolbox_plan: Arc::default(),
            egress: Arc::default(),
            egress_run: None,
        }
    }
}

impl SandboxConfig {
    /// This deployment's sandbox as a run asked for it: limits only ever
    /// lowered, network only where allowed. `Err`: what the run may not have.
    pub fn narrowed(&self, spec: &SandboxSpec) -> Result<SandboxConfig, String> {
        let mut config = self.clone();
        if let Some(mb) = spec.memory_mb {
            config.memory_bytes = config.memory_bytes.min(i64::from(mb) * 1024 * 1024);
        }
        if let Some(cpus) = spec.cpus {
            config.nano_cpus = config.nano_cpus.min((cpus * 1e9) as i64);
        }
        if let Some(pids) = spec.pids {
            config.pids_limit = config.pids_limit.min(i64::from(pids));
        }
        match spec.network.unwrap_or_default() {
            NetworkMode::None => config.network = false,
            NetworkMode::Bridge if self.allow_network => config.network = true,
            NetworkMode::Bridge => {
                return Err("this run asked for network access (sandbox.network = \"bridge\"), which this \
                     deployment does not allow (KILN_SANDBOX_ALLOW_NETWORK)"
                    .into());
            }
        }
        if let Some(egress) = &spec.egress {
            if egress.mode != EgressMode::None && self.egress.deployment.mode == EgressMode::None {
                return Err(format!(
                    "this run asked for egress (sandbox.egress.mode = \"{}\"), which this deployment does not \
                     allow (KILN_EGRESS_MODE)",
                    egress.mode.as_str()
                ));
            }
            config.egress_run = Some(egress.clone());
        }
        Ok(config)
    }

    /// The policies a request from this sandbox must pass: the
    /// deployment's, then the run's.
    pub fn egress_layers(&self) -> Layers {
        Layers { deployment: self.egress.deployment.clone(), run: self.egress_run.clone() }
    }

    /// Whether the sandbox needs its session's network and proxy.
    pub fn wants_egress(&self) -> bool {
        self.egress_layers().mode() != EgressMode::None
    }
}

/// A running session sandbox: the handle the rest of the worker uses. It
/// holds the worker's [`Backend`] and the backend's handle (`id`) of the
/// sandbox; what it does goes through the backend.
#[derive(Debug, Clone)]
pub struct Sandbox {
    backend: Backend,
    id: String,
    config: SandboxConfig,
    /// Shared by clones: one toolbox process per sandbox.
    toolbox: Arc<ToolboxState>,
}

/// Who a container belongs to, written as labels.
#[derive(Debug, Clone)]
pub struct Owner {
    pub run_id: Uuid,
    pub session_id: Uuid,
    pub worker: String,
}

impl Sandbox {
    /// Creates and starts a sandbox for the session. A stopped one left
    /// under the session's name is replaced.
    pub async fn start(
        backend: impl Into<Backend>,
        config: &SandboxConfig,
        owner: &Owner,
    ) -> Result<Sandbox, SandboxError> {
        let name = session_container_name(owner.session_id);
        Self::create(backend.into(), CreateSpec { name: &name, purpose: Purpose::Session(owner), config }).await
    }

    /// Creates and starts a sandbox for a run's environment setup: the
    /// run's labels, a name of its own (not the session's: the session's
    /// sandbox is made afterwards, from what setup prepared).
    pub async fn start_setup(
        backend: impl Into<Backend>,
        config: &SandboxConfig,
        owner: &Owner,
    ) -> Result<Sandbox, SandboxError> {
        let name = format!("{SETUP_PREFIX}{}", Uuid::new_v4().simple());
        Self::create(backend.into(), CreateSpec { name: &name, purpose: Purpose::Session(owner), config }).await
    }

    /// Creates and starts a warm sandbox, not yet anyone's.
    pub async fn start_warm(
        backend: impl Into<Backend>,
        config: &SandboxConfig,
        worker: &str,
    ) -> Result<Sandbox, SandboxError> {
        let name = format!("{WARM_PREFIX}{}", Uuid::new_v4().simple());
        Self::create(backend.into(), CreateSpec { name: &name, purpose: Purpose::Warm { worker }, config }).await
    }

    /// The backend makes the sandbox (and its network); its toolbox is
    /// started here. A sandbox whose toolbox cannot start goes, with the
    /// session's network it was the only one on.
    async fn create(backend: Backend, spec: CreateSpec<'_>) -> Result<Sandbox, SandboxError> {
        let id = backend.create(&spec).await?;
        let mut sandbox = Sandbox::bound(backend, id, spec.config);
        if let Err(e) = sandbox.start_toolbox(Provenance::Made).await {
            sandbox.remove().await;
            if let Purpose::Session(owner) = spec.purpose
                && spec.config.wants_egress()
            {
                sandbox.backend.remove_session_network(&spec.config.egress.host_firewall, owner.session_id).await;
            }
            return Err(e);
        }
        Ok(sandbox)
    }

    /// The handle of the backend's sandbox `id`, no toolbox started.
    fn bound(backend: Backend, id: String, config: &SandboxConfig) -> Sandbox {
        Sandbox { backend, id, config: config.clone(), toolbox: Arc::default() }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn image(&self) -> &str {
        &self.config.image
    }

    /// Force-removes the sandbox (killing whatever runs in it).
    pub async fn remove(&self) {
        self.backend.remove(&self.id).await;
    }
}

/// The backend's errors as callers have always seen them: a missing
/// image, the disk bound, the egress network and I/O keep their own
/// variants.
impl From<BackendError> for SandboxError {
    fn from(e: BackendError) -> Self {
        match e {
            BackendError::ImageMissing(image) => SandboxError::ImageMissing(image),
            BackendError::Disk(e) => SandboxError::Disk(e),
            BackendError::Network(e) => SandboxError::Network(e),
            BackendError::Io(e) => SandboxError::Io(e),
            e => SandboxError::Backend(e),
        }
    }
}

/// Every sandbox Kiln created on this backend.
pub async fn list_managed(backend: impl Into<Backend>) -> Result<Vec<Managed>, SandboxError> {
    Ok(backend.into().list_managed().await?)
}

/// Force-removes a sandbox by id; a missing one is not an error.
pub async fn remove_by_id(backend: impl Into<Backend>, id: &str) {
    backend.into().remove(id).await;
}

#[cfg(test)]
#[path = "backend_tests.rs"]
mod backend_tests;
#[cfg(test)]
pub(crate) mod recording;
#[cfg(test)]
#[path = "toolbox_watch_tests.rs"]
mod toolbox_watch_tests;
