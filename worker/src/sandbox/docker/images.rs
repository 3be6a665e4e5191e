//! The Docker backend's image store: the engine's own images. A snapshot
//! is a `docker commit` of a fresh, never started container of the base
//! image into whose layer the sandbox's trees were copied (the archive API,
//! streamed, never whole in memory): the trees may be tmpfs volumes, which
//! `docker commit` does not capture (see `environment::cache`). "Used"
//! is the image's `LastTagTime`, set by tagging it again.

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use bollard::Docker;
use bollard::models::{ContainerConfig, ContainerCreateBody, ContainerSummary, HostConfig};
use bollard::query_parameters::{
    CommitContainerOptionsBuilder, CreateContainerOptionsBuilder, DownloadFromContainerOptionsBuilder,
    ListContainersOptionsBuilder, ListImagesOptionsBuilder, RemoveImageOptionsBuilder, TagImageOptionsBuilder,
    UploadToContainerOptionsBuilder,
};
use futures::TryStreamExt;
use uuid::Uuid;

use super::DockerBackend;
use super::container::remove_container;
use crate::labels::LABEL_POOL;
use crate::sandbox::WARM_PREFIX;
use crate::sandbox::backend::{BackendError, ImageStore};
use crate::sandbox::image_store::{ImageInfo, SnapshotSpec, StoredImage, Tree};

#[async_trait]
impl ImageStore for DockerBackend {
    async fn image(&self, name: &str) -> Result<Option<ImageInfo>, BackendError> {
        let image = match self.docker.inspect_image(name).await {
            Ok(image) => image,
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let names = image.repo_tags.into_iter().flatten().chain(image.repo_digests.into_iter().flatten()).collect();
        Ok(Some(ImageInfo {
            id: image.id.unwrap_or_default(),
            names,
            labels: image.config.and_then(|c| c.labels).unwrap_or_default(),
        }))
    }

    async fn mark_used(&self, name: &str) -> Result<(), BackendError> {
        let (repo, tag) = repository_and_tag(name);
        let options = TagImageOptionsBuilder::new().repo(repo).tag(tag).build();
        self.docker.tag_image(name, Some(options)).await?;
        Ok(())
    }

    async fn snapshot(&self, spec: &SnapshotSpec<'_>) -> Result<(), BackendError> {
        let docker = &self.docker;
        let name = format!("kiln-snapshot-{}", Uuid::new_v4().simple());
        let body = ContainerCreateBody {
            image: Some(spec.image.to_owned()),
            cmd: Some(vec!["true".into()]),
            labels: Some(spec.scratch_labels.clone()),
            network_disabled: Some(true),
            host_config: Some(HostConfig { network_mode: Some("none".into()), ..Default::default() }),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::new().name(&name).build();
        let created = docker.create_container(Some(options), body).await?;
        let result = copy_and_commit(docker, spec, &created.id).await;
        remove_container(docker, &created.id).await;
        result
    }

    async fn images_labelled(&self, labels: &[String]) -> Result<Vec<StoredImage>, BackendError> {
        let docker = &self.docker;
        let filters = HashMap::from([("label".to_owned(), labels.to_vec())]);
        let images = docker.list_images(Some(ListImagesOptionsBuilder::new().filters(&filters).build())).await?;
        let containers = docker.list_containers(Some(ListContainersOptionsBuilder::new().all(true).build())).await?;
        let (warm, others): (Vec<_>, Vec<_>) = containers.into_iter().partition(is_unbound_warm);
        let used: HashSet<String> = others.into_iter().filter_map(|c| c.image_id).collect();
        let mut stored = Vec::new();
        for image in images {
            let inspected = docker.inspect_image(&image.id).await?;
            let last_used = inspected
                .metadata
                .and_then(|m| m.last_tag_time)
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(&t).ok())
                .map(|t| t.with_timezone(&chrono::Utc))
                .unwrap_or_default();
            let on_it = |c: &&ContainerSummary| c.image_id.as_deref() == Some(image.id.as_str());
            stored.push(StoredImage {
                in_use: used.contains(&image.id),
                warm: warm.iter().filter(on_it).filter_map(|c| c.id.clone()).collect(),
                bytes: u64::try_from(image.size).unwrap_or(0),
                last_used,
                names: image.repo_tags,
                id: image.id,
            });
        }
        Ok(stored)
    }

    async fn remove_image(&self, id: &str) -> Result<(), BackendError> {
        let options = RemoveImageOptionsBuilder::new().force(false).build();
        self.docker.remove_image(id, Some(options), None).await?;
        Ok(())
    }
}

/// Copies `spec`'s trees into the never started container `into`, and
/// commits it as `spec.name`.
async fn copy_and_commit(docker: &Docker, spec: &SnapshotSpec<'_>, into: &str) -> Result<(), BackendError> {
    let upload = UploadToContainerOptionsBuilder::new().path("/").build();
    docker.upload_to_container(into, Some(upload), bollard::body_full(directories(&spec.trees)?.into())).await?;
    for tree in &spec.trees {
        let download = DownloadFromContainerOptionsBuilder::new().path(&tree.path).build();
        let tar = docker.download_from_container(spec.from, Some(download)).map_err(std::io::Error::other);
        let upload = UploadToContainerOptionsBuilder::new().path(&tree.into).build();
        docker.upload_to_container(into, Some(upload), bollard::body_try_stream(tar)).await?;
    }
    let (repo, tag) = repository_and_tag(spec.name);
    let options = CommitContainerOptionsBuilder::new().container(into).repo(repo).tag(tag).build();
    // Docker merges this with the container's configuration: the variables
    // are added to the image's environment, the rest is the image's.
    let config = ContainerConfig {
        labels: Some(spec.labels.clone()),
        env: (!spec.env.is_empty()).then(|| spec.env.clone()),
        ..Default::default()
    };
    docker.commit_container(options, config).await?;
    Ok(())
}

/// `repository:tag` apart (`latest` when it has no tag; a registry's port
/// is not a tag).
fn repository_and_tag(name: &str) -> (&str, &str) {
    match name.rsplit_once(':') {
        Some((repository, tag)) if !tag.contains('/') => (repository, tag),
        _ => (name, "latest"),
    }
}

/// A tar of the (empty, root-owned) directories the trees go into, and
/// their parents.
fn directories(trees: &[Tree]) -> Result<Vec<u8>, std::io::Error> {
    let mut dirs: Vec<String> = Vec::new();
    for tree in trees {
        let mut path = String::new();
        for part in tree.into.split('/').filter(|p| !p.is_empty()) {
            path.push_str(part);
            path.push('/');
            if !dirs.contains(&path) {
                dirs.push(path.clone());
            }
        }
    }
    let mut builder = tar::Builder::new(Vec::new());
    for dir in dirs {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(0o755);
        header.set_size(0);
        builder.append_data(&mut header, dir, std::io::empty())?;
    }
    builder.into_inner()
}

/// A warm container no session has taken yet (taking renames it).
fn is_unbound_warm(c: &ContainerSummary) -> bool {
    let pooled = c.labels.as_ref().and_then(|l| l.get(LABEL_POOL)).is_some_and(|v| v == "true");
    let names = c.names.as_deref().unwrap_or_default();
    pooled && !names.is_empty() && names.iter().all(|n| n.trim_start_matches('/').starts_with(WARM_PREFIX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_its_repository_and_tag() {
        assert_eq!(repository_and_tag("kiln-env:abc"), ("kiln-env", "abc"));
        assert_eq!(repository_and_tag("registry:5000/kiln-env"), ("registry:5000/kiln-env", "latest"));
    }

    #[test]
    fn the_trees_directories_and_their_parents_are_made_once_each() {
        let trees = [
            Tree { path: "/workspace".into(), into: "/.kiln-prepared/w".into() },
            Tree { path: "/home/kiln".into(), into: "/.kiln-prepared/h".into() },
        ];
        let tar = directories(&trees).unwrap();
        let mut archive = tar::Archive::new(tar.as_slice());
        let names: Vec<String> =
            archive.entries().unwrap().map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, [".kiln-prepared/", ".kiln-prepared/w/", ".kiln-prepared/h/"]);
    }
}
