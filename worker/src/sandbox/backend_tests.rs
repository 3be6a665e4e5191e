//! The seam is real: a backend that is not Docker (it records what it is
//! asked and answers from memory) plugs into the same `Sandbox` handle,
//! and the handle's methods drive it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use uuid::Uuid;

use super::backend::{
    Backend, BackendError, CreateSpec, Exec, ExecChunk, ExecSpec, ExecStatus, Found, Managed, SandboxBackend, TarStream,
};
use super::{Sandbox, SandboxConfig, lifecycle, session_container_name};
use crate::egress::host_firewall::HostFirewall;

/// What the recording backend was asked, in order.
#[derive(Debug, Default)]
struct Recording {
    calls: Mutex<Vec<String>>,
    /// What every attached exec prints on stdout.
    stdout: &'static str,
    /// Sandboxes it has, by name: running or not.
    sandboxes: Vec<(String, bool)>,
}

impl Recording {
    fn record(&self, call: String) {
        self.calls.lock().unwrap().push(call);
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
            networks: Vec::new(),
        }))
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
}

fn calls(backend: &Arc<Recording>) -> Vec<String> {
    backend.calls.lock().unwrap().clone()
}

/// The handle, bound to the recording backend as `Arc<dyn SandboxBackend>`.
fn plugged(recording: &Arc<Recording>) -> Backend {
    let backend: Arc<dyn SandboxBackend> = recording.clone();
    Backend::from(backend)
}

#[tokio::test]
async fn a_file_read_is_one_exec_as_the_command_user_through_the_backend() {
    let recording = Arc::new(Recording { stdout: "hello", ..Recording::default() });
    let sandbox = Sandbox::bound(plugged(&recording), "sb-1".into(), &SandboxConfig::default());
    let content = sandbox.read_file("notes.txt", 1024).await.unwrap();
    assert_eq!(content, b"hello");
    let calls = calls(&recording);
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(calls[0].starts_with("exec sb-1 as 1000:1000 in Some(\"/workspace\") stdin=false: timeout -k 2 60 sh -c"));
    assert!(calls[0].ends_with("/workspace/notes.txt 1024"), "{}", calls[0]);
    assert_eq!(calls[1], "status e1");
}

#[tokio::test]
async fn a_kept_session_has_its_processes_killed_and_one_let_go_is_removed_with_its_network() {
    let session = Uuid::new_v4();
    let name = session_container_name(session);
    let config = SandboxConfig::default();
    let recording = Arc::new(Recording::default());
    lifecycle::after_run(plugged(&recording), &config, session, true).await;
    assert_eq!(
        calls(&recording),
        [format!("detached {name} as 1000:1000 in None stdin=false: kill -9 -1"), "status e2".into()]
    );

    let recording = Arc::new(Recording::default());
    lifecycle::after_run(plugged(&recording), &config, session, false).await;
    assert_eq!(calls(&recording), [format!("remove {name}"), format!("remove network {session}")]);
}

#[tokio::test]
async fn a_stopped_session_sandbox_is_not_running_and_a_missing_image_is_said_as_before() {
    let session = Uuid::new_v4();
    let name = session_container_name(session);
    let recording = Arc::new(Recording { sandboxes: vec![(name.clone(), false)], ..Recording::default() });
    assert!(!lifecycle::has_container(plugged(&recording), session).await);
    let owner = super::Owner { run_id: Uuid::new_v4(), session_id: session, worker: "w".into() };
    let err = lifecycle::acquire(plugged(&recording), &SandboxConfig::default(), None, &owner).await.unwrap_err();
    assert!(matches!(err, super::SandboxError::ImageMissing(ref i) if i == "kiln-sandbox:latest"), "{err:?}");
    // Adoption found it stopped and removed it before making a new one.
    assert_eq!(
        calls(&recording),
        [
            format!("find {name}"),
            format!("find {name}"),
            format!("remove {name}"),
            format!("create {name} from kiln-sandbox:latest"),
        ]
    );
}

/// A call waiting on a toolbox whose stream never ends (gVisor left it open
/// when its sandbox died): the watch asks the backend, finds the sandbox
/// stopped, ends the call with that, and stops the reader.
#[tokio::test]
async fn a_call_waiting_on_a_sandbox_that_stopped_ends_saying_so() {
    use std::sync::atomic::AtomicBool;

    use super::toolbox::ToolboxError;
    use super::toolbox_reader::{CallLimits, Pending, PendingMap, lock};
    use super::toolbox_watch::{CHECK_EVERY, Watched, watch};

    let recording = Arc::new(Recording { sandboxes: vec![("sb-1".into(), false)], ..Recording::default() });
    let pending: PendingMap = Arc::default();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let limits = CallLimits { stream_bytes: 0, reply_bytes: 1024 };
    lock(&pending).insert(1, Pending::new(tx, None, limits));
    let reader = tokio::spawn(futures::future::pending::<()>());
    let alive = Arc::new(AtomicBool::new(true));
    let watched = Watched {
        backend: plugged(&recording),
        sandbox: "sb-1".into(),
        pending: pending.clone(),
        alive: alive.clone(),
        reader: reader.abort_handle(),
    };
    tokio::spawn(watch(watched));
    let answer = tokio::time::timeout(CHECK_EVERY * 3, rx).await.expect("the call ends").unwrap();
    match answer {
        Err(ToolboxError::SandboxStopped(how)) => assert_eq!(how.to_string(), "the sandbox stopped"),
        other => panic!("{other:?}"),
    }
    assert!(!alive.load(std::sync::atomic::Ordering::Acquire));
    assert!(reader.await.unwrap_err().is_cancelled(), "the reader is stopped");
    assert_eq!(calls(&recording), ["find sb-1"]);
}

/// While the sandbox runs, the watch leaves a waiting call alone.
#[tokio::test]
async fn a_call_into_a_running_sandbox_is_left_waiting() {
    use std::sync::atomic::AtomicBool;

    use super::toolbox_reader::{CallLimits, Pending, PendingMap, lock};
    use super::toolbox_watch::{CHECK_EVERY, Watched, watch};

    let recording = Arc::new(Recording { sandboxes: vec![("sb-1".into(), true)], ..Recording::default() });
    let pending: PendingMap = Arc::default();
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    let limits = CallLimits { stream_bytes: 0, reply_bytes: 1024 };
    lock(&pending).insert(1, Pending::new(tx, None, limits));
    let reader = tokio::spawn(futures::future::pending::<()>());
    let alive = Arc::new(AtomicBool::new(true));
    let watched =
        Watched { backend: plugged(&recording), sandbox: "sb-1".into(), pending, alive, reader: reader.abort_handle() };
    let watching = tokio::spawn(watch(watched));
    tokio::time::sleep(CHECK_EVERY * 2 + CHECK_EVERY / 2).await;
    assert!(matches!(rx.try_recv(), Err(tokio::sync::oneshot::error::TryRecvError::Empty)), "still waiting");
    assert!(!reader.is_finished());
    assert_eq!(calls(&recording), ["find sb-1", "find sb-1"]);
    watching.abort();
}
