//! GitHub delivery end to end: a signed webhook queues a run; the worker
//! checks it out with the token on its own side, acknowledges it, and
//! reports back against a fake GitHub (`kiln_tests::fake_github`): a branch
//! pushed over git's smart HTTP to a real bare repository, a pull request
//! and an issue comment, or a comment with the reason; also for a run
//! cancelled while still queued, which no worker ever held.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use kiln_protocol::{CreateRun, EventBody, RunStatus};
use kiln_tests::fake_github::{BareRepo, FakeGithub, git_basic_auth};
use kiln_tests::github_kiln::{OWED_POLL, fixture, github_against, send_webhook};
use kiln_tests::kiln_scripted_model::Reply;
use kiln_tests::logs::Logs;
use kiln_tests::{Event, Options, TestApp, kinds, pick, token, worker_config};
use kiln_worker::github::Credentials;
use kiln_worker::{ProviderKind, WorkerConfig};
use secrecy::ExposeSecret;
use serde_json::{Value, json};
use tracing_subscriber::filter::LevelFilter;
use uuid::Uuid;

const REPO: &str = "acme/widget";
const WEBHOOK_SECRET: &str = "delivery-test-webhook-secret";

struct Setup {
    app: TestApp,
    github: FakeGithub,
    repo: BareRepo,
    credentials: Credentials,
    /// The fixed token; with an App, a placeholder (installation tokens
    /// still start with `ghs_secret`, which every leak check looks for).
    token: String,
    /// The installation the webhook names.
    installation: Option<i64>,
}

async fn setup(script: Vec<Reply>) -> Setup {
    let s = setup_idle(script).await;
    s.start_worker().await;
    s
}

/// Kiln with the webhook on and a fixed token, but no worker yet.
async fn setup_idle(script: Vec<Reply>) -> Setup {
    let token = format!("ghs_secret{}", Uuid::new_v4().simple());
    setup_without_worker(script, Credentials::Token(token.as_str().into()), token, None).await
}

async fn setup_without_worker(
    script: Vec<Reply>,
    credentials: Credentials,
    token: String,
    installation: Option<i64>,
) -> Setup {
    let options = Options { script, worker: false, github_secret: Some(WEBHOOK_SECRET.into()), ..Default::default() };
    setup_with(options, credentials, token, installation).await
}

async fn setup_with(options: Options, credentials: Credentials, token: String, installation: Option<i64>) -> Setup {
    let app = TestApp::spawn(options).await;
    let repo = BareRepo::create(REPO);
    let github = FakeGithub::start(repo.root().to_owned()).await;
    if let Credentials::Token(t) = &credentials {
        github.accept_git_token(t.expose_secret());
    }
    Setup { app, github, repo, credentials, token, installation }
}

impl Setup {
    /// Starts a worker with GitHub configured against the fake.
    async fn start_worker(&self) {
        self.start_worker_with(|_| {}).await;
    }

    /// Starts a worker with GitHub configured against the fake, and
    /// `adjust` applied to its configuration.
    async fn start_worker_with(&self, adjust: impl FnOnce(&mut WorkerConfig)) {
        self.app.start_worker(self.worker_config(adjust)).await;
    }

    /// A worker's configuration with GitHub against the fake, and `adjust`
    /// applied.
    fn worker_config(&self, adjust: impl FnOnce(&mut WorkerConfig)) -> WorkerConfig {
        let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
        // GitHub runs reach their repository over http(s) only.
        config.allow_file_repos = false;
        config.github = Some(github_against(&self.github, self.credentials.clone(), &self.app));
        adjust(&mut config);
        config
    }
}

/// Queues a GitHub run through the webhook, as GitHub would: a `/kiln`
/// comment by the repository's owner (`comment`: its id) on issue `issue`
/// (a pull request if `on_pr`), or else the `kiln` label on it.
async fn github_run(s: &Setup, issue: i64, on_pr: bool, comment: Option<i64>) -> Uuid {
    github_run_with(s, issue, on_pr, comment, |_| {}).await
}

/// [`github_run`], with `adjust` applied to the payload before it is signed.
async fn github_run_with(
    s: &Setup,
    issue: i64,
    on_pr: bool,
    comment: Option<i64>,
    adjust: impl FnOnce(&mut Value),
) -> Uuid {
    let (event, mut payload) = match comment {
        Some(id) => {
            let mut v = fixture("issue_comment.created.json");
            v["comment"]["id"] = id.into();
            v["comment"]["body"] = "/kiln fix the greeting".into();
            v["comment"]["author_association"] = "OWNER".into();
            ("issue_comment", v)
        }
        None => {
            let mut v = fixture("issues.labeled.json");
            v["label"]["name"] = "kiln".into();
            ("issues", v)
        }
    };
    payload["repository"]["full_name"] = REPO.into();
    payload["repository"]["clone_url"] = s.github.clone_url(REPO).into();
    payload["repository"]["default_branch"] = "main".into();
    payload["issue"]["number"] = issue.into();
    if on_pr {
        payload["issue"]["pull_request"] = json!({ "url": format!("{}/repos/{REPO}/pulls/{issue}", s.github.url) });
    }
    match s.installation {
        Some(id) => payload["installation"] = json!({ "id": id }),
        None => {
            payload.as_object_mut().unwrap().remove("installation");
        }
    }
    adjust(&mut payload);
    let response = send_webhook(&s.app, WEBHOOK_SECRET, event, &payload).await;
    assert_eq!(response.status(), 201, "the webhook should queue a run");
    let created: Value = response.json().await.unwrap();
    created["run_id"].as_str().unwrap().parse().unwrap()
}

/// The first delivery event.
fn delivery_event(evs: &[Event]) -> &Event {
    evs.iter()
        .find(|e| matches!(e.body, EventBody::DeliverySucceeded { .. } | EventBody::DeliveryFailed { .. }))
        .unwrap()
}

/// The branch a run's pull request comes from.
fn branch_of(issue: i64, run: Uuid) -> String {
    format!("kiln/issue-{issue}-{}", run.simple())
}

async fn run_status(s: &Setup, run: Uuid) -> RunStatus {
    s.app.store.get_run_unscoped(run).await.unwrap().unwrap().status
}

/// `base64("x-access-token:ghs_secre")`: how every test token starts in
/// the basic-auth header git sends (base64 keeps 3-byte groups aligned, and
/// `x-access-token:` is 15 bytes).
const BASIC_TOKEN_PREFIX: &str = "eC1hY2Nlc3MtdG9rZW46Z2hzX3NlY3Jl";

/// Neither the token nor its git basic-auth form appears in `text`.
fn assert_no_token_in(text: &str, token: &str, what: &str) {
    assert!(!text.contains(token), "the token leaked into {what}");
    assert!(!text.contains("ghs_secret"), "a token fragment leaked into {what}");
    assert!(!text.contains(&git_basic_auth(token)[6..]), "the token's basic-auth form leaked into {what}");
    assert!(!text.contains(BASIC_TOKEN_PREFIX), "a basic-auth token leaked into {what}");
}

/// Neither the token nor its git basic-auth form appears in any event of
/// the run. Read as the stored JSON, every field of it, known to
/// [`EventBody`] or not.
async fn assert_token_absent(s: &Setup, run: Uuid) {
    let evs = s.app.store.events_after(run, 0, 10_000).await.unwrap();
    let all = serde_json::to_string(&evs.iter().map(|e| &e.payload).collect::<Vec<_>>()).unwrap();
    assert_no_token_in(&all, &s.token, "an event");
}

/// Looks for the token in the container: in its environment (what a bash
/// call sees) and in its files, as itself or in the basic-auth form git
/// sends it in; and for git's `extraheader` setting, which the worker gives
/// git through its environment only. The patterns are assembled in the
/// shell so the command itself does not carry them.
const TOKEN_HUNT: &str = "env; P=ghs_; P=${P}secret; B=eC1hY2Nlc3Mt; B=${B}dG9rZW46Z2hzX3NlY3Jl; \
     if grep -rIqs -e \"$P\" -e \"$B\" /workspace /tmp /home /etc /proc/1/environ; \
     then echo found=yes; else echo found=no; fi; \
     if grep -rIqsi extraheader /workspace; then echo header=yes; else echo header=no; fi; \
     echo origin=$(git -C /workspace config --get remote.origin.url); \
     sleep 2";

#[tokio::test]
async fn a_run_with_changes_is_pushed_and_opened_as_a_pull_request() {
    let logs = Logs::capture(LevelFilter::DEBUG);
    let s = setup(vec![
        Reply::tool("bash", json!({ "command": "echo 'hello from kiln' > greeting.txt && git status --short" })),
        Reply::tool("bash", json!({ "command": TOKEN_HUNT })),
        Reply::text("I added greeting.txt with a friendly greeting."),
    ])
    .await;
    // GitHub stumbles on the pull request: 502 twice, then it goes through.
    s.github.set_flaky(&format!("/repos/{REPO}/pulls"), 2);
    let run = github_run(&s, 42, false, Some(555)).await;

    // While the sandbox lives, its configuration carries no token.
    s.app.wait_for_event(run, "sandbox.ready").await;
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let containers = s.app.containers_of(&run.to_string()).await;
    assert!(!containers.is_empty(), "the sandbox should still be running");
    for id in containers {
        let inspect = docker.inspect_container(&id, None).await.unwrap();
        let config = serde_json::to_string(&inspect.config).unwrap();
        assert!(!config.contains("ghs_secret"), "the token is in the container's config");
    }

    let evs = s.app.wait_for_event(run, "delivery.succeeded").await;
    assert_eq!(run_status(&s, run).await, RunStatus::Succeeded);
    let delivered = delivery_event(&evs);
    let EventBody::DeliverySucceeded { pull_request, .. } = &delivered.body else { panic!("{delivered:?}") };
    assert_eq!(pull_request.as_deref(), Some("https://github.test/acme/widget/pull/77"));
    // The container's view: no token in env or files.
    let hunt = pick!(evs, EventBody::ToolResult { output, .. } => output).find(|o| o.contains("found="));
    assert!(hunt.is_some(), "the token hunt did not run: {:?}", kinds(&evs));
    let output = hunt.unwrap();
    assert!(output.contains("found=no"), "the token was found in the container: {output}");
    assert!(output.contains("header=no"), "git's auth header setting is in the workspace: {output}");
    // The checkout's `.git/config` names the repository as it is, without credentials.
    let origin = format!("origin={}\n", s.github.clone_url(REPO));
    assert!(output.contains(&origin), "the checkout's remote is not the plain clone URL: {output}");
    assert_token_absent(&s, run).await;
    // Nor in any log line the worker (or anything else here) wrote.
    let log = logs.text();
    assert!(log.contains("delivered to GitHub"), "the worker's log was not captured: {log}");
    assert_no_token_in(&log, &s.token, "a log line");

    // The branch is in the bare repository with the agent's change.
    let branch = branch_of(42, run);
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
    // Opened as a draft: a person reviews it before it is merged.
    assert_eq!(pr["draft"], true, "{pr}");
    assert_eq!(pr["title"], "Fix the greeting in acme/widget");
    let body = pr["body"].as_str().unwrap();
    assert!(body.contains("Fixes #42"), "{body}");
    assert!(body.contains("I added greeting.txt"), "{body}");
    assert!(body.contains(&run.to_string()), "{body}");
    // The issue comment links the pull request.
    let comments = s.github.seen_to("POST", &format!("/repos/{REPO}/issues/42/comments"));
    assert_eq!(comments.len(), 1);
    assert!(comments[0].body["body"].as_str().unwrap().contains("https://github.test/acme/widget/pull/77"));
    // Every REST call used the token, and only as a bearer credential.
    let api = s.github.api_seen();
    assert!(!api.is_empty());
    for seen in api {
        assert_eq!(seen.auth.as_deref(), Some(format!("Bearer {}", s.token).as_str()), "{seen:?}");
    }
    // git went over smart HTTP, every request with the token as basic auth:
    // the checkout's clone (upload-pack) and the delivery's clone and push
    // (receive-pack).
    let git = s.github.git_seen();
    let paths: Vec<String> = git.iter().map(|g| format!("{} {}", g.method, g.path)).collect();
    for service in ["git-upload-pack", "git-receive-pack"] {
        assert!(paths.contains(&format!("POST /{REPO}.git/{service}")), "no {service}: {paths:?}");
    }
    for seen in &git {
        assert_eq!(seen.auth.as_deref(), Some(git_basic_auth(&s.token).as_str()), "{seen:?}");
    }
    // And the fake does want it: without the token git is turned away.
    let anonymous = tokio::process::Command::new("git")
        .args(["ls-remote", &s.github.clone_url(REPO)])
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .await
        .unwrap();
    assert!(!anonymous.status.success(), "the fake GitHub served git without a token: {anonymous:?}");
    assert_eq!(s.github.git_seen().last().unwrap().auth, None);
}

#[tokio::test]
async fn a_run_without_changes_on_a_pull_request_comments_its_answer() {
    let s = setup(vec![
        Reply::tool("bash", json!({ "command": "cat feature.txt" })),
        Reply::text("Nothing to change: the greeting is already right."),
    ])
    .await;
    // A comment on pull request #7: the run works on the PR's branch.
    let run = github_run(&s, 7, true, Some(556)).await;
    let evs = s.app.wait_for_event(run, "delivery.succeeded").await;
    assert_eq!(run_status(&s, run).await, RunStatus::Succeeded);
    let cat = pick!(evs, EventBody::ToolResult { output, .. } => output).next().unwrap();
    assert!(cat.contains("only on the feature branch"), "{cat:?}");
    assert_eq!(s.github.seen_to("GET", &format!("/repos/{REPO}/pulls/7")).len(), 1);

    assert!(s.github.seen_to("POST", &format!("/repos/{REPO}/pulls")).is_empty(), "no pull request without changes");
    let comments = s.github.seen_to("POST", &format!("/repos/{REPO}/issues/7/comments"));
    assert_eq!(comments.len(), 1);
    let body = comments[0].body["body"].as_str().unwrap();
    assert!(body.contains("without changing any files"), "{body}");
    assert!(body.contains("Nothing to change: the greeting is already right."), "{body}");
    assert!(!s.repo.git(&["branch", "--list", "kiln/*"]).contains("kiln/"), "no branch pushed");
    assert_token_absent(&s, run).await;
}

#[tokio::test]
async fn a_failed_labelled_run_says_working_on_it_then_comments_the_reason() {
    let s = setup(vec![Reply::error(400)]).await;
    let run = github_run(&s, 9, false, None).await;
    s.app.wait_for_event(run, "delivery.succeeded").await;
    assert_eq!(run_status(&s, run).await, RunStatus::Failed);
    let comments = s.github.seen_to("POST", &format!("/repos/{REPO}/issues/9/comments"));
    assert_eq!(comments.len(), 2, "working on it, then the result: {comments:?}");
    let texts: Vec<&str> = comments.iter().map(|c| c.body["body"].as_str().unwrap()).collect();
    let ack = texts.iter().find(|t| t.contains("working on it")).expect("a working-on-it comment");
    assert!(ack.contains(&run.to_string()), "{ack}");
    let result = texts.iter().find(|t| t.contains("failed")).expect("a failure comment");
    assert!(result.contains(&run.to_string()), "{result}");
    assert!(s.github.seen_to("POST", &format!("/repos/{REPO}/pulls")).is_empty());
    assert_token_absent(&s, run).await;
}

#[tokio::test]
async fn when_github_is_down_delivery_fails_as_an_event_and_can_be_retried() {
    // The bash step gives the test time to take GitHub's API down once the
    // run is checked out (the sender's permission is asked before that, and
    // without an answer the run would not start).
    let s = setup(vec![
        Reply::tool("bash", json!({ "command": "sleep 2 && echo fixed > fix.txt" })),
        Reply::text("Fixed it."),
    ])
    .await;
    let run = github_run(&s, 5, false, Some(557)).await;
    s.app.wait_for_event(run, "sandbox.ready").await;
    s.github.set_api_down(true);
    let evs = s.app.wait_for_event(run, "delivery.failed").await;
    // The run's own result stands.
    assert_eq!(run_status(&s, run).await, RunStatus::Succeeded);
    assert!(kinds(&evs).contains(&"run.succeeded"));
    let failed = delivery_event(&evs);
    let EventBody::DeliveryFailed { error } = &failed.body else { panic!("{failed:?}") };
    assert!(error.contains("503"), "{failed:?}");
    assert_token_absent(&s, run).await;

    // GitHub is back; a client asks for the delivery again.
    s.github.set_api_down(false);
    let url = s.app.url(&format!("/v1/runs/{run}/deliver"));
    let r = s.app.http.post(&url).bearer_auth(token("github")).send().await.unwrap();
    assert_eq!(r.status(), 202);
    // Someone else's run is not theirs to deliver.
    let r = s.app.http.post(&url).bearer_auth(token("mallory")).send().await.unwrap();
    assert_eq!(r.status(), 404);

    s.app.wait_for_event(run, "delivery.succeeded").await;
    let branch = branch_of(5, run);
    assert_eq!(s.repo.git(&["show", &format!("{branch}:fix.txt")]), "fixed\n");
    assert_eq!(s.github.seen_to("POST", &format!("/repos/{REPO}/pulls")).len(), 1);
    assert_token_absent(&s, run).await;

    // Delivered: another request is refused.
    let r = s.app.http.post(&url).bearer_auth(token("github")).send().await.unwrap();
    assert_eq!(r.status(), 409);
}

#[tokio::test]
async fn deliver_refuses_runs_not_from_github() {
    let s = setup(vec![Reply::text("hi")]).await;
    let id = s.app.submit("alice", CreateRun::new("say hi")).await.id;
    let url = s.app.url(&format!("/v1/runs/{id}/deliver"));
    let r = s.app.http.post(&url).bearer_auth(token("alice")).send().await.unwrap();
    assert_eq!(r.status(), 409);
}

/// A worker with GitHub configured leaves API runs to themselves: no origin
/// lookup, no capture of their changes for GitHub, no delivery. (It used to
/// try to capture every successful API run and log that it failed.)
#[tokio::test]
async fn an_api_run_on_a_worker_with_github_touches_nothing_of_github() {
    let logs = Logs::capture(LevelFilter::DEBUG);
    let s = setup_idle(vec![Reply::text("hi")]).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let worker = s.app.start_worker_until(s.worker_config(|_| {}), stop.clone()).await;
    let id = s.app.submit("alice", CreateRun::new("say hi")).await.id;
    s.app.wait_for_event(id, "run.succeeded").await;
    // The delivery hooks run after the terminal event, in the run's task; a
    // stopping worker waits for its run tasks (and stops its delivery
    // loop), so once it has exited nothing more can come of this run.
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(60), worker).await.expect("the worker stops").unwrap();
    let evs = s.app.stored_events(id).await;
    assert!(kinds(&evs).contains(&"run.succeeded"), "{:?}", kinds(&evs));
    assert!(!kinds(&evs).iter().any(|k| k.starts_with("delivery.")), "{:?}", kinds(&evs));
    let log = logs.text();
    assert!(log.contains("run finished"), "the worker's log was not captured: {log}");
    assert!(!log.contains("for GitHub failed"), "the GitHub capture ran for an API run: {log}");
    assert!(s.github.seen().is_empty(), "GitHub was called for an API run");
}

/// A throwaway RSA key for the App test (PKCS#1, as GitHub issues them).
/// It signs nothing outside this file.
const TEST_APP_KEY: &str = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEAp4+6eSZTekpouH0WjcW3C0Yd3kO2Gp2zKHDD4Js4f2j7Ilkg\n55MjyS1+o7V0NNh17xODmZhp2Av2ymIIrRrba7Q7YjWSHi7rlFRUYg8lXw8fl0+F\neH2Poi064y6UWoQ6VgZ6E+vdC94MMQGv/n7LK1nP1Ia+VfOnChyUuALK897dSCUo\n2zn+39Ij5tueRhZbp1UdVXHJOwSopZNUOX5SdzgAMDc3J+93gFhWZQRyqtdhEa79\nO2JDjuqh58WvUDZhJiG0qwTLIp+zUOGgwLsiGlfgbFSlEefmZYEiHoVK88hy+HVW\nSxrq2EixgsvdYIcxksVxVuGAdUE4eUaZ8lMDBwIDAQABAoIBABKyxfWsV+HBrptH\nz4h/6Rk8+IBLwLqKS+qAtZsO4eh15/Br+cazHhSJGySxpFzGpa0e2a9ThBwz2ZUO\ns4vS/2wEGiGve2Aa5ExnzLLUoIWnGQ4NiwYTHOrVbp4uHdKsBsaAGodhPrLgUy6f\nfZWXbfH8fRC+Uzx24CEPZ258AUyNV8swDqSJx5LO3AZDfKjde3e/kSTLOVKeT8wl\nrYI/pLeAlRXMk95zKpWiVSEy5/EtvCWQUlNbUfcvgBTUiEeWhaC8xKZZ9lXOrHaQ\nqoqnCIFykYzR7g4RILk1ghVGePKe8shSPQ7I6TZMQW1IqIoQl8+MGp0Hi59yY6IR\nrf3HZEECgYEA4L31qHpcVmNBaYcoO0sep6nRotFJG0xhGyM15fPLcraAs3gJt4/g\nCD8nE/r8wu5BGDwSKSRrrvqUIhCSFcWhghCJRcfVJwl9W98z6cA5mQjKSTnZQ1Mt\nSu6KzgsW4F5W/+obty2JQKqs+O3Z/x9vGCa2Rqbgymdq+BhJk7d6qEkCgYEAvt3U\nDVscPg1aNV0mnNebpxy5ioMqeOTlpnCT4vTqH8VibZZIIweAfIdDRY7CnhdmcfpH\n70O2IC7p0v/42LtlgLD6fZ7ECUryAKLVBW+gFsAMV5qIoSxkThfD2nFRQuuazI2j\nOQ2VrcDDQzFRn54SwndDgS3Zq36fBe21GXpdcM8CgYEAxxhBqlFLv9QKPLxZbb2s\nmIeeiYiyJRbS58GXm/EQCL2Y4mSy5wT0SRn5OoAcr2t2C0wcIop7QvYFiO/5GoSM\nAbc4hLL1J7IGdf8T9D4wSFw7KAexay0icMFGAiZcy8OHewsgJnSWpM0Oky/S8Wod\ndt3EmG55sZVQdBzAAbaHWNECgYEAikFFCSemHYyue1kuTw4ewb4c6Ch663diol2J\nwiyGKt1fnuHs/vLAL3QLVqdCciGhI46X7MivdECHP0ALkXKs47tOtw/6EIEpKyzI\nAVgKLnCOgCaAMb9mKOsuA11x73eaefFe+kTM1z96MYHYDjcCf7rEOx5rPb5KkpDN\nTddFOCECgYBpIcjmXPkgGymbgxIc23N7hmFQJ8kCFmMGdyoK4LutvA2V1s3eRwbw\n5nRDBoE2AePr+uSSOISCEXlr2xtKbaTLuxpg7LDmJaHUCNXpGGGlHT//0e6C+PU4\nvJVBXWW9mHfxnRhYIpUCuRHcJLapD9yX89vsbuHkf85AsNkTKG/2wA==\n-----END RSA PRIVATE KEY-----\n";
const TEST_APP_PUBLIC_KEY: &str = "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAp4+6eSZTekpouH0WjcW3\nC0Yd3kO2Gp2zKHDD4Js4f2j7Ilkg55MjyS1+o7V0NNh17xODmZhp2Av2ymIIrRrb\na7Q7YjWSHi7rlFRUYg8lXw8fl0+FeH2Poi064y6UWoQ6VgZ6E+vdC94MMQGv/n7L\nK1nP1Ia+VfOnChyUuALK897dSCUo2zn+39Ij5tueRhZbp1UdVXHJOwSopZNUOX5S\ndzgAMDc3J+93gFhWZQRyqtdhEa79O2JDjuqh58WvUDZhJiG0qwTLIp+zUOGgwLsi\nGlfgbFSlEefmZYEiHoVK88hy+HVWSxrq2EixgsvdYIcxksVxVuGAdUE4eUaZ8lMD\nBwIDAQAB\n-----END PUBLIC KEY-----\n";

#[tokio::test]
async fn a_github_app_signs_a_jwt_and_caches_the_installation_token() {
    let credentials = Credentials::app("12345", TEST_APP_KEY.as_bytes()).unwrap();
    let script = vec![Reply::tool("bash", json!({ "command": "echo app > app.txt" })), Reply::text("Added app.txt.")];
    let s = setup_without_worker(script, credentials, "ghs_secretinstallation99".into(), Some(99)).await;
    s.start_worker().await;
    let run = github_run(&s, 11, false, Some(558)).await;
    let evs = s.app.wait_for_event(run, "delivery.succeeded").await;
    assert_eq!(delivery_event(&evs).kind(), "delivery.succeeded");
    assert_token_absent(&s, run).await;

    // One exchange serves the acknowledgement and the delivery.
    let exchanges = s.github.seen_to("POST", "/app/installations/99/access_tokens");
    assert_eq!(exchanges.len(), 1, "{:?}", s.github.seen());
    // Scoped to the run's one repository and to what delivery needs: a
    // repository outside the installation gets no token at all.
    assert_eq!(
        exchanges[0].body,
        json!({
            "repositories": ["widget"],
            "permissions": { "contents": "write", "pull_requests": "write", "issues": "write", "metadata": "read" }
        })
    );
    let jwt = exchanges[0].auth.as_deref().unwrap().strip_prefix("Bearer ").unwrap();
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    validation.set_issuer(&["12345"]);
    validation.set_required_spec_claims(&["exp", "iss", "iat"]);
    let key = jsonwebtoken::DecodingKey::from_rsa_pem(TEST_APP_PUBLIC_KEY.as_bytes()).unwrap();
    let claims = jsonwebtoken::decode::<Value>(jwt, &key, &validation).unwrap().claims;
    let lifetime = claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap();
    assert!(lifetime <= 600, "GitHub refuses App JWTs over 10 minutes: {lifetime}");
    // Everything else uses the installation token: REST as a bearer
    // credential, git as basic auth.
    for seen in s.github.api_seen().iter().filter(|r| !r.path.starts_with("/app/")) {
        assert_eq!(seen.auth.as_deref(), Some("Bearer ghs_secretinstallation99"), "{seen:?}");
    }
    let git = s.github.git_seen();
    assert!(!git.is_empty(), "git did not go over HTTP");
    for seen in &git {
        assert_eq!(seen.auth.as_deref(), Some(git_basic_auth("ghs_secretinstallation99").as_str()), "{seen:?}");
    }
    let branch = branch_of(11, run);
    assert_eq!(s.repo.git(&["show", &format!("{branch}:app.txt")]), "app\n");
}

/// Cancels `run` through the API, as its owner.
async fn cancel(s: &Setup, run: Uuid) -> u16 {
    let url = s.app.url(&format!("/v1/runs/{run}/cancel"));
    s.app.http.post(&url).bearer_auth(token("github")).send().await.unwrap().status().as_u16()
}

/// Comments posted on issue `n`.
fn comments_on(s: &Setup, n: i64) -> Vec<String> {
    s.github
        .seen_to("POST", &format!("/repos/{REPO}/issues/{n}/comments"))
        .iter()
        .map(|c| c.body["body"].as_str().unwrap().to_owned())
        .collect()
}

/// Waits until no delivery is owed or in progress for `run`, then a few
/// of the worker's polls for owed deliveries more. Settled, the row is not
/// owed, so a correct worker never claims it again; a worker that
/// delivers a settled run again (a claim that ignores the settlement, a
/// delivery left owed once made) does so at its next poll, which this
/// absence window lets happen: five polls, so a poll delayed by a busy
/// machine still falls inside it.
async fn settle(s: &Setup, run: Uuid) {
    let sql = s.app.sql().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let row = sql
            .query_one(
                "SELECT delivery_requested_at IS NULL AND delivery_holder IS NULL FROM github_runs WHERE run_id = $1",
                &[&run],
            )
            .await
            .unwrap();
        if row.get::<_, bool>(0) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the delivery never settled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(OWED_POLL * 5).await;
}

#[tokio::test]
async fn a_run_cancelled_while_queued_is_reported_once_by_a_worker_started_later() {
    // No worker: the run stays queued, and nobody ever claims it.
    let s = setup_idle(vec![Reply::text("never asked")]).await;
    let run = github_run(&s, 21, false, Some(560)).await;
    assert_eq!(run_status(&s, run).await, RunStatus::Queued);
    assert_eq!(cancel(&s, run).await, 200);
    assert_eq!(run_status(&s, run).await, RunStatus::Cancelled);
    assert!(s.github.seen().is_empty(), "no worker, so nothing on GitHub yet");

    // A worker that starts later reports it: it never runs it.
    s.start_worker().await;
    s.app.wait_for_event(run, "delivery.succeeded").await;
    settle(&s, run).await;
    let comments = comments_on(&s, 21);
    assert_eq!(comments.len(), 1, "{comments:?}");
    assert!(comments[0].contains("was cancelled"), "{}", comments[0]);
    assert!(comments[0].contains(&run.to_string()), "{}", comments[0]);
    assert_eq!(
        kinds(&s.app.stored_events(run).await),
        ["run.queued", "run.cancelled", "delivery.succeeded"],
        "reported once, never run"
    );
    // Nothing else: no 👀 for a run nobody worked on, no checkout, no PR.
    assert_eq!(s.github.seen().len(), 1, "{:?}", s.github.seen());
    assert!(s.app.model.requests().is_empty(), "the model was asked for a cancelled run");
    assert_token_absent(&s, run).await;
}

#[tokio::test]
async fn a_delivery_left_by_a_dead_worker_is_taken_over_when_its_lease_runs_out() {
    let s = setup_idle(vec![Reply::text("never asked")]).await;
    let run = github_run(&s, 22, false, Some(561)).await;
    assert_eq!(cancel(&s, run).await, 200);

    // Two workers reach for the owed delivery at once: one gets it. That
    // one dies without posting; its lease holds for 5 s more.
    let store = &s.app.store;
    let lease = Duration::from_secs(5);
    let claimed_at = tokio::time::Instant::now();
    let (a, b) =
        tokio::join!(store.claim_github_delivery(Some(run), lease), store.claim_github_delivery(Some(run), lease));
    let claimed = [a.unwrap(), b.unwrap()];
    assert_eq!(claimed.iter().filter(|c| c.is_some()).count(), 1, "exactly one claim wins");

    s.start_worker().await;
    // While the dead worker's lease holds, no one else delivers (the live
    // worker polls every 200 ms).
    tokio::time::sleep_until(claimed_at + Duration::from_secs(3)).await;
    assert!(comments_on(&s, 22).is_empty(), "delivered while another worker held the delivery");

    // Then the live worker takes it over, once.
    s.app.wait_for_event(run, "delivery.succeeded").await;
    assert!(claimed_at.elapsed() >= lease);
    settle(&s, run).await;
    let comments = comments_on(&s, 22);
    assert_eq!(comments.len(), 1, "{comments:?}");
    assert!(comments[0].contains("was cancelled"), "{}", comments[0]);
    let deliveries = s.app.stored_events(run).await.into_iter().filter(|e| e.kind().starts_with("delivery.")).count();
    assert_eq!(deliveries, 1);
}

#[tokio::test]
async fn a_run_the_reaper_gives_up_on_is_reported_by_another_worker() {
    let s = setup_idle(vec![Reply::text("never asked")]).await;
    let run = github_run(&s, 23, false, Some(562)).await;
    // Its last attempt's worker died holding it: the lease has run out.
    let n = s
        .app
        .sql()
        .await
        .execute(
            "UPDATE runs SET status = 'running', attempt = max_attempts, losses = max_attempts - 1,
                    lease_owner = 'dead-worker',
                    lease_expires_at = now() - interval '1 second'
             WHERE id = $1",
            &[&run],
        )
        .await
        .unwrap();
    assert_eq!(n, 1);

    // A live worker's reaper fails the run; the failure is reported.
    s.start_worker().await;
    s.app.wait_for_event(run, "delivery.succeeded").await;
    assert_eq!(run_status(&s, run).await, RunStatus::Failed);
    settle(&s, run).await;
    let comments = comments_on(&s, 23);
    assert_eq!(comments.len(), 1, "{comments:?}");
    assert!(comments[0].contains("failed: the worker running this run was lost"), "{}", comments[0]);
}

/// The fake's git bridge handles what git sends, compressed negotiations
/// included: a fetch by a clone with many commits the server lacks sends
/// enough `have` lines for git to gzip the request.
#[tokio::test]
async fn the_fake_github_serves_gzipped_git_negotiations() {
    let repo = BareRepo::create(REPO);
    let github = FakeGithub::start(repo.root().to_owned()).await;
    github.accept_git_token("ghs_secretfake");
    let auth = format!("http.extraHeader=Authorization: {}", git_basic_auth("ghs_secretfake"));
    let dir = tempfile::tempdir().unwrap();
    let git = |args: Vec<String>| {
        let mut cmd = tokio::process::Command::new("git");
        cmd.args(["-c", &auth, "-c", "user.name=Test", "-c", "user.email=test@example.com"])
            .args(args)
            .current_dir(dir.path())
            .env("GIT_TERMINAL_PROMPT", "0");
        async move {
            let out = cmd.output().await.unwrap();
            assert!(out.status.success(), "{out:?}");
        }
    };
    let args = |a: &str| a.split(' ').map(str::to_owned).collect::<Vec<_>>();
    git(vec!["clone".into(), "--quiet".into(), github.clone_url(REPO), "w".into()]).await;
    for i in 0..200 {
        git(args(&format!("-C w commit --quiet --allow-empty -m local{i}"))).await;
    }
    // A commit on the server the clone does not have yet.
    let tree = repo.git(&["rev-parse", "main^{tree}"]);
    let next = repo.git(&["commit-tree", tree.trim(), "-p", "main", "-m", "upstream"]);
    repo.git(&["update-ref", "refs/heads/main", next.trim()]);

    git(args("-C w fetch --quiet origin")).await;
    // Local only from here: no request to the fake, so blocking is fine.
    let fetched = kiln_tests::fake_github::git(dir.path(), &["-C", "w", "rev-parse", "origin/main"]);
    assert_eq!(fetched, next, "the fetch did not bring the new commit");
    let gzipped = github.git_seen().iter().filter(|s| s.encoding.as_deref() == Some("gzip")).count();
    assert!(gzipped > 0, "git sent no gzipped request: {:?}", github.git_seen());
}

/// A run's error is whatever the model, its commands or a service said:
/// posted under Kiln's account it must mention nobody, not address Kiln
/// again, and not open a block that swallows the rest of the comment.
#[tokio::test]
async fn a_failure_comment_quotes_the_error_so_it_mentions_and_triggers_nothing() {
    let s = setup_idle(vec![Reply::text("never asked")]).await;
    let run = github_run(&s, 24, false, Some(563)).await;
    let error = "model said: @someone look\n/kiln do more\n```\n@kiln and <b>bold</b> [x](http://e.test)";
    let n = s
        .app
        .sql()
        .await
        .execute("UPDATE runs SET status = 'failed', error = $2, finished_at = now() WHERE id = $1", &[&run, &error])
        .await
        .unwrap();
    assert_eq!(n, 1);
    let url = s.app.url(&format!("/v1/runs/{run}/deliver"));
    let asked = s.app.http.post(&url).bearer_auth(token("github")).send().await.unwrap();
    assert_eq!(asked.status().as_u16(), 202);
    s.start_worker().await;
    s.app.wait_for_event(run, "delivery.succeeded").await;
    settle(&s, run).await;

    let comments = comments_on(&s, 24);
    assert_eq!(comments.len(), 1, "{comments:?}");
    let body = &comments[0];
    // The error is all there, and the comment is Kiln's sentence to the end.
    assert!(body.contains("failed: model said: @"), "{body}");
    assert!(body.contains("do more"), "{body}");
    assert_eq!(body.lines().count(), 1, "the error opened lines of its own: {body}");
    // No mention: every `@` is followed by something no login starts with.
    for (at, _) in body.match_indices('@') {
        let next = body[at + 1..].chars().next();
        assert!(!next.is_some_and(|c| c.is_ascii_alphanumeric()), "a mention at {at}: {body}");
    }
    // Kiln's webhook would not take it as a request, whoever posted it.
    let rules = kiln_api::github::TriggerRules::new("kiln", "kiln").unwrap();
    assert!(!rules.addresses_kiln(body), "{body}");
    // No fence, tag or link opened by the error.
    for markup in ["\n```", "<b>", "[x](http"] {
        assert!(!body.contains(markup), "{markup:?} in {body}");
    }
}

/// Asks for the run's delivery again, as a client would after a failure.
async fn ask_delivery(s: &Setup, run: Uuid) {
    let url = s.app.url(&format!("/v1/runs/{run}/deliver"));
    let r = s.app.http.post(&url).bearer_auth(token("github")).send().await.unwrap();
    assert_eq!(r.status(), 202);
}

/// Waits for the run's `n`th `delivery.*` event (from 1) and returns it.
async fn nth_delivery(s: &Setup, run: Uuid, n: usize) -> Event {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let evs = s.app.stored_events(run).await;
        let kinds = kinds(&evs).join(", ");
        if let Some(e) = evs.into_iter().filter(|e| e.kind().starts_with("delivery.")).nth(n - 1) {
            return e;
        }
        assert!(tokio::time::Instant::now() < deadline, "no delivery event #{n}; got {kinds}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The error of a `delivery.failed` event.
fn delivery_error(event: &Event) -> &str {
    let EventBody::DeliveryFailed { error } = &event.body else { panic!("not a failed delivery: {event:?}") };
    error
}

/// Points `branch` of the fake's repository at a new commit on `parent`
/// made by someone other than Kiln; returns its id.
fn someone_elses_commit(repo: &BareRepo, branch: &str, parent: &str) -> String {
    let tree = repo.git(&["rev-parse", &format!("{parent}^{{tree}}")]);
    let commit = repo.git(&["commit-tree", tree.trim(), "-p", parent, "-m", "a human's commit"]);
    let commit = commit.trim().to_owned();
    repo.git(&["update-ref", &format!("refs/heads/{branch}"), &commit]);
    commit
}

/// The commit `rev` names in the fake's repository.
fn rev(repo: &BareRepo, rev: &str) -> String {
    repo.git(&["rev-parse", rev]).trim().to_owned()
}

/// Two runs on one issue, queued within the same second (their ids share
/// their leading, timestamp, digits), each get their own branch and pull
/// request, each branch holding that run's commit.
#[tokio::test]
async fn two_runs_on_one_issue_push_to_branches_of_their_own() {
    let s = setup_idle(vec![
        Reply::tool("bash", json!({ "command": "echo one > who.txt" })),
        Reply::text("Wrote one."),
        Reply::tool("bash", json!({ "command": "echo two > who.txt" })),
        Reply::text("Wrote two."),
    ])
    .await;
    let a = github_run(&s, 34, false, Some(564)).await;
    let b = github_run(&s, 34, false, Some(565)).await;
    // One run at a time, so each follows its half of the script.
    s.start_worker_with(|config| config.concurrency = 1).await;
    for run in [a, b] {
        let evs = s.app.wait_for_event(run, "delivery.succeeded").await;
        assert_eq!(delivery_event(&evs).kind(), "delivery.succeeded");
    }

    let (branch_a, branch_b) = (branch_of(34, a), branch_of(34, b));
    assert_ne!(branch_a, branch_b);
    let mut contents = Vec::new();
    for (run, branch) in [(a, &branch_a), (b, &branch_b)] {
        let message = s.repo.git(&["log", "-1", "--format=%B", branch]);
        assert!(message.contains(&run.to_string()), "{branch} does not hold run {run}'s commit: {message}");
        assert_eq!(rev(&s.repo, &format!("{branch}~1")), rev(&s.repo, "main"));
        contents.push(s.repo.git(&["show", &format!("{branch}:who.txt")]));
    }
    contents.sort();
    assert_eq!(contents, ["one\n", "two\n"]);
    let mut heads: Vec<String> = s
        .github
        .seen_to("POST", &format!("/repos/{REPO}/pulls"))
        .iter()
        .map(|p| p.body["head"].as_str().unwrap().to_owned())
        .collect();
    heads.sort();
    let mut expected = vec![branch_a, branch_b];
    expected.sort();
    assert_eq!(heads, expected);
}

/// A run whose branch was pushed before opening its pull request failed
/// (every attempt at it answered 502).
async fn pushed_but_no_pull_request(issue: i64, comment: i64) -> (Setup, Uuid) {
    let s =
        setup(vec![Reply::tool("bash", json!({ "command": "echo fixed > fix.txt" })), Reply::text("Fixed it.")]).await;
    // The test's retry policy makes 4 attempts.
    s.github.set_flaky(&format!("/repos/{REPO}/pulls"), 4);
    let run = github_run(&s, issue, false, Some(comment)).await;
    let failed = nth_delivery(&s, run, 1).await;
    assert!(delivery_error(&failed).contains("502"), "{failed:?}");
    assert_eq!(s.repo.git(&["show", &format!("{}:fix.txt", branch_of(issue, run))]), "fixed\n");
    (s, run)
}

/// A retried delivery finds its own branch from the first attempt and
/// opens the pull request from it as it is (it does not push the change
/// again as a new commit).
#[tokio::test]
async fn a_retried_delivery_after_a_partial_push_opens_the_pull_request() {
    let (s, run) = pushed_but_no_pull_request(32, 566).await;
    let branch = branch_of(32, run);
    let pushed = rev(&s.repo, &branch);
    // Commit times are in seconds: a commit made again now gets a new id.
    tokio::time::sleep(Duration::from_millis(1100)).await;

    ask_delivery(&s, run).await;
    let second = nth_delivery(&s, run, 2).await;
    assert_eq!(second.kind(), "delivery.succeeded", "{second:?}");
    assert_eq!(rev(&s.repo, &branch), pushed, "the retry rewrote the branch");
    let pulls = s.github.seen_to("POST", &format!("/repos/{REPO}/pulls"));
    assert_eq!(pulls.len(), 5, "four 502s, then one success");
    assert_eq!(pulls[4].body["head"], branch.as_str());
}

/// Someone pushes onto Kiln's branch between two attempts at its delivery:
/// the retry fails, saying why, and leaves their commit in place.
#[tokio::test]
async fn a_branch_moved_between_attempts_is_not_overwritten() {
    let (s, run) = pushed_but_no_pull_request(31, 563).await;
    let branch = branch_of(31, run);
    let theirs = someone_elses_commit(&s.repo, &branch, &branch);

    ask_delivery(&s, run).await;
    let second = nth_delivery(&s, run, 2).await;
    let error = delivery_error(&second);
    assert!(error.contains(&branch) && error.contains("does not overwrite"), "{error}");
    assert_eq!(rev(&s.repo, &branch), theirs, "the other commit was overwritten");
    assert_eq!(s.github.seen_to("POST", &format!("/repos/{REPO}/pulls")).len(), 4, "no pull request");
}

/// A branch of the run's name that someone else made is left alone.
#[tokio::test]
async fn an_existing_branch_of_the_same_name_is_not_overwritten() {
    let s = setup_idle(vec![Reply::tool("bash", json!({ "command": "echo fixed > fix.txt" })), Reply::text("Fixed.")])
        .await;
    let run = github_run(&s, 33, false, Some(567)).await;
    let branch = branch_of(33, run);
    let theirs = someone_elses_commit(&s.repo, &branch, "main");
    s.start_worker().await;

    let failed = nth_delivery(&s, run, 1).await;
    let error = delivery_error(&failed);
    assert!(error.contains(&branch) && error.contains("does not overwrite"), "{error}");
    assert_eq!(run_status(&s, run).await, RunStatus::Succeeded);
    assert_eq!(rev(&s.repo, &branch), theirs, "the other branch was overwritten");
    assert!(s.github.seen_to("POST", &format!("/repos/{REPO}/pulls")).is_empty());
}

// ---------------------------------------------------------------------------
// Where the token goes, who may trigger, what lands
// ---------------------------------------------------------------------------

/// The payload's `clone_url` is not where the token goes: the worker builds
/// the repository's URL from its configured GitHub, and a payload naming
/// another host fails the run before anything is sent there.
#[tokio::test]
async fn a_foreign_clone_url_gets_no_request_and_no_token() {
    let s = setup(vec![Reply::text("never asked")]).await;
    // Another server on loopback that would gladly serve the repository.
    let elsewhere_repo = BareRepo::create(REPO);
    let elsewhere = FakeGithub::start(elsewhere_repo.root().to_owned()).await;
    elsewhere.accept_git_token(&s.token);
    let foreign = elsewhere.clone_url(REPO);
    let run =
        github_run_with(&s, 12, false, Some(570), |p| p["repository"]["clone_url"] = foreign.clone().into()).await;
    s.app.wait_for_event(run, "delivery.succeeded").await;
    assert_eq!(run_status(&s, run).await, RunStatus::Failed);
    assert!(elsewhere.seen().is_empty(), "the foreign host was contacted: {:?}", elsewhere.seen());
    let error = s.app.store.get_run_unscoped(run).await.unwrap().unwrap().error.unwrap();
    assert!(error.contains("clone URL") && error.contains(&s.github.clone_url(REPO)), "{error}");
    assert!(s.github.git_seen().is_empty(), "nothing was cloned");
    assert_token_absent(&s, run).await;
}

/// An author association or a label says nothing about push access: the
/// worker asks GitHub for the sender's permission before any work, and a
/// reader or triager gets a comment saying why, and no clone, no push, no PR.
#[tokio::test]
async fn senders_without_write_access_get_no_clone_no_push_and_a_reason() {
    let s = setup(vec![Reply::text("never asked")]).await;
    s.github.set_role("Codertocat", "read");
    let commented = github_run(&s, 13, false, Some(571)).await;
    s.app.wait_for_event(commented, "delivery.succeeded").await;
    assert_eq!(run_status(&s, commented).await, RunStatus::Failed);
    s.github.set_role("Codertocat", "triage");
    let labelled = github_run(&s, 14, false, None).await;
    s.app.wait_for_event(labelled, "delivery.succeeded").await;
    assert_eq!(run_status(&s, labelled).await, RunStatus::Failed);

    assert!(s.github.git_seen().is_empty(), "git was used: {:?}", s.github.git_seen());
    assert!(s.github.seen_to("POST", &format!("/repos/{REPO}/pulls")).is_empty());
    assert!(s.github.seen_to("POST", &format!("/repos/{REPO}/issues/comments/571/reactions")).is_empty());
    for (issue, role) in [(13, "read"), (14, "triage")] {
        let comments = comments_on(&s, issue);
        assert_eq!(comments.len(), 1, "only the reason: {comments:?}");
        assert!(comments[0].contains(role) && comments[0].contains("write"), "{}", comments[0]);
    }
    let checks = s.github.seen_to("GET", &format!("/repos/{REPO}/collaborators/Codertocat/permission"));
    assert_eq!(checks.len(), 2);
}

/// A change to `.github/` (workflows run with the repository's secrets) is
/// not pushed; the issue is told why.
#[tokio::test]
async fn a_patch_touching_github_workflows_is_not_pushed_and_the_issue_says_why() {
    let s = setup(vec![
        Reply::tool(
            "bash",
            json!({ "command": "mkdir -p .github/workflows && echo 'on: push' > .github/workflows/x.yml && echo ok > ok.txt" }),
        ),
        Reply::text("Added a workflow."),
    ])
    .await;
    let run = github_run(&s, 15, false, Some(572)).await;
    let evs = s.app.wait_for_event(run, "delivery.succeeded").await;
    assert_eq!(run_status(&s, run).await, RunStatus::Succeeded);
    let EventBody::DeliverySucceeded { pull_request, .. } = &delivery_event(&evs).body else { panic!() };
    assert_eq!(pull_request, &None);
    let pushes: Vec<_> = s.github.git_seen().into_iter().filter(|g| g.path.ends_with("git-receive-pack")).collect();
    assert!(pushes.is_empty(), "something was pushed: {pushes:?}");
    assert!(!s.repo.git(&["branch", "--list", "kiln/*"]).contains("kiln/"), "no branch pushed");
    assert!(s.github.seen_to("POST", &format!("/repos/{REPO}/pulls")).is_empty());
    let comments = comments_on(&s, 15);
    assert_eq!(comments.len(), 1, "{comments:?}");
    assert!(comments[0].contains(".github/workflows/x.yml") && comments[0].contains("not pushed"), "{}", comments[0]);
}

#[tokio::test]
async fn a_background_process_cannot_change_the_workspace_after_its_patch_is_taken() {
    // The run leaves a process behind (its own session, so the call's end
    // does not stop it) that rewrites counter.txt every 10 ms. The patch is
    // taken only once it is stopped, so the pushed counter is the one the
    // workspace keeps: nothing changes it after (or while) it is taken.
    // The counter is written to a temporary file and renamed, so the file is
    // never seen half-written (`echo > f` truncates first; a process stopped
    // between the truncation and the write leaves it empty, which once made
    // this test fail for a reason that is not the one it exists for).
    let s = setup_idle(vec![
        Reply::tool(
            "bash",
            json!({ "command": "setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > .counter.tmp; mv .counter.tmp counter.txt; sleep 0.01; done' \
                                >/dev/null 2>&1 < /dev/null & sleep 0.5; echo started" }),
        ),
        Reply::text("I left a counter running."),
    ])
    .await;
    s.start_worker_with(|c| c.sandbox_idle = Duration::from_secs(600)).await;
    let run = github_run(&s, 43, false, None).await;
    s.app.wait_for_event(run, "delivery.succeeded").await;
    let pushed = s.repo.git(&["show", &format!("{}:counter.txt", branch_of(43, run))]);
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let containers = s.app.containers_of(&run.to_string()).await;
    assert_eq!(containers.len(), 1, "the session's container stays");
    let exec = docker
        .create_exec(
            &containers[0],
            bollard::exec::CreateExecOptions {
                cmd: Some(vec!["cat", "/workspace/counter.txt"]),
                attach_stdout: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut now = String::new();
    if let bollard::exec::StartExecResults::Attached { mut output, .. } =
        docker.start_exec(&exec.id, None).await.unwrap()
    {
        while let Some(Ok(chunk)) = futures::StreamExt::next(&mut output).await {
            now.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
        }
    }
    // As Kiln removes one: with its volumes and its loop disk.
    kiln_worker::sandbox::remove_by_id(&docker, &containers[0]).await;
    assert!(pushed.trim().parse::<u64>().unwrap() > 1, "the counter ran: {pushed:?}");
    assert_eq!(now, pushed, "the workspace changed after its patch was taken");
}

/// A repository mapped to an environment (`KILN_GITHUB_ENVIRONMENTS`) gets
/// the GitHub owner subject's environment of that name: set up on the
/// first run, a hit on the next after the default branch moved (the
/// token's shallow checkout brought in place), and both delivered.
#[tokio::test]
async fn a_repository_mapped_to_an_environment_gets_it_on_every_run_and_still_delivers() {
    let look = "cat ~/.widget/ok; git log -1 --format=%s";
    let script = vec![
        Reply::tool("bash", json!({ "command": format!("{look}; echo 'hello from kiln' > greeting.txt") })),
        Reply::text("Added greeting.txt."),
        Reply::tool("bash", json!({ "command": format!("{look}; echo 'second' > second.txt") })),
        Reply::text("Added second.txt."),
    ];
    let gh_token = format!("ghs_secret{}", Uuid::new_v4().simple());
    let options = Options {
        script,
        worker: false,
        github_secret: Some(WEBHOOK_SECRET.into()),
        github_environments: format!("other/repo=nothing, {}=widget-env", REPO.to_uppercase()),
        ..Default::default()
    };
    let s = setup_with(options, Credentials::Token(gh_token.as_str().into()), gh_token, None).await;
    // The environment belongs to the subject that owns GitHub runs.
    let setup = "echo widget-setup-ran; mkdir -p ~/.widget && echo tool-ready > ~/.widget/ok";
    let body = json!({"name": "widget-env", "setup_script": setup, "maintenance_script": "echo widget-maintained"});
    let created = s.app.http.post(s.app.url("/v1/environments")).bearer_auth(token("github")).json(&body).send().await;
    assert_eq!(created.unwrap().status(), 201);
    s.start_worker().await;

    let first = github_run(&s, 42, false, Some(601)).await;
    let evs = s.app.wait_for_event(first, "delivery.succeeded").await;
    let started: Vec<(String, bool)> =
        pick!(evs, EventBody::EnvironmentStarted { environment, hit, .. } => (environment.clone(), *hit)).collect();
    assert_eq!(started, [("widget-env".to_owned(), false)], "{:?}", kinds(&evs));
    let setup_out: String = pick!(evs, EventBody::EnvironmentOutput { text, .. } => text.clone()).collect();
    assert!(setup_out.contains("widget-setup-ran"), "{setup_out}");
    let out: String = pick!(evs, EventBody::ToolResult { output, .. } => output.clone()).collect();
    assert!(out.contains("tool-ready"), "the setup's result is not in the agent's sandbox: {out}");
    assert_eq!(s.repo.git(&["show", &format!("{}:greeting.txt", branch_of(42, first))]), "hello from kiln\n");
    assert_token_absent(&s, first).await;

    let main = rev(&s.repo, "main");
    someone_elses_commit(&s.repo, "main", &main);
    let second = github_run(&s, 43, false, Some(602)).await;
    let evs = s.app.wait_for_event(second, "delivery.succeeded").await;
    let started: Vec<bool> = pick!(evs, EventBody::EnvironmentStarted { hit, .. } => *hit).collect();
    assert_eq!(started, [true], "the second run did not reuse the prepared sandbox: {:?}", kinds(&evs));
    let out: String = pick!(evs, EventBody::ToolResult { output, .. } => output.clone()).collect();
    assert!(out.contains("tool-ready") && out.contains("a human's commit"), "{out}");
    let maintained: String = pick!(evs, EventBody::EnvironmentOutput { text, .. } => text.clone()).collect();
    assert!(maintained.contains("widget-maintained"), "{maintained}");
    let branch = branch_of(43, second);
    assert_eq!(s.repo.git(&["show", &format!("{branch}:second.txt")]), "second\n");
    assert_eq!(rev(&s.repo, &format!("{branch}~1")), rev(&s.repo, "main"), "not based on the moved main");
    let key: Vec<String> = pick!(evs, EventBody::EnvironmentStarted { cache_key, .. } => cache_key.clone()).collect();
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let options = bollard::query_parameters::RemoveImageOptionsBuilder::new().force(true).build();
    let _ = docker.remove_image(&format!("kiln-env:{}", key[0]), Some(options), None).await;
}

/// Files the environment's setup leaves in the workspace (a dependency
/// folder the repository does not ignore, a tool's log) are not the run's
/// changes: the pull request holds only what the agent edited.
#[tokio::test]
async fn a_pull_request_from_a_run_with_an_environment_holds_only_the_agents_changes() {
    let script = vec![
        Reply::tool("bash", json!({ "command": "ls vendor setup.log && echo 'edited by kiln' > greeting.txt" })),
        Reply::text("Edited greeting.txt."),
    ];
    let gh_token = format!("ghs_secret{}", Uuid::new_v4().simple());
    let options = Options {
        script,
        worker: false,
        github_secret: Some(WEBHOOK_SECRET.into()),
        github_environments: format!("{REPO}=leaves-files"),
        ..Default::default()
    };
    let s = setup_with(options, Credentials::Token(gh_token.as_str().into()), gh_token, None).await;
    let setup = "mkdir -p vendor/pkg && echo dep > vendor/pkg/index.js && echo installed > setup.log";
    let body = json!({"name": "leaves-files", "setup_script": setup});
    let created = s.app.http.post(s.app.url("/v1/environments")).bearer_auth(token("github")).json(&body).send().await;
    assert_eq!(created.unwrap().status(), 201);
    s.start_worker().await;

    let run = github_run(&s, 44, false, Some(603)).await;
    let evs = s.app.wait_for_event(run, "delivery.succeeded").await;
    let out: String = pick!(evs, EventBody::ToolResult { output, .. } => output.clone()).collect();
    assert!(out.contains("setup.log") && out.contains("pkg"), "setup's files are not in the workspace: {out}");
    let branch = branch_of(44, run);
    let changed = s.repo.git(&["diff", "--name-only", "main", &branch]);
    assert_eq!(changed.trim(), "greeting.txt", "the pull request holds more than the agent's edit");
    let key: Vec<String> = pick!(evs, EventBody::EnvironmentStarted { cache_key, .. } => cache_key.clone()).collect();
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let options = bollard::query_parameters::RemoveImageOptionsBuilder::new().force(true).build();
    let _ = docker.remove_image(&format!("kiln-env:{}", key[0]), Some(options), None).await;
}
