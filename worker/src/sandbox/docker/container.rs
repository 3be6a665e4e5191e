//! A sandbox's container: made from a [`CreateSpec`] (confinement, limits,
//! disk bound, network, labels), removed with its disk, listed for the
//! reaper.

use std::collections::HashMap;

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
};
use uuid::Uuid;

use super::disk::{self, DiskPlan};
use super::loop_disk::{self, LABEL_DISK, LoopDisk};
use super::network as egress_network;
use super::pids;
use super::toolbox_mount::{self, ToolboxPlan};
use crate::egress::SANDBOX_DNS;
use crate::labels::{LABEL_MANAGED, LABEL_POOL, LABEL_RUN, LABEL_SESSION, LABEL_WORKER};
use crate::sandbox::backend::{BackendError, CreateSpec, Managed, Purpose};
use crate::sandbox::{WORKSPACE, session_of_name};

/// Who the container's idle main process runs as. Root, because Docker
/// gives an exec the capabilities of the container's main process, and the
/// toolbox exec needs [`TOOLBOX_CAPABILITIES`]; the process is `sleep`,
/// which the command user can neither signal nor trace.
pub(super) const MAIN_PROCESS_USER: &str = "0:0";
/// The only capabilities a container has: what the toolbox (root) needs
/// to start commands as the sandbox user and to kill them. Commands start
/// with none (setuid to the user clears them; `no-new-privileges` keeps
/// anything from regaining them).
const TOOLBOX_CAPABILITIES: [&str; 3] = ["SETUID", "SETGID", "KILL"];

/// One container in the making: what was asked, the engine's disk plan,
/// the toolbox's, and where it sits on its session's egress network, if it
/// does.
struct Creation<'a> {
    spec: &'a CreateSpec<'a>,
    plan: &'a DiskPlan,
    toolbox: &'a ToolboxPlan,
    egress: Option<Attachment>,
    /// It runs under gVisor (see `pids`).
    gvisor: bool,
}

/// A sandbox's place on its session's egress network.
struct Attachment {
    network: String,
    /// Where the session's proxy listens.
    proxy: std::net::SocketAddr,
    session_id: Uuid,
}

/// Creates and starts the container `spec` asks for (`gvisor`: its
/// runtime is gVisor): its id.
pub(super) async fn create(
    docker: &Docker,
    spec: &CreateSpec<'_>,
    plan: &DiskPlan,
    toolbox: &ToolboxPlan,
    gvisor: bool,
) -> Result<String, BackendError> {
    let config = spec.config;
    if let Some(dir) = &toolbox.dir {
        toolbox_mount::ensure(dir, config).await?;
    }
    // A session's sandbox with egress sits on the session's network
    // (warm ones never do: runs with egress do not take from the pool).
    let egress = match spec.purpose {
        Purpose::Session(owner) if config.wants_egress() => {
            let net = egress_network::ensure(docker, &config.egress, owner.session_id).await?;
            let proxy = std::net::SocketAddr::new(net.gateway.into(), config.egress.port);
            Some(Attachment { network: net.name, proxy, session_id: owner.session_id })
        }
        _ => None,
    };
    let creation = Creation { spec, plan, toolbox, egress, gvisor };
    let made = create_on(docker, &creation).await;
    // A sandbox that never started leaves no network behind: nothing
    // else would remove it (the reaper goes by containers, and there is
    // none). The session has no other container on it: one is made only
    // when the session has none running.
    // (Unless another took the session's name meanwhile: then the
    // network is that one's.)
    if let (Err(e), Some(attachment)) = (&made, &creation.egress)
        && !matches!(e, BackendError::NameTaken { .. })
    {
        egress_network::remove(docker, &config.egress.host_firewall, attachment.session_id).await;
    }
    made
}

/// The container with its disk, started.
async fn create_on(docker: &Docker, creation: &Creation<'_>) -> Result<String, BackendError> {
    let disk = disk::make_disk(creation.plan, creation.spec.config).await?;
    let id = match create_container(docker, creation, disk.as_ref()).await {
        Ok(id) => id,
        Err(e) => {
            // No container took the disk: nothing else would free it now.
            if let Some(disk) = &disk {
                loop_disk::release(&disk.dir).await;
            }
            return Err(e);
        }
    };
    if let Err(e) = docker.start_container(&id, None).await {
        remove_container(docker, &id).await;
        return Err(e.into());
    }
    Ok(id)
}

async fn create_container(
    docker: &Docker,
    creation: &Creation<'_>,
    disk: Option<&LoopDisk>,
) -> Result<String, BackendError> {
    let name = creation.spec.name;
    let options = CreateContainerOptionsBuilder::new().name(name).build();
    let body = || container_body(creation, disk);
    match docker.create_container(Some(options.clone()), body()).await {
        Ok(c) => Ok(c.id),
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {
            Err(BackendError::ImageMissing(creation.spec.config.image.clone()))
        }
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 409, .. }) => {
            // A dead container under this name (callers adopt live ones
            // first): start afresh.
            remove_container(docker, name).await;
            match docker.create_container(Some(options), body()).await {
                Ok(c) => Ok(c.id),
                Err(e @ bollard::errors::Error::DockerResponseServerError { status_code: 409, .. }) => {
                    Err(BackendError::NameTaken { said: format!("docker: {e}") })
                }
                Err(e) => Err(e.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}

fn container_body(creation: &Creation<'_>, disk: Option<&LoopDisk>) -> ContainerCreateBody {
    let (config, egress) = (creation.spec.config, creation.egress.as_ref());
    let labels = labels_of(&creation.spec.purpose, disk);
    let mut host_config = host_config(creation);
    // The disk bound, and memory (no swap) that leaves room for every tmpfs.
    disk::apply(creation.plan, creation.toolbox, config, &mut host_config, disk);
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
fn host_config(creation: &Creation<'_>) -> HostConfig {
    let (config, egress) = (creation.spec.config, creation.egress.as_ref());
    HostConfig {
        // docker-init as PID 1 reaps orphans, so killed commands leave no zombies.
        init: Some(true),
        cap_drop: Some(vec!["ALL".into()]),
        cap_add: Some(TOOLBOX_CAPABILITIES.iter().map(|c| (*c).to_owned()).collect()),
        security_opt: Some(vec!["no-new-privileges:true".into()]),
        // Under gVisor, with room for its own threads (see `pids`).
        pids_limit: Some(pids::host_limit(config, creation.gvisor)),
        nano_cpus: Some(config.nano_cpus),
        network_mode: Some(match egress {
            Some(a) => a.network.clone(),
            None if config.network => "bridge".into(),
            None => "none".into(),
        }),
        // The engine's resolver for the sandbox forwards to an address it
        // cannot reach (see `SANDBOX_DNS`): names resolve at the proxy only.
        dns: egress.map(|_| vec![SANDBOX_DNS.to_owned()]),
        ulimits: Some(pids::ulimits(config, creation.gvisor)),
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

/// Force-removes a container with its volumes, and frees its loop disk
/// if it has one.
pub async fn remove_container(docker: &Docker, id: &str) {
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

/// Every container Kiln created on this engine.
pub async fn list_managed(docker: &Docker) -> Result<Vec<Managed>, BackendError> {
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
