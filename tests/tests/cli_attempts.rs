//! `kiln run --attempts`, `kiln select`, and `kiln diff`/`kiln apply` with
//! `--attempt`: the real binary against a real Kiln with a real worker
//! and sandboxes; each attempt's model answers from its own script.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Output, Stdio};
use std::time::Duration;

use kiln_tests::git_repo::{git, repo_with};
use kiln_tests::kiln_bin::kiln_bin;
use kiln_tests::kiln_scripted_model::Reply;
use kiln_tests::{Options, TestApp, token, worker_config};
use kiln_worker::ProviderKind;
use serde_json::json;

async fn kiln(app: &TestApp, args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(kiln_bin());
    cmd.args(args)
        .env("KILN_URL", app.url(""))
        .env("KILN_TOKEN", token("alice"))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    tokio::time::timeout(Duration::from_secs(120), cmd.output()).await.expect("kiln finished in time").unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn run_with_attempts_shows_each_then_diff_select_and_apply_take_the_attempt_asked_for() {
    let (_repo, url) = repo_with(&[("README", "hello\n")]);
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    config.concurrency = 2;
    app.start_worker(config).await;
    for model in ["model-one", "model-two"] {
        let write = format!("echo from {model} > attempt.txt");
        app.model.script_model(model, vec![Reply::tool("bash", json!({"command": write})), Reply::text("done")]);
    }

    let args = ["run", "--repo", &url, "--prompt", "write attempt.txt", "--attempts", "2"];
    let models = ["--attempt-model", "model-one", "--attempt-model", "model-two", "--follow"];
    let out = kiln(&app, &[&args[..], &models[..]].concat()).await;
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    // One line per thing each attempt did, then each attempt's change.
    for k in [1, 2] {
        assert!(stdout.contains(&format!("[{k}] ✓ bash")), "{stdout}");
        assert!(stdout.contains(&format!("attempt {k}: succeeded: 1 files +1 -0")), "{stdout}");
    }
    let group = stdout.split_whitespace().nth(1).unwrap().to_owned();
    assert!(stdout.contains(&format!("select {group} K")), "{stdout}");

    let second = kiln(&app, &["diff", &group, "--attempt", "2"]).await;
    assert!(second.status.success() && text(&second.stdout).contains("+from model-two"), "{}", text(&second.stdout));
    let beyond = kiln(&app, &["diff", &group, "--attempt", "3"]).await;
    assert!(!beyond.status.success());
    assert!(text(&beyond.stderr).contains("has 2 attempts"), "{}", text(&beyond.stderr));

    let chosen = kiln(&app, &["select", &group, "2"]).await;
    assert!(chosen.status.success(), "{}", text(&chosen.stderr));
    assert!(text(&chosen.stdout).contains("attempt 2"), "{}", text(&chosen.stdout));
    let group_diff = kiln(&app, &["diff", &group]).await;
    assert_eq!(text(&group_diff.stdout), text(&second.stdout), "the group's change is the chosen attempt's");

    // Apply another attempt than the chosen one into a local checkout.
    let checkout = tempfile::tempdir().unwrap();
    git(checkout.path(), &["clone", "-q", &url, "."]);
    let dir = checkout.path().to_str().unwrap();
    let applied = kiln(&app, &["apply", &group, "--attempt", "1", "--dir", dir]).await;
    assert!(applied.status.success(), "{}{}", text(&applied.stdout), text(&applied.stderr));
    assert_eq!(std::fs::read_to_string(checkout.path().join("attempt.txt")).unwrap(), "from model-one\n");
}
