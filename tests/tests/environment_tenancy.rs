//! Environments are a tenant boundary (issue 34): no tenant starts from
//! another's prepared image (by its `kiln-env:<key>` name, by an image-id
//! prefix, or from its repository's `.kiln/environment.toml`), no
//! repository's run reuses another repository's prepared workspace, and
//! nothing the prepared `.git` holds runs on a cache hit. An environment's
//! image is one the operator allows (`KILN_ENVIRONMENT_IMAGES`). Real
//! Postgres, real Docker; only the model is scripted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kiln_protocol::image_name::ImagePatterns;
use kiln_protocol::{CreateRun, EventBody, RepoSpec, RunStatus};
use kiln_scripted_model::Reply;
use kiln_tests::git_repo::git;
use kiln_tests::{Event, Options, TestApp, kinds, outcome, pick, sandbox_image, token, worker_config};
use kiln_worker::ProviderKind;
use serde_json::{Value, json};
use uuid::Uuid;

/// What tenant A's setup writes into its workspace.
const PRIVATE: &str = "tenant-a-private-5f1c9e";

/// A repository with one commit of its own (`tag` makes its commits differ
/// from every other test repository's).
fn repo(tag: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    git(d, &["init", "-q", "-b", "main"]);
    std::fs::write(d.join("README"), format!("repository {tag}\n")).unwrap();
    git(d, &["add", "."]);
    git(d, &["commit", "-q", "-m", &format!("first of {tag}")]);
    let url = format!("file://{}", d.display());
    (dir, url)
}

fn commit_file(dir: &Path, name: &str, content: &str) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
    git(dir, &["add", "."]);
    git(dir, &["commit", "-q", "-m", &format!("add {name}")]);
}

fn head(dir: &Path) -> String {
    let out = std::process::Command::new("git").arg("-C").arg(dir).args(["rev-parse", "HEAD"]).output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// An app whose API and worker allow `images` (`KILN_ENVIRONMENT_IMAGES`;
/// `None`: the default, the sandbox image only).
async fn app(script: Vec<Reply>, images: Option<&str>) -> TestApp {
    let patterns = Arc::new(match images {
        Some(list) => ImagePatterns::parse(list).unwrap(),
        None => kiln_tests::sandbox_image_only(),
    });
    let mut options = Options { script, worker: false, ..Default::default() };
    options.api.environment_images = patterns.clone();
    let app = TestApp::spawn(options).await;
    let config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    app.start_worker(kiln_worker::WorkerConfig { environment_images: patterns, ..config }).await;
    app
}

async fn request(app: &TestApp, sub: &str, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut r = app.http.request(method, app.url(path)).bearer_auth(token(sub));
    if let Some(body) = body {
        r = r.json(&body);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn run(app: &TestApp, sub: &str, url: &str, environment: Option<&str>) -> Vec<Event> {
    let spec = CreateRun {
        repo: Some(RepoSpec { url: url.to_owned(), git_ref: None }),
        environment: environment.map(str::to_owned),
        ..CreateRun::new("work on the repository")
    };
    let id: Uuid = app.submit(sub, spec).await.id;
    app.events(sub, id).await
}

/// `(cache_key, hit, image)` of the run's `environment.started`.
fn started(events: &[Event]) -> (String, bool, String) {
    pick!(events, EventBody::EnvironmentStarted { cache_key, hit, image, .. } => (cache_key.clone(), *hit, image.clone()))
        .last()
        .unwrap_or_else(|| panic!("no environment.started: {:?}", kinds(events)))
}

fn failure(events: &[Event]) -> String {
    pick!(events, EventBody::RunFailed { error } => error.clone())
        .next()
        .unwrap_or_else(|| panic!("the run did not fail: {:?}", kinds(events)))
}

fn tool_output(events: &[Event]) -> String {
    pick!(events, EventBody::ToolResult { output, .. } => output.clone()).collect::<Vec<_>>().join("\n")
}

fn docker() -> bollard::Docker {
    bollard::Docker::connect_with_local_defaults().unwrap()
}

/// Removes the prepared images a test made (the engine is shared).
async fn remove_images(keys: &[String]) {
    for key in keys {
        let options = bollard::query_parameters::RemoveImageOptionsBuilder::new().force(true).build();
        let _ = docker().remove_image(&format!("kiln-env:{key}"), Some(options), None).await;
    }
}

#[tokio::test]
async fn tenant_b_cannot_start_from_tenant_as_prepared_image_by_name_id_prefix_or_repository_file() {
    let app = app(vec![Reply::text("a is done")], None).await;
    let (_a_dir, a_url) = repo("a");
    let setup = format!("printf '%s' {PRIVATE} > private.txt");
    let (status, body) = request(
        &app,
        "a",
        reqwest::Method::POST,
        "/v1/environments",
        Some(json!({"name": "a-env", "setup_script": setup})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let a_run = run(&app, "a", &a_url, Some("a-env")).await;
    assert_eq!(outcome(&a_run), Some(RunStatus::Succeeded), "{:?}", kinds(&a_run));
    let (key, _, _) = started(&a_run);
    let prepared = format!("kiln-env:{key}");
    let id = docker().inspect_image(&prepared).await.unwrap().id.unwrap();
    let prefix = id.trim_start_matches("sha256:")[..6].to_owned();

    // B names A's image through the API: refused, nothing stored.
    let steal = "ls -R /.kiln-prepared; cat /.kiln-prepared/w/workspace/private.txt";
    for image in [prepared.as_str(), prefix.as_str()] {
        let body = json!({"name": "b-env", "image": image, "setup_script": steal});
        let (status, answer) = request(&app, "b", reqwest::Method::POST, "/v1/environments", Some(body)).await;
        assert_eq!(status, 422, "{image}: {answer}");
        assert!(answer.to_string().contains("image"), "{answer}");
    }
    let (status, listed) = request(&app, "b", reqwest::Method::GET, "/v1/environments", None).await;
    assert_eq!((status, &listed["environments"]), (200, &json!([])), "a refused environment was stored");

    // B names it from its repository's file: the run fails before any
    // engine is asked (whose answer would let B walk id prefixes): the
    // file's image is no image name by the rule the API states.
    let (b_dir, b_url) = repo("b");
    for image in [prepared.as_str(), prefix.as_str()] {
        let file = format!("image = \"{image}\"\nsetup_script = \"{steal}\"\n");
        commit_file(b_dir.path(), ".kiln/environment.toml", &file);
        let events = run(&app, "b", &b_url, None).await;
        assert_eq!(outcome(&events), Some(RunStatus::Failed), "{image}: {:?}", kinds(&events));
        let error = failure(&events);
        assert!(error.contains(".kiln/environment.toml: image must be an image name"), "{error}");
        let seen = format!("{events:?}");
        assert!(!seen.contains(PRIVATE) && !seen.contains("private.txt"), "B saw A's files: {seen}");
    }
    remove_images(&[key]).await;
}

#[tokio::test]
async fn a_run_on_another_repository_misses_and_cannot_list_the_first_ones_objects() {
    let list = "git cat-file --batch-all-objects --batch-check";
    let app =
        app(vec![Reply::text("x is done"), Reply::tool("bash", json!({"command": list})), Reply::text("y")], None)
            .await;
    let (x_dir, x_url) = repo("x");
    commit_file(x_dir.path(), "x-only.txt", "only in x\n");
    let x_commit = head(x_dir.path());
    let (_y_dir, y_url) = repo("y");
    let body = json!({"name": "shared", "setup_script": "echo set-up"});
    let (status, answer) = request(&app, "alice", reqwest::Method::POST, "/v1/environments", Some(body)).await;
    assert_eq!(status, 201, "{answer}");

    let on_x = run(&app, "alice", &x_url, Some("shared")).await;
    assert_eq!(outcome(&on_x), Some(RunStatus::Succeeded), "{:?}", kinds(&on_x));
    let (x_key, _, _) = started(&on_x);
    let on_y = run(&app, "alice", &y_url, Some("shared")).await;
    assert_eq!(outcome(&on_y), Some(RunStatus::Succeeded), "{:?}", kinds(&on_y));
    let (y_key, hit, _) = started(&on_y);
    assert!(!hit && y_key != x_key, "repository y started from x's prepared workspace");
    let objects = tool_output(&on_y);
    assert!(objects.contains(" commit "), "the listing ran: {objects}");
    assert!(!objects.contains(&x_commit), "y's run lists x's commit {x_commit}: {objects}");
    remove_images(&[x_key, y_key]).await;
}

/// Setup plants a `post-checkout` hook in the prepared `.git` that would
/// leave a marker.
const PLANT_HOOK: &str = r#"mkdir -p .git/hooks
printf '#!/bin/sh\necho hook-fired-7d2 > /workspace/.git/hook-marker\n' > .git/hooks/post-checkout
chmod +x .git/hooks/post-checkout"#;

#[tokio::test]
async fn a_post_checkout_hook_left_by_setup_never_runs_on_a_cache_hit() {
    let look = "test -x .git/hooks/post-checkout && echo hook-present; cat .git/hook-marker 2>/dev/null; git log -1 --format=%s";
    let app =
        app(vec![Reply::text("first"), Reply::tool("bash", json!({"command": look})), Reply::text("second")], None)
            .await;
    let (x_dir, x_url) = repo("hooked");
    let body = json!({"name": "hooked", "setup_script": PLANT_HOOK});
    let (status, answer) = request(&app, "alice", reqwest::Method::POST, "/v1/environments", Some(body)).await;
    assert_eq!(status, 201, "{answer}");
    let first = run(&app, "alice", &x_url, Some("hooked")).await;
    assert_eq!(outcome(&first), Some(RunStatus::Succeeded), "{:?}", kinds(&first));
    let (key, _, _) = started(&first);

    commit_file(x_dir.path(), "second.txt", "second\n");
    let second = run(&app, "alice", &x_url, Some("hooked")).await;
    assert_eq!(outcome(&second), Some(RunStatus::Succeeded), "{:?}", kinds(&second));
    let (second_key, hit, _) = started(&second);
    assert!(hit && second_key == key, "the second run of the same repository hits");
    let out = tool_output(&second);
    assert!(out.contains("hook-present") && out.contains("add second.txt"), "checked out with the hook kept: {out}");
    assert!(!out.contains("hook-fired"), "the planted hook ran on the in-place checkout: {out}");
    remove_images(&[key]).await;
}

#[tokio::test]
async fn an_image_the_operator_allows_works_and_one_not_listed_is_refused() {
    let tag = Uuid::new_v4().simple().to_string()[..12].to_owned();
    let allowed = format!("kiln-tenancy-test:{tag}");
    let options = bollard::query_parameters::TagImageOptionsBuilder::new().repo("kiln-tenancy-test").tag(&tag).build();
    docker().tag_image(&sandbox_image(), Some(options)).await.unwrap();
    let app = app(vec![Reply::text("done")], Some(&format!("{}, kiln-tenancy-test:*", sandbox_image()))).await;
    let (_dir, url) = repo("allowed");

    let body = json!({"name": "ok", "image": allowed, "setup_script": "echo from-the-allowed-image"});
    let (status, answer) = request(&app, "alice", reqwest::Method::POST, "/v1/environments", Some(body)).await;
    assert_eq!(status, 201, "{answer}");
    let events = run(&app, "alice", &url, Some("ok")).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let (key, _, image) = started(&events);
    assert_eq!(image, allowed);

    for image in ["busybox:latest", "kiln-tenancy-other:1"] {
        let body = json!({"name": "not-listed", "image": image, "setup_script": "true"});
        let (status, answer) = request(&app, "alice", reqwest::Method::POST, "/v1/environments", Some(body)).await;
        assert_eq!(status, 422, "{image}: {answer}");
        assert!(answer.to_string().contains("not available to this deployment"), "{answer}");
    }
    // A PUT is held to the same rule, and leaves the stored image alone.
    let body = json!({"name": "ok", "image": "busybox:latest", "setup_script": "true"});
    let (status, _) = request(&app, "alice", reqwest::Method::PUT, "/v1/environments/ok", Some(body)).await;
    assert_eq!(status, 422);
    let (_, stored) = request(&app, "alice", reqwest::Method::GET, "/v1/environments/ok", None).await;
    assert_eq!(stored["image"], json!(allowed));
    remove_images(&[key]).await;
    let _ = docker().remove_image(&allowed, None::<bollard::query_parameters::RemoveImageOptions>, None).await;
}
