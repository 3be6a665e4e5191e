//! The seam is real: a backend that is not Docker (`recording.rs`: it
//! records what it is asked and answers from memory) plugs into the same
//! `Sandbox` handle, and the handle's methods drive it; so does a sandbox's
//! egress proxy, which listens where the backend routes the sandbox.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use uuid::Uuid;

use super::backend::Backend;
use super::recording::Recording;
use super::{Sandbox, SandboxConfig, lifecycle, serve_egress, session_container_name};
use crate::egress::{EgressSettings, Phase, ProxyRoute};

fn calls(backend: &Arc<Recording>) -> Vec<String> {
    backend.calls()
}

/// The handle, bound to the recording backend as `Arc<dyn SandboxBackend>`.
fn plugged(recording: &Arc<Recording>) -> Backend {
    recording.plugged()
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

/// The status line the proxy at `addr` answers a request with, from this
/// address; empty: it closed the connection unanswered.
async fn ask(addr: std::net::SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = stream.write_all(b"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n").await;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    while !answer.windows(2).any(|w| w == b"\r\n") {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&chunk[..n]),
        }
    }
    String::from_utf8_lossy(&answer).lines().next().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn the_egress_proxy_listens_where_the_backend_routes_the_sandbox_and_answers_it_alone() {
    let settings = EgressSettings { port: 0, ..EgressSettings::default() };
    let layers = || SandboxConfig::default().egress_layers();
    let session = Uuid::new_v4();
    let loopback = IpAddr::from([127, 0, 0, 1]);
    for (client, answered) in [(loopback, true), (IpAddr::from([127, 0, 0, 2]), false)] {
        let route = ProxyRoute { listen: loopback, client };
        let recording = Arc::new(Recording { route: Some(route), ..Recording::default() });
        let proxy = serve_egress(plugged(&recording), &settings, layers(), Phase::Agent, session, "sb-1", None)
            .await
            .unwrap()
            .expect("the backend routes the sandbox: a proxy");
        assert_eq!(proxy.addr.ip(), loopback);
        assert_eq!(calls(&recording), [format!("route sb-1 {session}")]);
        let answer = tokio::time::timeout(std::time::Duration::from_secs(10), ask(proxy.addr)).await.unwrap();
        assert_eq!(answer.starts_with("HTTP/1.1 "), answered, "client {client}: {answer:?}");
        proxy.stop().await;
    }

    // A sandbox the backend routes nowhere has no egress: no proxy.
    let recording = Arc::new(Recording::default());
    let served = serve_egress(plugged(&recording), &settings, layers(), Phase::Setup, session, "sb-2", None).await;
    assert!(served.unwrap().is_none());
    assert_eq!(calls(&recording), [format!("route sb-2 {session}")]);
}

/// A call waiting on a toolbox whose stream never ends (gVisor left it open
/// when its sandbox died), with no news of stops: the watch asks the backend, finds the sandbox
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
        // A backend without news of stops: the watch asks.
        feed: None,
        unsure: false,
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
    let watched = Watched {
        backend: plugged(&recording),
        sandbox: "sb-1".into(),
        pending,
        alive,
        reader: reader.abort_handle(),
        feed: None,
        unsure: false,
    };
    let watching = tokio::spawn(watch(watched));
    tokio::time::sleep(CHECK_EVERY * 2 + CHECK_EVERY / 2).await;
    assert!(matches!(rx.try_recv(), Err(tokio::sync::oneshot::error::TryRecvError::Empty)), "still waiting");
    assert!(!reader.is_finished());
    assert_eq!(calls(&recording), ["find sb-1", "find sb-1"]);
    watching.abort();
}
