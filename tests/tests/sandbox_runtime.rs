//! The sandbox runtime (`KILN_SANDBOX_RUNTIME`, issue 30): a worker whose
//! runtime the engine does not have refuses to start and says which one
//! and what the engine has, instead of failing every run later. Real
//! Docker engine, real `kiln worker` binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::Duration;

use kiln_tests::kiln_bin::kiln_bin;
use kiln_tests::{Options, TestApp};
use kiln_worker::sandbox::runtime::{self, RuntimeError};

const MISSING: &str = "kiln-test-no-such-runtime";

#[tokio::test]
async fn the_engines_runtimes_are_accepted_and_a_missing_one_is_named() {
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    runtime::check(&docker, None).await.expect("the engine's default needs no check");
    runtime::check(&docker, Some("runc")).await.expect("every engine has runc");
    let err = runtime::check(&docker, Some(MISSING)).await.unwrap_err();
    assert!(matches!(err, RuntimeError::Unknown { .. }), "{err:?}");
    let said = err.to_string();
    assert!(said.contains(MISSING) && said.contains("runc") && said.contains("daemon.json"), "{said}");
}

#[tokio::test]
async fn a_worker_with_a_runtime_the_engine_lacks_exits_at_start_saying_so() {
    let app = TestApp::spawn(Options::default()).await;
    let mut cmd = tokio::process::Command::new(kiln_bin());
    cmd.arg("worker")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("DATABASE_URL", &app.db_url)
        .env("KILN_MODEL_PROVIDER", "openai")
        .env("KILN_MODEL_BASE_URL", app.model.openai_base_url())
        .env("OPENAI_API_KEY", "sk-test-openai")
        .env("KILN_MODEL", "scripted")
        .env("KILN_SANDBOX_RUNTIME", MISSING)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for var in ["HOME", "DOCKER_HOST"] {
        if let Some(v) = std::env::var_os(var) {
            cmd.env(var, v);
        }
    }
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("the worker exits at start, it does not run")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("KILN_SANDBOX_RUNTIME") && stderr.contains(MISSING) && stderr.contains("runc"), "{stderr}");
}
