//! Prepared sandboxes as Docker images: `kiln-env:<key>`, labelled so
//! that Kiln finds, ages and removes only its own.
//!
//! What setup changed lives where the command user can write: `/workspace`
//! and its home. Under the tmpfs disk bound (see `sandbox::docker::disk`) both are
//! tmpfs volumes, which `docker commit` does not capture, and which Docker
//! does not fill from the image either (it copies an image's content only
//! into plain volumes, not ones with tmpfs options; checked by hand on this
//! engine). So the snapshot copies those two trees out of the setup
//! container (the archive API, streamed, never whole in memory) into
//! [`PREPARED`] in the layer of a fresh, never started container of the
//! same image, and commits that; a sandbox made from the image copies them
//! back onto its fresh tmpfs volumes (`cp -a` inside, as the command user:
//! see [`restore_command`]) before anything else runs. The same works
//! unchanged where the layer itself is sized.
//!
//! The snapshot container is created from the environment's image with
//! nothing of the run: its configuration (and so the image's) holds the
//! image's own environment plus the plain variables, never a secret.

use std::collections::{HashMap, HashSet};

use bollard::Docker;
use bollard::models::{ContainerConfig, ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    CommitContainerOptionsBuilder, CreateContainerOptionsBuilder, DownloadFromContainerOptionsBuilder,
    ListContainersOptionsBuilder, ListImagesOptionsBuilder, RemoveImageOptionsBuilder, TagImageOptionsBuilder,
    UploadToContainerOptionsBuilder,
};
use futures::TryStreamExt;
use uuid::Uuid;

use super::key::Tenancy;
use crate::sandbox::environment_pools::EnvironmentPools;
use crate::sandbox::{LABEL_MANAGED, LABEL_POOL, LABEL_RUN, SandboxError, WARM_PREFIX};

/// The repository of prepared images.
pub const REPOSITORY: &str = "kiln-env";
/// On every prepared image.
pub const LABEL_CACHE: &str = "dev.kiln.env-cache";
/// The run's base commit the image's workspace is at.
pub const LABEL_COMMIT: &str = "dev.kiln.env-commit";
/// The environment's id.
pub const LABEL_ENVIRONMENT: &str = "dev.kiln.environment";
/// The cache the image counts against (`KILN_ENVIRONMENT_CACHE_SCOPE`).
pub const LABEL_SCOPE: &str = "dev.kiln.env-scope";
/// The home directory kept in the image, if any.
pub const LABEL_HOME: &str = "dev.kiln.env-home";
/// Whose the image is: a hash of the run's owner ([`Tenancy::owner_label`]).
pub const LABEL_OWNER: &str = "dev.kiln.env-owner";
/// Of which repository: a hash of its normalised URL.
pub const LABEL_REPOSITORY: &str = "dev.kiln.env-repository";
/// Where a prepared image keeps setup's trees: `w/workspace` and `h/<home's name>`.
pub const PREPARED: &str = "/.kiln-prepared";

/// Bounds of the cache on one engine (`KILN_ENVIRONMENT_CACHE_MAX_IMAGES`,
/// `KILN_ENVIRONMENT_CACHE_MAX_MB`), over the images of one scope
/// (`KILN_ENVIRONMENT_CACHE_SCOPE`): two deployments sharing an engine
/// bound their own images and never remove each other's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheBounds {
    pub max_images: usize,
    pub max_bytes: u64,
    pub scope: String,
}

/// The scope of a deployment that sets none.
pub const DEFAULT_SCOPE: &str = "default";

impl Default for CacheBounds {
    fn default() -> Self {
        CacheBounds { max_images: 20, max_bytes: 20 * 1024 * 1024 * 1024, scope: DEFAULT_SCOPE.to_owned() }
    }
}

/// The tag of the image prepared under `key`.
pub fn tag_of(key: &str) -> String {
    format!("{REPOSITORY}:{key}")
}

/// What a prepared image says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The commit setup ran on.
    pub commit: Option<String>,
    /// The home directory it keeps.
    pub home: Option<String>,
}

/// The prepared image of `key`, if it is there and `tenancy`'s: the key
/// covers owner and repository already, the labels say so again, and an
/// image whose labels do not match (made before they existed, or not by
/// this code) is a miss.
pub async fn lookup(docker: &Docker, key: &str, tenancy: &Tenancy) -> Result<Option<Found>, SandboxError> {
    match docker.inspect_image(&tag_of(key)).await {
        Ok(image) => {
            let labels = image.config.and_then(|c| c.labels).unwrap_or_default();
            let owner = labels.get(LABEL_OWNER).is_some_and(|o| *o == tenancy.owner_label());
            let repository = labels.get(LABEL_REPOSITORY).is_some_and(|r| *r == tenancy.repository_label());
            if !(owner && repository) {
                tracing::warn!(
                    key,
                    owner,
                    repository,
                    "a prepared image is not the run's owner's and repository's: a miss"
                );
                return Ok(None);
            }
            Ok(Some(Found { commit: labels.get(LABEL_COMMIT).cloned(), home: labels.get(LABEL_HOME).cloned() }))
        }
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Marks the image used now: tagging again sets its `LastTagTime`, which
/// orders eviction (least recently used first).
pub async fn touch(docker: &Docker, key: &str) -> Result<(), SandboxError> {
    let options = TagImageOptionsBuilder::new().repo(REPOSITORY).tag(key).build();
    docker.tag_image(&tag_of(key), Some(options)).await?;
    Ok(())
}

/// What a snapshot is made of.
pub struct Snapshot<'a> {
    /// The setup container.
    pub from: &'a str,
    /// The environment's image (the setup container's).
    pub image: &'a str,
    /// The command user's home, kept besides `/workspace`.
    pub home: Option<String>,
    pub key: &'a str,
    pub run_id: Uuid,
    pub environment_id: Uuid,
    /// Whose it is (labelled, checked by [`lookup`]).
    pub tenancy: &'a Tenancy,
    pub commit: Option<&'a str>,
    /// The cache it counts against.
    pub scope: &'a str,
    /// `NAME=value` of the plain variables: the image's environment for
    /// the agent's commands.
    pub variables: Vec<String>,
}

/// Commits what setup left in `snapshot.from` as `kiln-env:<key>`.
pub async fn store(docker: &Docker, snapshot: &Snapshot<'_>) -> Result<(), SandboxError> {
    let name = format!("kiln-snapshot-{}", Uuid::new_v4().simple());
    let labels = HashMap::from([
        (LABEL_MANAGED.to_owned(), "true".to_owned()),
        (LABEL_RUN.to_owned(), snapshot.run_id.to_string()),
    ]);
    let body = ContainerCreateBody {
        image: Some(snapshot.image.to_owned()),
        cmd: Some(vec!["true".into()]),
        labels: Some(labels),
        network_disabled: Some(true),
        host_config: Some(HostConfig { network_mode: Some("none".into()), ..Default::default() }),
        ..Default::default()
    };
    let options = CreateContainerOptionsBuilder::new().name(&name).build();
    let created = docker.create_container(Some(options), body).await?;
    let result = copy_and_commit(docker, snapshot, &created.id).await;
    crate::sandbox::remove_by_id(docker, &created.id).await;
    result
}

async fn copy_and_commit(docker: &Docker, snapshot: &Snapshot<'_>, into: &str) -> Result<(), SandboxError> {
    let upload = UploadToContainerOptionsBuilder::new().path("/").build();
    docker.upload_to_container(into, Some(upload), bollard::body_full(prepared_dirs()?.into())).await?;
    let mut trees = vec![(crate::sandbox::WORKSPACE.to_owned(), format!("{PREPARED}/w"))];
    if let Some(home) = &snapshot.home {
        trees.push((home.clone(), format!("{PREPARED}/h")));
    }
    for (path, into_dir) in trees {
        // The archive of `/a/b` holds `b/…`.
        let download = DownloadFromContainerOptionsBuilder::new().path(&path).build();
        let tar = docker.download_from_container(snapshot.from, Some(download)).map_err(std::io::Error::other);
        let upload = UploadToContainerOptionsBuilder::new().path(&into_dir).build();
        docker.upload_to_container(into, Some(upload), bollard::body_try_stream(tar)).await?;
    }
    let mut labels = HashMap::from([
        (LABEL_MANAGED.to_owned(), "true".to_owned()),
        (LABEL_CACHE.to_owned(), "true".to_owned()),
        (LABEL_ENVIRONMENT.to_owned(), snapshot.environment_id.to_string()),
        (LABEL_SCOPE.to_owned(), snapshot.scope.to_owned()),
        (LABEL_OWNER.to_owned(), snapshot.tenancy.owner_label()),
        (LABEL_REPOSITORY.to_owned(), snapshot.tenancy.repository_label()),
    ]);
    if let Some(commit) = snapshot.commit {
        labels.insert(LABEL_COMMIT.to_owned(), commit.to_owned());
    }
    if let Some(home) = &snapshot.home {
        labels.insert(LABEL_HOME.to_owned(), home.clone());
    }
    let options = CommitContainerOptionsBuilder::new().container(into).repo(REPOSITORY).tag(snapshot.key).build();
    // Docker merges this with the container's configuration: the variables
    // are added to the image's environment, the rest is the image's.
    let config = ContainerConfig {
        labels: Some(labels),
        env: (!snapshot.variables.is_empty()).then(|| snapshot.variables.clone()),
        ..Default::default()
    };
    docker.commit_container(options, config).await?;
    Ok(())
}

/// A tar of the (empty, root-owned) directories [`PREPARED`] holds.
fn prepared_dirs() -> Result<Vec<u8>, SandboxError> {
    let mut builder = tar::Builder::new(Vec::new());
    for dir in ["w", "h"] {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(0o755);
        header.set_size(0);
        builder.append_data(&mut header, format!("{}/{dir}/", PREPARED.trim_start_matches('/')), std::io::empty())?;
    }
    Ok(builder.into_inner()?)
}

/// The command (run as the command user in a sandbox made from a prepared
/// image) that puts setup's trees back onto the sandbox's own `/workspace`
/// and `home`, keeping modes and times.
pub fn restore_command(home: Option<&str>) -> String {
    let mut command = format!("cp -a {PREPARED}/w/workspace/. /workspace/");
    if let Some(home) = home {
        let name = home.rsplit('/').next().unwrap_or_default();
        command.push_str(&format!(" && cp -a '{PREPARED}/h/{name}/.' '{home}/'"));
    }
    command
}

/// A prepared image as eviction sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cached {
    pub id: String,
    pub bytes: u64,
    /// When it was last tagged (made or used), RFC 3339.
    pub last_used: chrono::DateTime<chrono::Utc>,
    pub in_use: bool,
}

/// Which of `images` go so that the rest fit `bounds`: least recently
/// used first, never one in use.
pub fn to_evict(mut images: Vec<Cached>, bounds: &CacheBounds) -> Vec<String> {
    images.sort_by_key(|i| i.last_used);
    let mut count = images.len();
    let mut bytes: u64 = images.iter().map(|i| i.bytes).sum();
    let mut gone = Vec::new();
    for image in images {
        if count <= bounds.max_images && bytes <= bounds.max_bytes {
            break;
        }
        if image.in_use {
            continue;
        }
        count -= 1;
        bytes = bytes.saturating_sub(image.bytes);
        gone.push(image.id);
    }
    gone
}

/// Removes prepared images of `bounds.scope` beyond `bounds` (see
/// [`to_evict`]); the image of `keep` (just made, about to be used) counts
/// as in use. Warm containers not yet any session's do not keep an image:
/// they go with it (this worker's through their pool, which then stops;
/// other workers' pools stop when they find the image gone).
pub async fn evict(
    docker: &Docker,
    bounds: &CacheBounds,
    keep: &str,
    pools: &EnvironmentPools,
) -> Result<(), SandboxError> {
    let keep = tag_of(keep);
    let labels = vec![format!("{LABEL_CACHE}=true"), format!("{LABEL_SCOPE}={}", bounds.scope)];
    let filters = HashMap::from([("label".to_owned(), labels)]);
    let images = docker.list_images(Some(ListImagesOptionsBuilder::new().filters(&filters).build())).await?;
    let containers = docker.list_containers(Some(ListContainersOptionsBuilder::new().all(true).build())).await?;
    let (warm, sessions): (Vec<_>, Vec<_>) = containers.into_iter().partition(is_unbound_warm);
    let used: HashSet<String> = sessions.into_iter().filter_map(|c| c.image_id).collect();
    let mut cached = Vec::new();
    let mut tags = HashMap::new();
    for image in images {
        let inspected = docker.inspect_image(&image.id).await?;
        let last_used = inspected
            .metadata
            .and_then(|m| m.last_tag_time)
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(&t).ok())
            .map(|t| t.with_timezone(&chrono::Utc))
            .unwrap_or_default();
        cached.push(Cached {
            in_use: used.contains(&image.id) || image.repo_tags.contains(&keep),
            id: image.id.clone(),
            bytes: u64::try_from(image.size).unwrap_or(0),
            last_used,
        });
        tags.insert(image.id, image.repo_tags);
    }
    for id in to_evict(cached, bounds) {
        for tag in tags.get(&id).into_iter().flatten() {
            if let Some(key) = tag.strip_prefix(REPOSITORY).and_then(|t| t.strip_prefix(':')) {
                pools.forget_key(key).await;
            }
        }
        for c in warm.iter().filter(|c| c.image_id.as_deref() == Some(id.as_str())) {
            if let Some(container) = &c.id {
                crate::sandbox::remove_by_id(docker, container).await;
            }
        }
        let options = RemoveImageOptionsBuilder::new().force(false).build();
        match docker.remove_image(&id, Some(options), None).await {
            Ok(_) => tracing::info!(image = %id, "removed a prepared environment image (cache bound)"),
            // Taken into use since the listing: it stays.
            Err(e) => tracing::info!(image = %id, error = %e, "kept a prepared environment image"),
        }
    }
    Ok(())
}

/// A warm container no session has taken yet (taking renames it).
fn is_unbound_warm(c: &bollard::models::ContainerSummary) -> bool {
    let pooled = c.labels.as_ref().and_then(|l| l.get(LABEL_POOL)).is_some_and(|v| v == "true");
    let names = c.names.as_deref().unwrap_or_default();
    pooled && !names.is_empty() && names.iter().all(|n| n.trim_start_matches('/').starts_with(WARM_PREFIX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(id: &str, bytes: u64, age_s: i64, in_use: bool) -> Cached {
        Cached { id: id.into(), bytes, last_used: chrono::Utc::now() - chrono::Duration::seconds(age_s), in_use }
    }

    #[test]
    fn the_least_recently_used_go_first_and_one_in_use_stays() {
        let bounds = &CacheBounds { max_images: 2, max_bytes: 1000, ..Default::default() };
        let images = vec![image("new", 10, 1, false), image("old", 10, 100, true), image("mid", 10, 50, false)];
        assert_eq!(to_evict(images, bounds), ["mid"]);
        let bytes = &CacheBounds { max_images: 10, max_bytes: 25, ..Default::default() };
        let images = vec![image("a", 10, 3, false), image("b", 10, 2, false), image("c", 10, 1, false)];
        assert_eq!(to_evict(images, bytes), ["a"]);
        let fits = vec![image("a", 10, 3, false)];
        assert!(to_evict(fits, bounds).is_empty());
    }
}
