//! Sandboxes configured as the worker configures them, and the options all
//! the benchmarks share.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig, ResourcesUlimits};
use bollard::query_parameters::{CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder};
use kiln_toolbox::protocol::{ExecRequest, Reply, RequestBody};
use kiln_worker::sandbox::{LABEL_MANAGED, LABEL_WORKER, Owner, Sandbox, SandboxConfig};
use uuid::Uuid;

/// Options every benchmark takes.
#[derive(Debug, Clone, clap::Args)]
pub struct Common {
    /// Measured repetitions (after one unmeasured warm-up).
    #[arg(long, default_value_t = 20)]
    pub runs: usize,
    /// Sandbox image, for Kiln and the baseline alike.
    #[arg(long, default_value = "kiln-sandbox:latest")]
    pub image: String,
    /// The toolbox binary copied into sandboxes (default: `kiln-toolbox`
    /// next to this executable, as the worker looks for it).
    #[arg(long)]
    pub toolbox: Option<PathBuf>,
}

impl Common {
    /// The worker's default sandbox settings, with this image and toolbox.
    pub fn sandbox_config(&self) -> anyhow::Result<SandboxConfig> {
        if self.runs == 0 {
            bail!("--runs must be at least 1");
        }
        let toolbox = match &self.toolbox {
            Some(path) => path.clone(),
            None => std::env::current_exe().context("locating this executable")?.with_file_name("kiln-toolbox"),
        };
        if !toolbox.is_file() {
            bail!(
                "no toolbox binary at {} (build it first: cargo build --release -p kiln-toolbox, or pass --toolbox)",
                toolbox.display()
            );
        }
        Ok(SandboxConfig { image: self.image.clone(), toolbox_path: Some(toolbox), ..SandboxConfig::default() })
    }
}

/// A directory of the benchmark's own for loop disks (on the host's disk,
/// beside the worker's default `/var/lib/kiln/sandbox-disks`), so that no
/// worker's sweep of its own directory meets them. Remove it at the end.
pub fn bench_disk_dir() -> anyhow::Result<PathBuf> {
    let dir = PathBuf::from(format!("/var/lib/kiln/bench-disks-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// The local Docker engine, checked to answer.
pub async fn docker() -> anyhow::Result<Docker> {
    let docker = Docker::connect_with_local_defaults().context("connecting to Docker")?;
    docker.ping().await.context("Docker does not answer")?;
    Ok(docker)
}

/// A fresh session owner; the worker name marks the containers as the
/// benchmark's (a crashed benchmark's containers are Kiln-labelled, so a
/// worker's start-up cleanup removes them).
pub fn owner() -> Owner {
    Owner { run_id: Uuid::new_v4(), session_id: Uuid::new_v4(), worker: format!("bench-{}", Uuid::new_v4().simple()) }
}

/// Runs `command` through the sandbox's toolbox, as the `bash` tool does,
/// and fails unless it exits 0. Returns its output.
pub async fn bash(sandbox: &Sandbox, command: &str, timeout: Duration) -> anyhow::Result<String> {
    let request = ExecRequest { timeout_ms: timeout.as_millis() as u64, ..ExecRequest::new(command) };
    match sandbox.toolbox_call(RequestBody::Exec(request), None).await? {
        Some(Reply::Exec(r)) if r.exit_code == Some(0) => Ok(r.output),
        Some(Reply::Exec(r)) => {
            bail!("{command:?} failed: exit {:?}, signal {:?}: {}", r.exit_code, r.signal, r.output)
        }
        Some(other) => bail!("unexpected toolbox reply to {command:?}: {other:?}"),
        None => bail!("the sandbox has no toolbox (was the binary copied in?)"),
    }
}

/// Creates an empty database `{prefix}_{random}` next to `admin` (a
/// Postgres URL) and returns its URL and name.
pub async fn scratch_database(admin: &str, prefix: &str) -> anyhow::Result<(String, String)> {
    let (client, conn) =
        tokio_postgres::connect(admin, tokio_postgres::NoTls).await.context("connecting to Postgres")?;
    tokio::spawn(conn);
    let name = format!("{prefix}_{}", Uuid::new_v4().simple());
    client.execute(&format!("CREATE DATABASE {name}"), &[]).await?;
    let base = admin.rsplit_once('/').map(|(base, _)| base).context("DATABASE_URL has no database name")?;
    Ok((format!("{base}/{name}"), name))
}

/// Drops a database [`scratch_database`] made, telling (not failing) when
/// it cannot.
pub async fn drop_database(admin: &str, name: &str) {
    if let Ok((client, conn)) = tokio_postgres::connect(admin, tokio_postgres::NoTls).await {
        tokio::spawn(conn);
        if let Err(e) = client.execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"), &[]).await {
            eprintln!("dropping the scratch database {name} failed: {e}");
        }
    }
}

/// A container with the worker's settings (see `sandbox::container_body`:
/// hardening, limits, no network, `/tmp` on tmpfs), running `cmd`, not
/// started. Its id.
pub async fn create_like_kiln(d: &Docker, c: &SandboxConfig, worker: &str, cmd: &[&str]) -> anyhow::Result<String> {
    let name = format!("kiln-bench-{}", Uuid::new_v4().simple());
    let labels =
        HashMap::from([(LABEL_MANAGED.to_owned(), "true".to_owned()), (LABEL_WORKER.to_owned(), worker.to_owned())]);
    let host_config = HostConfig {
        init: Some(true),
        cap_drop: Some(vec!["ALL".into()]),
        // What the toolbox (root, acting for the sandbox user) needs.
        cap_add: Some(vec!["SETUID".into(), "SETGID".into(), "KILL".into()]),
        security_opt: Some(vec!["no-new-privileges:true".into()]),
        pids_limit: Some(c.pids_limit),
        memory: Some(c.memory_bytes),
        memory_swap: Some(c.memory_bytes),
        nano_cpus: Some(c.nano_cpus),
        network_mode: Some("none".into()),
        ulimits: Some(vec![ResourcesUlimits {
            name: Some("nofile".into()),
            soft: Some(c.nofile),
            hard: Some(c.nofile),
        }]),
        tmpfs: Some(HashMap::from([("/tmp".to_owned(), format!("rw,nosuid,nodev,size={}m,mode=1777", c.tmpfs_mb))])),
        ..Default::default()
    };
    let body = ContainerCreateBody {
        image: Some(c.image.clone()),
        // Root, so that the toolbox exec gets the capabilities above.
        user: Some("0:0".into()),
        working_dir: Some("/workspace".into()),
        cmd: Some(cmd.iter().map(|s| (*s).to_owned()).collect()),
        tty: Some(false),
        open_stdin: Some(false),
        labels: Some(labels),
        network_disabled: Some(true),
        host_config: Some(host_config),
        ..Default::default()
    };
    let created = d.create_container(Some(CreateContainerOptionsBuilder::new().name(&name).build()), body).await?;
    Ok(created.id)
}

/// Removes a benchmark's container, telling (not failing) when it cannot.
pub async fn remove_container(d: &Docker, id: &str) {
    let options = RemoveContainerOptionsBuilder::new().force(true).v(true).build();
    if let Err(e) = d.remove_container(id, Some(options)).await {
        eprintln!("removing {id}: {e}");
    }
}
