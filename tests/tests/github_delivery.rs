//! GitHub delivery end to end: a run triggered from GitHub is checked out
//! with the token on the worker's side, acknowledged, and reported back (a
//! branch pushed to a real bare repository, a pull request and an issue
//! comment, or a comment with the reason) against a fake GitHub REST API.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use kiln_protocol::{RepoSpec, StoredEvent};
use kiln_store::{Delivery, GithubOrigin, NewGithubRun, Recorded};
use kiln_tests::kiln_scripted_model::Reply;
use kiln_tests::{Options, TestApp, token, worker_config};
use kiln_worker::ProviderKind;
use kiln_worker::github::{Credentials, Github, GithubSettings, RetryPolicy};
use serde_json::{Value, json};
use uuid::Uuid;

const REPO: &str = "acme/widget";

/// One request the fake GitHub received.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    auth: Option<String>,
    body: Value,
}

#[derive(Default)]
struct FakeState {
    seen: Vec<Seen>,
    /// Every request answers 503.
    down: bool,
    /// Requests to this path answer 502 this many times first.
    flaky: Option<(String, usize)>,
    next_id: i64,
}

#[derive(Clone)]
struct FakeGithub {
    url: String,
    state: Arc<Mutex<FakeState>>,
}

impl FakeGithub {
    async fn start() -> FakeGithub {
        let state = Arc::new(Mutex::new(FakeState { next_id: 1000, ..Default::default() }));
        let app = Router::new().fallback(fake_github).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        FakeGithub { url, state }
    }

    fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    fn seen_to(&self, method: &str, path: &str) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.method == method && s.path == path).collect()
    }

    fn set_down(&self, down: bool) {
        self.state.lock().unwrap().down = down;
    }
}

async fn fake_github(
    State(state): State<Arc<Mutex<FakeState>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let mut s = state.lock().unwrap();
    s.seen.push(Seen {
        method: method.to_string(),
        path: path.clone(),
        auth: headers.get("authorization").map(|v| v.to_str().unwrap().to_owned()),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    });
    if s.down {
        return (StatusCode::SERVICE_UNAVAILABLE, "GitHub is down").into_response();
    }
    if let Some((p, n)) = &mut s.flaky
        && *p == path
        && *n > 0
    {
        *n -= 1;
        return (StatusCode::BAD_GATEWAY, "bad gateway").into_response();
    }
    s.next_id += 1;
    let id = s.next_id;
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let created = |v: Value| (StatusCode::CREATED, axum::Json(v)).into_response();
    match (method.as_str(), parts.as_slice()) {
        ("GET", ["repos", o, r, "issues", n]) => {
            axum::Json(json!({ "number": n.parse::<i64>().unwrap(), "title": format!("Fix the greeting in {o}/{r}") }))
                .into_response()
        }
        ("GET", ["repos", o, r, "pulls", _]) => {
            axum::Json(json!({ "head": { "ref": "feature", "repo": { "full_name": format!("{o}/{r}") } } }))
                .into_response()
        }
        ("POST", ["repos", _, _, "issues", "comments", _, "reactions"]) => {
            created(json!({ "id": id, "content": "eyes" }))
        }
        ("POST", ["repos", o, r, "issues", n, "comments"]) => created(
            json!({ "id": id, "html_url": format!("https://github.test/{o}/{r}/issues/{n}#issuecomment-{id}") }),
        ),
        ("POST", ["app", "installations", n, "access_tokens"]) => {
            let expires_at = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
            created(json!({ "token": format!("ghs_secretinstallation{n}"), "expires_at": expires_at }))
        }
        ("POST", ["repos", o, r, "pulls"]) => {
            created(json!({ "number": 77, "html_url": format!("https://github.test/{o}/{r}/pull/77") }))
        }
        _ => (StatusCode::NOT_FOUND, axum::Json(json!({ "message": "Not Found" }))).into_response(),
    }
}

/// A bare repository with `main` (README.md) and `feature` (also
/// feature.txt), reachable as `file://`.
struct BareRepo {
    _dir: tempfile::TempDir,
    bare: PathBuf,
}

impl BareRepo {
    fn create() -> BareRepo {
        let dir = tempfile::tempdir().unwrap();
        let bare = dir.path().join("widget.git");
        let work = dir.path().join("work");
        git(dir.path(), &["init", "--quiet", "--bare", "-b", "main", bare.to_str().unwrap()]);
        git(dir.path(), &["init", "--quiet", "-b", "main", work.to_str().unwrap()]);
        std::fs::write(work.join("README.md"), "# widget\n").unwrap();
        git(&work, &["add", "-A"]);
        git(&work, &["commit", "--quiet", "-m", "initial"]);
        git(&work, &["checkout", "--quiet", "-b", "feature"]);
        std::fs::write(work.join("feature.txt"), "only on the feature branch\n").unwrap();
        git(&work, &["add", "-A"]);
        git(&work, &["commit", "--quiet", "-m", "feature"]);
        git(&work, &["push", "--quiet", bare.to_str().unwrap(), "main", "feature"]);
        BareRepo { _dir: dir, bare }
    }

    fn url(&self) -> String {
        format!("file://{}", self.bare.display())
    }

    /// `git <args>` in the bare repository; stdout.
    fn git(&self, args: &[&str]) -> String {
        git(&self.bare, args)
    }
}

fn git(cwd: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.name=Test", "-c", "user.email=test@example.com"])
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

struct Setup {
    app: TestApp,
    github: FakeGithub,
    repo: BareRepo,
    /// The fixed token; with an App, a placeholder (installation tokens
    /// still start with `ghs_secret`, which every leak check looks for).
    token: String,
    /// The installation the webhook names.
    installation: Option<i64>,
}

async fn setup(script: Vec<Reply>) -> Setup {
    let token = format!("ghs_secret{}", Uuid::new_v4().simple());
    setup_with(script, Credentials::Token(token.clone()), token, None).await
}

async fn setup_with(script: Vec<Reply>, credentials: Credentials, token: String, installation: Option<i64>) -> Setup {
    let app = TestApp::spawn(Options { script, worker: false, ..Default::default() }).await;
    let github = FakeGithub::start().await;
    let repo = BareRepo::create();
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    config.github = Some(
        Github::new(GithubSettings {
            api_url: github.url.clone(),
            credentials,
            public_url: Some(format!("http://{}", app.addr)),
            retry: RetryPolicy {
                attempts: 4,
                base_delay: Duration::from_millis(50),
                max_delay: Duration::from_secs(2),
            },
            request_poll: Duration::from_millis(200),
        })
        .unwrap(),
    );
    app.start_worker(config).await;
    Setup { app, github, repo, token, installation }
}

/// Queues a GitHub run as the webhook route would.
async fn github_run(s: &Setup, issue: i64, pr: Option<i64>, comment: Option<i64>, git_ref: Option<&str>) -> Uuid {
    let delivery = Delivery {
        id: Uuid::new_v4().to_string(),
        event: if comment.is_some() { "issue_comment" } else { "issues" }.into(),
        action: Some(if comment.is_some() { "created" } else { "labeled" }.into()),
        repo: Some(REPO.into()),
    };
    let new = NewGithubRun {
        owner: "github".into(),
        prompt: "Fix the greeting".into(),
        repo: RepoSpec { url: s.repo.url(), git_ref: git_ref.map(str::to_owned) },
        origin: GithubOrigin {
            event: delivery.event.clone(),
            repo_full_name: REPO.into(),
            issue_number: issue,
            pr_number: pr,
            comment_id: comment,
            installation_id: s.installation,
            sender_login: "octocat".into(),
        },
    };
    match s.app.store.create_github_run(&delivery, &new).await.unwrap() {
        Recorded::New { run_id: Some(id) } => id,
        other => panic!("no run created: {other:?}"),
    }
}

async fn events(s: &Setup, run: Uuid) -> Vec<StoredEvent> {
    s.app.store.events_after(run, 0, 10_000).await.unwrap()
}

/// Waits for an event of `kind` and returns all events so far.
async fn wait_for(s: &Setup, run: Uuid, kind: &str) -> Vec<StoredEvent> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let evs = events(s, run).await;
        if evs.iter().any(|e| e.kind == kind) {
            return evs;
        }
        assert!(tokio::time::Instant::now() < deadline, "no {kind} event; got {:?}", kinds(&evs));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn kinds(evs: &[StoredEvent]) -> Vec<&str> {
    evs.iter().map(|e| e.kind.as_str()).collect()
}

/// The first delivery event.
fn delivery_event(evs: &[StoredEvent]) -> &StoredEvent {
    evs.iter().find(|e| e.kind.starts_with("delivery.")).unwrap()
}

async fn run_status(s: &Setup, run: Uuid) -> String {
    s.app.store.get_run_unscoped(run).await.unwrap().unwrap().status.to_string()
}

/// Neither the token nor its git basic-auth form appears in any event.
fn assert_token_absent(evs: &[StoredEvent], token: &str) {
    let all = serde_json::to_string(&evs.iter().map(|e| &e.payload).collect::<Vec<_>>()).unwrap();
    assert!(!all.contains(token), "the token leaked into an event");
    assert!(!all.contains("ghs_secret"), "a token fragment leaked into an event");
}

/// Looks for the token in the container: in its environment (what a bash
/// call sees) and in its files. The pattern is assembled in the shell so the
/// command itself does not carry it.
const TOKEN_HUNT: &str = "env; P=ghs_; P=${P}secret; \
     if grep -rIqs \"$P\" /workspace /tmp /home /etc /proc/1/environ; then echo found=yes; else echo found=no; fi; \
     sleep 2";

#[tokio::test]
async fn a_run_with_changes_is_pushed_and_opened_as_a_pull_request() {
    let s = setup(vec![
        Reply::tool("bash", json!({ "command": "echo 'hello from kiln' > greeting.txt && git status --short" })),
        Reply::tool("bash", json!({ "command": TOKEN_HUNT })),
        Reply::text("I added greeting.txt with a friendly greeting."),
    ])
    .await;
    // GitHub stumbles on the pull request: 502 twice, then it goes through.
    s.github.state.lock().unwrap().flaky = Some((format!("/repos/{REPO}/pulls"), 2));
    let run = github_run(&s, 42, None, Some(555), Some("main")).await;

    // While the sandbox lives, its configuration carries no token.
    wait_for(&s, run, "sandbox.ready").await;
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let containers = s.app.containers_of(&run.to_string()).await;
    assert!(!containers.is_empty(), "the sandbox should still be running");
    for id in containers {
        let inspect = docker.inspect_container(&id, None).await.unwrap();
        let config = serde_json::to_string(&inspect.config).unwrap();
        assert!(!config.contains("ghs_secret"), "the token is in the container's config");
    }

    let evs = wait_for(&s, run, "delivery.succeeded").await;
    assert_eq!(run_status(&s, run).await, "succeeded");
    let delivered = delivery_event(&evs);
    assert_eq!(delivered.kind, "delivery.succeeded", "{:?}", delivered.payload);
    assert_eq!(delivered.payload["pull_request"], "https://github.test/acme/widget/pull/77");
    // The container's view: no token in env or files.
    let hunt = evs.iter().find(|e| e.kind == "tool.result" && e.payload["output"].as_str().unwrap().contains("found="));
    assert!(hunt.is_some(), "the token hunt did not run: {:?}", kinds(&evs));
    let output = hunt.unwrap().payload["output"].as_str().unwrap();
    assert!(output.contains("found=no"), "the token was found in the container: {output}");
    assert_token_absent(&evs, &s.token);

    // The branch is in the bare repository with the agent's change.
    let branch = format!("kiln/issue-42-{}", &run.simple().to_string()[..8]);
    assert_eq!(s.repo.git(&["show", &format!("{branch}:greeting.txt")]), "hello from kiln\n");
    let subject = s.repo.git(&["log", "-1", "--format=%s", &branch]);
    assert!(subject.contains("#42"), "{subject}");
    assert_eq!(s.repo.git(&["rev-parse", &format!("{branch}~1")]), s.repo.git(&["rev-parse", "main"]));

    // 👀 on the triggering comment.
    let reactions = s.github.seen_to("POST", &format!("/repos/{REPO}/issues/comments/555/reactions"));
    assert_eq!(reactions.len(), 1);
    assert_eq!(reactions[0].body["content"], "eyes");
    // The pull request: retried through two 502s, then created once.
    let pulls = s.github.seen_to("POST", &format!("/repos/{REPO}/pulls"));
    assert_eq!(pulls.len(), 3, "two 502s and one success");
    let pr = &pulls[2].body;
    assert_eq!(pr["head"], branch.as_str());
    assert_eq!(pr["base"], "main");
    assert_eq!(pr["title"], "Fix the greeting in acme/widget");
    let body = pr["body"].as_str().unwrap();
    assert!(body.contains("Fixes #42"), "{body}");
    assert!(body.contains("I added greeting.txt"), "{body}");
    assert!(body.contains(&run.to_string()), "{body}");
    // The issue comment links the pull request.
    let comments = s.github.seen_to("POST", &format!("/repos/{REPO}/issues/42/comments"));
    assert_eq!(comments.len(), 1);
    assert!(comments[0].body["body"].as_str().unwrap().contains("https://github.test/acme/widget/pull/77"));
    // Every call used the token, and only as a bearer credential.
    for seen in s.github.seen() {
        assert_eq!(seen.auth.as_deref(), Some(format!("Bearer {}", s.token).as_str()), "{seen:?}");
    }
}

#[tokio::test]
async fn a_run_without_changes_on_a_pull_request_comments_its_answer() {
    let s = setup(vec![
        Reply::tool("bash", json!({ "command": "cat feature.txt" })),
        Reply::text("Nothing to change: the greeting is already right."),
    ])
    .await;
    // A comment on pull request #7: the run works on the PR's branch.
    let run = github_run(&s, 7, Some(7), Some(556), None).await;
    let evs = wait_for(&s, run, "delivery.succeeded").await;
    assert_eq!(run_status(&s, run).await, "succeeded");
    let cat = evs.iter().find(|e| e.kind == "tool.result").unwrap();
    assert!(cat.payload["output"].as_str().unwrap().contains("only on the feature branch"), "{:?}", cat.payload);
    assert_eq!(s.github.seen_to("GET", &format!("/repos/{REPO}/pulls/7")).len(), 1);

    assert!(s.github.seen_to("POST", &format!("/repos/{REPO}/pulls")).is_empty(), "no pull request without changes");
    let comments = s.github.seen_to("POST", &format!("/repos/{REPO}/issues/7/comments"));
    assert_eq!(comments.len(), 1);
    let body = comments[0].body["body"].as_str().unwrap();
    assert!(body.contains("without changing any files"), "{body}");
    assert!(body.contains("Nothing to change: the greeting is already right."), "{body}");
    assert!(!s.repo.git(&["branch", "--list", "kiln/*"]).contains("kiln/"), "no branch pushed");
    assert_token_absent(&evs, &s.token);
}

#[tokio::test]
async fn a_failed_labelled_run_says_working_on_it_then_comments_the_reason() {
    let s = setup(vec![Reply::error(400)]).await;
    let run = github_run(&s, 9, None, None, Some("main")).await;
    let evs = wait_for(&s, run, "delivery.succeeded").await;
    assert_eq!(run_status(&s, run).await, "failed");
    let comments = s.github.seen_to("POST", &format!("/repos/{REPO}/issues/9/comments"));
    assert_eq!(comments.len(), 2, "working on it, then the result: {comments:?}");
    let texts: Vec<&str> = comments.iter().map(|c| c.body["body"].as_str().unwrap()).collect();
    let ack = texts.iter().find(|t| t.contains("working on it")).expect("a working-on-it comment");
    assert!(ack.contains(&run.to_string()), "{ack}");
    let result = texts.iter().find(|t| t.contains("failed")).expect("a failure comment");
    assert!(result.contains(&run.to_string()), "{result}");
    assert!(s.github.seen_to("POST", &format!("/repos/{REPO}/pulls")).is_empty());
    assert_token_absent(&evs, &s.token);
}

#[tokio::test]
async fn when_github_is_down_delivery_fails_as_an_event_and_can_be_retried() {
    let s =
        setup(vec![Reply::tool("bash", json!({ "command": "echo fixed > fix.txt" })), Reply::text("Fixed it.")]).await;
    s.github.set_down(true);
    let run = github_run(&s, 5, None, Some(557), Some("main")).await;
    let evs = wait_for(&s, run, "delivery.failed").await;
    // The run's own result stands.
    assert_eq!(run_status(&s, run).await, "succeeded");
    assert!(kinds(&evs).contains(&"run.succeeded"));
    let failed = delivery_event(&evs);
    assert!(failed.payload["error"].as_str().unwrap().contains("503"), "{:?}", failed.payload);
    assert_token_absent(&evs, &s.token);

    // GitHub is back; a client asks for the delivery again.
    s.github.set_down(false);
    let url = s.app.url(&format!("/v1/runs/{run}/deliver"));
    let r = s.app.http.post(&url).bearer_auth(token("github")).send().await.unwrap();
    assert_eq!(r.status(), 202);
    // Someone else's run is not theirs to deliver.
    let r = s.app.http.post(&url).bearer_auth(token("mallory")).send().await.unwrap();
    assert_eq!(r.status(), 404);

    let evs = wait_for(&s, run, "delivery.succeeded").await;
    let branch = format!("kiln/issue-5-{}", &run.simple().to_string()[..8]);
    assert_eq!(s.repo.git(&["show", &format!("{branch}:fix.txt")]), "fixed\n");
    assert_eq!(s.github.seen_to("POST", &format!("/repos/{REPO}/pulls")).len(), 1);
    assert_token_absent(&evs, &s.token);

    // Delivered: another request is refused.
    let r = s.app.http.post(&url).bearer_auth(token("github")).send().await.unwrap();
    assert_eq!(r.status(), 409);
}

#[tokio::test]
async fn deliver_refuses_runs_not_from_github() {
    let s = setup(vec![Reply::text("hi")]).await;
    let run = s.app.create_run("alice", json!({ "prompt": "say hi" })).await;
    let id = run["id"].as_str().unwrap();
    let url = s.app.url(&format!("/v1/runs/{id}/deliver"));
    let r = s.app.http.post(&url).bearer_auth(token("alice")).send().await.unwrap();
    assert_eq!(r.status(), 409);
}

/// A throwaway RSA key for the App test (PKCS#1, as GitHub issues them).
/// It signs nothing outside this file.
const TEST_APP_KEY: &str = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEAp4+6eSZTekpouH0WjcW3C0Yd3kO2Gp2zKHDD4Js4f2j7Ilkg\n55MjyS1+o7V0NNh17xODmZhp2Av2ymIIrRrba7Q7YjWSHi7rlFRUYg8lXw8fl0+F\neH2Poi064y6UWoQ6VgZ6E+vdC94MMQGv/n7LK1nP1Ia+VfOnChyUuALK897dSCUo\n2zn+39Ij5tueRhZbp1UdVXHJOwSopZNUOX5SdzgAMDc3J+93gFhWZQRyqtdhEa79\nO2JDjuqh58WvUDZhJiG0qwTLIp+zUOGgwLsiGlfgbFSlEefmZYEiHoVK88hy+HVW\nSxrq2EixgsvdYIcxksVxVuGAdUE4eUaZ8lMDBwIDAQABAoIBABKyxfWsV+HBrptH\nz4h/6Rk8+IBLwLqKS+qAtZsO4eh15/Br+cazHhSJGySxpFzGpa0e2a9ThBwz2ZUO\ns4vS/2wEGiGve2Aa5ExnzLLUoIWnGQ4NiwYTHOrVbp4uHdKsBsaAGodhPrLgUy6f\nfZWXbfH8fRC+Uzx24CEPZ258AUyNV8swDqSJx5LO3AZDfKjde3e/kSTLOVKeT8wl\nrYI/pLeAlRXMk95zKpWiVSEy5/EtvCWQUlNbUfcvgBTUiEeWhaC8xKZZ9lXOrHaQ\nqoqnCIFykYzR7g4RILk1ghVGePKe8shSPQ7I6TZMQW1IqIoQl8+MGp0Hi59yY6IR\nrf3HZEECgYEA4L31qHpcVmNBaYcoO0sep6nRotFJG0xhGyM15fPLcraAs3gJt4/g\nCD8nE/r8wu5BGDwSKSRrrvqUIhCSFcWhghCJRcfVJwl9W98z6cA5mQjKSTnZQ1Mt\nSu6KzgsW4F5W/+obty2JQKqs+O3Z/x9vGCa2Rqbgymdq+BhJk7d6qEkCgYEAvt3U\nDVscPg1aNV0mnNebpxy5ioMqeOTlpnCT4vTqH8VibZZIIweAfIdDRY7CnhdmcfpH\n70O2IC7p0v/42LtlgLD6fZ7ECUryAKLVBW+gFsAMV5qIoSxkThfD2nFRQuuazI2j\nOQ2VrcDDQzFRn54SwndDgS3Zq36fBe21GXpdcM8CgYEAxxhBqlFLv9QKPLxZbb2s\nmIeeiYiyJRbS58GXm/EQCL2Y4mSy5wT0SRn5OoAcr2t2C0wcIop7QvYFiO/5GoSM\nAbc4hLL1J7IGdf8T9D4wSFw7KAexay0icMFGAiZcy8OHewsgJnSWpM0Oky/S8Wod\ndt3EmG55sZVQdBzAAbaHWNECgYEAikFFCSemHYyue1kuTw4ewb4c6Ch663diol2J\nwiyGKt1fnuHs/vLAL3QLVqdCciGhI46X7MivdECHP0ALkXKs47tOtw/6EIEpKyzI\nAVgKLnCOgCaAMb9mKOsuA11x73eaefFe+kTM1z96MYHYDjcCf7rEOx5rPb5KkpDN\nTddFOCECgYBpIcjmXPkgGymbgxIc23N7hmFQJ8kCFmMGdyoK4LutvA2V1s3eRwbw\n5nRDBoE2AePr+uSSOISCEXlr2xtKbaTLuxpg7LDmJaHUCNXpGGGlHT//0e6C+PU4\nvJVBXWW9mHfxnRhYIpUCuRHcJLapD9yX89vsbuHkf85AsNkTKG/2wA==\n-----END RSA PRIVATE KEY-----\n";
const TEST_APP_PUBLIC_KEY: &str = "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAp4+6eSZTekpouH0WjcW3\nC0Yd3kO2Gp2zKHDD4Js4f2j7Ilkg55MjyS1+o7V0NNh17xODmZhp2Av2ymIIrRrb\na7Q7YjWSHi7rlFRUYg8lXw8fl0+FeH2Poi064y6UWoQ6VgZ6E+vdC94MMQGv/n7L\nK1nP1Ia+VfOnChyUuALK897dSCUo2zn+39Ij5tueRhZbp1UdVXHJOwSopZNUOX5S\ndzgAMDc3J+93gFhWZQRyqtdhEa79O2JDjuqh58WvUDZhJiG0qwTLIp+zUOGgwLsi\nGlfgbFSlEefmZYEiHoVK88hy+HVWSxrq2EixgsvdYIcxksVxVuGAdUE4eUaZ8lMD\nBwIDAQAB\n-----END PUBLIC KEY-----\n";

#[tokio::test]
async fn a_github_app_signs_a_jwt_and_caches_the_installation_token() {
    let credentials = Credentials::app("12345", TEST_APP_KEY.as_bytes()).unwrap();
    let script = vec![Reply::tool("bash", json!({ "command": "echo app > app.txt" })), Reply::text("Added app.txt.")];
    let s = setup_with(script, credentials, "ghs_secretinstallation99".into(), Some(99)).await;
    let run = github_run(&s, 11, None, Some(558), Some("main")).await;
    let evs = wait_for(&s, run, "delivery.succeeded").await;
    assert_eq!(delivery_event(&evs).kind, "delivery.succeeded");
    assert_token_absent(&evs, &s.token);

    // One exchange serves the acknowledgement and the delivery.
    let exchanges = s.github.seen_to("POST", "/app/installations/99/access_tokens");
    assert_eq!(exchanges.len(), 1, "{:?}", s.github.seen());
    let jwt = exchanges[0].auth.as_deref().unwrap().strip_prefix("Bearer ").unwrap();
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    validation.set_issuer(&["12345"]);
    validation.set_required_spec_claims(&["exp", "iss", "iat"]);
    let key = jsonwebtoken::DecodingKey::from_rsa_pem(TEST_APP_PUBLIC_KEY.as_bytes()).unwrap();
    let claims = jsonwebtoken::decode::<Value>(jwt, &key, &validation).unwrap().claims;
    let lifetime = claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap();
    assert!(lifetime <= 600, "GitHub refuses App JWTs over 10 minutes: {lifetime}");
    // Everything else uses the installation token.
    for seen in s.github.seen().iter().filter(|r| !r.path.starts_with("/app/")) {
        assert_eq!(seen.auth.as_deref(), Some("Bearer ghs_secretinstallation99"), "{seen:?}");
    }
    let branch = format!("kiln/issue-11-{}", &run.simple().to_string()[..8]);
    assert_eq!(s.repo.git(&["show", &format!("{branch}:app.txt")]), "app\n");
}
