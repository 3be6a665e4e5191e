//! The terminal client covers the API and says it in words: the scripted
//! model `kiln up` serves plays every run its script, `kiln run` chooses
//! what a run may use, `kiln say` steers, `kiln env` manages environments,
//! and setup's lines and approvals read once and in place.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Output, Stdio};
use std::time::Duration;

use kiln_protocol::EventBody;
use kiln_scripted_model::Reply;
use kiln_tests::kiln_bin::kiln_bin;
use kiln_tests::{Options, TestApp, token};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

fn kiln(app_url: &str, sub: &str, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(kiln_bin());
    cmd.args(args)
        .env("KILN_URL", app_url)
        .env("KILN_TOKEN", token(sub))
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn output(mut cmd: tokio::process::Command) -> Output {
    tokio::time::timeout(Duration::from_secs(180), cmd.output()).await.expect("kiln finished in time").unwrap()
}

/// `kiln ARGS` with `input` on its stdin.
async fn output_with_stdin(mut cmd: tokio::process::Command, input: &str) -> Output {
    cmd.stdin(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await.unwrap().unwrap()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn json_out(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(out)))
}

/// The run id in `run <id> <status>: …`, the first line `kiln run` prints.
fn run_id(out: &Output) -> String {
    let all = text(out);
    let line = all.lines().find(|l| l.starts_with("run ")).unwrap_or_else(|| panic!("{all}"));
    line.split_whitespace().nth(1).unwrap().to_owned()
}

#[tokio::test]
async fn a_per_conversation_script_plays_every_run_from_its_first_reply_and_fails_one_that_outlasts_it() {
    let app = TestApp::spawn(Options {
        script: vec![Reply::tool("bash", json!({"command": "echo tool-ran"})), Reply::text("All done.")],
        ..Default::default()
    })
    .await;
    app.model.replay_per_conversation();
    let url = app.url("");
    let mut first = String::new();
    for n in 0..2 {
        let out = output(kiln(&url, "alice", &["run", "--prompt", "work", "--follow"])).await;
        let said = text(&out);
        assert!(out.status.success(), "run {n}: {said}");
        assert!(said.contains("✓ bash") && said.contains("tool-ran") && said.contains("All done."), "run {n}: {said}");
        assert!(!said.contains("script exhausted"), "run {n}: {said}");
        if n == 0 {
            first = run_id(&out);
        }
    }
    // A follow-up continues the first conversation, which has had both
    // replies: it fails, saying why, instead of succeeding empty.
    let out = output(kiln(&url, "alice", &["run", "--session", &first, "--prompt", "more", "--follow"])).await;
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("run failed") && said.contains("script exhausted"), "{said}");
    assert!(said.contains(&format!("(session of run {first})")), "{said}");
}

#[tokio::test]
async fn run_flags_become_the_runs_settings_and_contradictions_are_usage_errors() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let url = app.url("");
    let (status, _) = app.post_json("alice", "/v1/environments", json!({"name": "web", "setup_script": "true"})).await;
    assert_eq!(status, 201);
    let out = output(kiln(
        &url,
        "alice",
        &[
            "run",
            "--prompt",
            "go",
            "--environment",
            "web",
            "--egress",
            "allowlist",
            "--allow",
            "registry.npmjs.org",
            "--allow",
            "*.example.org:8443",
            "--mcp",
            "none",
            "--agents",
            "explore",
            "--max-steps",
            "7",
            "--max-cost",
            "0.25",
            "--json",
        ],
    ))
    .await;
    assert!(out.status.success(), "{}", text(&out));
    let run = json_out(&out);
    assert_eq!(run["environment"], "web");
    assert_eq!(
        run["sandbox"]["egress"],
        json!({"mode": "allowlist", "allow": [{"host": "registry.npmjs.org"}, {"host": "*.example.org", "ports": [8443]}]})
    );
    assert_eq!(run["mcp"], json!([]));
    assert_eq!(run["agents"], json!(["explore"]));
    assert_eq!((run["limits"]["max_steps"].as_u64(), run["limits"]["max_cost_usd"].as_f64()), (Some(7), Some(0.25)));

    for (args, says) in [
        (&["--egress", "open", "--allow", "a.org"][..], "--allow needs --egress allowlist"),
        (&["--egress", "bridge"], "expected none, allowlist or open"),
        (&["--mcp", "none", "--mcp", "github"], "--mcp none cannot be combined"),
        (&["--session", "0192f4c1-7a3e-7c1d-9a4b-3f1e2d4c5b6a", "--max-steps", "3"], "--session continues a session"),
    ] {
        let out = output(kiln(&url, "alice", &[&["run", "--prompt", "go"], args].concat())).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(says), "{args:?}: {}", text(&out));
    }
    // An environment that is not yours is the API's 404, said plainly.
    let out = output(kiln(&url, "mallory", &["run", "--prompt", "go", "--environment", "web"])).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("404") && text(&out).contains("no environment named \"web\""), "{}", text(&out));
}

#[tokio::test]
async fn kiln_say_steers_a_working_run_and_starts_a_follow_up_of_a_finished_one() {
    let app = TestApp::spawn(Options {
        script: vec![
            Reply::tool("bash", json!({"command": "echo first"})),
            Reply::text("Steered."),
            Reply::text("Followed up."),
        ],
        ..Default::default()
    })
    .await;
    let url = app.url("");
    let out = output(kiln(&url, "alice", &["run", "--prompt", "work", "--approval", "always", "--json"])).await;
    let id = json_out(&out)["id"].as_str().unwrap().to_owned();
    let run: uuid::Uuid = id.parse().unwrap();
    app.wait_for_event(run, "approval.requested").await;

    let out = output(kiln(&url, "alice", &["say", &id, "also mention the steering words"])).await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(&format!("message queued for run {id}")), "{}", text(&out));
    let call = app.wait_for_event(run, "approval.requested").await;
    let call_id = kiln_tests::pick!(call, EventBody::ApprovalRequested { call_id, .. } => call_id.clone()).last();
    let out = output(kiln(&url, "alice", &["approve", &id, &call_id.unwrap()])).await;
    assert!(out.status.success(), "{}", text(&out));
    let out = output(kiln(&url, "alice", &["logs", &id, "--follow"])).await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("» also mention the steering words"), "{}", text(&out));
    let requests = app.model.requests();
    assert!(requests[1].body.to_string().contains("also mention the steering words"), "the model was told");

    // To a finished run: a follow-up in its session, followed to its end.
    let out = output(kiln(&url, "alice", &["say", &id, "and now a follow-up", "--follow"])).await;
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains(&format!("run {id} had finished: follow-up run ")) && said.contains("Followed up."),
        "{said}"
    );
    let out = output(kiln(&url, "alice", &["say", &id, "json please", "--json"])).await;
    let answer = json_out(&out);
    assert!(answer["disposition"] == "follow_up" || answer["disposition"] == "queued", "{answer}");
    // Someone else's run is not there.
    let out = output(kiln(&url, "mallory", &["say", &id, "hello"])).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("404"), "{}", text(&out));
}

#[tokio::test]
async fn kiln_env_manages_environments_with_secrets_from_stdin_never_shown() {
    let mut options = Options { worker: false, ..Default::default() };
    let key = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
    options.api.secrets_key = Some(std::sync::Arc::new(kiln_store::secrets::SecretsKey::from_hex(key).unwrap()));
    let app = TestApp::spawn(options).await;
    let url = app.url("");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("environment.toml");
    std::fs::write(&file, "setup_script = \"npm ci\"\nmaintenance_script = \"npm ci --prefer-offline\"\n[variables]\nNODE_ENV = \"development\"\n").unwrap();
    let secret = "s3cr3t-value-never-shown";
    let create = kiln(
        &url,
        "alice",
        &[
            "env",
            "create",
            "web",
            "--file",
            file.to_str().unwrap(),
            "--var",
            "EXTRA=1",
            "--secrets",
            "-",
            "--setup-egress",
            "allowlist",
            "--setup-allow",
            "registry.npmjs.org",
        ],
    );
    let out = output_with_stdin(create, &format!("# the registry\nNPM_TOKEN={secret}\n")).await;
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "created environment web (image the deployment's)\n");

    let out = output(kiln(&url, "alice", &["env", "show", "web"])).await;
    let shown = text(&out);
    assert!(out.status.success(), "{shown}");
    for expected in [
        "    npm ci\n",
        "variable NODE_ENV=development",
        "variable EXTRA=1",
        "secrets (values never shown): NPM_TOKEN",
        "setup network: allowlist registry.npmjs.org",
    ] {
        assert!(shown.contains(expected), "{expected:?} in {shown}");
    }
    let out = output(kiln(&url, "alice", &["env", "list", "--json"])).await;
    let listed = json_out(&out);
    assert_eq!(listed["secret_names"], json!(["NPM_TOKEN"]));
    assert!(!text(&out).contains(secret) && !shown.contains(secret));

    // Update changes what the flags name and keeps the rest, secrets too.
    let out = output(kiln(&url, "alice", &["env", "update", "web", "--setup", "npm install", "--json"])).await;
    let updated = json_out(&out);
    assert_eq!(updated["setup_script"], "npm install");
    assert_eq!(updated["maintenance_script"], "npm ci --prefer-offline");
    assert_eq!(updated["secret_names"], json!(["NPM_TOKEN"]));
    assert_eq!(updated["variables"], json!({"EXTRA": "1", "NODE_ENV": "development"}));

    let out = output(kiln(&url, "alice", &["env", "reset-cache", "web"])).await;
    assert!(text(&out).contains("cache reset (generation 1)"), "{}", text(&out));
    // Secrets are never taken from the command line; a bad secrets line
    // is named without its text.
    let out = output(kiln(&url, "alice", &["env", "create", "x", "--setup", "true", "--secret", "A=b"])).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = output_with_stdin(
        kiln(&url, "alice", &["env", "create", "x", "--setup", "true", "--secrets", "-"]),
        "hunter2-no-equals\n",
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("secrets line 1: expected NAME=VALUE") && !text(&out).contains("hunter2"));
    // Someone else's environment is not there; deleting ends it.
    let out = output(kiln(&url, "mallory", &["env", "show", "web"])).await;
    assert!(out.status.code() == Some(1) && text(&out).contains("404"), "{}", text(&out));
    let out = output(kiln(&url, "alice", &["env", "delete", "web", "--json"])).await;
    assert_eq!(json_out(&out), json!({"deleted": "web"}));
    let out = output(kiln(&url, "alice", &["env", "list"])).await;
    assert!(text(&out).contains("(no environments"), "{}", text(&out));
}

/// A repository with a lock file, for an environment's cache key.
fn repo() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    kiln_tests::git_repo::git(d, &["init", "-q", "-b", "main"]);
    std::fs::write(d.join("Cargo.lock"), "version = 1\n").unwrap();
    kiln_tests::git_repo::git(d, &["add", "."]);
    kiln_tests::git_repo::git(d, &["commit", "-q", "-m", "first"]);
    let url = format!("file://{}", d.display());
    (dir, url)
}

#[tokio::test]
async fn plain_output_shows_setup_and_maintenance_lines_under_their_phase_and_says_what_was_stored() {
    let app = TestApp::spawn(Options { script: vec![Reply::text("Done.")], ..Default::default() }).await;
    app.model.replay_per_conversation();
    let url = app.url("");
    let (status, env) = app
        .post_json(
            "alice",
            "/v1/environments",
            json!({"name": "lines", "setup_script": "echo installing one\nprintf 'two\\nthree-without-newline'",
                   "maintenance_script": "echo maintaining"}),
        )
        .await;
    assert_eq!(status, 201, "{env}");
    let (_dir, repo_url) = repo();
    let args = ["run", "--prompt", "go", "--repo", &repo_url, "--environment", "lines", "--follow"];
    let first = output(kiln(&url, "alice", &args)).await;
    let said = String::from_utf8_lossy(&first.stdout).to_string();
    assert!(first.status.success(), "{}", text(&first));
    let setup = "● setup output:\n  │ installing one\n  │ two\n  │ three-without-newline\n● setup exited 0 (";
    assert!(said.contains(setup), "{said}");
    assert!(said.contains(" ms); prepared sandbox stored in the cache\n"), "{said}");

    let second = output(kiln(&url, "alice", &[&args[..], &["--json"]].concat())).await;
    assert!(second.status.success(), "{}", text(&second));
    let events: Vec<Value> =
        String::from_utf8_lossy(&second.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let started = events.iter().find(|e| e["kind"] == "environment.started").unwrap();
    let finished = events.iter().find(|e| e["kind"] == "environment.finished").unwrap();
    assert_eq!(started["payload"]["hit"], true);
    assert_eq!(finished["payload"]["phase"], "maintenance");
    // `stored` says what it means; `cached`, its old name, stays alongside.
    assert_eq!((&finished["payload"]["stored"], &finished["payload"]["cached"]), (&json!(false), &json!(false)));
    let plain = output(kiln(&url, "alice", &args[..args.len() - 1])).await;
    let first_id = run_id(&plain);
    let logs = output(kiln(&url, "alice", &["logs", &first_id, "--follow"])).await;
    let said = String::from_utf8_lossy(&logs.stdout).to_string();
    assert!(said.contains("● maintenance output:\n  │ maintaining\n● maintenance exited 0 ("), "{said}");
    assert!(!said.contains("stored in the cache"), "a hit stores nothing: {said}");

    // The engine is shared: the prepared image goes.
    let key = started["payload"]["cache_key"].as_str().unwrap().to_owned();
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let options = bollard::query_parameters::RemoveImageOptionsBuilder::new().force(true).build();
    let _ = docker.remove_image(&format!("kiln-env:{key}"), Some(options), None).await;
}
