//! Environments (issue 15, items 1–3): a repository's setup runs once, its
//! prepared sandbox is cached as an image and reused with the run's commit
//! checked out in place; secrets reach the setup script and nothing else;
//! the API keeps environments per subject and refuses bad input whole.
//! Real Postgres, real Docker; only the model is scripted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kiln_protocol::{CreateRun, EventBody, RepoSpec, RunStatus};
use kiln_scripted_model::Reply;
use kiln_store::secrets::SecretsKey;
use kiln_tests::git_repo::git;
use kiln_tests::{Event, Options, TestApp, kinds, outcome, pick, token, worker_config};
use kiln_worker::ProviderKind;
use serde_json::{Value, json};
use uuid::Uuid;

const KEY_HEX: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

/// A repository that ignores `deps/` and has a lock file.
fn repo() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    git(d, &["init", "-q", "-b", "main"]);
    std::fs::write(d.join(".gitignore"), "deps/\n").unwrap();
    std::fs::write(d.join("Cargo.lock"), "version = 1\n").unwrap();
    std::fs::write(d.join("README"), "hello\n").unwrap();
    git(d, &["add", "."]);
    git(d, &["commit", "-q", "-m", "first"]);
    let url = format!("file://{}", d.display());
    (dir, url)
}

fn commit_file(dir: &Path, name: &str, content: &str, message: &str) {
    std::fs::write(dir.join(name), content).unwrap();
    git(dir, &["add", "."]);
    git(dir, &["commit", "-q", "-m", message]);
}

/// An app whose API and worker share the secrets key (when `secrets`).
async fn app(script: Vec<Reply>, secrets: bool) -> TestApp {
    let key = || secrets.then(|| Arc::new(SecretsKey::from_hex(KEY_HEX).unwrap()));
    let mut options = Options { script, worker: false, ..Default::default() };
    options.api.secrets_key = key();
    let app = TestApp::spawn(options).await;
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    config.secrets_key = key();
    app.start_worker(config).await;
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

async fn create_environment(app: &TestApp, body: Value) -> Value {
    let (status, env) = app.post_json("alice", "/v1/environments", body).await;
    assert_eq!(status, 201, "{env}");
    env
}

async fn run(app: &TestApp, url: &str, environment: &str) -> (Uuid, Vec<Event>) {
    let spec = CreateRun {
        repo: Some(RepoSpec { url: url.to_owned(), git_ref: None }),
        environment: Some(environment.to_owned()),
        ..CreateRun::new("work on the repository")
    };
    let id = app.submit("alice", spec).await.id;
    (id, app.events("alice", id).await)
}

/// `(cache_key, hit)` of the run's `environment.started`.
fn started(events: &[Event]) -> (String, bool) {
    pick!(events, EventBody::EnvironmentStarted { cache_key, hit, .. } => (cache_key.clone(), *hit))
        .last()
        .unwrap_or_else(|| panic!("no environment.started: {:?}", kinds(events)))
}

fn output_of(events: &[Event], of: &str) -> String {
    pick!(events, EventBody::EnvironmentOutput { phase, text } => (phase.clone(), text.clone()))
        .filter(|(phase, _)| phase == of)
        .map(|(_, text)| text)
        .collect()
}

fn tool_output(events: &[Event]) -> String {
    pick!(events, EventBody::ToolResult { output, .. } => output.clone()).collect::<Vec<_>>().join("\n")
}

async fn image_exists(key: &str) -> bool {
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    docker.inspect_image(&format!("kiln-env:{key}")).await.is_ok()
}

/// Removes the prepared images a test made (the engine is shared).
async fn remove_images(keys: &[String]) {
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    for key in keys {
        let options = bollard::query_parameters::RemoveImageOptionsBuilder::new().force(true).build();
        let _ = docker.remove_image(&format!("kiln-env:{key}"), Some(options), None).await;
    }
}

const SETUP: &str = r#"echo setting-up
mkdir -p deps && echo dep-installed > deps/lib.txt
mkdir -p "$HOME/.tool" && printf '#!/bin/sh\necho tool-ok\n' > "$HOME/.tool/tool" && chmod +x "$HOME/.tool/tool"
echo "greeting=$GREETING""#;

#[tokio::test]
async fn a_miss_sets_up_then_a_hit_reuses_home_and_ignored_files_at_the_new_commit_after_maintenance() {
    let (dir, url) = repo();
    let look = "cat deps/lib.txt; $HOME/.tool/tool; git log --format=%s -1; cat new.txt 2>&1; echo var=$GREETING";
    let app = app(
        vec![
            Reply::tool("bash", json!({"command": look})),
            Reply::text("first done"),
            Reply::tool("bash", json!({"command": look})),
            Reply::text("second done"),
        ],
        false,
    )
    .await;
    create_environment(
        &app,
        json!({"name": "web", "setup_script": SETUP, "maintenance_script": "echo maintenance-ran; git log --format=%s -1",
               "variables": {"GREETING": "hello-var"}}),
    )
    .await;

    let (_, first) = run(&app, &url, "web").await;
    assert_eq!(outcome(&first), Some(RunStatus::Succeeded), "{:?}", kinds(&first));
    let (key, hit) = started(&first);
    assert!(!hit, "the first run of an environment misses");
    let setup = output_of(&first, "setup");
    assert!(setup.contains("setting-up") && setup.contains("greeting=hello-var"), "{setup}");
    let finished: Vec<_> =
        pick!(first, EventBody::EnvironmentFinished { phase, exit_code, cached, .. } => (phase.clone(), *exit_code, *cached))
            .collect();
    assert_eq!(finished, [("setup".to_owned(), 0, true)]);
    let stored: Vec<bool> = pick!(first, EventBody::EnvironmentFinished { stored, .. } => *stored).collect();
    assert_eq!(stored, [true], "a miss stores setup's result, and says so as `stored`");
    let out = tool_output(&first);
    assert!(out.contains("dep-installed") && out.contains("tool-ok") && out.contains("first"), "{out}");
    assert!(out.contains("var=hello-var"), "the variables reach the agent's commands: {out}");

    commit_file(dir.path(), "new.txt", "brand-new\n", "second");
    let (_, second) = run(&app, &url, "web").await;
    assert_eq!(outcome(&second), Some(RunStatus::Succeeded), "{:?}", kinds(&second));
    assert_eq!(started(&second), (key.clone(), true), "the same environment and lock files hit");
    assert!(output_of(&second, "setup").is_empty(), "setup ran on a hit");
    let maintenance = output_of(&second, "maintenance");
    assert!(maintenance.contains("maintenance-ran"), "{maintenance}");
    assert!(maintenance.contains("second"), "maintenance runs after the run's commit is in place: {maintenance}");
    let stored: Vec<(String, bool)> =
        pick!(second, EventBody::EnvironmentFinished { phase, stored, .. } => (phase.clone(), *stored)).collect();
    assert_eq!(stored, [("maintenance".to_owned(), false)], "a hit stores nothing");
    let out = tool_output(&second);
    assert!(out.contains("dep-installed"), "the ignored dependency folder is gone: {out}");
    assert!(out.contains("tool-ok"), "the tool under $HOME is gone: {out}");
    assert!(out.contains("second") && out.contains("brand-new"), "the workspace is not at the new commit: {out}");
    remove_images(&[key]).await;
}

#[tokio::test]
async fn a_changed_lock_file_a_changed_script_and_a_reset_cache_each_miss() {
    let (dir, url) = repo();
    let app = app((0..5).map(|i| Reply::text(format!("done {i}"))).collect(), false).await;
    let mut body = json!({"name": "svc", "setup_script": "echo one > deps.txt"});
    create_environment(&app, body.clone()).await;
    let mut keys = Vec::new();
    let mut next = async |expect_hit: bool, why: &str| {
        let (_, events) = run(&app, &url, "svc").await;
        assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{why}: {:?}", kinds(&events));
        let (key, hit) = started(&events);
        assert_eq!(hit, expect_hit, "{why}");
        keys.push(key);
    };
    next(false, "first run").await;
    next(true, "nothing changed").await;
    commit_file(dir.path(), "Cargo.lock", "version = 2\n", "bump");
    next(false, "the lock file changed").await;
    body["setup_script"] = json!("echo two > deps.txt");
    let (status, _) = request(&app, "alice", reqwest::Method::PUT, "/v1/environments/svc", Some(body)).await;
    assert_eq!(status, 200);
    next(false, "the setup script changed").await;
    let (status, env) = app.post_json("alice", "/v1/environments/svc/reset-cache", json!({})).await;
    assert_eq!((status, &env["cache_generation"]), (200, &json!(1)), "{env}");
    next(false, "the cache was reset").await;
    let distinct: std::collections::HashSet<&String> = keys.iter().collect();
    assert_eq!(distinct.len(), 4, "{keys:?}");
    remove_images(&keys).await;
}

#[tokio::test]
async fn secrets_reach_the_setup_script_and_nothing_else() {
    const SECRET: &str = "s3cr3t-Value-9f8e7d";
    let (_dir, url) = repo();
    let look = "env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c API_TOKEN; cat ~/.setup-proof";
    let app = app(vec![Reply::tool("bash", json!({"command": look})), Reply::text("done")], true).await;
    // The script checks the value by its hash: the secret itself appears
    // nowhere but in `secrets`.
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(SECRET.as_bytes()));
    let setup = format!(
        "[ \"$(printf %s \"$API_TOKEN\" | sha256sum | cut -d' ' -f1)\" = {digest} ] && echo seen-by-setup > ~/.setup-proof
         echo \"token is $API_TOKEN\""
    );
    let env =
        create_environment(&app, json!({"name": "sec", "secrets": {"API_TOKEN": SECRET}, "setup_script": setup})).await;
    assert_eq!(env["secret_names"], json!(["API_TOKEN"]));
    assert!(!env.to_string().contains(SECRET), "{env}");
    let (status, got) = request(&app, "alice", reqwest::Method::GET, "/v1/environments/sec", None).await;
    assert_eq!(status, 200);
    assert!(!got.to_string().contains(SECRET), "{got}");

    let (id, events) = run(&app, &url, "sec").await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let out = tool_output(&events);
    assert!(out.contains("seen-by-setup"), "the setup script did not see the secret: {out}");
    assert!(!out.contains(SECRET) && !out.contains("API_TOKEN="), "the agent phase sees the secret: {out}");
    for event in app.stored_events(id).await {
        let json = serde_json::to_string(&event.body).unwrap();
        assert!(!json.contains(SECRET), "an event holds the secret: {json}");
    }
    assert!(output_of(&events, "setup").contains("token is [secret]"), "{}", output_of(&events, "setup"));
    for request in app.model.requests() {
        assert!(!request.body.to_string().contains(SECRET), "a model request holds the secret");
    }
    let (key, _) = started(&events);
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let image = docker.inspect_image(&format!("kiln-env:{key}")).await.unwrap();
    let config = serde_json::to_string(&image.config).unwrap();
    assert!(!config.contains(SECRET) && !config.contains("API_TOKEN"), "the image's configuration holds it: {config}");
    let row =
        app.sql().await.query_one("SELECT secrets_sealed FROM environments WHERE name = 'sec'", &[]).await.unwrap();
    let sealed: Vec<u8> = row.get(0);
    assert!(!sealed.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()), "the column holds the plaintext");
    assert!(sealed.len() > SECRET.len(), "nothing sealed");
    remove_images(&[key]).await;
}

#[tokio::test]
async fn a_failing_setup_fails_the_run_with_its_status_and_tail_and_caches_nothing() {
    let (_dir, url) = repo();
    let app = app(vec![Reply::text("never")], false).await;
    create_environment(&app, json!({"name": "broken", "setup_script": "echo line-one; echo last-words >&2; exit 7"}))
        .await;
    let (_, events) = run(&app, &url, "broken").await;
    assert_eq!(outcome(&events), Some(RunStatus::Failed), "{:?}", kinds(&events));
    let error = pick!(events, EventBody::RunFailed { error } => error.clone()).next().unwrap();
    assert!(error.contains("exit status 7") && error.contains("last-words"), "{error}");
    let finished: Vec<_> =
        pick!(events, EventBody::EnvironmentFinished { exit_code, cached, .. } => (*exit_code, *cached)).collect();
    assert_eq!(finished, [(7, false)]);
    assert!(pick!(events, EventBody::EnvironmentFinished { stored, .. } => *stored).all(|stored| !stored));
    let (key, _) = started(&events);
    assert!(!image_exists(&key).await, "a failed setup was cached");
    assert!(app.model.requests().is_empty(), "the agent ran after a failed setup");
}

#[tokio::test]
async fn environments_are_their_owners_and_bad_input_is_refused_with_nothing_stored() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let created = create_environment(&app, json!({"name": "mine", "setup_script": "true"})).await;
    assert_eq!(created["lock_files"][0], "Cargo.lock", "{created}");
    let get = reqwest::Method::GET;
    let (status, _) = request(&app, "bob", get.clone(), "/v1/environments/mine", None).await;
    assert_eq!(status, 404, "another subject's environment is not found");
    let (status, listed) = request(&app, "bob", get.clone(), "/v1/environments", None).await;
    assert_eq!((status, listed), (200, json!({"environments": []})));
    let (status, _) = request(&app, "bob", reqwest::Method::DELETE, "/v1/environments/mine", None).await;
    assert_eq!(status, 404);
    let (status, body) = app.post_json("bob", "/v1/runs", json!({"prompt": "x", "environment": "mine"})).await;
    assert_eq!(status, 404, "a run named another subject's environment: {body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("no environment named"), "{body}");
    let (status, _) = app.post_json("alice", "/v1/runs", json!({"prompt": "x", "environment": "mine"})).await;
    assert_eq!(status, 201);

    for (bad, why) in [
        (json!({"name": "Bad Name"}), "name"),
        (json!({"name": "ok", "setup_script": "x".repeat(64 * 1024 + 1)}), "setup_script"),
        (json!({"name": "ok", "setup": "x"}), "unknown field"),
        (json!({"name": "ok", "variables": {"1X": "v"}}), "variables"),
        (json!({"name": "ok", "lock_files": ["../etc/passwd"]}), "lock_files"),
        (json!({"name": "ok", "secrets": {"T": "v"}}), "KILN_SECRETS_KEY"),
    ] {
        let (status, body) = app.post_json("alice", "/v1/environments", bad).await;
        assert_eq!(status, 422, "{why}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(why), "{why}: {message}");
    }
    // Two parts of one request that contradict each other: 409.
    let both = json!({"name": "ok", "variables": {"T": "a"}, "secrets": {"T": "b"}});
    let (status, body) = app.post_json("alice", "/v1/environments", both).await;
    assert_eq!(status, 409, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("both a variable and a secret"), "{body}");
    let (status, body) = app.post_json("alice", "/v1/environments", json!({"name": "mine"})).await;
    assert_eq!(status, 409, "{body}");
    let (_, listed) = request(&app, "alice", get.clone(), "/v1/environments", None).await;
    let names: Vec<&str> =
        listed["environments"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["mine"], "a refused environment was stored");
    let (status, _) = request(&app, "alice", reqwest::Method::DELETE, "/v1/environments/mine", None).await;
    assert_eq!(status, 204);
    let (status, _) = request(&app, "alice", get, "/v1/environments/mine", None).await;
    assert_eq!(status, 404);
}

/// Runs the agent on `url` without naming an environment.
async fn run_unnamed(app: &TestApp, url: &str) -> (Uuid, Vec<Event>) {
    let spec = CreateRun { repo: Some(RepoSpec { url: url.to_owned(), git_ref: None }), ..CreateRun::new("work") };
    let id = app.submit("alice", spec).await.id;
    (id, app.events("alice", id).await)
}

fn environment_named(events: &[Event]) -> String {
    pick!(events, EventBody::EnvironmentStarted { environment, .. } => environment.clone())
        .last()
        .unwrap_or_else(|| panic!("no environment.started: {:?}", kinds(events)))
}

const REPOSITORY_FILE: &str = r#"# the repository's environment
setup_script = """
echo file-setup-ran
mkdir -p deps && echo dep-from-file > deps/lib.txt
"""
maintenance_script = "echo file-maintenance-ran"
lock_files = ["Cargo.lock"]

[variables]
FROM_FILE = "file-var"
"#;

#[tokio::test]
async fn a_repository_file_sets_up_once_then_hits_and_a_named_environment_wins_over_it() {
    let (dir, url) = repo();
    std::fs::create_dir_all(dir.path().join(".kiln")).unwrap();
    commit_file(dir.path(), ".kiln/environment.toml", REPOSITORY_FILE, "environment file");
    let look = "cat deps/lib.txt; echo var=$FROM_FILE";
    let app = app(
        vec![
            Reply::tool("bash", json!({"command": look})),
            Reply::text("first"),
            Reply::tool("bash", json!({"command": look})),
            Reply::text("second"),
            Reply::text("third"),
            Reply::text("fourth"),
        ],
        false,
    )
    .await;

    let (_, first) = run_unnamed(&app, &url).await;
    assert_eq!(outcome(&first), Some(RunStatus::Succeeded), "{:?}", kinds(&first));
    assert_eq!(environment_named(&first), ".kiln/environment.toml");
    let (key, hit) = started(&first);
    assert!(!hit, "the first run with the file misses");
    assert!(output_of(&first, "setup").contains("file-setup-ran"), "{}", output_of(&first, "setup"));
    let out = tool_output(&first);
    assert!(out.contains("dep-from-file") && out.contains("var=file-var"), "{out}");

    commit_file(dir.path(), "new.txt", "x\n", "unrelated change");
    let (_, second) = run_unnamed(&app, &url).await;
    assert_eq!(outcome(&second), Some(RunStatus::Succeeded), "{:?}", kinds(&second));
    assert_eq!(started(&second), (key.clone(), true), "the same file and lock files hit");
    assert!(output_of(&second, "setup").is_empty(), "setup ran on a hit");
    assert!(output_of(&second, "maintenance").contains("file-maintenance-ran"));
    assert!(tool_output(&second).contains("dep-from-file"), "{}", tool_output(&second));

    // The file is part of the key: a changed script misses.
    commit_file(
        dir.path(),
        ".kiln/environment.toml",
        &REPOSITORY_FILE.replace("file-setup-ran", "file-setup-ran-again"),
        "change the setup",
    );
    let (_, third) = run_unnamed(&app, &url).await;
    assert_eq!(outcome(&third), Some(RunStatus::Succeeded), "{:?}", kinds(&third));
    let (changed_key, hit) = started(&third);
    assert!(!hit && changed_key != key, "a changed file hit the old image");
    assert!(output_of(&third, "setup").contains("file-setup-ran-again"));

    // A run that names an environment gets it, not the file's.
    create_environment(&app, json!({"name": "api-env", "setup_script": "echo api-setup-ran"})).await;
    let (_, fourth) = run(&app, &url, "api-env").await;
    assert_eq!(outcome(&fourth), Some(RunStatus::Succeeded), "{:?}", kinds(&fourth));
    assert_eq!(environment_named(&fourth), "api-env");
    assert!(output_of(&fourth, "setup").contains("api-setup-ran"));
    let (api_key, _) = started(&fourth);
    remove_images(&[key, changed_key, api_key]).await;
}

#[tokio::test]
async fn a_bad_repository_file_fails_the_run_with_the_reason_and_a_secret_in_it_is_refused() {
    let (dir, url) = repo();
    let app = app(vec![Reply::text("never")], false).await;
    std::fs::create_dir_all(dir.path().join(".kiln")).unwrap();
    for (file, expect) in [
        ("setup = \"make deps\"\n", "unknown field `setup`"),
        ("setup_script = \"unterminated\n", ".kiln/environment.toml is not valid"),
        ("setup_script = \"make\"\n[secrets]\nNPM_TOKEN = \"npm_abcdef123456\"\n", "must not hold secrets"),
        ("[variables]\nPATH = \"/evil\"\n", "PATH"),
    ] {
        commit_file(dir.path(), ".kiln/environment.toml", file, "bad file");
        let (_, events) = run_unnamed(&app, &url).await;
        assert_eq!(outcome(&events), Some(RunStatus::Failed), "{file}: {:?}", kinds(&events));
        let error = pick!(events, EventBody::RunFailed { error } => error.clone()).next().unwrap();
        assert!(error.contains(expect), "{file}: {error}");
        assert!(!error.contains("npm_abcdef123456"), "the error quotes the secret: {error}");
        assert!(pick!(events, EventBody::EnvironmentStarted { .. } => ()).next().is_none(), "setup started");
    }
    // A symbolic link is refused, not followed (to a file of the worker's).
    std::fs::remove_file(dir.path().join(".kiln/environment.toml")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", dir.path().join(".kiln/environment.toml")).unwrap();
    git(dir.path(), &["add", "."]);
    git(dir.path(), &["commit", "-q", "-m", "link"]);
    let (_, events) = run_unnamed(&app, &url).await;
    let error = pick!(events, EventBody::RunFailed { error } => error.clone()).next().unwrap();
    assert!(error.contains("not a regular file"), "{error}");
    assert!(app.model.requests().is_empty(), "the agent ran with a bad environment file");
}

#[tokio::test]
async fn a_secret_printed_slowly_across_output_pieces_is_masked_in_events_and_in_the_error() {
    const SECRET: &str = "Sl0w-s3cret-42";
    let (_dir, url) = repo();
    let app = app(vec![Reply::text("never")], true).await;
    // One byte at a time, each after the worker has sent what it had (it
    // sends every 200 ms): every piece holds at most a byte of the secret.
    let setup = r#"echo start; for i in $(seq 0 $((${#TOKEN} - 1))); do printf %s "${TOKEN:$i:1}"; sleep 0.3; done; echo; exit 3"#;
    create_environment(&app, json!({"name": "slow", "secrets": {"TOKEN": SECRET}, "setup_script": setup})).await;
    let (_, events) = run(&app, &url, "slow").await;
    assert_eq!(outcome(&events), Some(RunStatus::Failed), "{:?}", kinds(&events));
    let pieces: Vec<String> =
        pick!(events, EventBody::EnvironmentOutput { phase, text } => (phase.clone(), text.clone()))
            .filter(|(phase, _)| phase == "setup")
            .map(|(_, text)| text)
            .collect();
    let shown: String = pieces.concat();
    assert!(pieces.len() >= 2, "the output came in one piece: {pieces:?}");
    assert!(!shown.contains(SECRET), "the secret was put together from the pieces: {pieces:?}");
    assert!(shown.contains("[secret]"), "{shown}");
    let error = pick!(events, EventBody::RunFailed { error } => error.clone()).next().unwrap();
    assert!(error.contains("exit status 3") && !error.contains(SECRET), "{error}");
}

/// Removes the containers of a run's session: its prepared image is then
/// used by no container.
async fn remove_containers_of(app: &TestApp, run: Uuid) {
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    for id in app.containers_of(run).await {
        // As Kiln removes one: with its volumes and its loop disk.
        kiln_worker::sandbox::remove_by_id(&docker, &id).await;
    }
}

#[tokio::test]
async fn over_the_cache_bound_the_least_recently_used_image_goes_and_one_in_use_stays() {
    let (_dir, url) = repo();
    let app = TestApp::spawn(Options {
        script: (0..5).map(|i| Reply::text(format!("done {i}"))).collect(),
        worker: false,
        ..Default::default()
    })
    .await;
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    // A scope of this test's own: the engine is shared, and other tests'
    // images are none of this cache's business.
    let scope = format!("bound-test-{}", Uuid::new_v4().simple());
    config.environment_cache =
        kiln_worker::environment::cache::CacheBounds { max_images: 3, max_bytes: u64::MAX, scope: scope.clone() };
    // Sessions keep their containers (and so their images in use) until
    // the test removes them.
    config.sandbox_idle = Duration::from_secs(600);
    app.start_worker(config).await;
    let mut keys = Vec::new();
    for n in 1..=4 {
        create_environment(&app, json!({"name": format!("e{n}"), "setup_script": format!("echo {n} > deps.txt")}))
            .await;
    }
    let next = async |name: &str, keep_container: bool, expect_hit: bool| {
        let (id, events) = run(&app, &url, name).await;
        assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{name}: {:?}", kinds(&events));
        let (key, hit) = started(&events);
        assert_eq!(hit, expect_hit, "{name}");
        if !keep_container {
            remove_containers_of(&app, id).await;
        }
        (key, id)
    };
    // e1's image is the oldest but stays in use (its session's container
    // lives on); e2's and e3's are free; e2 is used again after e3.
    let (key, first) = next("e1", true, false).await;
    keys.push(key);
    keys.push(next("e2", false, false).await.0);
    keys.push(next("e3", false, false).await.0);
    assert_eq!(next("e2", false, true).await.0, keys[1]);
    for key in &keys {
        assert!(image_exists(key).await, "within the bound an image went: {key}");
    }
    // A fourth image: one must go. Not e1's (in use), not e2's (used more
    // recently): e3's.
    let (key, last) = next("e4", true, false).await;
    keys.push(key);
    let present: Vec<bool> = futures::future::join_all(keys.iter().map(|k| image_exists(k))).await;
    assert_eq!(present, [true, true, false, true], "e1 (in use), e2 (used last), e3 (least recently used), e4 (new)");
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let labels = docker.inspect_image(&format!("kiln-env:{}", keys[3])).await.unwrap().config.unwrap().labels.unwrap();
    assert_eq!(labels.get("dev.kiln.env-scope"), Some(&scope));
    remove_containers_of(&app, first).await;
    remove_containers_of(&app, last).await;
    remove_images(&keys).await;
}
