//! A sandbox backend that is not Docker, for unit tests: it records what
//! it is asked, in order, and answers from memory. The handle's tests
//! (`backend_tests.rs`), the environment cache's and the egress route's use
//! it to show that what they do goes through the seam.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use uuid::Uuid;

use super::SandboxConfig;
use super::backend::{
    Backend, BackendError, CreateSpec, Exec, ExecChunk, ExecSpec, ExecStatus, Found, ImageStore, Managed,
    SandboxBackend, TarStream,
};
use super::image_store::{ImageInfo, SnapshotSpec, StoredImage};
use super::stops::{StopFeed, StopHub};
use crate::egress::ProxyRoute;
use crate::egress::host_firewall::HostFirewall;

/// What the recording backend was asked, in order, and what it answers.
#[derive(Debug, Default)]
pub struct Recording {
    pub calls: Mutex<Vec<String>>,
    /// What every attached exec prints on stdout.
    pub stdout: &'static str,
    /// Sandboxes it has, by name: running or not.
    pub sandboxes: Vec<(String, bool)>,
    /// Images its store has, by name.
    pub images: HashMap<String, ImageInfo>,
    /// What [`ImageStore::images_labelled`] lists.
    pub stored: Vec<StoredImage>,
    /// Where it routes every sandbox's egress (`None`: none has any).
    pub route: Option<ProxyRoute>,
    /// The snapshots it was asked to store, as asked.
    pub snapshots: Mutex<Vec<String>>,
    /// Its news of sandboxes stopping, told by the test.
    pub stops: StopHub,
}

impl Recording {
    fn record(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }

    /// What it was asked so far.
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    /// Itself, as the worker holds a backend: `Arc<dyn SandboxBackend>`.
    pub fn plugged(self: &Arc<Self>) -> Backend {
        let backend: Arc<dyn SandboxBackend> = self.clone();
        Backend::from(backend)
    }
}

fn exec_line(kind: &str, id: &str, spec: &ExecSpec<'_>) -> String {
    format!("{kind} {id} as {} in {:?} stdin={}: {}", spec.user, spec.cwd, spec.stdin, spec.argv.join(" "))
}

#[async_trait]
impl SandboxBackend for Recording {
    async fn create(&self, spec: &CreateSpec<'_>) -> Result<String, BackendError> {
        self.record(format!("create {} from {}", spec.name, spec.config.image));
        Err(BackendError::ImageMissing(spec.config.image.clone()))
    }

    async fn find(&self, name: &str) -> Result<Option<Found>, BackendError> {
        self.record(format!("find {name}"));
        Ok(self.sandboxes.iter().find(|(n, _)| n == name).map(|(n, running)| Found {
            id: n.clone(),
            running: *running,
            egress_of: Vec::new(),
        }))
    }

    fn stop_feed(&self) -> Option<StopFeed> {
        Some(self.stops.subscribe())
    }

    async fn rename(&self, id: &str, name: &str) -> Result<(), BackendError> {
        self.record(format!("rename {id} {name}"));
        Ok(())
    }

    async fn exec(&self, id: &str, spec: &ExecSpec<'_>) -> Result<Exec, BackendError> {
        self.record(exec_line("exec", id, spec));
        let chunks = vec![Ok(ExecChunk::Stdout(Bytes::from_static(self.stdout.as_bytes())))];
        Ok(Exec {
            id: "e1".into(),
            output: Box::pin(futures::stream::iter(chunks)),
            input: Box::pin(tokio::io::sink()),
        })
    }

    async fn exec_detached(&self, id: &str, spec: &ExecSpec<'_>) -> Result<String, BackendError> {
        self.record(exec_line("detached", id, spec));
        Ok("e2".into())
    }

    async fn exec_status(&self, _id: &str, exec: &str) -> Result<ExecStatus, BackendError> {
        self.record(format!("status {exec}"));
        Ok(ExecStatus { running: Some(false), exit_code: Some(0) })
    }

    async fn put_archive(&self, id: &str, dir: &str, _tar: TarStream) -> Result<(), BackendError> {
        self.record(format!("put {id} {dir}"));
        Ok(())
    }

    async fn get_archive(&self, id: &str, path: &str, _cap: usize) -> Result<Option<Vec<u8>>, BackendError> {
        self.record(format!("get {id} {path}"));
        Ok(None)
    }

    async fn remove(&self, id: &str) {
        self.record(format!("remove {id}"));
    }

    async fn list_managed(&self) -> Result<Vec<Managed>, BackendError> {
        Ok(Vec::new())
    }

    async fn remove_session_network(&self, _firewall: &HostFirewall, session_id: Uuid) {
        self.record(format!("remove network {session_id}"));
    }

    async fn proxy_route(&self, id: &str, session_id: Uuid) -> Result<Option<ProxyRoute>, BackendError> {
        self.record(format!("route {id} {session_id}"));
        Ok(self.route)
    }

    async fn check(&self, config: &SandboxConfig) -> Result<(), BackendError> {
        self.record(format!("check {}", config.image));
        Ok(())
    }

    async fn engine_id(&self) -> Option<String> {
        Some("recording".into())
    }

    async fn sweep_leftovers(&self, _config: &SandboxConfig) -> usize {
        self.record("sweep".into());
        0
    }

    async fn kept_home(&self, _config: &SandboxConfig) -> Result<Option<String>, BackendError> {
        Ok(Some("/home/kiln".into()))
    }
}

#[async_trait]
impl ImageStore for Recording {
    async fn image(&self, name: &str) -> Result<Option<ImageInfo>, BackendError> {
        self.record(format!("image {name}"));
        Ok(self.images.get(name).cloned())
    }

    async fn mark_used(&self, name: &str) -> Result<(), BackendError> {
        self.record(format!("mark used {name}"));
        Ok(())
    }

    async fn snapshot(&self, spec: &SnapshotSpec<'_>) -> Result<(), BackendError> {
        self.record(format!("snapshot {} of {} as {}", spec.from, spec.image, spec.name));
        let trees: Vec<String> = spec.trees.iter().map(|t| format!("{} -> {}", t.path, t.into)).collect();
        let mut labels: Vec<String> = spec.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.sort();
        let said = format!("trees [{}] env [{}] labels [{}]", trees.join(", "), spec.env.join(", "), labels.join(", "));
        self.snapshots.lock().unwrap().push(said);
        Ok(())
    }

    async fn images_labelled(&self, labels: &[String]) -> Result<Vec<StoredImage>, BackendError> {
        self.record(format!("images {}", labels.join(" ")));
        Ok(self.stored.clone())
    }

    async fn remove_image(&self, id: &str) -> Result<(), BackendError> {
        self.record(format!("remove image {id}"));
        Ok(())
    }
}
