//! `POST /v1/webhooks/github` as GitHub sees it: signed deliveries of the
//! recorded payloads in `tests/fixtures/github/` (octokit/webhooks), edited
//! per test, compact-serialised and signed here the way GitHub signs them.
//!
//! No worker runs: a triggered run stays `queued`, and the tests read what
//! was stored (the run, its `github_runs` origin, the delivery row).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use futures::future::join_all;
use kiln_api::github::WebhookSecret;
use kiln_protocol::run::MAX_PROMPT_BYTES;
use kiln_store::GithubOrigin;
use kiln_tests::{GITHUB_BOT_LOGIN, Options, TestApp, token};
use reqwest::{Response, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

const WEBHOOK_SECRET: &str = "It's a Secret to Everybody";
/// The subject that owns webhook-created runs (the harness's setting).
const OWNER: &str = "github";

/// The API with GitHub webhooks enabled, without a worker.
async fn app() -> TestApp {
    TestApp::spawn(Options { worker: false, github_secret: Some(WEBHOOK_SECRET.into()), ..Default::default() }).await
}

fn fixture(name: &str) -> Value {
    let path = format!("{}/fixtures/github/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect(&path)).unwrap()
}

/// The `issue_comment.created` fixture with this comment body and author
/// association.
fn comment(body: &str, association: &str) -> Value {
    let mut v = fixture("issue_comment.created.json");
    v["comment"]["body"] = body.into();
    v["comment"]["author_association"] = association.into();
    v
}

fn sign(body: &[u8]) -> String {
    WebhookSecret::new(WEBHOOK_SECRET.as_bytes()).unwrap().sign(body)
}

fn new_delivery_id() -> String {
    Uuid::new_v4().to_string()
}

/// Sends `body` as delivery `id` of `event`, with `signature` as the
/// `X-Hub-Signature-256` header (none if `None`).
async fn send(app: &TestApp, event: &str, id: &str, body: Vec<u8>, signature: Option<String>) -> Response {
    let mut request = app
        .http
        .post(app.url("/v1/webhooks/github"))
        .header("content-type", "application/json")
        .header("user-agent", "GitHub-Hookshot/test")
        .header("x-github-event", event)
        .header("x-github-delivery", id)
        .body(body);
    if let Some(signature) = signature {
        request = request.header("x-hub-signature-256", signature);
    }
    request.send().await.unwrap()
}

/// Delivers `payload` compact-serialised and correctly signed.
async fn deliver(app: &TestApp, event: &str, id: &str, payload: &Value) -> Response {
    let body = serde_json::to_vec(payload).unwrap();
    let signature = sign(&body);
    send(app, event, id, body, Some(signature)).await
}

/// Asserts the status and returns the JSON body.
async fn json_of(response: Response, status: u16) -> Value {
    let got = response.status();
    let body: Value = response.json().await.unwrap();
    assert_eq!(got.as_u16(), status, "{body}");
    body
}

/// Asserts an error response: status, `error.code`, and a message
/// mentioning `why`.
async fn assert_error(response: Response, status: u16, code: &str, why: &str) {
    let body = json_of(response, status).await;
    assert_eq!(body["error"]["code"], code, "{body}");
    let message = body["error"]["message"].as_str().unwrap().to_lowercase();
    assert!(message.contains(&why.to_lowercase()), "message {message:?} should mention {why:?}");
}

/// Rows in `runs`, `sessions`, `webhook_deliveries` and `github_runs`.
async fn counts(app: &TestApp) -> [i64; 4] {
    let row = app
        .sql()
        .await
        .query_one(
            "SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM sessions),
                    (SELECT count(*) FROM webhook_deliveries), (SELECT count(*) FROM github_runs)",
            &[],
        )
        .await
        .unwrap();
    [row.get(0), row.get(1), row.get(2), row.get(3)]
}

/// The stored delivery row: (event, action, repo, run_id, outcome).
async fn delivery_row(app: &TestApp, id: &str) -> (String, Option<String>, Option<String>, Option<Uuid>, String) {
    let row = app
        .sql()
        .await
        .query_one("SELECT event, action, repo, run_id, outcome FROM webhook_deliveries WHERE delivery_id = $1", &[&id])
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4))
}

fn run_id_of(body: &Value) -> Uuid {
    body["run_id"].as_str().unwrap_or_else(|| panic!("no run_id in {body}")).parse().unwrap()
}

/// Delivers `payload` and asserts it was ignored (202) with a reason
/// mentioning `why`, that nothing but the delivery row was written, and that
/// a redelivery is a duplicate.
async fn assert_ignored(app: &TestApp, event: &str, payload: &Value, why: &str) {
    let id = new_delivery_id();
    let before = counts(app).await;
    let body = json_of(deliver(app, event, &id, payload).await, 202).await;
    let reason = body["ignored"].as_str().unwrap_or_else(|| panic!("no reason in {body}"));
    assert!(reason.contains(why), "reason {reason:?} should mention {why:?}");
    let after = counts(app).await;
    assert_eq!(after, [before[0], before[1], before[2] + 1, before[3]], "only the delivery is recorded");
    let (_, _, _, run_id, outcome) = delivery_row(app, &id).await;
    assert_eq!((run_id, outcome), (None, format!("ignored: {reason}")));
    let again = json_of(deliver(app, event, &id, payload).await, 200).await;
    assert_eq!(again, json!({"duplicate": true, "run_id": null}));
}

// ---------------------------------------------------------------------------
// Triggers
// ---------------------------------------------------------------------------

#[tokio::test]
async fn an_owner_mentioning_kiln_queues_one_run_and_a_redelivery_creates_nothing() {
    let app = app().await;
    let id = new_delivery_id();
    let payload = comment("@kiln please fix", "OWNER");

    let created = json_of(deliver(&app, "issue_comment", &id, &payload).await, 201).await;
    let run_id = run_id_of(&created);

    let run = app.get_run(OWNER, &run_id.to_string()).await;
    assert_eq!(run["trigger"], "github");
    assert_eq!(run["status"], "queued");
    assert_eq!(run["repo"], json!({"url": "https://github.com/Codertocat/Hello-World.git", "ref": "master"}));
    let prompt = run["prompt"].as_str().unwrap();
    assert!(prompt.contains("issue #1 of the GitHub repository Codertocat/Hello-World"), "{prompt}");
    assert!(prompt.contains("> Spelling error in the README file\n"), "{prompt}");
    assert!(prompt.contains("> It looks like you accidently spelled 'commit' with two 't's.\n"), "{prompt}");
    assert!(prompt.contains("The comment by @Codertocat that asked for this run:\n> @kiln please fix\n"), "{prompt}");
    assert!(prompt.contains("written by GitHub users"), "{prompt}");

    let origin = app.store.github_origin(run_id).await.unwrap().unwrap();
    assert_eq!(
        origin,
        GithubOrigin {
            event: "issue_comment".into(),
            repo_full_name: "Codertocat/Hello-World".into(),
            issue_number: 1,
            pr_number: None,
            comment_id: Some(492700400),
            installation_id: None,
            sender_login: "Codertocat".into(),
        }
    );
    let delivery = delivery_row(&app, &id).await;
    assert_eq!(
        delivery,
        (
            "issue_comment".into(),
            Some("created".into()),
            Some("Codertocat/Hello-World".into()),
            Some(run_id),
            "run".into()
        )
    );
    let queued: i64 = app
        .sql()
        .await
        .query_one("SELECT count(*) FROM events WHERE run_id = $1 AND kind = 'run.queued'", &[&run_id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(queued, 1);
    assert_eq!(counts(&app).await, [1, 1, 1, 1]);

    // GitHub's "Redeliver" sends the same delivery id.
    let again = json_of(deliver(&app, "issue_comment", &id, &payload).await, 200).await;
    assert_eq!(again, json!({"duplicate": true, "run_id": run_id.to_string()}));
    assert_eq!(counts(&app).await, [1, 1, 1, 1]);

    // The run belongs to the webhook owner, not to whoever holds a token.
    let other = app.http.get(app.url(&format!("/v1/runs/{run_id}"))).bearer_auth(token("alice")).send().await.unwrap();
    assert_eq!(other.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn slash_commands_from_members_and_collaborators_trigger() {
    let app = app().await;
    for (n, association) in ["MEMBER", "COLLABORATOR"].into_iter().enumerate() {
        let mut payload = comment("/kiln add a test for parse()", association);
        // Two comments: each has its own id.
        payload["comment"]["id"] = (1000 + n as i64).into();
        json_of(deliver(&app, "issue_comment", &new_delivery_id(), &payload).await, 201).await;
    }
    assert_eq!(counts(&app).await, [2, 2, 2, 2]);
}

#[tokio::test]
async fn a_comment_on_a_pull_request_records_the_pr_and_the_app_installation() {
    let app = app().await;
    let mut payload = fixture("issue_comment.created.with-installation.json");
    payload["comment"]["body"] = "@Kiln rebase this on main".into();
    payload["issue"]["pull_request"] = json!({"url": "https://api.github.com/repos/Codertocat/Hello-World/pulls/1"});
    let created = json_of(deliver(&app, "issue_comment", &new_delivery_id(), &payload).await, 201).await;
    let run_id = run_id_of(&created);

    let origin = app.store.github_origin(run_id).await.unwrap().unwrap();
    assert_eq!((origin.issue_number, origin.pr_number, origin.installation_id), (1, Some(1), Some(1)));
    let run = app.get_run(OWNER, &run_id.to_string()).await;
    // The head branch is not in the payload: no ref yet, the worker resolves it.
    assert_eq!(run["repo"], json!({"url": "https://github.com/Codertocat/Hello-World.git"}));
    assert!(run["prompt"].as_str().unwrap().contains("pull request #1"));
}

#[tokio::test]
async fn the_trigger_label_queues_a_run_and_other_labels_are_ignored() {
    let app = app().await;
    let mut payload = fixture("issues.labeled.json");
    assert_ignored(&app, "issues", &payload, "label `bug` is not Kiln's trigger label `kiln`").await;

    payload["label"]["name"] = "kiln".into();
    let created = json_of(deliver(&app, "issues", &new_delivery_id(), &payload).await, 201).await;
    let run_id = run_id_of(&created);
    let origin = app.store.github_origin(run_id).await.unwrap().unwrap();
    assert_eq!(
        (origin.event.as_str(), origin.comment_id, origin.sender_login.as_str()),
        ("issues", None, "Codertocat")
    );
    let run = app.get_run(OWNER, &run_id.to_string()).await;
    assert!(run["prompt"].as_str().unwrap().contains("@Codertocat asked for this by labelling the issue \"kiln\"."));

    // A bot adding the label starts nothing.
    payload["sender"]["type"] = "Bot".into();
    assert_ignored(&app, "issues", &payload, "bot").await;
    assert_eq!(counts(&app).await[0], 1);
}

// ---------------------------------------------------------------------------
// Deliveries Kiln does not act on
// ---------------------------------------------------------------------------

#[tokio::test]
async fn comments_from_authors_without_write_access_are_ignored() {
    let app = app().await;
    for association in ["NONE", "CONTRIBUTOR", "FIRST_TIME_CONTRIBUTOR"] {
        let payload = comment("@kiln please fix", association);
        assert_ignored(&app, "issue_comment", &payload, "not allowed to trigger").await;
    }
    assert_eq!(counts(&app).await[0], 0);
}

#[tokio::test]
async fn comments_that_do_not_address_kiln_are_ignored() {
    let app = app().await;
    for body in ["You are totally right! I'll get this fixed right away.", "ask @kilnbot", "> @kiln please fix\n+1"] {
        assert_ignored(&app, "issue_comment", &comment(body, "OWNER"), "does not mention @kiln").await;
    }
    assert_eq!(counts(&app).await[0], 0);
}

#[tokio::test]
async fn kiln_own_comments_and_other_bots_never_trigger() {
    let app = app().await;
    // Kiln as a GitHub App (`kiln[bot]`, type Bot), as a machine user
    // (login `kiln`), and another App echoing a request.
    for (login, kind) in [("kiln[bot]", "Bot"), ("kiln", "User"), ("dependabot[bot]", "Bot")] {
        let mut payload = comment("@kiln please fix", "OWNER");
        payload["sender"]["login"] = login.into();
        payload["sender"]["type"] = kind.into();
        payload["comment"]["user"]["login"] = login.into();
        payload["comment"]["user"]["type"] = kind.into();
        assert_ignored(&app, "issue_comment", &payload, "bot").await;
    }
    assert_eq!(counts(&app).await[0], 0);
}

/// With a person's or machine user's token, Kiln's comments are that
/// account's: a member, with write access, and no bot. They quote run text
/// that may well say `@kiln`, and must not start runs of their own.
#[tokio::test]
async fn comments_by_the_login_kiln_posts_as_never_trigger() {
    let app = app().await;
    for login in [GITHUB_BOT_LOGIN, &GITHUB_BOT_LOGIN.to_uppercase()] {
        let mut payload = comment("@kiln please fix\n/kiln do more", "MEMBER");
        payload["sender"]["login"] = login.into();
        payload["sender"]["type"] = "User".into();
        payload["comment"]["user"]["login"] = login.into();
        payload["comment"]["user"]["type"] = "User".into();
        assert_ignored(&app, "issue_comment", &payload, "bot").await;
    }
    assert_eq!(counts(&app).await[0], 0);
}

#[tokio::test]
async fn a_ping_is_answered_and_recorded() {
    let app = app().await;
    let id = new_delivery_id();
    let body = json_of(deliver(&app, "ping", &id, &fixture("ping.json")).await, 200).await;
    assert_eq!(body, json!({"ok": true}));
    let (event, _, repo, run_id, outcome) = delivery_row(&app, &id).await;
    assert_eq!(
        (event.as_str(), repo.as_deref(), run_id, outcome.as_str()),
        ("ping", Some("Octocoders/Hello-World"), None, "ping")
    );
    // A GitHub App's ping carries the app id; it is answered the same way.
    let body = json_of(deliver(&app, "ping", &new_delivery_id(), &fixture("ping.with-app_id.json")).await, 200).await;
    assert_eq!(body, json!({"ok": true}));
    assert_eq!(counts(&app).await, [0, 0, 2, 0]);
}

#[tokio::test]
async fn other_events_and_actions_are_ignored_with_a_reason() {
    let app = app().await;
    assert_ignored(&app, "pull_request", &fixture("pull_request.opened.json"), "does not act on `pull_request` events")
        .await;
    // Review comments on a diff line are a different event: not a trigger (yet).
    let review_comment = fixture("pull_request_review_comment.created.json");
    assert_ignored(&app, "pull_request_review_comment", &review_comment, "does not act on").await;
    assert_ignored(&app, "installation", &fixture("installation.created.json"), "does not act on").await;
    assert_ignored(&app, "issues", &fixture("issues.opened.json"), "with action `opened`").await;
    let mut edited = comment("@kiln please fix", "OWNER");
    edited["action"] = "edited".into();
    assert_ignored(&app, "issue_comment", &edited, "with action `edited`").await;
    assert_eq!(counts(&app).await[0], 0);
}

// ---------------------------------------------------------------------------
// Authentication and configuration
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_bad_or_missing_signature_is_401_and_stores_nothing() {
    let app = app().await;
    let body = serde_json::to_vec(&comment("@kiln please fix", "OWNER")).unwrap();
    let other_secret = WebhookSecret::new(b"not the secret").unwrap().sign(&body);
    let tampered = {
        let mut b = body.clone();
        b.extend_from_slice(b" ");
        sign(&b)
    };
    let digest = sign(&body)["sha256=".len()..].to_owned();
    let cases = [
        (None, "missing"),
        (Some(other_secret), "does not match"),
        (Some(tampered), "does not match"),
        (Some(format!("sha1={digest}")), "sha256="),
        (Some(digest), "sha256="),
        (Some("sha256=".to_owned()), "sha256="),
    ];
    for (signature, why) in cases {
        let response = send(&app, "issue_comment", &new_delivery_id(), body.clone(), signature).await;
        assert_error(response, 401, "unauthorized", why).await;
    }
    assert_eq!(counts(&app).await, [0, 0, 0, 0]);
}

#[tokio::test]
async fn without_a_configured_secret_every_delivery_is_refused() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let body = serde_json::to_vec(&comment("@kiln please fix", "OWNER")).unwrap();
    let unsigned = send(&app, "issue_comment", &new_delivery_id(), body.clone(), None).await;
    assert_error(unsigned, 404, "not_found", "webhooks are disabled").await;
    let signed = send(&app, "issue_comment", &new_delivery_id(), body.clone(), Some(sign(&body))).await;
    assert_error(signed, 404, "not_found", "KILN_GITHUB_WEBHOOK_SECRET").await;
    assert_eq!(counts(&app).await, [0, 0, 0, 0]);
}

#[tokio::test]
async fn the_webhook_needs_no_bearer_token_and_ignores_one() {
    let app = app().await;
    let body = serde_json::to_vec(&comment("@kiln please fix", "OWNER")).unwrap();
    // A valid token does not stand in for the signature.
    let response = app
        .http
        .post(app.url("/v1/webhooks/github"))
        .bearer_auth(token("alice"))
        .header("x-github-event", "issue_comment")
        .header("x-github-delivery", new_delivery_id())
        .body(body)
        .send()
        .await
        .unwrap();
    assert_error(response, 401, "unauthorized", "X-Hub-Signature-256").await;
}

// ---------------------------------------------------------------------------
// Concurrency
// ---------------------------------------------------------------------------

#[tokio::test]
async fn concurrent_copies_of_one_delivery_create_exactly_one_run() {
    let app = app().await;
    let id = new_delivery_id();
    let payload = comment("@kiln please fix", "OWNER");
    let responses = join_all((0..8).map(|_| deliver(&app, "issue_comment", &id, &payload))).await;
    let mut created = Vec::new();
    let mut duplicates = Vec::new();
    for response in responses {
        match response.status().as_u16() {
            201 => created.push(run_id_of(&response.json().await.unwrap())),
            200 => {
                let body: Value = response.json().await.unwrap();
                assert_eq!(body["duplicate"], true, "{body}");
                duplicates.push(run_id_of(&body));
            }
            other => panic!("unexpected status {other}: {}", response.text().await.unwrap()),
        }
    }
    assert_eq!(created.len(), 1, "exactly one copy creates the run");
    assert!(duplicates.iter().all(|d| *d == created[0]), "every duplicate names that run");
    assert_eq!(counts(&app).await, [1, 1, 1, 1]);
}

#[tokio::test]
async fn racing_copies_that_all_miss_the_lookup_still_create_one_run() {
    // Straight to the store, past the route's "seen before?" lookup, so every
    // copy reaches the insert and only the delivery's primary key decides.
    let app = app().await;
    let delivery = kiln_store::Delivery {
        id: new_delivery_id(),
        event: "issue_comment".into(),
        action: Some("created".into()),
        repo: Some("octo/hello".into()),
    };
    let new = kiln_store::NewGithubRun {
        owner: OWNER.into(),
        environment: None,
        prompt: "fix it".into(),
        repo: kiln_protocol::RepoSpec { url: "https://github.com/octo/hello.git".into(), git_ref: None },
        origin: GithubOrigin {
            event: "issue_comment".into(),
            repo_full_name: "octo/hello".into(),
            issue_number: 3,
            pr_number: None,
            comment_id: Some(9),
            installation_id: None,
            sender_login: "octocat".into(),
        },
        trigger_key: "issue_comment:9".into(),
        attempts: None,
        take_first_success: false,
        refusal: None,
    };
    let outcomes = join_all((0..8).map(|_| app.store.create_github_run(&delivery, &new, None))).await;
    let mut created = Vec::new();
    let mut duplicates = Vec::new();
    for outcome in outcomes {
        match outcome.unwrap() {
            kiln_store::Recorded::New { run_id } => created.push(run_id.unwrap()),
            kiln_store::Recorded::Duplicate(past) => duplicates.push(past.run_id.unwrap()),
            kiln_store::Recorded::Refused { reason } => panic!("refused without a quota: {reason}"),
        }
    }
    assert_eq!(created.len(), 1);
    assert!(duplicates.iter().all(|d| *d == created[0]));
    assert_eq!(counts(&app).await, [1, 1, 1, 1]);
}

// ---------------------------------------------------------------------------
// Hostile or broken input, with a valid signature
// ---------------------------------------------------------------------------

#[tokio::test]
async fn malformed_bodies_are_400_and_store_nothing() {
    let app = app().await;
    let cases: [(&[u8], &str); 4] = [
        (b"{\"action\": \"created\", ", "not valid JSON"),
        (b"[\"created\"]", "JSON object"),
        (b"{\"action\": \"created\", \"x\": \"\xff\xfe\"}", "not UTF-8"),
        (b"{\"action\": \"created\"}", "missing field `issue`"),
    ];
    for (body, why) in cases {
        let response = send(&app, "issue_comment", &new_delivery_id(), body.to_vec(), Some(sign(body))).await;
        assert_error(response, 400, "bad_request", why).await;
    }
    let mut no_number = comment("@kiln please fix", "OWNER");
    no_number["issue"].as_object_mut().unwrap().remove("number");
    let response = deliver(&app, "issue_comment", &new_delivery_id(), &no_number).await;
    assert_error(response, 400, "bad_request", "missing field `number`").await;
    let mut bad_url = comment("@kiln please fix", "OWNER");
    bad_url["repository"]["clone_url"] = "file:///etc".into();
    let response = deliver(&app, "issue_comment", &new_delivery_id(), &bad_url).await;
    assert_error(response, 400, "bad_request", "clone_url must be an http(s) URL").await;
    bad_url["repository"]["clone_url"] = "https://github.com/a b".into();
    let response = deliver(&app, "issue_comment", &new_delivery_id(), &bad_url).await;
    assert_error(response, 400, "bad_request", "repo.url").await;
    assert_eq!(counts(&app).await, [0, 0, 0, 0]);
}

#[tokio::test]
async fn missing_headers_and_form_encoding_are_refused_clearly() {
    let app = app().await;
    let body = serde_json::to_vec(&comment("@kiln please fix", "OWNER")).unwrap();
    let request =
        || app.http.post(app.url("/v1/webhooks/github")).header("x-hub-signature-256", sign(&body)).body(body.clone());
    let no_delivery = request().header("x-github-event", "issue_comment").send().await.unwrap();
    assert_error(no_delivery, 400, "bad_request", "missing X-GitHub-Delivery").await;
    let no_event = request().header("x-github-delivery", new_delivery_id()).send().await.unwrap();
    assert_error(no_event, 400, "bad_request", "missing X-GitHub-Event").await;
    let bad_id = request().header("x-github-event", "issue_comment").header("x-github-delivery", "a b").send().await;
    assert_error(bad_id.unwrap(), 400, "bad_request", "X-GitHub-Delivery").await;
    let form = request()
        .header("x-github-event", "issue_comment")
        .header("x-github-delivery", new_delivery_id())
        .header("content-type", "application/x-www-form-urlencoded")
        .send()
        .await
        .unwrap();
    assert_error(form, 415, "unsupported_media_type", "application/json").await;
    assert_eq!(counts(&app).await, [0, 0, 0, 0]);
}

#[tokio::test]
async fn a_body_over_one_mebibyte_is_413() {
    let app = app().await;
    let mut payload = comment("@kiln please fix", "OWNER");
    payload["issue"]["body"] = "x".repeat(1024 * 1024).into();
    let body = serde_json::to_vec(&payload).unwrap();
    let response = send(&app, "issue_comment", &new_delivery_id(), body.clone(), Some(sign(&body))).await;
    assert_error(response, 413, "payload_too_large", "larger than").await;
    assert_eq!(counts(&app).await, [0, 0, 0, 0]);
}

#[tokio::test]
async fn huge_and_hostile_text_makes_a_capped_prompt() {
    let app = app().await;
    // Over the API's usual 256 KiB body limit, under the webhook's 1 MiB.
    let mut payload = comment(&format!("@kiln please fix\n{}", "c".repeat(200_000)), "OWNER");
    payload["issue"]["title"] = format!("NUL \u{0} and a lone CR \r in the title {}", "t".repeat(5000)).into();
    payload["issue"]["body"] = "line\n".repeat(100_000).into();
    let body = serde_json::to_vec(&payload).unwrap();
    assert!(body.len() > 512 * 1024);
    let created =
        json_of(send(&app, "issue_comment", &new_delivery_id(), body.clone(), Some(sign(&body))).await, 201).await;
    let run = app.get_run(OWNER, &run_id_of(&created).to_string()).await;
    let prompt = run["prompt"].as_str().unwrap();
    assert!(prompt.len() <= MAX_PROMPT_BYTES, "{} bytes", prompt.len());
    assert_eq!(prompt.matches("[Kiln cut the text above here").count(), 3, "title, body and comment are each cut");
    assert!(prompt.contains("> NUL \u{FFFD} and a lone CR \u{FFFD} in the title"));
    assert!(prompt.contains("> @kiln please fix\n> ccc"));
}

// ---------------------------------------------------------------------------
// Replays and quotas
// ---------------------------------------------------------------------------

/// The delivery id is outside the signature: a captured signed body sent
/// again under a new id is the same event, and queues nothing more.
#[tokio::test]
async fn a_signed_body_replayed_under_new_delivery_ids_queues_one_run() {
    let app = app().await;
    let payload = comment("@kiln please fix", "OWNER");
    let run = run_id_of(&json_of(deliver(&app, "issue_comment", &new_delivery_id(), &payload).await, 201).await);
    for _ in 0..2 {
        let again = json_of(deliver(&app, "issue_comment", &new_delivery_id(), &payload).await, 200).await;
        assert_eq!(again, json!({"duplicate": true, "run_id": run.to_string()}));
    }
    assert_eq!(counts(&app).await, [1, 1, 3, 1]);

    // A label event: the same body again is a replay; the label added
    // again later (GitHub stamps the issue anew) is a new request.
    let mut label = fixture("issues.labeled.json");
    label["label"]["name"] = "kiln".into();
    let labelled = run_id_of(&json_of(deliver(&app, "issues", &new_delivery_id(), &label).await, 201).await);
    let again = json_of(deliver(&app, "issues", &new_delivery_id(), &label).await, 200).await;
    assert_eq!(again, json!({"duplicate": true, "run_id": labelled.to_string()}));
    label["issue"]["updated_at"] = "2019-05-16T09:00:00Z".into();
    json_of(deliver(&app, "issues", &new_delivery_id(), &label).await, 201).await;
    assert_eq!(counts(&app).await[0], 3);
}

/// Webhook runs all belong to one subject; the per-subject quota applies
/// per repository and per sender instead, and a delivery over it is
/// answered 202 with the reason and queues nothing.
#[tokio::test]
async fn webhook_runs_over_a_repository_or_sender_quota_are_ignored_with_the_reason() {
    let mut options = Options { worker: false, github_secret: Some(WEBHOOK_SECRET.into()), ..Default::default() };
    options.api.quota = kiln_store::Quota { max_active_runs: 100, max_runs_per_minute: 2 };
    let app = TestApp::spawn(options).await;
    let mut next_comment = 5000;
    let mut from = |login: &str, repo: &str| {
        let mut v = comment("/kiln go", "OWNER");
        next_comment += 1;
        v["comment"]["id"] = next_comment.into();
        v["comment"]["user"]["login"] = login.into();
        v["sender"]["login"] = login.into();
        v["repository"]["full_name"] = repo.into();
        v
    };
    for _ in 0..2 {
        json_of(deliver(&app, "issue_comment", &new_delivery_id(), &from("alice", "acme/one")).await, 201).await;
    }
    let before = counts(&app).await;
    let refused =
        json_of(deliver(&app, "issue_comment", &new_delivery_id(), &from("alice", "acme/two")).await, 202).await;
    let reason = refused["ignored"].as_str().unwrap();
    assert!(reason.contains("quota") && reason.contains("sender alice"), "{reason}");
    let refused =
        json_of(deliver(&app, "issue_comment", &new_delivery_id(), &from("bob", "acme/one")).await, 202).await;
    let reason = refused["ignored"].as_str().unwrap();
    assert!(reason.contains("quota") && reason.contains("repository acme/one"), "{reason}");
    let after = counts(&app).await;
    assert_eq!(after, [before[0], before[1], before[2] + 2, before[3]], "only the deliveries are recorded");
    // Someone else, elsewhere, is not held up.
    json_of(deliver(&app, "issue_comment", &new_delivery_id(), &from("bob", "acme/two")).await, 201).await;
}
