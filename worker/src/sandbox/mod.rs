//! One Docker container per session, driven through the Docker API.
//!
//! A session's container is named after the session (`kiln-session-<id>`),
//! so any worker on the engine finds it again: a follow-up run or a run
//! taken over from a dead worker continues in the same workspace. It stays
//! after a run ends until the session has been idle for a while (see
//! `lifecycle`). Warm containers (`pool`) are started ahead of need and
//! renamed when a session takes one.
//!
//! Commands run as an unprivileged user with no capabilities,
//! `no-new-privileges`, pids/memory/CPU/disk limits (see `disk`) and no
//! network. Only the toolbox runs as root, with `CAP_SETUID`, `CAP_SETGID`
//! and `CAP_KILL` alone, so that commands cannot reach it (see `toolbox`). The workspace
//! enters and leaves through the archive API, so the worker can drive a
//! remote engine; credentials never enter the container.

pub mod disk;
pub mod environment_pools;
mod exec;
mod files;
pub mod lifecycle;
pub mod loop_disk;
pub mod pool;
pub mod repo_clone;
pub mod runtime;
mod stdio;

pub mod toolbox;
mod toolbox_binary;
mod toolbox_reader;
mod toolbox_session;
pub mod workspace;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig, ResourcesUlimits};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
};
use disk::{DiskError, DiskMode, DiskPlan};
use kiln_protocol::egress::{EgressMode, EgressPolicy, Layers};
use kiln_protocol::{NetworkMode, SandboxSpec};
use loop_disk::{LABEL_DISK, LoopDisk};

use crate::egress::network::{self as egress_network, NetworkError};
use crate::egress::{EgressSettings, SANDBOX_DNS};
use uuid::Uuid;

pub use exec::ExecOutput;
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
/// Who the container's idle main process runs as. Root, because Docker
/// gives an exec the capabilities of the container's main process, and the
/// toolbox exec needs [`TOOLBOX_CAPABILITIES`]; the process is `sleep`,
/// which the command user can neither signal nor trace.
const MAIN_PROCESS_USER: &str = "0:0";
/// The only capabilities a container has: what the toolbox (root) needs
/// to start commands as the sandbox user and to kill them. Commands start
/// with none (setuid to the user clears them; `no-new-privileges` keeps
/// anything from regaining them).
const TOOLBOX_CAPABILITIES: [&str; 3] = ["SETUID", "SETGID", "KILL"];
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
    #[error("docker: {0}")]
    Docker(#[from] bollard::errors::Error),
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
            disk_mb: 1024,
            disk_mode: DiskMode::Auto,
            disk_dir: DEFAULT_DISK_DIR.into(),
            disk_plan: Arc::default(),
            egress: Arc::default(),
            egress_run: None,
        }
    }
}

impl SandboxConfig {
    /// How sandboxes' disk is bounded on this engine: probed the first time
    /// it is asked for, then remembered.
    pub async fn disk_plan(&self, docker: &Docker) -> Result<&DiskPlan, SandboxError> {
        self.disk_plan
            .get_or_try_init(|| async {
                let plan = disk::probe(docker, self).await?;
                tracing::info!(
                    mechanism = plan.mechanism.as_str(),
                    disk_mb = self.disk_mb,
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

/// A running session container.
#[derive(Debug, Clone)]
pub struct Sandbox {
    docker: Docker,
    id: String,
    config: SandboxConfig,
    /// Shared by clones: one toolbox process per container.
    toolbox: Arc<ToolboxState>,
}

/// Who a container belongs to, written as labels.
#[derive(Debug, Clone)]
pub struct Owner {
    pub run_id: Uuid,
    pub session_id: Uuid,
    pub worker: String,
}

/// What a new container is for: a session, or the warm pool.
enum Purpose<'a> {
    Session(&'a Owner),
    Warm { worker: &'a str },
}

impl Sandbox {
    /// Creates and starts a container for the session. A stopped container
    /// left under the session's name is replaced.
    pub async fn start(docker: &Docker, config: &SandboxConfig, owner: &Owner) -> Result<Sandbox, SandboxError> {
        Self::create(docker, config, &session_container_name(owner.session_id), Purpose::Session(owner)).await
    }

    /// Creates and starts a container for a run's environment setup: the
    /// run's labels, a name of its own (not the session's: the session's
    /// container is made afterwards, from what setup prepared).
    pub async fn start_setup(docker: &Docker, config: &SandboxConfig, owner: &Owner) -> Result<Sandbox, SandboxError> {
        let name = format!("{SETUP_PREFIX}{}", Uuid::new_v4().simple());
        Self::create(docker, config, &name, Purpose::Session(owner)).await
    }

    /// Creates and starts a warm container, not yet anyone's.
    pub async fn start_warm(docker: &Docker, config: &SandboxConfig, worker: &str) -> Result<Sandbox, SandboxError> {
        let name = format!("{WARM_PREFIX}{}", Uuid::new_v4().simple());
        Self::create(docker, config, &name, Purpose::Warm { worker }).await
    }

    async fn create(
        docker: &Docker,
        config: &SandboxConfig,
        name: &str,
        purpose: Purpose<'_>,
    ) -> Result<Sandbox, SandboxError> {
        let plan = config.disk_plan(docker).await?;
        // A session's sandbox with egress sits on the session's network
        // (warm ones never do: runs with egress do not take from the pool).
        let egress = match &purpose {
            Purpose::Session(owner) if config.wants_egress() => {
                let net = egress_network::ensure(docker, &config.egress, owner.session_id).await?;
                let proxy = std::net::SocketAddr::new(net.gateway.into(), config.egress.port);
                Some(Attachment { network: net.name, proxy, session_id: owner.session_id })
            }
            _ => None,
        };
        let made = Self::create_on(docker, config, name, &purpose, plan, egress.as_ref()).await;
        // A sandbox that never started leaves no network behind: nothing
        // else would remove it (the reaper goes by containers, and there is
        // none). The session has no other container on it: one is made only
        // when the session has none running.
        // (Unless another took the session's name meanwhile: then the
        // network is that one's.)
        if let (Err(e), Some(attachment)) = (&made, &egress)
            && !is_name_conflict(e)
        {
            egress_network::remove(docker, &config.egress.host_firewall, attachment.session_id).await;
        }
        made
    }

    async fn create_on(
        docker: &Docker,
        config: &SandboxConfig,
        name: &str,
        purpose: &Purpose<'_>,
        plan: &DiskPlan,
        egress: Option<&Attachment>,
    ) -> Result<Sandbox, SandboxError> {
        let disk = disk::make_disk(plan, config).await?;
        let created = match Self::create_container(docker, config, name, purpose, plan, egress, disk.as_ref()).await {
            Ok(created) => created,
            Err(e) => {
                // No container took the disk: nothing else would free it now.
                if let Some(disk) = &disk {
                    loop_disk::release(&disk.dir).await;
                }
                return Err(e);
            }
        };
        let mut sandbox =
            Sandbox { docker: docker.clone(), id: created, config: config.clone(), toolbox: Arc::default() };
        if let Err(e) = docker.start_container(&sandbox.id, None).await {
            sandbox.remove().await;
            return Err(e.into());
        }
        if let Err(e) = sandbox.start_toolbox().await {
            sandbox.remove().await;
            return Err(e);
        }
        Ok(sandbox)
    }

    async fn create_container(
        docker: &Docker,
        config: &SandboxConfig,
        name: &str,
        purpose: &Purpose<'_>,
        plan: &DiskPlan,
        egress: Option<&Attachment>,
        disk: Option<&LoopDisk>,
    ) -> Result<String, SandboxError> {
        let options = CreateContainerOptionsBuilder::new().name(name).build();
        let body = || container_body(config, plan, purpose, egress, disk);
        match docker.create_container(Some(options.clone()), body()).await {
            Ok(c) => Ok(c.id),
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {
                Err(SandboxError::ImageMissing(config.image.clone()))
            }
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 409, .. }) => {
                // A dead container under this name (callers adopt live ones
                // first): start afresh.
                remove_container(docker, name).await;
                Ok(docker.create_container(Some(options), body()).await?.id)
            }
            Err(e) => Err(e.into()),
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn image(&self) -> &str {
        &self.config.image
    }

    /// Force-removes the container (killing whatever runs in it).
    pub async fn remove(&self) {
        remove_container(&self.docker, &self.id).await;
    }
}

/// A sandbox's place on its session's egress network.
struct Attachment {
    network: String,
    /// Where the session's proxy listens.
    proxy: std::net::SocketAddr,
    session_id: Uuid,
}

fn container_body(
    config: &SandboxConfig,
    plan: &DiskPlan,
    purpose: &Purpose<'_>,
    egress: Option<&Attachment>,
    disk: Option<&LoopDisk>,
) -> ContainerCreateBody {
    let labels = labels_of(purpose, disk);
    let mut host_config = host_config(config, egress);
    // The disk bound, and memory (no swap) that leaves room for every tmpfs.
    disk::apply(plan, config, &mut host_config, disk);
    disk::label_volumes(&mut host_config, &labels);
    ContainerCreateBody {
        image: Some(config.image.clone()),
        // The container's own process (PID 1 and its `sleep`) does not run
        // as the command user: so the command user's processes can all be
        // killed at once (`kill -9 -1`, see toolbox_session) without stopping
        // the container (or the toolbox). Every exec names its user explicitly.
        user: Some(MAIN_PROCESS_USER.into()),
        working_dir: Some(WORKSPACE.into()),
        cmd: Some(vec!["sleep".into(), "infinity".into()]),
        // No TTY, no stdin: nothing in the container can wait on input.
        tty: Some(false),
        open_stdin: Some(false),
        labels: Some(labels),
        env: egress.map(|a| crate::egress::proxy_env(a.proxy)),
        network_disabled: Some(!config.network && egress.is_none()),
        host_config: Some(host_config),
        ..Default::default()
    }
}

/// Who a container is for, as labels: cleanup and the reaper find it by them.
fn labels_of(purpose: &Purpose<'_>, disk: Option<&LoopDisk>) -> HashMap<String, String> {
    let mut labels = HashMap::from([(LABEL_MANAGED.to_owned(), "true".to_owned())]);
    if let Some(disk) = disk {
        // Whoever removes the container frees the disk (see `remove_container`).
        labels.insert(LABEL_DISK.to_owned(), disk.dir.to_string_lossy().into_owned());
    }
    match purpose {
        Purpose::Session(owner) => {
            // Who created it; the name, not these, binds it to the session.
            labels.insert(LABEL_RUN.to_owned(), owner.run_id.to_string());
            labels.insert(LABEL_SESSION.to_owned(), owner.session_id.to_string());
            labels.insert(LABEL_WORKER.to_owned(), owner.worker.clone());
        }
        Purpose::Warm { worker } => {
            labels.insert(LABEL_POOL.to_owned(), "true".to_owned());
            labels.insert(LABEL_WORKER.to_owned(), (*worker).to_owned());
        }
    }
    labels
}

/// The container's confinement: capabilities, limits, network, `/tmp`,
/// runtime (the disk bound is added by `disk::apply`).
fn host_config(config: &SandboxConfig, egress: Option<&Attachment>) -> HostConfig {
    HostConfig {
        // docker-init as PID 1 reaps orphans, so killed commands leave no zombies.
        init: Some(true),
        cap_drop: Some(vec!["ALL".into()]),
        cap_add: Some(TOOLBOX_CAPABILITIES.iter().map(|c| (*c).to_owned()).collect()),
        security_opt: Some(vec!["no-new-privileges:true".into()]),
        pids_limit: Some(config.pids_limit),
        nano_cpus: Some(config.nano_cpus),
        network_mode: Some(match egress {
            Some(a) => a.network.clone(),
            None if config.network => "bridge".into(),
            None => "none".into(),
        }),
        // The engine's resolver for the sandbox forwards to an address it
        // cannot reach (see `SANDBOX_DNS`): names resolve at the proxy only.
        dns: egress.map(|_| vec![SANDBOX_DNS.to_owned()]),
        ulimits: Some(vec![ResourcesUlimits {
            name: Some("nofile".into()),
            soft: Some(config.nofile),
            hard: Some(config.nofile),
        }]),
        // nosuid/nodev like any scratch space; exec stays allowed because
        // builds and tests run binaries from /tmp.
        tmpfs: Some(HashMap::from([(
            "/tmp".to_owned(),
            format!("rw,nosuid,nodev,size={}m,mode=1777", config.tmpfs_mb),
        )])),
        runtime: config.runtime.clone(),
        ..Default::default()
    }
}

/// The engine refused a container's name: another container has it.
fn is_name_conflict(e: &SandboxError) -> bool {
    matches!(e, SandboxError::Docker(bollard::errors::Error::DockerResponseServerError { status_code: 409, .. }))
}

/// Force-removes a container with its volumes, and frees its loop disk
/// if it has one.
async fn remove_container(docker: &Docker, id: &str) {
    let disk = match docker.inspect_container(id, None).await {
        Ok(info) => info.config.and_then(|c| c.labels).and_then(|mut l| l.remove(LABEL_DISK)),
        Err(_) => None,
    };
    let options = RemoveContainerOptionsBuilder::new().force(true).v(true).build();
    match docker.remove_container(id, Some(options)).await {
        Ok(()) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {
            if let Some(dir) = disk {
                loop_disk::release(std::path::Path::new(&dir)).await;
            }
        }
        Err(e) => tracing::warn!(container = id, error = %e, "removing sandbox failed"),
    }
}

/// A Kiln container on the engine, as listed.
#[derive(Debug, Clone)]
pub struct Managed {
    pub id: String,
    /// The session it is bound to (by name), if any.
    pub session: Option<Uuid>,
    /// The run that created it (containers of older Kiln versions were
    /// bound to a run, not a session).
    pub run: Option<Uuid>,
    /// A warm container not yet bound to a session, and the worker that
    /// keeps it. (A bound one still carries the pool labels: labels cannot
    /// change.)
    pub pool_worker: Option<String>,
}

/// Every container Kiln created on this engine.
pub async fn list_managed(docker: &Docker) -> Result<Vec<Managed>, SandboxError> {
    let filters = HashMap::from([("label".to_owned(), vec![format!("{LABEL_MANAGED}=true")])]);
    let options = ListContainersOptionsBuilder::new().all(true).filters(&filters).build();
    let list = docker.list_containers(Some(options)).await?;
    Ok(list
        .into_iter()
        .filter_map(|c| {
            let labels = c.labels.unwrap_or_default();
            let label_uuid = |key: &str| labels.get(key).and_then(|v| Uuid::parse_str(v).ok());
            let session = c.names.unwrap_or_default().iter().find_map(|n| session_of_name(n));
            let pool_worker = match labels.get(LABEL_POOL).map(String::as_str) {
                Some("true") if session.is_none() => labels.get(LABEL_WORKER).cloned(),
                _ => None,
            };
            Some(Managed { id: c.id?, session, run: label_uuid(LABEL_RUN), pool_worker })
        })
        .collect())
}

/// Force-removes a container by id; a missing one is not an error.
pub async fn remove_by_id(docker: &Docker, id: &str) {
    remove_container(docker, id).await;
}
