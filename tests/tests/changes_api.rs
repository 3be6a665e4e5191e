//! `GET /v1/runs/{id}/patch` and `/changes` over real HTTP and Postgres:
//! nothing before the run ends, the exact bytes kept after, 409 for a
//! change too large to keep, nothing of another subject's; the run object
//! carries the totals.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use kiln_protocol::changes::{ChangeScope, ChangeTotals, RunChanges};
use kiln_protocol::{CreateRun, EventBody, RepoSpec};
use kiln_tests::changes::staged_change;
use kiln_tests::git_repo::{git, repo_with};
use kiln_tests::{Options, TestApp, token};
use serde_json::Value;
use uuid::Uuid;

async fn get(app: &TestApp, sub: &str, path: &str) -> reqwest::Response {
    app.http.get(app.url(path)).bearer_auth(token(sub)).send().await.unwrap()
}

/// The status and the JSON error's code of an error answer.
async fn error(response: reqwest::Response) -> (u16, String, String) {
    let status = response.status().as_u16();
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("application/json"));
    let body: Value = response.json().await.unwrap();
    (status, body["error"]["code"].as_str().unwrap().to_owned(), body["error"]["message"].as_str().unwrap().to_owned())
}

/// A repository and, in a clone of it, a change: one file edited, one
/// added, one deleted, a binary file added.
fn repository_and_change() -> (tempfile::TempDir, String, tempfile::TempDir, String) {
    let (repo, url) = repo_with(&[("README.md", "hello\n"), ("old.txt", "going\n"), ("src/lib.rs", "fn a() {}\n")]);
    let base = git(repo.path(), &["rev-parse", "HEAD"]);
    let work = tempfile::tempdir().unwrap();
    git(work.path(), &["clone", "-q", &url, "."]);
    std::fs::write(work.path().join("README.md"), "hello\nworld\n").unwrap();
    std::fs::write(work.path().join("NEW.md"), "new\n").unwrap();
    std::fs::write(work.path().join("logo.bin"), [0u8, 159, 146, 150, 0, 1]).unwrap();
    std::fs::remove_file(work.path().join("old.txt")).unwrap();
    (repo, url, work, base)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_change_is_served_once_it_ended_to_its_owner_only() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let (_repo, url, work, base) = repository_and_change();
    let change = staged_change(work.path(), &base, ChangeScope::Run);
    let expected_patch = change.patch.clone().unwrap();

    // Before it ends: queued, then running with its change saved, 404.
    let spec = CreateRun { repo: Some(RepoSpec { url: url.clone(), git_ref: None }), ..CreateRun::new("edit") };
    let run = app.submit("alice", spec).await;
    for route in ["patch", "changes"] {
        let (status, code, message) = error(get(&app, "alice", &format!("/v1/runs/{}/{route}", run.id)).await).await;
        assert_eq!((status, code.as_str()), (404, "not_found"), "{route}: {message}");
        assert!(message.contains("queued"), "{message}");
    }
    let (_, lease) = app.store.claim_run("stand-in", Duration::from_secs(60)).await.unwrap().unwrap();
    app.store.save_run_changes(&lease, &change).await.unwrap();
    let (status, _, message) = error(get(&app, "alice", &format!("/v1/runs/{}/patch", run.id)).await).await;
    assert_eq!(status, 404, "the change of a running run is not served: {message}");
    app.store.finish_run(&lease, &EventBody::RunSucceeded { summary: "done".into() }, None).await.unwrap();

    // After: the exact bytes, as a patch.
    let response = get(&app, "alice", &format!("/v1/runs/{}/patch", run.id)).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/x-diff");
    assert_eq!(response.bytes().await.unwrap().to_vec(), expected_patch);
    let response = get(&app, "alice", &format!("/v1/runs/{}/patch?scope=run", run.id)).await;
    assert_eq!(response.bytes().await.unwrap().to_vec(), expected_patch, "scope=run is the default");

    // The summary, file by file, against the base commit.
    let response = get(&app, "alice", &format!("/v1/runs/{}/changes", run.id)).await;
    assert_eq!(response.status(), 200);
    let changes: RunChanges = response.json().await.unwrap();
    assert_eq!(changes.base_commit.as_deref(), Some(base.as_str()));
    assert_eq!(changes.files, change.files);
    assert_eq!(changes.totals, ChangeTotals { files: 4, additions: 2, deletions: 1 });
    assert!(!changes.too_large);
    assert_eq!(changes.patch_bytes, expected_patch.len() as u64);
    let binary: Vec<&str> = changes.files.iter().filter(|f| f.binary).map(|f| f.path.as_str()).collect();
    assert_eq!(binary, ["logo.bin"]);

    // The run object carries the totals; so does the listing.
    assert_eq!(app.run("alice", run.id).await.changes, Some(changes.totals));
    let list: Value = get(&app, "alice", "/v1/runs").await.json().await.unwrap();
    assert_eq!(list["runs"][0]["changes"], serde_json::json!({"files": 4, "additions": 2, "deletions": 1}));

    // No session change was saved: 404 for that scope; a bad scope is 400.
    let (status, _, _) = error(get(&app, "alice", &format!("/v1/runs/{}/changes?scope=session", run.id)).await).await;
    assert_eq!(status, 404);
    let (status, code, _) =
        error(get(&app, "alice", &format!("/v1/runs/{}/patch?scope=everything", run.id)).await).await;
    assert_eq!((status, code.as_str()), (400, "bad_request"));

    // Another subject: the same 404 as for a run that does not exist.
    for route in ["patch", "changes"] {
        let (status, _, theirs) = error(get(&app, "mallory", &format!("/v1/runs/{}/{route}", run.id)).await).await;
        let (_, _, none) = error(get(&app, "mallory", &format!("/v1/runs/{}/{route}", Uuid::now_v7())).await).await;
        assert_eq!((status, theirs), (404, none), "{route}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_too_large_to_keep_has_its_summary_and_no_patch() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let (_repo, url, work, base) = repository_and_change();
    let mut change = staged_change(work.path(), &base, ChangeScope::Run);
    change.patch = None;
    change.too_large = true;
    let mut session = staged_change(work.path(), &base, ChangeScope::Session);
    session.files.truncate(1);
    let run = app.run_with_change("alice", &url, &[change.clone(), session.clone()]).await;

    let (status, code, message) = error(get(&app, "alice", &format!("/v1/runs/{run}/patch")).await).await;
    assert_eq!((status, code.as_str()), (409, "conflict"));
    assert!(message.contains("KILN_MAX_PATCH_MB"), "{message}");
    let changes: RunChanges = get(&app, "alice", &format!("/v1/runs/{run}/changes")).await.json().await.unwrap();
    assert!(changes.too_large);
    assert_eq!(changes.files, change.files, "the summary of every file is kept");

    // The session's scope is its own row.
    let response = get(&app, "alice", &format!("/v1/runs/{run}/patch?scope=session")).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.bytes().await.unwrap().to_vec(), session.patch.unwrap());
    let theirs: RunChanges =
        get(&app, "alice", &format!("/v1/runs/{run}/changes?scope=session")).await.json().await.unwrap();
    assert_eq!((theirs.scope, theirs.files.len()), (ChangeScope::Session, 1));
}
