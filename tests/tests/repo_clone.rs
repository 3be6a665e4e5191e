//! A run's repository, cloned from a tenant's URL (issue 17, findings 3, 5
//! and 14): the checkout is bounded and streamed, the clone goes only where
//! the deployment allows and follows no redirect, failures tell the tenant
//! nothing of the network, and credentials never ride in the URL.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kiln_protocol::repo_url::RepoRules;
use kiln_protocol::{CreateRun, EventBody, RepoSpec, RunStatus};
use kiln_scripted_model::Reply;
use kiln_tests::worker_process::WorkerProcess;
use kiln_tests::{Event, Options, TestApp, kinds, outcome, pick, worker_config};
use kiln_worker::ProviderKind;
use serde_json::json;
use uuid::Uuid;

const MB: u64 = 1024 * 1024;

/// An app whose worker is `kiln worker`, a process of its own, so that its
/// peak memory is the worker's alone (the process that runs git and reads
/// its output, and uploads the checkout), not the test's.
async fn app_with_worker_process(script: Vec<Reply>, env: &[(&str, &str)]) -> (TestApp, WorkerProcess) {
    let app = TestApp::spawn(Options { script, worker: false, ..Default::default() }).await;
    let mut env = env.to_vec();
    env.push(("KILN_ALLOW_FILE_REPOS", "true"));
    let worker = WorkerProcess::start(&app, 10, &env).await;
    (app, worker)
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git").args(args).current_dir(dir).output().unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A repository whose one commit holds `zeros.bin`, `mb` MiB of zeros: a
/// few hundred KB of objects (zlib packs zeros about 1000:1), built without
/// ever writing the file itself.
fn zeros_repo(mb: u64) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    git(d, &["init", "-q", "-b", "main"]);
    let blob = Command::new("sh")
        .args(["-c", &format!("head -c {} /dev/zero | git hash-object -w --stdin", mb * MB)])
        .current_dir(d)
        .output()
        .unwrap();
    assert!(blob.status.success());
    let blob = String::from_utf8(blob.stdout).unwrap().trim().to_owned();
    let mut mktree = Command::new("git")
        .arg("mktree")
        .current_dir(d)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    writeln!(mktree.stdin.take().unwrap(), "100644 blob {blob}\tzeros.bin").unwrap();
    let tree = String::from_utf8(mktree.wait_with_output().unwrap().stdout).unwrap().trim().to_owned();
    let commit = Command::new("git")
        .args(["commit-tree", &tree, "-m", "zeros"])
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.com")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.com")
        .current_dir(d)
        .output()
        .unwrap();
    let commit = String::from_utf8(commit.stdout).unwrap().trim().to_owned();
    git(d, &["update-ref", "refs/heads/main", &commit]);
    let url = format!("file://{}", d.display());
    (dir, url)
}

fn with_repo(url: String) -> CreateRun {
    CreateRun { repo: Some(RepoSpec { url, git_ref: None }), ..CreateRun::new("look at the repository") }
}

/// An app whose worker is configured by `adjust`.
async fn app_with(script: Vec<Reply>, adjust: impl FnOnce(&mut kiln_worker::WorkerConfig)) -> TestApp {
    let app = TestApp::spawn(Options { script, worker: false, ..Default::default() }).await;
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    adjust(&mut config);
    app.start_worker(config).await;
    app
}

async fn run_to_end(app: &TestApp, spec: CreateRun) -> (Uuid, Vec<Event>) {
    let id = app.submit("alice", spec).await.id;
    (id, app.events("alice", id).await)
}

fn failure(events: &[Event]) -> String {
    pick!(events, EventBody::RunFailed { error } => error.clone()).next().unwrap_or_default()
}

#[tokio::test]
async fn a_zip_bomb_repository_fails_its_run_once_naming_the_limit_in_bounded_memory() {
    let (_repo, url) = zeros_repo(300);
    // The worker's temporary files (its checkouts) go where the test watches.
    let tmp = tempfile::tempdir().unwrap();
    let env = [("KILN_MAX_REPO_MB", "64"), ("TMPDIR", tmp.path().to_str().unwrap())];
    let (app, worker) = app_with_worker_process(vec![Reply::text("done")], &env).await;
    let before = worker.peak_rss_bytes();
    let on_disk = PeakSize::watch(tmp.path());
    let (id, events) = run_to_end(&app, with_repo(url)).await;
    let grown = worker.peak_rss_bytes().saturating_sub(before);
    let on_disk = on_disk.stop();
    worker.stop().await;

    assert_eq!(outcome(&events), Some(RunStatus::Failed), "{:?}", kinds(&events));
    let error = failure(&events);
    assert!(error.contains("64 MB") && error.contains("KILN_MAX_REPO_MB"), "{error}");
    // Failed for its own content: final, not handed to another worker.
    let run = app.run("alice", id).await;
    assert_eq!(run.attempt, 1);
    assert_eq!(events.iter().filter(|e| e.kind() == "run.started").count(), 1, "{:?}", kinds(&events));
    assert!(app.model.requests().is_empty(), "the model was called for a run with no workspace");
    assert!(grown < 64 * MB, "the worker's peak memory grew by {} MB", grown / MB);
    // Nor on its disk: the tree's size is known before anything is checked
    // out, so the checkout holds the pack's few hundred KB, never the
    // bomb's 300 MB nor the cap's worth of it before a later check noticed
    // (memory alone cannot tell: a checkout goes to disk, and the upload
    // streams whatever the checkout holds).
    assert!(
        on_disk < 8 * MB,
        "the worker's checkout reached {} MB on its disk: the bomb was checked out",
        on_disk / MB
    );
}

/// The largest a directory tree grew to (its files' bytes), sampled every
/// few milliseconds from a thread: a checkout of the bomb's file, stopped
/// at the cap or not, stays on disk for far longer than that (it is
/// written at disk speed, and removed only once the run's preparation
/// failed).
struct PeakSize {
    stop: Arc<std::sync::atomic::AtomicBool>,
    sampler: std::thread::JoinHandle<u64>,
}

impl PeakSize {
    fn watch(dir: &Path) -> PeakSize {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (dir, stopped) = (dir.to_owned(), stop.clone());
        let sampler = std::thread::spawn(move || {
            let mut peak = 0;
            while !stopped.load(Ordering::SeqCst) {
                peak = peak.max(tree_bytes(&dir));
                std::thread::sleep(Duration::from_millis(2));
            }
            peak
        });
        PeakSize { stop, sampler }
    }

    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        self.sampler.join().unwrap()
    }
}

/// Bytes of the files under `dir` now (symlinks not followed).
fn tree_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let size = |e: std::fs::DirEntry| match e.file_type() {
        Ok(t) if t.is_dir() => tree_bytes(&e.path()),
        _ => e.metadata().map_or(0, |m| m.len()),
    };
    entries.flatten().map(size).sum()
}

#[tokio::test]
async fn a_large_checkout_under_the_cap_streams_into_the_sandbox_without_being_held() {
    let (_repo, url) = zeros_repo(160);
    let script = vec![
        Reply::tool("bash", json!({"command": "stat -c %s zeros.bin; git remote get-url origin"})),
        Reply::text("ok"),
    ];
    let (app, worker) = app_with_worker_process(script, &[]).await;
    let before = worker.peak_rss_bytes();
    let (_, events) = run_to_end(&app, with_repo(url.clone())).await;
    let grown = worker.peak_rss_bytes().saturating_sub(before);
    worker.stop().await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let output = pick!(events, EventBody::ToolResult { output, .. } => output.clone()).next().unwrap();
    assert!(output.contains(&(160 * MB).to_string()), "{output}");
    assert!(grown < 64 * MB, "uploading 160 MB grew the worker's peak memory by {} MB", grown / MB);
}

/// A listener on loopback that counts the connections it gets (and closes
/// each at once).
fn counting_listener() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            counter.fetch_add(1, Ordering::SeqCst);
            drop(conn);
        }
    });
    (port, seen)
}

#[tokio::test]
async fn a_repository_on_loopback_is_refused_before_any_connection() {
    let (port, seen) = counting_listener();
    let app = app_with(vec![Reply::text("done")], |c| c.repo_rules.allow_private = false).await;
    for url in [format!("http://127.0.0.1:{port}/r.git"), format!("http://localhost:{port}/r.git")] {
        let (_, events) = run_to_end(&app, with_repo(url.clone())).await;
        assert_eq!(outcome(&events), Some(RunStatus::Failed), "{url}: {:?}", kinds(&events));
        let error = failure(&events);
        assert!(error.contains("loopback") && error.contains("KILN_ALLOW_PRIVATE_REPOS"), "{url}: {error}");
        assert!(!error.contains(&port.to_string()), "{error}");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(seen.load(Ordering::SeqCst), 0, "the worker connected to the refused address");
}

#[tokio::test]
async fn a_redirect_is_not_followed_and_the_failure_says_nothing_of_what_answered() {
    let (elsewhere, seen) = counting_listener();
    // Answers every request with a redirect to the other listener.
    let redirector = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = redirector.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in redirector.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut buf = [0u8; 4096];
            let _ = std::io::Read::read(&mut conn, &mut buf);
            let answer = format!(
                "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:{elsewhere}/r.git/info/refs?service=git-upload-pack\r\n\
                 Content-Length: 0\r\nConnection: close\r\n\r\n"
            );
            let _ = std::io::Write::write_all(&mut conn, answer.as_bytes());
        }
    });
    let app = app_with(vec![Reply::text("done")], |_| {}).await;
    let (_, events) = run_to_end(&app, with_repo(format!("http://127.0.0.1:{port}/r.git"))).await;
    assert_eq!(outcome(&events), Some(RunStatus::Failed), "{:?}", kinds(&events));
    let error = failure(&events);
    assert!(error.contains("could not clone the repository"), "{error}");
    for detail in [port.to_string(), elsewhere.to_string(), "302".into(), "redirect".into(), "fatal".into()] {
        assert!(!error.contains(&detail), "the error tells the tenant {detail:?}: {error}");
    }
    assert_eq!(seen.load(Ordering::SeqCst), 0, "git followed the redirect");
}

async fn create_status(app: &TestApp, url: &str) -> (u16, String) {
    let (status, body) = app.post_json("alice", "/v1/runs", json!({"prompt": "x", "repo": {"url": url}})).await;
    (status, body.to_string())
}

#[tokio::test]
async fn repo_urls_with_credentials_are_422_and_never_echoed() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    for url in [
        "https://user:s3cr3t-tok@github.com/o/r.git",
        "https://s3cr3t-tok@github.com/o/r.git",
        "http://x:s3cr3t-tok@example.com/r",
    ] {
        let (status, body) = create_status(&app, url).await;
        assert_eq!(status, 422, "{url}: {body}");
        assert!(body.contains("credentials"), "{body}");
        assert!(!body.contains("s3cr3t"), "the refusal echoes the secret: {body}");
    }
}

#[tokio::test]
async fn private_addresses_and_git_protocols_are_422_unless_the_deployment_allows_them() {
    let strict = kiln_api::ApiSettings { repo_rules: RepoRules::default(), ..Options::default().api };
    let app = TestApp::spawn(Options { worker: false, api: strict, ..Default::default() }).await;
    for (url, expected) in [
        ("http://127.0.0.1:8080/r.git", "KILN_ALLOW_PRIVATE_REPOS"),
        ("https://10.1.2.3/r.git", "KILN_ALLOW_PRIVATE_REPOS"),
        ("http://[::1]/r.git", "KILN_ALLOW_PRIVATE_REPOS"),
        ("http://169.254.169.254/latest", "KILN_ALLOW_PRIVATE_REPOS"),
        ("git://example.com/r.git", "KILN_ALLOW_GIT_PROTOCOLS"),
        ("git@example.com:o/r.git", "KILN_ALLOW_GIT_PROTOCOLS"),
    ] {
        let (status, body) = create_status(&app, url).await;
        assert_eq!(status, 422, "{url}: {body}");
        assert!(body.contains(expected), "{url}: {body}");
    }
    let (status, body) = create_status(&app, "https://github.com/o/r.git").await;
    assert_eq!(status, 201, "{body}");
    // The harness's default deployment allows private addresses.
    let open = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    assert_eq!(create_status(&open, "http://127.0.0.1:8080/r.git").await.0, 201);
}
