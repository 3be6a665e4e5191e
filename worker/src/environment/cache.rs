//! Prepared sandboxes as images of the backend's image store
//! ([`ImageStore`]): `kiln-env:<key>`, labelled so that Kiln finds, ages
//! and removes only its own.
//!
//! What setup changed lives where the command user can write: `/workspace`
//! and its home. Under the tmpfs disk bound (see `sandbox::docker::disk`)
//! both are tmpfs volumes, which a snapshot of the sandbox's own layer
//! (`docker commit`) does not capture, and which Docker does not fill from
//! the image either (it copies an image's content only into plain volumes,
//! not ones with tmpfs options; checked by hand on this engine). So the
//! snapshot keeps those two trees ([`SnapshotSpec::trees`]) in [`PREPARED`]
//! of an image made from the same base image (Docker: in the layer of a
//! fresh, never started container, committed); a sandbox made from the
//! image copies them back onto its fresh tmpfs volumes (`cp -a` inside, as
//! the command user: see [`restore_command`]) before anything else runs.
//! The same works unchanged where the layer itself is sized.
//!
//! The snapshot is made from the environment's image with nothing of the
//! run: its configuration (and so the image's) holds the image's own
//! environment plus the plain variables, never a secret.

use std::collections::HashMap;

use uuid::Uuid;

use super::key::Tenancy;
use crate::sandbox::ImageStore;
use crate::sandbox::environment_pools::EnvironmentPools;
use crate::sandbox::image_store::{SnapshotSpec, Tree};
use crate::sandbox::{Backend, LABEL_MANAGED, LABEL_RUN, SandboxError};

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
pub async fn lookup(images: &dyn ImageStore, key: &str, tenancy: &Tenancy) -> Result<Option<Found>, SandboxError> {
    let Some(image) = images.image(&tag_of(key)).await? else { return Ok(None) };
    let labels = image.labels;
    let owner = labels.get(LABEL_OWNER).is_some_and(|o| *o == tenancy.owner_label());
    let repository = labels.get(LABEL_REPOSITORY).is_some_and(|r| *r == tenancy.repository_label());
    if !(owner && repository) {
        tracing::warn!(key, owner, repository, "a prepared image is not the run's owner's and repository's: a miss");
        return Ok(None);
    }
    Ok(Some(Found { commit: labels.get(LABEL_COMMIT).cloned(), home: labels.get(LABEL_HOME).cloned() }))
}

/// Marks the image used now: tagging again sets its `LastTagTime`, which
/// orders eviction (least recently used first).
pub async fn touch(images: &dyn ImageStore, key: &str) -> Result<(), SandboxError> {
    Ok(images.mark_used(&tag_of(key)).await?)
}

/// What a snapshot is made of.
pub struct Snapshot<'a> {
    /// The setup sandbox (the backend's handle).
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

/// Stores what setup left in `snapshot.from` as `kiln-env:<key>`.
pub async fn store(images: &dyn ImageStore, snapshot: &Snapshot<'_>) -> Result<(), SandboxError> {
    let name = tag_of(snapshot.key);
    let mut trees = vec![Tree { path: crate::sandbox::WORKSPACE.to_owned(), into: format!("{PREPARED}/w") }];
    if let Some(home) = &snapshot.home {
        trees.push(Tree { path: home.clone(), into: format!("{PREPARED}/h") });
    }
    let spec = SnapshotSpec {
        from: snapshot.from,
        image: snapshot.image,
        name: &name,
        trees,
        labels: labels_of(snapshot),
        env: snapshot.variables.clone(),
        scratch_labels: HashMap::from([
            (LABEL_MANAGED.to_owned(), "true".to_owned()),
            (LABEL_RUN.to_owned(), snapshot.run_id.to_string()),
        ]),
    };
    Ok(images.snapshot(&spec).await?)
}

/// What a prepared image says of itself: whose, of what, at which commit.
fn labels_of(snapshot: &Snapshot<'_>) -> HashMap<String, String> {
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
    labels
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
    backend: &Backend,
    bounds: &CacheBounds,
    keep: &str,
    pools: &EnvironmentPools,
) -> Result<(), SandboxError> {
    let keep = tag_of(keep);
    let labels = [format!("{LABEL_CACHE}=true"), format!("{LABEL_SCOPE}={}", bounds.scope)];
    let stored = backend.images_labelled(&labels).await?;
    let cached = stored
        .iter()
        .map(|image| Cached {
            id: image.id.clone(),
            bytes: image.bytes,
            last_used: image.last_used,
            in_use: image.in_use || image.names.contains(&keep),
        })
        .collect();
    for id in to_evict(cached, bounds) {
        let Some(image) = stored.iter().find(|i| i.id == id) else { continue };
        for name in &image.names {
            if let Some(key) = name.strip_prefix(REPOSITORY).and_then(|t| t.strip_prefix(':')) {
                pools.forget_key(key).await;
            }
        }
        for warm in &image.warm {
            backend.remove(warm).await;
        }
        match backend.remove_image(&id).await {
            Ok(()) => tracing::info!(image = %id, "removed a prepared environment image (cache bound)"),
            // Taken into use since the listing: it stays.
            Err(e) => tracing::info!(image = %id, error = %e, "kept a prepared environment image"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::sandbox::environment_pools::WarmSettings;
    use crate::sandbox::image_store::{ImageInfo, StoredImage};
    use crate::sandbox::recording::Recording;

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

    fn tenancy() -> Tenancy {
        Tenancy::new("alice", Some("https://github.com/o/r"))
    }

    fn prepared(tenancy: &Tenancy, commit: &str) -> ImageInfo {
        let labels = HashMap::from([
            (LABEL_OWNER.to_owned(), tenancy.owner_label()),
            (LABEL_REPOSITORY.to_owned(), tenancy.repository_label()),
            (LABEL_COMMIT.to_owned(), commit.to_owned()),
            (LABEL_HOME.to_owned(), "/home/kiln".to_owned()),
        ]);
        ImageInfo { id: format!("sha256:{commit}"), names: Vec::new(), labels }
    }

    #[tokio::test]
    async fn a_lookup_asks_the_backends_image_store_and_an_image_of_another_owner_is_a_miss() {
        let ours = tenancy();
        let theirs = Tenancy::new("bob", Some("https://github.com/o/r"));
        let images = HashMap::from([(tag_of("k1"), prepared(&ours, "c1")), (tag_of("k2"), prepared(&theirs, "c2"))]);
        let recording = Arc::new(Recording { images, ..Recording::default() });
        let found = lookup(&*recording, "k1", &ours).await.unwrap();
        assert_eq!(found, Some(Found { commit: Some("c1".into()), home: Some("/home/kiln".into()) }));
        assert_eq!(lookup(&*recording, "k2", &ours).await.unwrap(), None);
        assert_eq!(lookup(&*recording, "k3", &ours).await.unwrap(), None);
        touch(&*recording, "k1").await.unwrap();
        assert_eq!(
            recording.calls(),
            ["image kiln-env:k1", "image kiln-env:k2", "image kiln-env:k3", "mark used kiln-env:k1"]
        );
    }

    #[tokio::test]
    async fn a_snapshot_is_the_workspace_and_home_of_the_setup_sandbox_stored_through_the_backend() {
        let recording = Arc::new(Recording::default());
        let tenancy = tenancy();
        let environment_id = Uuid::new_v4();
        let snapshot = Snapshot {
            from: "setup-1",
            image: "debian:12",
            home: Some("/home/kiln".into()),
            key: "k1",
            run_id: Uuid::new_v4(),
            environment_id,
            tenancy: &tenancy,
            commit: Some("c1"),
            scope: "default",
            variables: vec!["A=1".into()],
        };
        store(&*recording.plugged(), &snapshot).await.unwrap();
        assert_eq!(recording.calls(), ["snapshot setup-1 of debian:12 as kiln-env:k1"]);
        let labels = [
            format!("{LABEL_CACHE}=true"),
            format!("{LABEL_COMMIT}=c1"),
            format!("{LABEL_ENVIRONMENT}={environment_id}"),
            format!("{LABEL_HOME}=/home/kiln"),
            format!("{LABEL_OWNER}={}", tenancy.owner_label()),
            format!("{LABEL_REPOSITORY}={}", tenancy.repository_label()),
            format!("{LABEL_SCOPE}=default"),
            format!("{LABEL_MANAGED}=true"),
        ];
        let mut labels = labels.to_vec();
        labels.sort();
        let said = format!(
            "trees [/workspace -> {PREPARED}/w, /home/kiln -> {PREPARED}/h] env [A=1] labels [{}]",
            labels.join(", ")
        );
        assert_eq!(*recording.snapshots.lock().unwrap(), [said]);
    }

    fn stored(id: &str, key: &str, age_s: i64, warm: &[&str]) -> StoredImage {
        StoredImage {
            id: id.into(),
            names: vec![tag_of(key)],
            bytes: 10,
            last_used: chrono::Utc::now() - chrono::Duration::seconds(age_s),
            in_use: false,
            warm: warm.iter().map(|w| w.to_string()).collect(),
        }
    }

    #[tokio::test]
    async fn eviction_lists_removes_warm_sandboxes_and_images_through_the_backend_and_keeps_the_new_one() {
        let images =
            vec![stored("old", "k1", 100, &["warm-1"]), stored("new", "k2", 1, &[]), stored("kept", "k3", 200, &[])];
        let recording = Arc::new(Recording { stored: images, ..Recording::default() });
        let backend = recording.plugged();
        let pools = EnvironmentPools::new(&backend, "w".into(), WarmSettings::default());
        let bounds = CacheBounds { max_images: 2, max_bytes: u64::MAX, scope: "s".into() };
        evict(&backend, &bounds, "k3", &pools).await.unwrap();
        let listed = format!("images {LABEL_CACHE}=true {LABEL_SCOPE}=s");
        assert_eq!(recording.calls(), [listed.as_str(), "remove warm-1", "remove image old"]);
    }
}
