//! Bounding what a sandbox can write, so one session cannot fill the
//! engine's disk (the disk Postgres may share, or the pod's emptyDir whose
//! overflow gets the whole worker evicted).
//!
//! Three mechanisms, chosen by probing the engine once:
//!
//! - [`DiskMechanism::Layer`]: the engine sizes the container's writable
//!   layer (`storage_opt size`: overlay2 on xfs with `pquota`, btrfs, zfs,
//!   devicemapper). `/workspace`, the home directory and everything else
//!   written outside `/tmp` lives in that layer, on disk.
//! - [`DiskMechanism::Loop`]: where the worker runs as root next to the
//!   engine (mount, loop devices, `mkfs.ext4`): the root filesystem is
//!   read-only and the writable places are directories of a per-sandbox
//!   ext4 image of the bound's size (see `loop_disk`). On disk, so the
//!   workspace costs page cache the kernel can reclaim, not RAM.
//! - [`DiskMechanism::Tmpfs`]: everywhere else (overlay2 on ext4,
//!   fuse-overlayfs, a worker without root). The root filesystem is read-only, so the layer cannot
//!   grow at all, and each writable place is a size-bounded tmpfs: a
//!   `local` volume of type tmpfs, which (unlike a plain tmpfs mount) the
//!   archive API can write to, so the repository upload and the toolbox copy
//!   still work. The workspace is then held in RAM; the memory limit is
//!   raised by every tmpfs's size so that a full tmpfs fails the writer with
//!   ENOSPC instead of getting the sandbox OOM-killed (tmpfs pages are
//!   charged to the container's memory cgroup).
//!
//! An engine where neither works gets no sandbox unless the operator says
//! so (`KILN_SANDBOX_DISK_MODE=unbounded`).

use std::collections::HashMap;
use std::path::Path;

use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, HostConfig, Mount, MountType, MountVolumeOptions, MountVolumeOptionsDriverConfig,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, DownloadFromContainerOptionsBuilder, WaitContainerOptionsBuilder,
};
use futures::StreamExt;
use uuid::Uuid;

use super::container::{MAIN_PROCESS_USER, remove_container};
use super::loop_disk::{self, LoopDisk};
use super::toolbox_mount::{self, ToolboxPlan};
use crate::labels::LABEL_MANAGED;
use crate::sandbox::backend::BackendError;
use crate::sandbox::files::parse_user;
use crate::sandbox::toolbox_binary::CONTAINER_DIR as TOOLBOX_DIR;
use crate::sandbox::{SandboxConfig, WORKSPACE};

/// The setting that turns the bound off.
pub const MODE_ENV: &str = "KILN_SANDBOX_DISK_MODE";
/// `/dev/shm`, sized explicitly because it is RAM the memory limit must cover.
pub const SHM_MB: u64 = 64;
/// Cap of the volume holding the toolbox binary. Only the engine (root)
/// writes there, and those pages are not charged to the container.
const TOOLBOX_DIR_MB: u64 = 256;
/// Label on the engine probe's throwaway containers.
const LABEL_PROBE: &str = "dev.kiln.probe";

/// How the operator wants sandboxes' disk bounded (`KILN_SANDBOX_DISK_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DiskMode {
    /// The writable layer's size where the engine supports it, else a loop
    /// disk where the worker can make one, else tmpfs.
    #[default]
    Auto,
    /// Only `storage_opt size`; refuse engines without it.
    Layer,
    /// Only read-only root plus a loop-mounted disk image per sandbox.
    Loop,
    /// Only read-only root plus tmpfs, even where the layer could be sized.
    Tmpfs,
    /// No bound: a sandbox can fill the engine's disk.
    Unbounded,
}

impl std::str::FromStr for DiskMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(DiskMode::Auto),
            "layer" => Ok(DiskMode::Layer),
            "loop" => Ok(DiskMode::Loop),
            "tmpfs" => Ok(DiskMode::Tmpfs),
            "unbounded" => Ok(DiskMode::Unbounded),
            other => Err(format!("{other:?} is not one of auto, layer, loop, tmpfs, unbounded")),
        }
    }
}

/// What bounds the sandboxes' disk on this engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskMechanism {
    Layer,
    Loop,
    Tmpfs,
    Unbounded,
}

impl DiskMechanism {
    pub fn as_str(self) -> &'static str {
        match self {
            DiskMechanism::Layer => "layer",
            DiskMechanism::Loop => "loop",
            DiskMechanism::Tmpfs => "tmpfs",
            DiskMechanism::Unbounded => "unbounded",
        }
    }
}

/// The probe's findings: how containers are to be created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskPlan {
    pub mechanism: DiskMechanism,
    /// The command user's home in the image, made a writable place (with
    /// the image's content) under [`DiskMechanism::Tmpfs`] and [`DiskMechanism::Loop`].
    pub home: Option<String>,
    /// Volumes the image declares: each would be an unbounded directory on
    /// the engine's disk, so each gets a bounded place instead.
    pub image_volumes: Vec<String>,
    /// Why the loop mechanism was not taken, when it was tried and failed
    /// (said in the start-up log line).
    pub loop_refused: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error(
        "this Docker engine can bound a sandbox's disk neither by sizing the writable layer (storage_opt: {layer}) \
         nor with a loop-mounted disk image ({loop_}) nor with a read-only root and tmpfs volumes ({tmpfs}); \
         without a bound one session can fill the engine's disk. Set {MODE_ENV}=unbounded to run anyway"
    )]
    NoBound { layer: String, loop_: String, tmpfs: String },
    #[error("{MODE_ENV}=loop, but this worker cannot give sandboxes a loop-mounted disk image: {0}")]
    NoLoop(String),
    #[error("{MODE_ENV}=layer, but this Docker engine cannot size a container's writable layer: {0}")]
    NoLayer(String),
    #[error("making the sandbox's disk image: {0}")]
    Loop(String),
    #[error(
        "{MODE_ENV}=tmpfs, but this Docker engine cannot run sandboxes with a read-only root and tmpfs volumes: {0}"
    )]
    NoTmpfs(String),
}

/// Which mechanisms the engine (and this worker) support: `Err` says why not.
#[derive(Debug, Clone)]
pub struct Support {
    pub layer: Result<(), String>,
    pub loop_: Result<(), String>,
    pub tmpfs: Result<(), String>,
}

/// The mechanism for `mode`, given which ones are supported: `auto` takes
/// the first of layer, loop, tmpfs; an explicit mode is taken or refused.
pub fn choose(mode: DiskMode, support: Support) -> Result<DiskMechanism, DiskError> {
    let Support { layer, loop_, tmpfs } = support;
    match mode {
        DiskMode::Unbounded => Ok(DiskMechanism::Unbounded),
        DiskMode::Layer => layer.map(|()| DiskMechanism::Layer).map_err(DiskError::NoLayer),
        DiskMode::Loop => loop_.map(|()| DiskMechanism::Loop).map_err(DiskError::NoLoop),
        DiskMode::Tmpfs => tmpfs.map(|()| DiskMechanism::Tmpfs).map_err(DiskError::NoTmpfs),
        DiskMode::Auto => match (layer, loop_, tmpfs) {
            (Ok(()), _, _) => Ok(DiskMechanism::Layer),
            (_, Ok(()), _) => Ok(DiskMechanism::Loop),
            (_, _, Ok(())) => Ok(DiskMechanism::Tmpfs),
            (Err(layer), Err(loop_), Err(tmpfs)) => Err(DiskError::NoBound { layer, loop_, tmpfs }),
        },
    }
}

/// Probes the engine (with throwaway containers of the sandbox image) and
/// plans the sandboxes' disk.
pub async fn probe(docker: &Docker, config: &SandboxConfig) -> Result<DiskPlan, BackendError> {
    if config.disk_mode == DiskMode::Unbounded {
        return Ok(DiskPlan {
            mechanism: DiskMechanism::Unbounded,
            home: None,
            image_volumes: Vec::new(),
            loop_refused: None,
        });
    }
    const NOT_TRIED: &str = "not tried";
    let layer = match config.disk_mode {
        DiskMode::Auto | DiskMode::Layer => probe_layer(docker, config).await?,
        _ => Err(NOT_TRIED.to_owned()),
    };
    let loop_ = match (config.disk_mode, &layer) {
        (DiskMode::Loop, _) | (DiskMode::Auto, Err(_)) => probe_loop(docker, config).await?,
        _ => Err(NOT_TRIED.to_owned()),
    };
    let loop_refused = loop_.as_ref().err().filter(|why| *why != NOT_TRIED).cloned();
    let inspection = inspect_image_tmpfs(docker, config).await?;
    let support = Support { layer: layer.as_ref().map(|_| ()).map_err(Clone::clone), loop_, tmpfs: inspection.tmpfs };
    let mechanism = choose(config.disk_mode, support)?;
    Ok(match (mechanism, layer) {
        // The layer probe's container had no mounts of Kiln's: its volumes
        // are all the image's, `/workspace` included.
        (DiskMechanism::Layer, Ok(image_volumes)) => DiskPlan { mechanism, home: None, image_volumes, loop_refused },
        _ => DiskPlan { mechanism, home: inspection.home, image_volumes: inspection.image_volumes, loop_refused },
    })
}

/// Whether this worker can give sandboxes a loop disk the engine sees: a
/// small disk with a marker file, bound into a (never started) container of
/// the image, and the marker read back through the engine. An engine in
/// another mount namespace would bind the bare directory (or none) instead.
async fn probe_loop(docker: &Docker, config: &SandboxConfig) -> Result<Result<(), String>, BackendError> {
    let disk = match loop_disk::create(&config.disk_dir, 16, (0, 0), &[(WORKSPACE, 0o755)]).await {
        Ok(disk) => disk,
        Err(e) => return Ok(Err(e.to_string())),
    };
    let result = probe_loop_on(docker, config, &disk).await;
    loop_disk::release(&disk.dir).await;
    result
}

async fn probe_loop_on(
    docker: &Docker,
    config: &SandboxConfig,
    disk: &LoopDisk,
) -> Result<Result<(), String>, BackendError> {
    let marker = Uuid::new_v4().to_string();
    let place = disk.place(WORKSPACE);
    if let Err(e) = tokio::fs::write(place.join(".kiln-probe"), &marker).await {
        return Ok(Err(format!("writing to the disk image: {e}")));
    }
    let host_config = HostConfig {
        readonly_rootfs: Some(true),
        mounts: Some(vec![bind_volume(WORKSPACE, &place)]),
        ..Default::default()
    };
    let id = match create_probe(docker, probe_body(config, host_config)).await.map_err(|e| image_missing(e, config))? {
        Ok(id) => id,
        Err(reason) => return Ok(Err(reason)),
    };
    let read = read_small_file(docker, &id, &format!("{WORKSPACE}/.kiln-probe")).await;
    remove_container(docker, &id).await;
    Ok(match read {
        Some(content) if content == marker.as_bytes() => Ok(()),
        _ => Err("the engine does not see the worker's mounts (is it on another host, or in another mount \
                  namespace?)"
            .to_owned()),
    })
}

/// A probe container's body: the sandbox image doing nothing, as nobody,
/// with no network.
pub(super) fn probe_body(config: &SandboxConfig, host_config: HostConfig) -> ContainerCreateBody {
    ContainerCreateBody {
        image: Some(config.image.clone()),
        user: Some(MAIN_PROCESS_USER.into()),
        cmd: Some(vec!["true".into()]),
        labels: Some(HashMap::from([
            (LABEL_MANAGED.to_owned(), "true".to_owned()),
            (LABEL_PROBE.to_owned(), "true".to_owned()),
        ])),
        network_disabled: Some(true),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            runtime: config.runtime.clone(),
            ..host_config
        }),
        ..Default::default()
    }
}

/// Creates a probe container; `Ok(Err(reason))`: the engine refused it.
pub(super) async fn create_probe(
    docker: &Docker,
    body: ContainerCreateBody,
) -> Result<Result<String, String>, BackendError> {
    let name = format!("kiln-probe-{}", Uuid::new_v4().simple());
    let options = CreateContainerOptionsBuilder::new().name(&name).build();
    match docker.create_container(Some(options), body).await {
        Ok(created) => Ok(Ok(created.id)),
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, message })
            if message.contains("image") =>
        {
            Err(BackendError::ImageMissing(String::new()))
        }
        Err(bollard::errors::Error::DockerResponseServerError { message, .. }) => Ok(Err(message)),
        Err(e) => Err(e.into()),
    }
}

/// Whether the engine sizes a container's writable layer; if so, the
/// volumes the image declares.
async fn probe_layer(docker: &Docker, config: &SandboxConfig) -> Result<Result<Vec<String>, String>, BackendError> {
    let host_config = HostConfig { storage_opt: Some(layer_storage_opt(config)), ..Default::default() };
    let created = create_probe(docker, probe_body(config, host_config)).await.map_err(|e| image_missing(e, config))?;
    Ok(match created {
        Ok(id) => {
            let mounts = docker.inspect_container(&id, None).await.map(|info| info.mounts.unwrap_or_default());
            remove_container(docker, &id).await;
            Ok(mounts?.into_iter().filter_map(|m| m.destination).collect())
        }
        Err(reason) => Err(reason),
    })
}

struct Inspection {
    tmpfs: Result<(), String>,
    home: Option<String>,
    image_volumes: Vec<String>,
}

/// Runs the image with a read-only root and a tmpfs volume (does that
/// work?) and reads what the plan needs from it: the volumes the image
/// declares and the command user's home.
async fn inspect_image_tmpfs(docker: &Docker, config: &SandboxConfig) -> Result<Inspection, BackendError> {
    let host_config = HostConfig {
        readonly_rootfs: Some(true),
        mounts: Some(vec![tmpfs_volume(WORKSPACE, 1, &config.user, 0o755)]),
        ..Default::default()
    };
    let body = probe_body(config, host_config);
    let id = match create_probe(docker, body).await.map_err(|e| image_missing(e, config))? {
        Ok(id) => id,
        Err(reason) => return Ok(Inspection { tmpfs: Err(reason), home: None, image_volumes: Vec::new() }),
    };
    let result = inspect_probe(docker, config, &id).await;
    remove_container(docker, &id).await;
    result
}

async fn inspect_probe(docker: &Docker, config: &SandboxConfig, id: &str) -> Result<Inspection, BackendError> {
    let info = docker.inspect_container(id, None).await?;
    let image_volumes =
        info.mounts.unwrap_or_default().into_iter().filter_map(|m| m.destination).filter(|d| d != WORKSPACE).collect();
    let passwd = read_small_file(docker, id, "/etc/passwd").await.unwrap_or_default();
    let (uid, _) = parse_user(&config.user);
    let home = home_of(&String::from_utf8_lossy(&passwd), uid);
    let tmpfs = match docker.start_container(id, None).await {
        Ok(()) => {
            let options = WaitContainerOptionsBuilder::new().condition("not-running").build();
            match docker.wait_container(id, Some(options)).next().await {
                Some(Ok(r)) if r.status_code == 0 => Ok(()),
                Some(Ok(r)) => Err(format!("a probe container exited with {}", r.status_code)),
                Some(Err(bollard::errors::Error::DockerContainerWaitError { code: 0, .. })) => Ok(()),
                Some(Err(e)) => Err(e.to_string()),
                None => Err("waiting for a probe container ended without an answer".into()),
            }
        }
        Err(e) => Err(e.to_string()),
    };
    Ok(Inspection { tmpfs, home, image_volumes })
}

fn image_missing(e: BackendError, config: &SandboxConfig) -> BackendError {
    match e {
        BackendError::ImageMissing(_) => BackendError::ImageMissing(config.image.clone()),
        other => other,
    }
}

/// A small file out of a (created, not necessarily started) container.
pub(super) async fn read_small_file(docker: &Docker, id: &str, path: &str) -> Option<Vec<u8>> {
    let options = DownloadFromContainerOptionsBuilder::new().path(path).build();
    let mut stream = docker.download_from_container(id, Some(options));
    let mut tarball = Vec::new();
    while let Some(chunk) = stream.next().await {
        tarball.extend_from_slice(&chunk.ok()?);
        if tarball.len() > 1024 * 1024 {
            return None;
        }
    }
    let mut archive = tar::Archive::new(tarball.as_slice());
    let mut entry = archive.entries().ok()?.next()?.ok()?;
    let mut content = Vec::new();
    std::io::Read::read_to_end(&mut entry, &mut content).ok()?;
    Some(content)
}

/// The home directory of `uid` in an `/etc/passwd`, if it is one worth
/// making writable (not `/`, not a place already writable).
fn home_of(passwd: &str, uid: u64) -> Option<String> {
    let home = passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.len() >= 6 && fields[2].parse::<u64>().ok() == Some(uid)).then(|| fields[5].to_owned())
    })?;
    let covered = ["/", "/tmp", WORKSPACE, "/nonexistent", "/dev", "/proc", "/sys"];
    let clean = home.trim_end_matches('/');
    (home.starts_with('/')
        && !covered.contains(&clean)
        && !clean.is_empty()
        && !clean.starts_with("/tmp/")
        && !clean.starts_with(&format!("{WORKSPACE}/")))
    .then(|| clean.to_owned())
}

fn layer_storage_opt(config: &SandboxConfig) -> HashMap<String, String> {
    HashMap::from([("size".to_owned(), format!("{}m", config.disk_mb))])
}

/// A fresh anonymous `local` volume of type tmpfs at `target`, of `size_mb`,
/// its root owned by `user` (`uid:gid`) with `mode`. Removed with the
/// container (`v=true`). The image's content at `target` is copied in.
fn tmpfs_volume(target: &str, size_mb: u64, user: &str, mode: u32) -> Mount {
    let (uid, gid) = parse_user(user);
    Mount {
        target: Some(target.to_owned()),
        typ: Some(MountType::VOLUME),
        volume_options: Some(MountVolumeOptions {
            driver_config: Some(MountVolumeOptionsDriverConfig {
                name: Some("local".into()),
                options: Some(HashMap::from([
                    ("type".to_owned(), "tmpfs".to_owned()),
                    ("device".to_owned(), "tmpfs".to_owned()),
                    ("o".to_owned(), format!("size={size_mb}m,uid={uid},gid={gid},mode={mode:o},nosuid,nodev")),
                ])),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A fresh anonymous `local` volume at `target` that binds `source` (a
/// directory of a loop disk, owned by the command user). A volume rather
/// than a bind mount so that it carries the sandbox's labels like the
/// tmpfs ones; `nocopy` so that it starts as a tmpfs one does: empty and
/// the command user's (the engine would otherwise copy the image's content
/// and the owner of the image's directory, root's in some images).
fn bind_volume(target: &str, source: &Path) -> Mount {
    Mount {
        target: Some(target.to_owned()),
        typ: Some(MountType::VOLUME),
        volume_options: Some(MountVolumeOptions {
            no_copy: Some(true),
            driver_config: Some(MountVolumeOptionsDriverConfig {
                name: Some("local".into()),
                options: Some(HashMap::from([
                    ("type".to_owned(), "none".to_owned()),
                    ("device".to_owned(), source.to_string_lossy().into_owned()),
                    ("o".to_owned(), "bind".to_owned()),
                ])),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The places a sandbox writes besides `/tmp` (path in the container, mode
/// of a fresh one): the workspace, the home, the image's volumes.
pub(super) fn places(plan: &DiskPlan) -> Vec<(&str, u32)> {
    let mut places = vec![(WORKSPACE, 0o755)];
    if let Some(home) = &plan.home {
        places.push((home.as_str(), 0o755));
    }
    for volume in &plan.image_volumes {
        if !places.iter().any(|(p, _)| p == volume) {
            places.push((volume.as_str(), 0o1777));
        }
    }
    places
}

/// Makes the sandbox's loop disk, if the plan uses one.
pub(super) async fn make_disk(plan: &DiskPlan, config: &SandboxConfig) -> Result<Option<LoopDisk>, BackendError> {
    if plan.mechanism != DiskMechanism::Loop {
        return Ok(None);
    }
    let owner = parse_user(&config.user);
    let disk = loop_disk::create(&config.disk_dir, config.disk_mb, owner, &places(plan))
        .await
        .map_err(|e| DiskError::Loop(e.to_string()))?;
    Ok(Some(disk))
}

/// What a sandbox container's host config gets from the plan: the bound
/// itself, the toolbox's place (as `toolbox` says), and the memory limit
/// that leaves room for every tmpfs. `disk`: the sandbox's loop disk,
/// under [`DiskMechanism::Loop`].
pub(super) fn apply(
    plan: &DiskPlan,
    toolbox: &ToolboxPlan,
    config: &SandboxConfig,
    host: &mut HostConfig,
    disk: Option<&LoopDisk>,
) {
    // The worker's binary bound read-only; else a volume the engine copies
    // it into, not charged to the container: only the engine writes there.
    let toolbox = match &toolbox.dir {
        Some(dir) => toolbox_mount::mount(dir),
        None => tmpfs_volume(TOOLBOX_DIR, TOOLBOX_DIR_MB, "0:0", 0o755),
    };
    let mut mounts = vec![toolbox];
    // RAM the sandbox's processes can fill besides their own memory: /tmp
    // and /dev/shm always, then every tmpfs volume they can write.
    let mut ram_mb = config.tmpfs_mb + SHM_MB;
    let mut add = |mounts: &mut Vec<Mount>, target: &str, size_mb: u64, mode: u32| {
        if !mounts.iter().any(|m| m.target.as_deref() == Some(target)) {
            mounts.push(tmpfs_volume(target, size_mb, &config.user, mode));
            ram_mb += size_mb;
        }
    };
    match (plan.mechanism, disk) {
        (DiskMechanism::Loop, Some(disk)) => {
            // Every place is on the disk: nothing added to the memory limit.
            host.readonly_rootfs = Some(true);
            for (target, _) in places(plan) {
                mounts.push(bind_volume(target, &disk.place(target)));
            }
        }
        (DiskMechanism::Unbounded, _) => {}
        (DiskMechanism::Layer, _) => host.storage_opt = Some(layer_storage_opt(config)),
        // (Loop without a disk does not happen: `make_disk` makes one.)
        (DiskMechanism::Tmpfs | DiskMechanism::Loop, _) => {
            host.readonly_rootfs = Some(true);
            add(&mut mounts, WORKSPACE, config.disk_mb, 0o755);
            if let Some(home) = &plan.home {
                add(&mut mounts, home, config.tmpfs_mb, 0o755);
            }
        }
    }
    if plan.mechanism != DiskMechanism::Unbounded {
        for volume in &plan.image_volumes {
            let size = if volume == WORKSPACE { config.disk_mb } else { config.tmpfs_mb };
            add(&mut mounts, volume, size, 0o1777);
        }
    }
    host.mounts = Some(mounts);
    host.shm_size = Some((SHM_MB * 1024 * 1024) as i64);
    host.memory = Some(config.memory_bytes + (ram_mb * 1024 * 1024) as i64);
    // Equal to memory: no swap.
    host.memory_swap = host.memory;
}

/// Gives the container's volumes its labels (worker, session): anonymous
/// volumes have no name to tell whose they are, and one outliving its
/// container (removed without `v`) must still be attributable, as
/// `scripts/check-test-leaks.sh` does for the tests' workers.
pub(super) fn label_volumes(host: &mut HostConfig, labels: &HashMap<String, String>) {
    for mount in host.mounts.iter_mut().flatten() {
        if let Some(options) = mount.volume_options.as_mut() {
            options.labels = Some(labels.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no(why: &str) -> Result<(), String> {
        Err(why.to_owned())
    }

    fn support(layer: Result<(), String>, loop_: Result<(), String>, tmpfs: Result<(), String>) -> Support {
        Support { layer, loop_, tmpfs }
    }

    #[test]
    fn auto_prefers_the_sized_layer_then_loop_then_tmpfs_then_refuses_naming_the_setting() {
        assert_eq!(choose(DiskMode::Auto, support(Ok(()), Ok(()), Ok(()))).unwrap(), DiskMechanism::Layer);
        let no_layer = support(no("--storage-opt is not supported"), Ok(()), Ok(()));
        assert_eq!(choose(DiskMode::Auto, no_layer).unwrap(), DiskMechanism::Loop);
        let no_loop = support(no("--storage-opt is not supported"), no("not root"), Ok(()));
        assert_eq!(choose(DiskMode::Auto, no_loop).unwrap(), DiskMechanism::Tmpfs);
        let refused = choose(DiskMode::Auto, support(no("no quota"), no("no losetup"), no("no tmpfs volumes")))
            .unwrap_err()
            .to_string();
        assert!(refused.contains("KILN_SANDBOX_DISK_MODE=unbounded"), "{refused}");
        assert!(refused.contains("no quota") && refused.contains("no losetup") && refused.contains("no tmpfs volumes"));
    }

    #[test]
    fn an_explicit_mode_is_taken_or_refused_never_swapped() {
        assert_eq!(choose(DiskMode::Tmpfs, support(Ok(()), Ok(()), Ok(()))).unwrap(), DiskMechanism::Tmpfs);
        assert_eq!(choose(DiskMode::Loop, support(Ok(()), Ok(()), Ok(()))).unwrap(), DiskMechanism::Loop);
        assert!(matches!(choose(DiskMode::Layer, support(no("x"), Ok(()), Ok(()))), Err(DiskError::NoLayer(_))));
        assert!(matches!(choose(DiskMode::Loop, support(Ok(()), no("x"), Ok(()))), Err(DiskError::NoLoop(_))));
        assert!(matches!(choose(DiskMode::Tmpfs, support(Ok(()), Ok(()), no("x"))), Err(DiskError::NoTmpfs(_))));
        assert_eq!(choose(DiskMode::Unbounded, support(no("x"), no("y"), no("z"))).unwrap(), DiskMechanism::Unbounded);
        assert!("sideways".parse::<DiskMode>().is_err());
        assert_eq!("tmpfs".parse::<DiskMode>().unwrap(), DiskMode::Tmpfs);
        assert_eq!("loop".parse::<DiskMode>().unwrap(), DiskMode::Loop);
    }

    #[test]
    fn the_home_comes_from_passwd_unless_already_covered() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nkiln:x:1000:1000::/home/kiln/:/bin/bash\nnobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n";
        assert_eq!(home_of(passwd, 1000).as_deref(), Some("/home/kiln"));
        assert_eq!(home_of(passwd, 65534), None);
        assert_eq!(home_of(passwd, 4242), None);
        assert_eq!(home_of("w:x:7:7::/workspace:/bin/sh", 7), None);
    }

    #[test]
    fn tmpfs_plans_a_read_only_root_and_memory_for_every_tmpfs() {
        let config = SandboxConfig { disk_mb: 64, tmpfs_mb: 32, memory_bytes: 512 << 20, ..SandboxConfig::default() };
        let plan = DiskPlan {
            mechanism: DiskMechanism::Tmpfs,
            home: Some("/home/kiln".into()),
            image_volumes: vec!["/data".into()],
            loop_refused: None,
        };
        let mut host = HostConfig::default();
        apply(&plan, &ToolboxPlan { dir: None }, &config, &mut host, None);
        assert_eq!(host.readonly_rootfs, Some(true));
        assert_eq!(host.storage_opt, None);
        let targets: Vec<&str> = host.mounts.iter().flatten().filter_map(|m| m.target.as_deref()).collect();
        assert_eq!(targets, [TOOLBOX_DIR, WORKSPACE, "/home/kiln", "/data"]);
        let workspace = &host.mounts.as_ref().unwrap()[1];
        let o =
            &workspace.volume_options.as_ref().unwrap().driver_config.as_ref().unwrap().options.as_ref().unwrap()["o"];
        assert!(o.starts_with("size=64m,uid=1000,gid=1000,"), "{o}");
        // /tmp 32 + shm 64 + workspace 64 + home 32 + /data 32.
        assert_eq!(host.memory, Some((512 + 32 + 64 + 64 + 32 + 32) << 20));
        assert_eq!(host.memory_swap, host.memory);
    }

    #[test]
    fn layer_plans_a_sized_layer_and_leaves_the_root_writable() {
        let config = SandboxConfig { disk_mb: 64, tmpfs_mb: 32, memory_bytes: 512 << 20, ..SandboxConfig::default() };
        let plan =
            DiskPlan { mechanism: DiskMechanism::Layer, home: None, image_volumes: Vec::new(), loop_refused: None };
        let toolbox = ToolboxPlan { dir: Some("/var/lib/kiln/toolbox/0123".into()) };
        let mut host = HostConfig::default();
        apply(&plan, &toolbox, &config, &mut host, None);
        assert_eq!(host.readonly_rootfs, None);
        // The worker's toolbox bound read-only, in no volume: nothing for
        // the memory limit either.
        let toolbox = &host.mounts.as_ref().unwrap()[0];
        assert_eq!((toolbox.target.as_deref(), toolbox.read_only), (Some(TOOLBOX_DIR), Some(true)));
        assert_eq!(toolbox.source.as_deref(), Some("/var/lib/kiln/toolbox/0123"));
        assert_eq!(host.storage_opt.as_ref().unwrap()["size"], "64m");
        assert_eq!(host.memory, Some((512 + 32 + 64) << 20));
    }
}

#[cfg(test)]
mod loop_tests {
    use super::*;

    #[test]
    fn loop_binds_every_place_from_the_disk_and_adds_no_memory_for_them() {
        let config = SandboxConfig { disk_mb: 64, tmpfs_mb: 32, memory_bytes: 512 << 20, ..SandboxConfig::default() };
        let plan = DiskPlan {
            mechanism: DiskMechanism::Loop,
            home: Some("/home/kiln".into()),
            image_volumes: vec!["/data".into()],
            loop_refused: None,
        };
        let disk = LoopDisk { dir: "/var/lib/kiln/sandbox-disks/kiln-disk-1".into() };
        let mut host = HostConfig::default();
        apply(&plan, &ToolboxPlan { dir: None }, &config, &mut host, Some(&disk));
        assert_eq!(host.readonly_rootfs, Some(true));
        let mounts = host.mounts.as_ref().unwrap();
        let targets: Vec<&str> = mounts.iter().filter_map(|m| m.target.as_deref()).collect();
        assert_eq!(targets, [TOOLBOX_DIR, WORKSPACE, "/home/kiln", "/data"]);
        let options = mounts[2].volume_options.as_ref().unwrap().driver_config.as_ref().unwrap().options.as_ref();
        let options = options.unwrap();
        assert_eq!(options["device"], "/var/lib/kiln/sandbox-disks/kiln-disk-1/mnt/home_kiln");
        assert_eq!(options["o"], "bind");
        // /tmp 32 + shm 64 only: the disk is not RAM.
        assert_eq!(host.memory, Some((512 + 32 + 64) << 20));
    }
}
