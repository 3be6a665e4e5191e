//! The seam between the worker and whatever runs its sandboxes: what the
//! worker needs of one, read from its uses (docs/architecture.md, "The
//! sandbox backend seam"). [`Sandbox`](super::Sandbox) is the handle the
//! rest of the worker uses; it holds a [`Backend`] and the backend's handle
//! (an id) of its sandbox, and everything it does goes through the
//! [`SandboxBackend`] trait. Docker (`super::docker`) is the one
//! implementation today.
//!
//! The trait is small on purpose: creating (the whole confinement is the
//! backend's, from a [`CreateSpec`]), finding one by name for adoption,
//! naming a warm one after its session, execs (attached, with stdin and the
//! output as a stream, or detached) and their status, tar archives in and
//! out, news of its sandboxes stopping, removal, the list of its own for
//! the reaper, a session's network
//! and where its egress proxy listens, and what the engine says of itself
//! (the start-up check, its identity, its leftovers); and, as its
//! [`ImageStore`] half, the images sandboxes start from and the prepared
//! ones the environment cache keeps. Everything built on those (the toolbox channel, killing the
//! user's processes, file reads and writes as the user, the workspace
//! upload) is written once, in the handle's modules, for every backend.

use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::Stream;
use tokio::io::AsyncWrite;
use uuid::Uuid;

use super::SandboxConfig;
use super::disk::DiskError;
use super::docker::network::NetworkError;
use super::docker::runtime::RuntimeError;
use super::image_store::{ImageInfo, SnapshotSpec, StoredImage};
use super::stops::StopFeed;
use crate::egress::ProxyRoute;
use crate::egress::host_firewall::HostFirewall;

/// Why a backend could not do what was asked. Each backend maps its
/// engine's errors onto these; `said` is the engine's own words, prefixed
/// with the backend's name (`docker: …`), which is how they reach users.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// No sandbox (or exec) of that name or id.
    #[error("{said}")]
    NotFound { said: String },
    /// The name is taken by another sandbox.
    #[error("{said}")]
    NameTaken { said: String },
    /// The engine could not start the program at all (it is not in the
    /// image, or not executable).
    #[error("{said}")]
    ExecRefused { said: String },
    #[error("sandbox image {0:?} is missing; build it with sandbox-images/build-offline.sh")]
    ImageMissing(String),
    /// The engine did not give a stream it was asked for.
    #[error("{0}")]
    NotAttached(String),
    #[error(transparent)]
    Disk(#[from] DiskError),
    #[error("egress network: {0}")]
    Network(#[from] NetworkError),
    #[error("checking the sandbox runtime: {0}")]
    Runtime(#[from] RuntimeError),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// The sandbox has a toolbox bound read-only that is not this worker's
    /// (one adopted from another worker, or from before an upgrade): a
    /// running sandbox's mounts cannot be changed, nor can anything be
    /// copied over a read-only bind.
    #[error("the sandbox has the toolbox of {bound} bound read-only, not this worker's ({ours})")]
    ForeignToolbox { bound: String, ours: String },
    /// Anything else the engine said.
    #[error("{said}")]
    Engine { said: String },
}

/// What a new sandbox is for: a session, or the warm pool.
#[derive(Debug, Clone, Copy)]
pub enum Purpose<'a> {
    Session(&'a super::Owner),
    Warm { worker: &'a str },
}

/// Everything a backend needs to make a sandbox: its name, what it is for
/// (its labels: who owns it, which worker keeps it), and the deployment's
/// sandbox as the run narrowed it (image, limits, user, disk bound,
/// network or egress, runtime).
#[derive(Debug, Clone, Copy)]
pub struct CreateSpec<'a> {
    pub name: &'a str,
    pub purpose: Purpose<'a>,
    pub config: &'a SandboxConfig,
}

/// How a sandbox whose toolbox is being installed came to the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provenance {
    /// Just made by this backend ([`SandboxBackend::create`]), with the
    /// config given: the backend knows what it put in.
    Made,
    /// Found by name ([`SandboxBackend::find`]: adopted after a restart or
    /// a takeover): made by any worker, of any version, either way.
    Found,
}

/// A sandbox found by name.
#[derive(Debug, Clone)]
pub struct Found {
    /// The backend's handle of it.
    pub id: String,
    pub running: bool,
    /// The sessions whose egress network it is on.
    pub egress_of: Vec<Uuid>,
}

/// How a sandbox that no longer runs ended, as far as the engine says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stopped {
    /// Its main process's exit code (gVisor's Sentry exits 2 when it cannot
    /// start a thread).
    pub exit_code: Option<i64>,
    /// The engine says the kernel's OOM killer stopped it.
    pub oom_killed: bool,
    /// It is gone altogether (removed).
    pub removed: bool,
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.removed, self.oom_killed, self.exit_code) {
            (true, _, _) => f.write_str("the sandbox was removed"),
            (false, true, _) => f.write_str("the sandbox was killed for running out of memory"),
            (false, false, Some(code)) => write!(f, "the sandbox stopped with exit code {code}"),
            (false, false, None) => f.write_str("the sandbox stopped"),
        }
    }
}

/// A sandbox of Kiln's, as the backend lists them for the reaper.
#[derive(Debug, Clone)]
pub struct Managed {
    pub id: String,
    /// The session it is bound to (by name), if any.
    pub session: Option<Uuid>,
    /// The run that created it (containers of older Kiln versions were
    /// bound to a run, not a session).
    pub run: Option<Uuid>,
    /// A warm container not yet bound to a session, and the worker that
    /// keeps it. (A bound one still carries the pool labels: labels cannot
    /// change.)
    pub pool_worker: Option<String>,
}

/// One process to run in a sandbox. Never a TTY (it would mangle the
/// streams).
#[derive(Debug, Clone, Default)]
pub struct ExecSpec<'a> {
    pub argv: Vec<&'a str>,
    /// `uid:gid` it runs as.
    pub user: &'a str,
    /// `KEY=value` pairs added to the sandbox's environment.
    pub env: Vec<String>,
    /// Working directory; `None`: the image's.
    pub cwd: Option<&'a str>,
    /// Whether its stdin is attached (else it reads EOF).
    pub stdin: bool,
}

/// A piece of a running exec's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecChunk {
    Stdout(Bytes),
    Stderr(Bytes),
    /// What the engine itself wrote on the stream (neither of the above).
    Other(Bytes),
}

impl ExecChunk {
    pub fn into_bytes(self) -> Bytes {
        match self {
            ExecChunk::Stdout(b) | ExecChunk::Stderr(b) | ExecChunk::Other(b) => b,
        }
    }
}

/// An exec's output until it ends.
pub type ExecStream = Pin<Box<dyn Stream<Item = Result<ExecChunk, BackendError>> + Send>>;
/// An exec's stdin.
pub type ExecInput = Pin<Box<dyn AsyncWrite + Send>>;
/// A tar archive's bytes, as they come.
pub type TarStream = Pin<Box<dyn Stream<Item = Result<Bytes, std::io::Error>> + Send>>;

/// A started, attached exec.
pub struct Exec {
    /// The backend's handle of the exec (for [`SandboxBackend::exec_status`]).
    pub id: String,
    pub output: ExecStream,
    pub input: ExecInput,
}

/// Where an exec is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecStatus {
    /// `None`: the engine does not say.
    pub running: Option<bool>,
    /// Once it ended; `None` if the engine could not tell.
    pub exit_code: Option<i64>,
}

/// What a sandbox backend supplies, its [`ImageStore`] included.
/// Object-safe: the worker holds it as `Arc<dyn SandboxBackend>`
/// ([`Backend`]).
#[async_trait]
pub trait SandboxBackend: ImageStore + Send + Sync + std::fmt::Debug {
    /// Makes and starts a sandbox as `spec` says, with its disk and (for a
    /// session's sandbox with egress) its session's network: the backend's
    /// handle of it. A stopped sandbox left under the name is replaced; a
    /// live one is [`BackendError::NameTaken`]. A sandbox that fails to
    /// start leaves nothing behind.
    async fn create(&self, spec: &CreateSpec<'_>) -> Result<String, BackendError>;

    /// The sandbox of that name (or handle), if there is one.
    async fn find(&self, name: &str) -> Result<Option<Found>, BackendError>;

    /// `None` while the sandbox runs; how it ended once it does not. The
    /// toolbox channel asks when its [`SandboxBackend::stop_feed`] names
    /// the sandbox (or may have missed it), so that a call into a dead
    /// sandbox ends (a stopped container does not always end the stream of
    /// an exec attached to it).
    async fn stopped(&self, id: &str) -> Result<Option<Stopped>, BackendError> {
        Ok(match self.find(id).await? {
            Some(found) if found.running => None,
            Some(_) => Some(Stopped::default()),
            None => Some(Stopped { removed: true, ..Stopped::default() }),
        })
    }

    /// News of its sandboxes stopping, as they stop: the toolbox channel
    /// listens, so that a call into a sandbox that died ends at once. One
    /// feed per backend, however many listen; `None`: the backend has none,
    /// and listeners ask [`SandboxBackend::stopped`] every few seconds.
    fn stop_feed(&self) -> Option<StopFeed> {
        None
    }

    /// Gives the sandbox a new name (a warm one becomes a session's; names
    /// are unique, so no other can take it).
    async fn rename(&self, id: &str, name: &str) -> Result<(), BackendError>;

    /// Starts `spec` in the sandbox, its output (stdout and stderr apart)
    /// as a stream until it ends, and its stdin.
    async fn exec(&self, id: &str, spec: &ExecSpec<'_>) -> Result<Exec, BackendError>;

    /// Starts `spec` in the sandbox without attaching: the exec's handle.
    async fn exec_detached(&self, id: &str, spec: &ExecSpec<'_>) -> Result<String, BackendError>;

    /// Whether an exec still runs, and how it ended.
    async fn exec_status(&self, id: &str, exec: &str) -> Result<ExecStatus, BackendError>;

    /// Unpacks a tar archive into directory `dir` of the sandbox. Acts with
    /// the engine's rights, not the sandbox user's: only for what Kiln
    /// itself puts there (the workspace, the toolbox).
    async fn put_archive(&self, id: &str, dir: &str, tar: TarStream) -> Result<(), BackendError>;

    /// Puts the toolbox `binary` at `toolbox_binary::CONTAINER_PATH` in the
    /// sandbox, one made with `config` or found (`provenance`). By default a
    /// copy through [`SandboxBackend::put_archive`]; a backend that made the
    /// sandbox with the binary already in place (Docker's read-only bind of
    /// the worker's copy) does nothing.
    async fn install_toolbox(
        &self,
        id: &str,
        binary: &[u8],
        _config: &SandboxConfig,
        _provenance: Provenance,
    ) -> Result<(), BackendError> {
        super::toolbox_binary::copy_in(self, id, binary).await
    }

    /// `path` of the sandbox as a tar archive, if it is at most `cap`
    /// bytes (`None`: larger). With the engine's rights, like
    /// [`SandboxBackend::put_archive`].
    async fn get_archive(&self, id: &str, path: &str, cap: usize) -> Result<Option<Vec<u8>>, BackendError>;

    /// Removes the sandbox with everything it holds (its disk too),
    /// killing whatever runs in it; a missing one is not an error.
    async fn remove(&self, id: &str);

    /// Every sandbox of Kiln's this backend runs (any worker's).
    async fn list_managed(&self) -> Result<Vec<Managed>, BackendError>;

    /// Removes the session's network (and the host's rules for it), if it
    /// has one: its sandbox is gone.
    async fn remove_session_network(&self, firewall: &HostFirewall, session_id: Uuid);

    /// Where the egress proxy for sandbox `id` of session `session_id`
    /// listens, and the one address it answers; `None`: the sandbox is not
    /// on its session's egress network (it has no egress).
    async fn proxy_route(&self, id: &str, session_id: Uuid) -> Result<Option<ProxyRoute>, BackendError>;

    /// What sandboxes like `config` need of the engine, checked once when
    /// the worker starts, so that a deployment that cannot work says so then
    /// rather than failing every run.
    async fn check(&self, config: &SandboxConfig) -> Result<(), BackendError>;

    /// Which engine this is: workers that say the same share its
    /// sandboxes (so the last to leave clears the idle ones). `None`: it
    /// cannot tell.
    async fn engine_id(&self) -> Option<String>;

    /// Frees what this backend's sandboxes left beside them once they are
    /// gone without it (a worker that crashed, an operator's removal), for
    /// sandboxes like `config`: how many went.
    async fn sweep_leftovers(&self, config: &SandboxConfig) -> usize;

    /// The command user's home if sandboxes like `config` keep it as a
    /// writable place of its own: a snapshot then keeps it besides the
    /// workspace.
    async fn kept_home(&self, config: &SandboxConfig) -> Result<Option<String>, BackendError>;
}

/// The image-store half of a sandbox backend: where the images sandboxes
/// start from live, and prepared ones are kept. The environment cache
/// (`environment::cache`) and the image checks (`environment::image`) are
/// written against it; Docker implements it with the engine's own images
/// (`sandbox::docker::images`).
#[async_trait]
pub trait ImageStore: Send + Sync {
    /// The image of that name (or id), if the store has it.
    async fn image(&self, name: &str) -> Result<Option<ImageInfo>, BackendError>;

    /// Marks the image used now: eviction takes the least recently used
    /// first.
    async fn mark_used(&self, name: &str) -> Result<(), BackendError>;

    /// Stores a snapshot of a sandbox as `spec` says.
    async fn snapshot(&self, spec: &SnapshotSpec<'_>) -> Result<(), BackendError>;

    /// The images carrying every one of `labels` (`key=value`).
    async fn images_labelled(&self, labels: &[String]) -> Result<Vec<StoredImage>, BackendError>;

    /// Removes the image unless something runs on it now.
    async fn remove_image(&self, id: &str) -> Result<(), BackendError>;
}

/// The worker's backend: cheap to clone, shared by every sandbox.
#[derive(Debug, Clone)]
pub struct Backend(Arc<dyn SandboxBackend>);

impl Backend {
    pub fn new(backend: impl SandboxBackend + 'static) -> Self {
        Backend(Arc::new(backend))
    }
}

impl std::ops::Deref for Backend {
    type Target = dyn SandboxBackend;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl From<&Backend> for Backend {
    fn from(backend: &Backend) -> Self {
        backend.clone()
    }
}

impl From<Arc<dyn SandboxBackend>> for Backend {
    fn from(backend: Arc<dyn SandboxBackend>) -> Self {
        Backend(backend)
    }
}
