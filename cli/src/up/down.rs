//! `kiln down`: stop what `kiln up` started for a state directory — the
//! `kiln up` process itself, its sandbox containers and its Postgres
//! cluster — and with `--reset`, delete the cluster, the local secrets and
//! the prepared environment images so the next `kiln up` starts afresh.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use bollard::query_parameters::{ListContainersOptionsBuilder, RemoveContainerOptionsBuilder};
use clap::Args;
use kiln_worker::sandbox::{LABEL_MANAGED, LABEL_WORKER};
use tokio::process::Command;

use crate::local::{self, LocalCluster};

/// The pid of a running `kiln up`, in its state directory.
pub const PID_FILE: &str = "up.pid";
/// How long a `kiln up` asked to stop may take.
const UP_STOP_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Args)]
pub struct DownArgs {
    /// The state directory `kiln up` used.
    #[arg(long, env = "KILN_STATE_DIR", default_value = ".kiln")]
    pub state_dir: PathBuf,
    /// Also delete the local Postgres cluster (every run in it), the JWT
    /// secret (tokens it signed stop working), the demo repository and the
    /// prepared environment images this state's `kiln up` made (Docker
    /// images `kiln-env:*` labelled with its cache scope). The local
    /// model's download is kept.
    #[arg(long)]
    pub reset: bool,
}

/// The worker id `kiln up` runs its worker under for `state_dir`, so that
/// `kiln down` finds its containers by label (and a restarted `kiln up`
/// takes back its runs at once).
pub fn up_worker_id(state_dir: &Path) -> anyhow::Result<String> {
    let state_dir = std::fs::canonicalize(state_dir)?;
    Ok(format!("kiln-up-{:016x}", local::fnv1a(state_dir.to_string_lossy().as_bytes())))
}

pub async fn down(args: DownArgs) -> anyhow::Result<ExitCode> {
    if !args.state_dir.exists() {
        eprintln!("kiln: nothing to stop: there is no state directory {}", args.state_dir.display());
        return Ok(ExitCode::SUCCESS);
    }
    if stop_up_process(&args.state_dir).await? {
        eprintln!("kiln: stopped kiln up");
    }
    let removed = remove_containers(&up_worker_id(&args.state_dir)?).await?;
    eprintln!("kiln: removed {removed} sandbox container(s)");
    let cluster = LocalCluster::of(&args.state_dir).await?;
    if args.reset {
        cluster.delete().await?;
        eprintln!("kiln: deleted the local Postgres cluster ({})", cluster.base.display());
        for name in [local::JWT_SECRET_FILE, "demo-repo"] {
            remove_path(&args.state_dir.join(name))?;
        }
        eprintln!(
            "kiln: deleted the JWT secret and the demo repository; kept {} (the model download)",
            args.state_dir.join("local-model").display()
        );
        let scope = up_cache_scope(&args.state_dir)?;
        let (images, bytes) = remove_prepared_images(&scope).await?;
        eprintln!(
            "kiln: removed {images} prepared environment image(s) (kiln-env:*, cache scope {scope}, {} MB)",
            bytes / 1_000_000
        );
    } else if cluster.stop().await? {
        eprintln!(
            "kiln: stopped the local Postgres ({}; `{} down --reset` deletes it)",
            cluster.data().display(),
            crate::invocation::kiln()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Asks a `kiln up` still running for this state directory to stop, and
/// waits for it: its cluster and containers are about to go.
async fn stop_up_process(state_dir: &Path) -> anyhow::Result<bool> {
    let Ok(text) = std::fs::read_to_string(state_dir.join(PID_FILE)) else { return Ok(false) };
    let Ok(pid) = text.trim().parse::<u32>() else { return Ok(false) };
    if !is_kiln(pid) {
        return Ok(false);
    }
    let status = Command::new("kill").arg("-TERM").arg(pid.to_string()).status().await?;
    if !status.success() {
        return Ok(false);
    }
    let waited = tokio::time::timeout(UP_STOP_TIMEOUT, async {
        while is_kiln(pid) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    waited.map_err(|_| anyhow::anyhow!("kiln up (pid {pid}) did not stop within {UP_STOP_TIMEOUT:?}"))?;
    Ok(true)
}

/// Whether `pid` is a live `kiln` process (a stale pid file may name a
/// process that has nothing to do with Kiln by now).
pub(crate) fn is_kiln(pid: u32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // A zombie has exited; its parent has not reaped it yet.
    let zombie = stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z'));
    let program = cmdline.split(|b| *b == 0).next().unwrap_or_default();
    !zombie && Path::new(std::str::from_utf8(program).unwrap_or_default()).file_name().is_some_and(|n| n == "kiln")
}

/// Removes every container Kiln made under `worker` (warm and session ones).
pub async fn remove_containers(worker: &str) -> anyhow::Result<usize> {
    let docker = bollard::Docker::connect_with_local_defaults().context("connecting to Docker")?;
    let filters = HashMap::from([(
        "label".to_owned(),
        vec![format!("{LABEL_MANAGED}=true"), format!("{LABEL_WORKER}={worker}")],
    )]);
    let options = ListContainersOptionsBuilder::new().all(true).filters(&filters).build();
    let containers = docker.list_containers(Some(options)).await.context("listing sandbox containers")?;
    let mut removed = 0;
    for id in containers.into_iter().filter_map(|c| c.id) {
        let options = RemoveContainerOptionsBuilder::new().force(true).v(true).build();
        match docker.remove_container(&id, Some(options)).await {
            Ok(()) => removed += 1,
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {}
            Err(e) => return Err(e).with_context(|| format!("removing container {id}")),
        }
    }
    Ok(removed)
}

fn remove_path(path: &Path) -> anyhow::Result<()> {
    let result = if path.is_dir() { std::fs::remove_dir_all(path) } else { std::fs::remove_file(path) };
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("deleting {}", path.display())),
    }
}

/// The environment cache scope `kiln up` labels its prepared images with
/// (unless `KILN_ENVIRONMENT_CACHE_SCOPE` names another): its worker id, so
/// `kiln down --reset` removes this state's images and no one else's.
pub fn up_cache_scope(state_dir: &Path) -> anyhow::Result<String> {
    up_worker_id(state_dir)
}

/// Removes the prepared environment images (`kiln-env:*`) of cache scope
/// `scope`; returns how many and their bytes.
pub async fn remove_prepared_images(scope: &str) -> anyhow::Result<(usize, u64)> {
    use bollard::query_parameters::{ListImagesOptionsBuilder, RemoveImageOptionsBuilder};
    use kiln_worker::environment::cache::{LABEL_CACHE, LABEL_SCOPE};
    let docker = bollard::Docker::connect_with_local_defaults().context("connecting to Docker")?;
    let labels = vec![format!("{LABEL_CACHE}=true"), format!("{LABEL_SCOPE}={scope}")];
    let filters = HashMap::from([("label".to_owned(), labels)]);
    let images = docker
        .list_images(Some(ListImagesOptionsBuilder::new().filters(&filters).build()))
        .await
        .context("listing prepared environment images")?;
    let (mut removed, mut bytes) = (0, 0);
    for image in images {
        // Forced: the image has several tags at most, all of them Kiln's;
        // its containers were removed above.
        let options = RemoveImageOptionsBuilder::new().force(true).build();
        match docker.remove_image(&image.id, Some(options), None).await {
            Ok(_) => {
                removed += 1;
                bytes += u64::try_from(image.size).unwrap_or(0);
            }
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {}
            Err(e) => return Err(e).with_context(|| format!("removing prepared image {}", image.id)),
        }
    }
    Ok((removed, bytes))
}
