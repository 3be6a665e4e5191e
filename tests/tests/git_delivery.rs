//! `deliver.git` (issue 28): the worker pushes a run's change, as one
//! commit on its base, to a branch of a git remote — here a bare
//! repository served over smart HTTP on loopback by `git http-backend`
//! behind a small server the test owns, with HTTP basic auth
//! (`git_http_server.py`). Only hosts in `KILN_GIT_CREDENTIALS` are pushed
//! to, and the credentials appear in no event, log line or sandbox.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use kiln_protocol::deliver::{Deliver, GitDelivery};
use kiln_protocol::{CreateRun, EventBody, RepoSpec, RunStatus};
use kiln_scripted_model::Reply;
use kiln_tests::git_repo::{git, repo_with};
use kiln_tests::logs::Logs;
use kiln_tests::worker_process::WorkerProcess;
use kiln_tests::{Event, Options, TestApp, docker_exec, kinds, worker_config};
use kiln_worker::git_delivery::GitDeliverySettings;
use kiln_worker::git_delivery::credentials::GitCredentials;
use kiln_worker::{ProviderKind, WorkerConfig};
use serde_json::json;
use tokio::io::AsyncBufReadExt;
use uuid::Uuid;

const USER: &str = "pusher";
const TOKEN: &str = "tok-9f8e7d6c5b4a-secret";

/// The test's git server: a bare repository `remote.git` under its root.
struct GitServer {
    _child: tokio::process::Child,
    _root: tempfile::TempDir,
    bare: PathBuf,
    log: PathBuf,
    port: u16,
}

impl GitServer {
    /// Serves a bare clone of `source` (so the remote has the run's base).
    async fn start(source: &str) -> GitServer {
        GitServer::start_with(source, "ok").await
    }

    /// The same, in trouble at first (`fail:N`: the first N requests are
    /// answered 503; `hang:N`: they are never answered).
    async fn start_with(source: &str, mode: &str) -> GitServer {
        let root = tempfile::tempdir().unwrap();
        git(root.path(), &["clone", "-q", "--bare", source, "remote.git"]);
        let bare = root.path().join("remote.git");
        let log = root.path().join("requests.log");
        std::fs::write(&log, "").unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/git_http_server.py");
        let mut child = tokio::process::Command::new("python3")
            .arg(script)
            .args([root.path().to_str().unwrap(), USER, TOKEN, log.to_str().unwrap(), mode])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let port = lines.next_line().await.unwrap().expect("the server's port").trim().parse().unwrap();
        GitServer { _child: child, _root: root, bare, log, port }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/remote.git", self.port)
    }

    fn requests(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }
}

fn config(credentials: &str) -> WorkerConfig {
    WorkerConfig {
        // The session's container stays, to look inside it after the run.
        sandbox_idle: Duration::from_secs(120),
        git_credentials: std::sync::Arc::new(GitCredentials::parse(credentials).unwrap()),
        ..worker_config(ProviderKind::OpenAi, Duration::from_secs(10))
    }
}

fn credentials_for(host: &str) -> String {
    json!({ host: { "username": USER, "token": TOKEN } }).to_string()
}

async fn app_with(script: Vec<Reply>, config: WorkerConfig) -> TestApp {
    let app = TestApp::spawn(Options { worker: false, script, ..Default::default() }).await;
    app.start_worker(config).await;
    app
}

fn delivering(repo: &str, remote: &str, branch: &str) -> CreateRun {
    CreateRun {
        repo: Some(RepoSpec { url: repo.to_owned(), git_ref: None }),
        deliver: Some(Deliver {
            git: Some(GitDelivery {
                url: remote.to_owned(),
                branch: branch.to_owned(),
                author_name: Some("Ada Kiln".into()),
                author_email: Some("ada@example.com".into()),
                message: None,
            }),
        }),
        ..CreateRun::new("Add the notes\n\nand more detail")
    }
}

/// The run's events once its delivery's outcome is recorded.
async fn until_delivered(app: &TestApp, run: Uuid) -> Vec<Event> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let events = app.stored_events(run).await;
        let done = events
            .iter()
            .any(|e| matches!(e.body, EventBody::DeliverySucceeded { .. } | EventBody::DeliveryFailed { .. }));
        if done {
            return events;
        }
        assert!(Instant::now() < deadline, "no delivery event; got {:?}", kinds(&events));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How the run ended (its terminal event; the delivery's comes after it).
fn ended(events: &[Event]) -> Option<RunStatus> {
    events.iter().find_map(|e| e.body.terminal_status())
}

/// The tree the sandbox's workspace is at, as git would write it (on a
/// copy in the container's `/tmp`).
async fn sandbox_tree(app: &TestApp, run: Uuid) -> String {
    let container = app.containers_of(run).await.pop().expect("the session's container");
    let (code, out) = docker_exec(
        &container,
        &[
            "sh",
            "-c",
            "rm -rf /tmp/ws && cp -R --preserve=mode,links /workspace /tmp/ws && cd /tmp/ws \
          && git -c safe.directory='*' add -A && git -c safe.directory='*' write-tree",
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    out.trim().to_owned()
}

const EDITS: &str = "set -e
printf 'one more line\\n' >> a.txt
rm gone.txt
chmod +x tool.sh
printf '\\000\\001\\002\\377binary' > blob.bin
ln -s a.txt link
mkdir -p dir && echo new > dir/NOTES.md";

#[tokio::test]
async fn the_branch_lands_as_one_commit_on_the_base_and_the_token_leaks_nowhere() {
    let logs = Logs::capture(tracing_subscriber::filter::LevelFilter::TRACE);
    let (_repo, url) = repo_with(&[("a.txt", "a\n"), ("gone.txt", "bye\n"), ("tool.sh", "echo\n")]);
    let base = git(Path::new(url.trim_start_matches("file://")), &["rev-parse", "HEAD"]);
    let server = GitServer::start(&url).await;
    let script = vec![
        Reply::tool("bash", json!({ "command": EDITS })),
        // What the sandbox can see of its own processes' environments.
        Reply::tool("bash", json!({ "command": "env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'" })),
        Reply::text("done"),
    ];
    let app = app_with(script, config(&credentials_for(&format!("127.0.0.1:{}", server.port)))).await;
    let id = app.submit("alice", delivering(&url, &server.url(), "kiln/notes")).await.id;
    let events = until_delivered(&app, id).await;
    assert_eq!(ended(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));

    let last = events.last().unwrap();
    let EventBody::DeliverySucceeded { branch, commit, remote, .. } = &last.body else {
        panic!("the delivery failed: {:?}", last.body)
    };
    assert_eq!(branch.as_deref(), Some("kiln/notes"));
    assert_eq!(remote.as_deref(), Some(server.url().as_str()));
    let commit = commit.clone().unwrap();
    // One commit whose parent is the base, holding exactly the sandbox's tree.
    let bare = &server.bare;
    assert_eq!(git(bare, &["rev-parse", "refs/heads/kiln/notes"]), commit);
    assert_eq!(git(bare, &["rev-parse", &format!("{commit}^@")]), base, "the parent is the base");
    assert_eq!(git(bare, &["rev-parse", &format!("{commit}^{{tree}}")]), sandbox_tree(&app, id).await);
    assert_eq!(git(bare, &["log", "-1", "--format=%an <%ae>|%s", &commit]), "Ada Kiln <ada@example.com>|Add the notes");
    assert!(server.requests().lines().all(|l| l.ends_with("authorized=true")), "{}", server.requests());

    // The token is in no event (the sandbox's environment is among them),
    // no log line, and nowhere in the sandbox.
    let all_events: String = events.iter().map(|e| serde_json::to_string(&e.body).unwrap()).collect();
    assert!(all_events.contains("PATH="), "the sandbox's environment was printed");
    let encoded = base64::Engine::encode(&base64::prelude::BASE64_STANDARD, format!("{USER}:{TOKEN}"));
    for secret in [TOKEN, encoded.as_str()] {
        assert!(!all_events.contains(secret), "an event holds the credential");
        assert!(!logs.text().contains(secret), "a log line holds the credential");
    }
    let container = app.containers_of(id).await.pop().unwrap();
    let (_, found) = docker_exec(
        &container,
        &["sh", "-c", &format!("grep -rlsF '{TOKEN}' / --exclude-dir=proc --exclude-dir=sys; env")],
    )
    .await;
    assert!(!found.contains(TOKEN), "the sandbox holds the token: {found}");
}

#[tokio::test]
async fn a_host_missing_from_the_credentials_file_is_refused_before_any_connection() {
    let (_repo, url) = repo_with(&[("a.txt", "a\n")]);
    let server = GitServer::start(&url).await;
    let script = vec![Reply::tool("bash", json!({ "command": "echo x > b.txt" })), Reply::text("done")];
    // Credentials for another port of the same address: not this remote.
    let app = app_with(script, config(&credentials_for(&format!("127.0.0.1:{}", server.port + 1)))).await;
    let id = app.submit("alice", delivering(&url, &server.url(), "kiln/x")).await.id;
    let events = until_delivered(&app, id).await;
    assert_eq!(ended(&events), Some(RunStatus::Succeeded), "a failed delivery leaves the run's result");
    let EventBody::DeliveryFailed { error } = &events.last().unwrap().body else { panic!("{:?}", kinds(&events)) };
    assert_eq!(server.requests(), "", "the worker connected to a host it has no credentials for");
    assert!(error.contains("no credentials for 127.0.0.1:"), "{error}");
    assert!(git(&server.bare, &["branch", "--list", "kiln/x"]).is_empty());
}

#[tokio::test]
async fn a_run_without_a_change_pushes_nothing_and_an_existing_branch_is_never_overwritten() {
    let (_repo, url) = repo_with(&[("a.txt", "a\n")]);
    let server = GitServer::start(&url).await;
    git(&server.bare, &["branch", "taken", "main"]);
    let script = vec![
        Reply::text("nothing to do"),
        Reply::tool("bash", json!({ "command": "echo x > b.txt" })),
        Reply::text("done"),
    ];
    let app = app_with(script, config(&credentials_for(&format!("127.0.0.1:{}", server.port)))).await;
    let id = app.submit("alice", delivering(&url, &server.url(), "kiln/empty")).await.id;
    let events = until_delivered(&app, id).await;
    let EventBody::DeliveryFailed { error } = &events.last().unwrap().body else { panic!("{:?}", kinds(&events)) };
    assert!(error.contains("the run changed no files"), "{error}");
    assert_eq!(server.requests(), "");

    let before = git(&server.bare, &["rev-parse", "taken"]);
    let id = app.submit("alice", delivering(&url, &server.url(), "taken")).await.id;
    let events = until_delivered(&app, id).await;
    assert_eq!(ended(&events), Some(RunStatus::Succeeded));
    let EventBody::DeliveryFailed { error } = &events.last().unwrap().body else { panic!("{:?}", kinds(&events)) };
    assert!(error.contains("already exists"), "{error}");
    assert_eq!(git(&server.bare, &["rev-parse", "taken"]), before, "the branch is untouched");
}

#[tokio::test]
async fn bad_deliveries_are_refused_at_the_api() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let remote =
        |url: &str, branch: &str| json!({ "prompt": "x", "deliver": { "git": { "url": url, "branch": branch } } });
    for (body, says) in [
        (remote("https://git.example.com/r.git", "-evil"), "deliver.git.branch"),
        (remote("https://git.example.com/r.git", "a..b"), "deliver.git.branch"),
        (remote("https://user:pw@git.example.com/r.git", "b"), "deliver.git.url"),
        (remote("file:///tmp/r", "b"), "deliver.git.url"),
    ] {
        let (status, answer) = app.post_json("alice", "/v1/runs", body).await;
        assert_eq!(status, 422, "{answer}");
        assert!(answer.to_string().contains(says), "{answer}");
        assert!(!answer.to_string().contains("pw@"), "{answer}");
    }
}

async fn select(app: &TestApp, group: Uuid, attempt: u32) -> (u16, serde_json::Value) {
    app.post_json("alice", &format!("/v1/runs/{group}/select"), json!({ "attempt": attempt })).await
}

/// A group of attempts with `deliver.git` (issue 29): nothing is pushed
/// until one is chosen; choosing the second pushes the second's change
/// only (one commit on the base); once pushed, the choice stands (409).
#[tokio::test]
async fn a_group_pushes_the_chosen_attempts_change_and_the_choice_then_stands() {
    let (_repo, url) = repo_with(&[("a.txt", "a\n")]);
    let base = git(Path::new(url.trim_start_matches("file://")), &["rev-parse", "HEAD"]);
    let server = GitServer::start(&url).await;
    let mut config = config(&credentials_for(&format!("127.0.0.1:{}", server.port)));
    config.concurrency = 3;
    let app = app_with(Vec::new(), config).await;
    let models = ["model-one", "model-two", "model-three"];
    for model in models {
        let edit = format!("echo from {model} > attempt.txt && echo {model} >> a.txt");
        app.model.script_model(model, vec![Reply::tool("bash", json!({ "command": edit })), Reply::text("done")]);
    }
    let spec = CreateRun {
        attempts: Some(3),
        attempt_models: Some(models.iter().map(|m| (*m).to_owned()).collect()),
        ..delivering(&url, &server.url(), "kiln/best")
    };
    let group = app.submit("alice", spec).await;
    let attempts = group.attempts.clone().expect("a group lists its attempts");
    let events = app.events("alice", group.id).await;
    assert_eq!(ended(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    // Ended, nothing chosen: nothing pushed, by the group or its attempts.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for run in std::iter::once(&group.id).chain(&attempts) {
        let events = app.stored_events(*run).await;
        assert!(
            !events
                .iter()
                .any(|e| matches!(e.body, EventBody::DeliverySucceeded { .. } | EventBody::DeliveryFailed { .. })),
            "{run}: {:?}",
            kinds(&events)
        );
    }
    assert_eq!(git(&server.bare, &["branch", "--list", "kiln/best"]), "", "nothing pushed before a choice");

    assert_eq!(select(&app, group.id, 2).await.0, 200);
    let events = until_delivered(&app, group.id).await;
    let last = events.last().unwrap();
    let EventBody::DeliverySucceeded { branch, commit, .. } = &last.body else {
        panic!("the delivery failed: {:?}", last.body)
    };
    assert_eq!(branch.as_deref(), Some("kiln/best"));
    let commit = commit.clone().unwrap();
    let bare = &server.bare;
    assert_eq!(git(bare, &["rev-parse", "refs/heads/kiln/best"]), commit);
    assert_eq!(git(bare, &["rev-parse", &format!("{commit}^@")]), base, "one commit on the base");
    assert_eq!(git(bare, &["show", &format!("{commit}:attempt.txt")]), "from model-two");
    assert_eq!(git(bare, &["show", &format!("{commit}:a.txt")]), "a\nmodel-two");
    assert_eq!(git(bare, &["diff", "--name-only", &base, &commit]), "a.txt\nattempt.txt", "the second's change only");

    // Pushed: the choice stands, for another attempt and the same one.
    for k in [1, 2] {
        let (status, body) = select(&app, group.id, k).await;
        assert_eq!(status, 409, "{body}");
        assert!(body["error"]["message"].as_str().unwrap().contains("already delivered"), "{body}");
    }
    assert_eq!(app.run("alice", group.id).await.selected_attempt, Some(2));
    assert_eq!(git(bare, &["rev-parse", "refs/heads/kiln/best"]), commit, "nothing pushed again");
}

/// The run's `delivery.retrying` events: (attempt, error).
fn retries(events: &[Event]) -> Vec<(u32, String)> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::DeliveryRetrying { attempt, error, .. } => Some((*attempt, error.clone())),
            _ => None,
        })
        .collect()
}

/// A remote that is down at first (503): the push is owed again after a
/// backoff, each failed attempt says so (`delivery.retrying`), and the
/// branch lands once the remote is back; a remote that stays down is
/// given up after the bound, saying so (`delivery.failed`).
#[tokio::test]
async fn a_remote_that_is_down_at_first_gets_the_branch_later_and_one_that_stays_down_is_given_up() {
    let logs = Logs::capture(tracing_subscriber::filter::LevelFilter::TRACE);
    let (_repo, url) = repo_with(&[("a.txt", "a\n")]);
    let server = GitServer::start_with(&url, "fail:2").await;
    let down = GitServer::start_with(&url, "fail:1000").await;
    let script = vec![
        Reply::tool("bash", json!({ "command": "echo x > b.txt" })),
        Reply::text("done"),
        Reply::tool("bash", json!({ "command": "echo y > c.txt" })),
        Reply::text("done"),
    ];
    let hosts = json!({
        format!("127.0.0.1:{}", server.port): { "username": USER, "token": TOKEN },
        format!("127.0.0.1:{}", down.port): { "username": USER, "token": TOKEN },
    });
    let mut config = config(&hosts.to_string());
    config.git_delivery = GitDeliverySettings {
        max_attempts: 3,
        base_delay: Duration::from_millis(400),
        max_delay: Duration::from_secs(2),
    };
    let app = app_with(script, config).await;

    let id = app.submit("alice", delivering(&url, &server.url(), "kiln/later")).await.id;
    let events = until_delivered(&app, id).await;
    assert_eq!(ended(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let retried = retries(&events);
    assert_eq!(retried.iter().map(|r| r.0).collect::<Vec<_>>(), [1, 2], "{:?}", kinds(&events));
    assert!(retried.iter().all(|(_, e)| e.contains("503")), "{retried:?}");
    let EventBody::DeliverySucceeded { commit, .. } = &events.last().unwrap().body else {
        panic!("{:?}", kinds(&events))
    };
    assert_eq!(git(&server.bare, &["rev-parse", "refs/heads/kiln/later"]), commit.clone().unwrap());
    assert_eq!(git(&server.bare, &["show", "kiln/later:b.txt"]), "x");

    let id = app.submit("alice", delivering(&url, &down.url(), "kiln/never")).await.id;
    let events = until_delivered(&app, id).await;
    assert_eq!(retries(&events).iter().map(|r| r.0).collect::<Vec<_>>(), [1, 2], "{:?}", kinds(&events));
    let EventBody::DeliveryFailed { error } = &events.last().unwrap().body else { panic!("{:?}", kinds(&events)) };
    assert!(error.contains("gave up after 3 attempts") && error.contains("503"), "{error}");
    assert_eq!(down.requests().lines().count(), 3, "one request per attempt, none after giving up");

    let all_events: String = events.iter().map(|e| serde_json::to_string(&e.body).unwrap()).collect();
    let encoded = base64::Engine::encode(&base64::prelude::BASE64_STANDARD, format!("{USER}:{TOKEN}"));
    for secret in [TOKEN, encoded.as_str()] {
        assert!(!all_events.contains(secret), "an event holds the credential");
        assert!(!logs.text().contains(secret), "a log line holds the credential");
    }
}

/// The worker that ended the run dies while pushing (SIGKILL, the remote
/// holding its request): the push was owed in the database with the run's
/// end, so once the dead worker's claim runs out another worker makes it.
#[tokio::test]
async fn a_push_whose_worker_died_is_made_by_another_worker() {
    let (_repo, url) = repo_with(&[("a.txt", "a\n")]);
    let server = GitServer::start_with(&url, "hang:1").await;
    let credentials = credentials_for(&format!("127.0.0.1:{}", server.port));
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &credentials).unwrap();
    let script = vec![Reply::tool("bash", json!({ "command": "echo x > b.txt" })), Reply::text("done")];
    let app = TestApp::spawn(Options { worker: false, script, ..Default::default() }).await;
    let env = [
        ("KILN_GIT_CREDENTIALS", file.path().to_str().unwrap()),
        ("KILN_ALLOW_FILE_REPOS", "true"),
        ("KILN_ALLOW_PRIVATE_REPOS", "true"),
    ];
    let doomed = WorkerProcess::start(&app, 3, &env).await;
    let id = app.submit("alice", delivering(&url, &server.url(), "kiln/survivor")).await.id;
    // The run has ended and its worker is pushing: the remote holds its
    // first request.
    let deadline = Instant::now() + Duration::from_secs(120);
    while server.requests().is_empty() {
        assert!(Instant::now() < deadline, "the worker never reached the remote");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let events = app.stored_events(id).await;
    assert_eq!(ended(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    doomed.kill().await;

    app.start_worker(config(&credentials)).await;
    let events = until_delivered(&app, id).await;
    let EventBody::DeliverySucceeded { commit, .. } = &events.last().unwrap().body else {
        panic!("{:?}", kinds(&events))
    };
    assert_eq!(git(&server.bare, &["rev-parse", "refs/heads/kiln/survivor"]), commit.clone().unwrap());
    let outcomes = events.iter().filter(|e| e.kind().starts_with("delivery.")).count();
    assert_eq!(outcomes, 1, "{:?}", kinds(&events));
}

/// An API given the credentials file (`KILN_GIT_CREDENTIALS`) refuses at
/// submission a remote whose host it does not list (422, naming the
/// field), before any run or worker; a listed host is taken.
#[tokio::test]
async fn an_api_with_the_credentials_file_refuses_an_unlisted_host_at_submission() {
    let hosts = std::collections::BTreeSet::from(["git.example.com".to_owned(), "127.0.0.1:8080".to_owned()]);
    let api = kiln_api::ApiSettings { git_hosts: Some(std::sync::Arc::new(hosts)), ..Options::default().api };
    let app = TestApp::spawn(Options { worker: false, api, ..Default::default() }).await;
    let remote = |url: &str| json!({ "prompt": "x", "deliver": { "git": { "url": url, "branch": "kiln/b" } } });
    for url in ["https://git.other.example/r.git", "http://127.0.0.1:8081/r.git", "http://git.example.com:8443/r"] {
        let (status, answer) = app.post_json("alice", "/v1/runs", remote(url)).await;
        assert_eq!(status, 422, "{url}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains("deliver.git.url") && message.contains("no credentials"), "{message}");
    }
    assert_eq!(app.sql().await.query_one("SELECT count(*) FROM runs", &[]).await.unwrap().get::<_, i64>(0), 0);
    for url in ["https://Git.Example.com/r.git", "http://127.0.0.1:8080/r.git"] {
        let (status, answer) = app.post_json("alice", "/v1/runs", remote(url)).await;
        assert_eq!(status, 201, "{url}: {answer}");
    }
}
