//! A sandbox's writable places on a filesystem image of its own (the
//! `loop` disk mechanism, see `disk`): a sparse file of the bound's size,
//! formatted ext4 and mounted on the host through a loop device. The
//! workspace, the home and the image's volumes are directories in it, handed
//! to the container as bind-type `local` volumes (the archive API writes
//! there as to the tmpfs ones). A full
//! image fails the writer with ENOSPC; the host loses at most the image's
//! size; and the files live in the host's page cache, reclaimable, not in
//! tmpfs pages pinned to the container's memory.
//!
//! Needs root on the engine's host (mount, loop devices) and the engine in
//! the worker's mount namespace; the start-up probe checks both.
//!
//! Each disk is a directory `kiln-disk-<uuid>` under the worker's disk
//! directory (`KILN_SANDBOX_DISK_DIR`) holding `disk.img` and `mnt/`; the
//! container carries the directory's path in [`LABEL_DISK`], so removing the
//! container frees the disk, and a disk whose container is gone (a worker
//! that crashed in between) is found and freed by [`sweep`].

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::Docker;
use bollard::query_parameters::ListContainersOptionsBuilder;
use tokio::process::Command;
use uuid::Uuid;

/// On a container with a loop disk: the disk's directory.
pub const LABEL_DISK: &str = "dev.kiln.disk";
/// Prefix of every disk's directory name: only such directories are freed.
const PREFIX: &str = "kiln-disk-";
const IMAGE: &str = "disk.img";
const MOUNT: &str = "mnt";

#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("{command} failed: {output}")]
    Command { command: String, output: String },
}

/// A mounted disk image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopDisk {
    /// `<disk dir>/kiln-disk-<uuid>`.
    pub dir: PathBuf,
}

impl LoopDisk {
    /// Where the filesystem is mounted on the host.
    pub fn mount_point(&self) -> PathBuf {
        self.dir.join(MOUNT)
    }

    /// The host directory in the disk for a path in the container.
    pub fn place(&self, target: &str) -> PathBuf {
        let name: String = target.trim_matches('/').chars().map(|c| if c == '/' { '_' } else { c }).collect();
        self.mount_point().join(if name.is_empty() { "root".into() } else { name })
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LoopError {
    let what = what.into();
    move |source| LoopError::Io { what, source }
}

async fn run(program: &str, args: &[&str]) -> Result<(), LoopError> {
    let out = Command::new(program).args(args).output().await.map_err(io(format!("running {program}")))?;
    if out.status.success() {
        return Ok(());
    }
    let mut output = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    output.truncate(500);
    Err(LoopError::Command { command: format!("{program} {}", args.join(" ")), output })
}

/// Makes, formats and mounts a disk of `size_mb` under `root`, with an
/// empty directory for each of `places` (paths in the container), owned by
/// `uid:gid`. Whatever was made is freed again on failure.
pub async fn create(
    root: &Path,
    size_mb: u64,
    owner: (u64, u64),
    places: &[(&str, u32)],
) -> Result<LoopDisk, LoopError> {
    let disk = LoopDisk { dir: root.join(format!("{PREFIX}{}", Uuid::new_v4().simple())) };
    match make(&disk, size_mb, owner, places).await {
        Ok(()) => Ok(disk),
        Err(e) => {
            release(&disk.dir).await;
            Err(e)
        }
    }
}

async fn make(disk: &LoopDisk, size_mb: u64, (uid, gid): (u64, u64), places: &[(&str, u32)]) -> Result<(), LoopError> {
    let mount = disk.mount_point();
    tokio::fs::create_dir_all(&mount).await.map_err(io(format!("creating {}", mount.display())))?;
    let image = disk.dir.join(IMAGE);
    // Sparse: the host gives blocks only as the sandbox writes.
    let file = tokio::fs::File::create(&image).await.map_err(io(format!("creating {}", image.display())))?;
    file.set_len(size_mb * 1024 * 1024).await.map_err(io("sizing the disk image"))?;
    drop(file);
    let image_s = image.to_string_lossy();
    let mount_s = mount.to_string_lossy();
    // No journal (a crash discards the disk anyway), no blocks reserved for
    // root, inode tables zeroed lazily: formatting takes milliseconds.
    run("mkfs.ext4", &["-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "lazy_itable_init=1,nodiscard", &image_s])
        .await?;
    // `-o loop` sets the loop device up with autoclear: unmounting detaches it.
    run("mount", &["-o", "loop,nosuid,nodev,noatime", &image_s, &mount_s]).await?;
    // Only the places: nothing else the sandbox could write to.
    let lost = mount.join("lost+found");
    tokio::fs::remove_dir(&lost).await.map_err(io("removing lost+found"))?;
    for (target, mode) in places {
        let place = disk.place(target);
        tokio::fs::create_dir(&place).await.map_err(io(format!("creating {}", place.display())))?;
        let place_s = place.to_string_lossy();
        run("chown", &[&format!("{uid}:{gid}"), &place_s]).await?;
        run("chmod", &[&format!("{mode:o}"), &place_s]).await?;
    }
    Ok(())
}

/// Unmounts a disk (detaching its loop device) and deletes it. Only
/// directories named like a disk are touched; errors are logged (the next
/// sweep tries again).
pub async fn release(dir: &Path) {
    if !dir.file_name().is_some_and(|n| n.to_string_lossy().starts_with(PREFIX)) {
        tracing::warn!(dir = %dir.display(), "not a sandbox disk; left alone");
        return;
    }
    let mount = dir.join(MOUNT);
    if is_mounted(&mount).await
        && let Err(e) = run("umount", &[&mount.to_string_lossy()]).await
    {
        tracing::warn!(dir = %dir.display(), error = %e, "unmounting a sandbox disk failed");
        return;
    }
    // A loop device left attached (a crash between setting it up and mounting).
    let image = dir.join(IMAGE);
    if let Ok(out) = Command::new("losetup").args(["-j", &image.to_string_lossy()]).output().await {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some(device) = line.split(':').next().filter(|d| d.starts_with("/dev/loop")) {
                let _ = run("losetup", &["-d", device]).await;
            }
        }
    }
    match tokio::fs::remove_dir_all(dir).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "deleting a sandbox disk failed"),
    }
}

/// Whether something is mounted at `path` (as the host's mount table says).
pub async fn is_mounted(path: &Path) -> bool {
    let Ok(table) = tokio::fs::read_to_string("/proc/self/mountinfo").await else { return false };
    let path = path.to_string_lossy();
    table.lines().any(|line| line.split(' ').nth(4) == Some(path.as_ref()))
}

/// The disks under `root` (their directories).
pub async fn list(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(mut entries) = tokio::fs::read_dir(root).await else { return found };
    while let Ok(Some(entry)) = entries.next_entry().await {
        if entry.file_name().to_string_lossy().starts_with(PREFIX) {
            found.push(entry.path());
        }
    }
    found
}

/// Frees every disk under `root` older than `grace` whose container is
/// gone (a disk is made just before its container: `grace` covers that).
/// Returns how many went.
pub async fn sweep(docker: &Docker, root: &Path, grace: Duration) -> usize {
    let disks = list(root).await;
    if disks.is_empty() {
        return 0;
    }
    let filters = std::collections::HashMap::from([("label".to_owned(), vec![LABEL_DISK.to_owned()])]);
    let options = ListContainersOptionsBuilder::new().all(true).filters(&filters).build();
    let in_use: HashSet<String> = match docker.list_containers(Some(options)).await {
        Ok(list) => list.into_iter().filter_map(|c| c.labels?.remove(LABEL_DISK)).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "listing sandboxes with disks failed");
            return 0;
        }
    };
    let mut freed = 0;
    for dir in disks {
        let age = tokio::fs::metadata(&dir).await.ok().and_then(|m| m.modified().ok()).and_then(|t| t.elapsed().ok());
        if in_use.contains(dir.to_string_lossy().as_ref()) || age.is_none_or(|a| a < grace) {
            continue;
        }
        tracing::info!(dir = %dir.display(), "freeing a sandbox disk whose container is gone");
        release(&dir).await;
        freed += 1;
    }
    freed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_flat_directories_of_the_disk() {
        let disk = LoopDisk { dir: "/d/kiln-disk-1".into() };
        assert_eq!(disk.place("/workspace"), Path::new("/d/kiln-disk-1/mnt/workspace"));
        assert_eq!(disk.place("/home/kiln/"), Path::new("/d/kiln-disk-1/mnt/home_kiln"));
    }
}
