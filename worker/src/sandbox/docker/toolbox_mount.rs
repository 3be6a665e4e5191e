//! The toolbox binary shared by every sandbox of this worker, mounted
//! read-only from the worker's disk instead of copied into each one.
//!
//! Copying the 8 MB static binary in through the archive API was the
//! largest part of a cold sandbox start (254 of 555 ms in
//! `start_profile`: the engine untars it in a process of its own, per
//! sandbox), and four sandboxes starting at once paid it four times over on
//! the same cores. Where the engine sees the worker's files (the worker on
//! the engine's host, as the `loop` disk mechanism also needs), the binary
//! is written once per worker under `KILN_TOOLBOX_MOUNT_DIR`, in a
//! directory named by its hash, and each sandbox gets that directory bound
//! read-only at [`CONTAINER_DIR`]: nothing is copied, and the command user
//! cannot replace the binary (nor can root in the sandbox: the mount is
//! read-only and the sandbox has no `CAP_SYS_ADMIN` to remount it).
//!
//! The directory is named by the binary's content, and the binary is
//! written under a temporary name and renamed into place, so two workers
//! sharing the directory never see a half-written binary, and a sandbox
//! already running keeps the file it started with. Where the engine does
//! not see the worker's files (another host, another mount namespace, a
//! worker that cannot write the directory), sandboxes get their copy as
//! before: a probe decides once, beside the disk plan ([`ToolboxPlan`]).

use std::path::{Path, PathBuf};

use bollard::Docker;
use bollard::models::{HostConfig, Mount, MountPoint, MountType};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::container::remove_container;
use super::disk::{create_probe, probe_body, read_small_file};
use crate::sandbox::SandboxConfig;
use crate::sandbox::backend::BackendError;
use crate::sandbox::toolbox_binary::{self, BINARY_NAME, CONTAINER_DIR};

/// Where the worker keeps the binary it mounts, unless
/// `KILN_TOOLBOX_MOUNT_DIR` says otherwise (empty: never mount, copy).
pub const DEFAULT_DIR: &str = "/var/lib/kiln/toolbox";
pub const DIR_ENV: &str = "KILN_TOOLBOX_MOUNT_DIR";
/// Where the probe container sees the worker's directory.
const PROBE_TARGET: &str = "/kiln-toolbox-probe";

/// Where sandboxes made with a config get the toolbox, as the probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolboxPlan {
    /// The worker's directory holding the binary, bound read-only into
    /// every sandbox; `None`: each sandbox gets a copy.
    pub dir: Option<PathBuf>,
}

/// Plans the toolbox of sandboxes made with `config`: see [`probe_dir`].
pub async fn probe(docker: &Docker, config: &SandboxConfig) -> Result<ToolboxPlan, BackendError> {
    Ok(ToolboxPlan { dir: probe_dir(docker, config).await? })
}

/// The host directory to bind at [`CONTAINER_DIR`] for sandboxes made
/// with `config`, or `None` when they get a copy (no binary, mounting off,
/// the directory not writable, or the engine not seeing it). `Err`: the
/// engine failed while asked; the caller may try again later.
async fn probe_dir(docker: &Docker, config: &SandboxConfig) -> Result<Option<PathBuf>, BackendError> {
    let (Some(root), Some(binary)) =
        (config.toolbox_mount_dir.as_deref(), toolbox_binary::local_binary(config.toolbox_path.as_deref()))
    else {
        return Ok(None);
    };
    let dir = match place(root, binary).await {
        Ok(dir) => dir,
        Err(e) => {
            tracing::info!(dir = %root.display(), error = %e, "cannot keep the toolbox to mount; copying it per sandbox");
            return Ok(None);
        }
    };
    match engine_sees(docker, config, root).await? {
        Ok(()) => Ok(Some(dir)),
        Err(why) => {
            tracing::info!(dir = %root.display(), reason = %why, "the engine cannot mount the worker's toolbox; copying it per sandbox");
            Ok(None)
        }
    }
}

/// Puts the binary back if something removed it since the probe (a
/// cleaner of the directory, an operator): a sandbox bound to a missing
/// directory would not start.
pub async fn ensure(dir: &Path, config: &SandboxConfig) -> std::io::Result<()> {
    if tokio::fs::metadata(dir.join(BINARY_NAME)).await.is_ok() {
        return Ok(());
    }
    let binary = toolbox_binary::local_binary(config.toolbox_path.as_deref())
        .ok_or_else(|| std::io::Error::other("the toolbox binary is no longer readable"))?;
    let root = dir.parent().ok_or_else(|| std::io::Error::other("the toolbox directory has no parent"))?;
    place(root, binary).await.map(|_| ())
}

/// The read-only bind of `dir` at [`CONTAINER_DIR`].
pub fn mount(dir: &Path) -> Mount {
    Mount {
        target: Some(CONTAINER_DIR.to_owned()),
        source: Some(dir.to_string_lossy().into_owned()),
        typ: Some(MountType::BIND),
        read_only: Some(true),
        ..Default::default()
    }
}

/// Whether the found sandbox `id` has this worker's toolbox bound in (then
/// it needs no copy), `ours` being the directory this worker binds (`None`:
/// it copies). Asked of the engine: a sandbox adopted from another worker
/// may have been made either way, and one from before an upgrade has the
/// older binary's directory bound.
pub async fn adopted_is_bound(docker: &Docker, id: &str, ours: Option<&Path>) -> Result<bool, BackendError> {
    let info = docker.inspect_container(id, None).await?;
    is_ours(bound_source(&info.mounts.unwrap_or_default()), ours)
}

/// The host directory bound at [`CONTAINER_DIR`] among a container's
/// mounts, if one is (else it has the copy's volume, or nothing).
fn bound_source(mounts: &[MountPoint]) -> Option<&Path> {
    mounts
        .iter()
        .find(|m| m.destination.as_deref() == Some(CONTAINER_DIR) && m.typ.as_deref() == Some("bind"))
        .map(|m| Path::new(m.source.as_deref().unwrap_or_default()))
}

/// `Ok(true)`: `bound` is this worker's directory; `Ok(false)`: nothing is
/// bound, so a copy goes in. Another directory (another binary: they are
/// named by its hash) is refused: it is read-only, so no copy could
/// replace it, and the worker then falls back as for a failed copy (the
/// image's toolbox, else one exec per call) rather than talk to a toolbox
/// of another version.
fn is_ours(bound: Option<&Path>, ours: Option<&Path>) -> Result<bool, BackendError> {
    match bound {
        None => Ok(false),
        Some(bound) if Some(bound) == ours => Ok(true),
        Some(bound) => Err(BackendError::ForeignToolbox {
            bound: bound.display().to_string(),
            ours: ours.map_or_else(|| "copied in".to_owned(), |dir| dir.display().to_string()),
        }),
    }
}

/// `root/<hash>/kiln-toolbox`, written if it is not there yet: the
/// directory the sandboxes bind.
async fn place(root: &Path, binary: &'static [u8]) -> std::io::Result<PathBuf> {
    let dir = root.join(hex::encode(&Sha256::digest(binary)[..8]));
    let (dir_in_task, path) = (dir.clone(), dir.join(BINARY_NAME));
    tokio::task::spawn_blocking(move || write_once(&dir_in_task, &path, binary))
        .await
        .map_err(std::io::Error::other)??;
    Ok(dir)
}

/// Writes `binary` at `path` unless exactly it is there already (a file
/// of another content, planted or truncated, is replaced: it would run in
/// every sandbox), through a temporary file renamed into place (atomic: a
/// reader sees the old file or the whole new one).
fn write_once(dir: &Path, path: &Path, binary: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let same_length = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file() && m.len() == binary.len() as u64);
    if same_length && std::fs::read(path).is_ok_and(|there| there == binary) {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    let mut temporary = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut temporary, binary)?;
    temporary.as_file().set_permissions(std::fs::Permissions::from_mode(0o755))?;
    temporary.as_file().sync_all()?;
    temporary.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Whether the engine sees the worker's `root`: a marker written there,
/// bound into a (never started) container and read back through the
/// engine. `Ok(Err(why))`: it does not.
async fn engine_sees(docker: &Docker, config: &SandboxConfig, root: &Path) -> Result<Result<(), String>, BackendError> {
    let name = format!("probe-{}", Uuid::new_v4().simple());
    let marker = Uuid::new_v4().to_string();
    if let Err(e) = tokio::fs::write(root.join(&name), &marker).await {
        return Ok(Err(format!("writing {}: {e}", root.display())));
    }
    let bind = Mount {
        target: Some(PROBE_TARGET.to_owned()),
        source: Some(root.to_string_lossy().into_owned()),
        typ: Some(MountType::BIND),
        read_only: Some(true),
        ..Default::default()
    };
    let host_config = HostConfig { mounts: Some(vec![bind]), ..Default::default() };
    let created = create_probe(docker, probe_body(config, host_config)).await;
    let seen =
        match created {
            Ok(Ok(id)) => {
                let read = read_small_file(docker, &id, &format!("{PROBE_TARGET}/{name}")).await;
                remove_container(docker, &id).await;
                Ok(match read {
                    Some(content) if content == marker.as_bytes() => Ok(()),
                    _ => Err("the engine does not see the worker's files (another host, or another mount namespace)"
                        .to_owned()),
                })
            }
            Ok(Err(refused)) => Ok(Err(refused)),
            Err(e) => Err(e),
        };
    let _ = tokio::fs::remove_file(root.join(&name)).await;
    seen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binary_is_written_once_whole_and_executable() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("abc");
        let path = dir.join(BINARY_NAME);
        write_once(&dir, &path, b"\x7fELF one").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"\x7fELF one");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o755);
        // Already there: left as it is, not rewritten.
        let before = std::fs::metadata(&path).unwrap().modified().unwrap();
        write_once(&dir, &path, b"\x7fELF one").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), before);
        // One of the same length but another content is replaced too.
        std::fs::write(&path, b"\x7fELF two").unwrap();
        write_once(&dir, &path, b"\x7fELF one").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"\x7fELF one");
        // A truncated one is replaced, and no temporary file stays behind.
        std::fs::write(&path, b"\x7fE").unwrap();
        write_once(&dir, &path, b"\x7fELF one").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"\x7fELF one");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    }

    fn bind(destination: &str, source: &str) -> MountPoint {
        MountPoint {
            typ: Some("bind".into()),
            destination: Some(destination.into()),
            source: Some(source.into()),
            ..Default::default()
        }
    }

    #[test]
    fn an_adopted_sandbox_is_bound_only_with_this_workers_directory() {
        let ours = Path::new("/var/lib/kiln/toolbox/0123");
        let mounts = [bind("/workspace", "/d/ws"), bind(CONTAINER_DIR, "/var/lib/kiln/toolbox/0123/")];
        assert_eq!(bound_source(&mounts), Some(Path::new("/var/lib/kiln/toolbox/0123")));
        assert!(is_ours(bound_source(&mounts), Some(ours)).unwrap());
        // The copy's volume (or nothing) at the toolbox's place: copied in.
        let volume = MountPoint { typ: Some("volume".into()), ..bind(CONTAINER_DIR, "/var/lib/docker/volumes/x") };
        assert_eq!(bound_source(&[volume, bind("/workspace", "/d/ws")]), None);
        assert!(!is_ours(None, Some(ours)).unwrap());
        assert!(!is_ours(None, None).unwrap());
        // An older binary's directory (a rolling upgrade), or any bind when
        // this worker copies: refused, naming both.
        let older = is_ours(Some(Path::new("/var/lib/kiln/toolbox/4567")), Some(ours)).unwrap_err().to_string();
        assert!(older.contains("toolbox/4567") && older.contains("toolbox/0123"), "{older}");
        assert!(matches!(is_ours(Some(ours), None), Err(BackendError::ForeignToolbox { .. })));
    }

    #[test]
    fn the_mount_is_a_read_only_bind_at_the_toolbox_directory() {
        let m = mount(Path::new("/var/lib/kiln/toolbox/0123"));
        assert_eq!(m.typ, Some(MountType::BIND));
        assert_eq!(m.read_only, Some(true));
        assert_eq!(m.target.as_deref(), Some(CONTAINER_DIR));
        assert_eq!(m.source.as_deref(), Some("/var/lib/kiln/toolbox/0123"));
    }
}
