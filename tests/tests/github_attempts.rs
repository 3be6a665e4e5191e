//! Groups of attempts asked for on GitHub (issue 29): `/kiln --attempts N`
//! runs the task N times; when every attempt has ended the issue gets a
//! summary of them, and the pull request is opened only once one is chosen
//! (`/kiln select K` or `POST /v1/runs/{id}/select`), with that attempt's
//! change only; after that the choice stands (409). With
//! `KILN_GITHUB_ATTEMPTS_TAKE_FIRST` the first attempt to succeed is chosen
//! and its pull request opened at once. Against the fake GitHub
//! (`kiln_tests::fake_github`), real Postgres and Docker.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use kiln_protocol::{EventBody, Run, RunStatus};
use kiln_tests::fake_github::{BareRepo, FakeGithub};
use kiln_tests::github_kiln::{fixture, github_against, send_webhook};
use kiln_tests::kiln_scripted_model::Reply;
use kiln_tests::{Event, Options, TestApp, kinds, token, worker_config};
use kiln_worker::ProviderKind;
use kiln_worker::github::Credentials;
use serde_json::{Value, json};
use uuid::Uuid;

const REPO: &str = "acme/widget";
const WEBHOOK_SECRET: &str = "attempts-test-webhook-secret";

struct Setup {
    app: TestApp,
    github: FakeGithub,
    repo: BareRepo,
}

/// Kiln with the webhook on (`take_first`: KILN_GITHUB_ATTEMPTS_TAKE_FIRST)
/// and one worker running one run at a time, so the attempts take the
/// script's replies in turn: each writes what its first reply says.
async fn setup(script: Vec<Reply>, take_first: bool) -> Setup {
    let options = Options {
        script,
        worker: false,
        github_secret: Some(WEBHOOK_SECRET.into()),
        github_take_first: take_first,
        ..Default::default()
    };
    let app = TestApp::spawn(options).await;
    let repo = BareRepo::create(REPO);
    let github = FakeGithub::start(repo.root().to_owned()).await;
    let token = format!("ghs_secret{}", Uuid::new_v4().simple());
    github.accept_git_token(&token);
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    config.concurrency = 1;
    config.allow_file_repos = false;
    config.github = Some(github_against(&github, Credentials::Token(token.as_str().into()), &app));
    app.start_worker(config).await;
    Setup { app, github, repo }
}

/// Attempt after attempt: write `attempt.txt` saying `words[i]`, answer;
/// `pause` before the last attempt's answer.
fn script(words: &[&str], pause: Duration) -> Vec<Reply> {
    let mut replies = Vec::new();
    for (i, word) in words.iter().enumerate() {
        replies.push(Reply::tool("bash", json!({ "command": format!("echo {word} > attempt.txt") })));
        let delay = if i + 1 == words.len() { pause } else { Duration::ZERO };
        replies.push(Reply::text(format!("I wrote {word}.")).with_delay(delay));
    }
    replies
}

/// Sends a signed `issue_comment.created` with `body` by `login` (an
/// OWNER) on issue `issue`; returns the answer's status and body.
async fn comment(s: &Setup, issue: i64, id: i64, login: &str, body: &str) -> (u16, Value) {
    let mut v = fixture("issue_comment.created.json");
    v["comment"]["id"] = id.into();
    v["comment"]["body"] = body.into();
    v["comment"]["author_association"] = "OWNER".into();
    v["comment"]["user"]["login"] = login.into();
    v["sender"]["login"] = login.into();
    v["repository"]["full_name"] = REPO.into();
    v["repository"]["clone_url"] = s.github.clone_url(REPO).into();
    v["repository"]["default_branch"] = "main".into();
    v["issue"]["number"] = issue.into();
    v.as_object_mut().unwrap().remove("installation");
    let response = send_webhook(&s.app, WEBHOOK_SECRET, "issue_comment", &v).await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// Asks for a group on `issue` with `command`; the group's id.
async fn ask(s: &Setup, issue: i64, command: &str) -> Uuid {
    let (status, body) = comment(s, issue, 7000 + issue, "Codertocat", command).await;
    assert_eq!(status, 201, "{body}");
    body["run_id"].as_str().unwrap().parse().unwrap()
}

fn comments_on(s: &Setup, n: i64) -> Vec<String> {
    s.github
        .seen_to("POST", &format!("/repos/{REPO}/issues/{n}/comments"))
        .iter()
        .map(|c| c.body["body"].as_str().unwrap().to_owned())
        .collect()
}

/// Waits for the `n`-th comment on issue `issue`.
async fn nth_comment(s: &Setup, issue: i64, n: usize) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(c) = comments_on(s, issue).get(n - 1) {
            return c.clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "no comment {n} on #{issue}: {:?}", comments_on(s, issue));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The group's `n`-th delivery event.
async fn nth_delivery(s: &Setup, group: Uuid, n: usize) -> Event {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let events = s.app.stored_events(group).await;
        let deliveries: Vec<&Event> = events
            .iter()
            .filter(|e| matches!(e.body, EventBody::DeliverySucceeded { .. } | EventBody::DeliveryFailed { .. }))
            .collect();
        if let Some(e) = deliveries.get(n - 1) {
            return (*e).clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "no delivery {n}: {:?}", kinds(&events));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn run(s: &Setup, id: Uuid) -> Run {
    s.app.run("github", id).await
}

async fn patch(s: &Setup, run: Uuid) -> String {
    let url = s.app.url(&format!("/v1/runs/{run}/patch"));
    let r = s.app.http.get(url).bearer_auth(token("github")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap()
}

async fn select(s: &Setup, group: Uuid, attempt: u32) -> (u16, Value) {
    s.app.post_json("github", &format!("/v1/runs/{group}/select"), json!({ "attempt": attempt })).await
}

fn pulls(s: &Setup) -> Vec<Value> {
    s.github.seen_to("POST", &format!("/repos/{REPO}/pulls")).into_iter().map(|p| p.body).collect()
}

/// What the group's branch holds in `attempt.txt`; and that it is one
/// commit on `main` changing that file only.
fn pushed(s: &Setup, issue: i64, group: Uuid) -> String {
    let branch = format!("kiln/issue-{issue}-{}", group.simple());
    assert_eq!(s.repo.git(&["rev-parse", &format!("{branch}~1")]), s.repo.git(&["rev-parse", "main"]));
    assert_eq!(s.repo.git(&["diff", "--name-only", "main", &branch]).trim(), "attempt.txt");
    s.repo.git(&["show", &format!("{branch}:attempt.txt")])
}

#[tokio::test]
async fn a_github_group_reports_its_attempts_then_opens_the_pull_request_of_the_chosen_second_only() {
    let s = setup(script(&["one", "two", "three"], Duration::ZERO), false).await;
    // mallory's comments pass the webhook's checks, but she may only read
    // the repository.
    s.github.set_role("mallory", "read");
    let group = ask(&s, 12, "/kiln --attempts 3 write attempt.txt").await;
    let attempts = run(&s, group).await.attempts.expect("a group of attempts");
    assert_eq!(attempts.len(), 3);

    // Every attempt has ended: one comment lists them and says how to
    // choose; no pull request yet.
    let summary = nth_comment(&s, 12, 1).await;
    assert!(summary.contains("Kiln tried this 3 times"), "{summary}");
    for k in 1..=3 {
        assert!(summary.contains(&format!("| {k} | succeeded | 2 |")), "{summary}");
    }
    assert!(summary.contains("1 file, +1 −0"), "{summary}");
    assert!(summary.contains("/kiln select K") && summary.contains(&format!("kiln select {group} K")), "{summary}");
    assert!(pulls(&s).is_empty(), "a pull request before any choice");
    assert_eq!(run(&s, group).await.status, RunStatus::Succeeded);
    // The trigger was acknowledged once, for the group.
    assert_eq!(s.github.seen_to("POST", &format!("/repos/{REPO}/issues/comments/7012/reactions")).len(), 1);

    // A choice by someone who may not push is taken, but pushed nowhere.
    let (status, body) = comment(&s, 12, 8001, "mallory", "/kiln select 3").await;
    assert_eq!((status, body["selected"].as_u64()), (200, Some(3)), "{body}");
    let refused = nth_delivery(&s, group, 2).await;
    let EventBody::DeliveryFailed { error } = &refused.body else { panic!("{refused:?}") };
    assert!(error.contains("@mallory has read access"), "{error}");
    assert!(pulls(&s).is_empty(), "a pull request for a reader's choice");

    // The owner chooses the second: the group's patch is the second's, and
    // the pull request carries its change only.
    let (status, body) = comment(&s, 12, 8002, "Codertocat", "/kiln select 2").await;
    assert_eq!((status, body["run_id"].as_str()), (200, Some(group.to_string().as_str())), "{body}");
    let delivered = nth_delivery(&s, group, 3).await;
    let EventBody::DeliverySucceeded { pull_request, .. } = &delivered.body else { panic!("{delivered:?}") };
    assert_eq!(pull_request.as_deref(), Some("https://github.test/acme/widget/pull/77"));
    let second = patch(&s, attempts[1]).await;
    assert_eq!(patch(&s, group).await, second);
    assert_eq!(pushed(&s, 12, group), format!("{}\n", second_word(&second)));
    for other in [attempts[0], attempts[2]] {
        assert_ne!(patch(&s, other).await, second, "the attempts should differ");
    }
    let prs = pulls(&s);
    assert_eq!(prs.len(), 1);
    assert!(prs[0]["body"].as_str().unwrap().contains(&format!("I wrote {}.", second_word(&second))));
    let opened = nth_comment(&s, 12, 2).await;
    assert!(opened.contains("attempt 2's change: https://github.test/acme/widget/pull/77"), "{opened}");

    // After delivery the choice stands: 409 through the API, refused by comment.
    let (status, body) = select(&s, group, 1).await;
    assert_eq!(status, 409, "{body}");
    let (status, body) = comment(&s, 12, 8003, "Codertocat", "/kiln select 1").await;
    assert_eq!(status, 202, "{body}");
    assert!(body["ignored"].as_str().unwrap().contains("already opened"), "{body}");
    assert_eq!(run(&s, group).await.selected_attempt, Some(2));
    assert_eq!(pulls(&s).len(), 1);
}

/// The word an attempt's patch wrote into `attempt.txt`.
fn second_word(patch: &str) -> &str {
    patch.lines().find_map(|l| l.strip_prefix('+').filter(|l| !l.starts_with("++"))).unwrap()
}

#[tokio::test]
async fn taking_the_first_success_opens_its_pull_request_while_the_others_still_run() {
    // The second attempt answers late: the first's pull request is open by then.
    let s = setup(script(&["first", "second"], Duration::from_secs(6)), true).await;
    let group = ask(&s, 21, "@kiln --attempts 2 write attempt.txt").await;
    let attempts = run(&s, group).await.attempts.unwrap();

    let delivered = nth_delivery(&s, group, 1).await;
    let EventBody::DeliverySucceeded { pull_request, .. } = &delivered.body else { panic!("{delivered:?}") };
    assert!(pull_request.is_some(), "{delivered:?}");
    let now = run(&s, group).await;
    assert_eq!(now.status, RunStatus::Running, "the other attempt should still be running");
    // The attempt that ran first (and answered "first") was chosen.
    let k = now.selected_attempt.expect("the first success is chosen");
    assert_eq!(pushed(&s, 21, group), "first\n");
    let (status, body) = select(&s, group, 3 - k).await;
    assert_eq!(status, 409, "{body}");

    // The group ends; nothing more lands on GitHub.
    let events = s.app.wait_for_event(group, "run.succeeded").await;
    assert_eq!(patch(&s, group).await, patch(&s, attempts[k as usize - 1]).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(pulls(&s).len(), 1);
    let comments = comments_on(&s, 21);
    assert_eq!(comments.len(), 1, "{comments:?}");
    assert!(comments[0].contains(&format!("attempt {k}'s change")), "{comments:?}");
    assert!(kinds(&events).contains(&"attempt.selected"), "{:?}", kinds(&events));
}

#[tokio::test]
async fn attempts_out_of_range_or_not_a_number_are_answered_on_the_issue() {
    let s = setup(Vec::new(), false).await;
    let run_id = ask(&s, 31, "/kiln --attempts 9 write attempt.txt").await;
    let reply = nth_comment(&s, 31, 1).await;
    assert!(
        reply.contains("out of range") && reply.contains("1 to 4") && reply.contains("KILN\\_MAX\\_ATTEMPTS"),
        "{reply}"
    );
    let failed = run(&s, run_id).await;
    assert_eq!((failed.status, failed.attempts), (RunStatus::Failed, None));

    let (status, body) = comment(&s, 32, 9032, "Codertocat", "/kiln --attempts lots").await;
    assert_eq!(status, 201, "{body}");
    let reply = nth_comment(&s, 32, 1).await;
    assert!(reply.contains("takes a number of attempts"), "{reply}");
    assert!(s.app.model.requests().is_empty(), "a refused request reached the model");
    // `/kiln select` where no group was asked for.
    let (status, body) = comment(&s, 33, 9033, "Codertocat", "/kiln select 1").await;
    assert_eq!(status, 202, "{body}");
    assert!(body["ignored"].as_str().unwrap().contains("no group of attempts"), "{body}");
}
