//! What the image-store half of the sandbox backend
//! (`backend::ImageStore`) speaks of: images sandboxes start from, and
//! snapshots of sandboxes kept as images. A leaf: the trait lives beside
//! `SandboxBackend`, which has it as a supertrait.

use std::collections::HashMap;

/// An image as the store describes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageInfo {
    /// The store's id of it.
    pub id: String,
    /// Every name it is known by (tags and digests), canonical or not.
    pub names: Vec<String>,
    /// The labels it carries.
    pub labels: HashMap<String, String>,
}

/// A tree of a sandbox kept in a snapshot: `path` in the sandbox, copied
/// into directory `into` of the snapshot (the archive of `/a/b` lands as
/// `into/b`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    pub path: String,
    pub into: String,
}

/// What a snapshot of a sandbox is made of: the named image holds `image`
/// with `trees` of sandbox `from` copied in (nothing else of `from`: not its
/// settings, not its environment), and carries `labels` and `env`.
#[derive(Debug, Clone)]
pub struct SnapshotSpec<'a> {
    /// The sandbox (backend handle) the trees are copied from.
    pub from: &'a str,
    /// The image the snapshot starts from (`from`'s own).
    pub image: &'a str,
    /// `repository:tag` the snapshot is stored as.
    pub name: &'a str,
    pub trees: Vec<Tree>,
    pub labels: HashMap<String, String>,
    /// `NAME=value` added to the image's environment.
    pub env: Vec<String>,
    /// Labels on anything the backend makes on the way (Docker: the
    /// never-started container it commits), so the reaper finds it.
    pub scratch_labels: HashMap<String, String>,
}

/// A stored image, as eviction sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredImage {
    pub id: String,
    /// Its `repository:tag` names.
    pub names: Vec<String>,
    pub bytes: u64,
    /// When it was last stored or marked used.
    pub last_used: chrono::DateTime<chrono::Utc>,
    /// A sandbox (or anything else of the engine's) other than a warm one
    /// no session has taken runs on it.
    pub in_use: bool,
    /// The warm sandboxes no session has taken yet that run on it: they go
    /// with it.
    pub warm: Vec<String>,
}
