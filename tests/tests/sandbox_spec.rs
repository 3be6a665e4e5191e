//! A run narrows its sandbox: lower limits apply, higher ones do not widen
//! the deployment's, and network access needs the deployment's consent.
//! Checked by inspection from inside (cgroup files, interfaces, routes);
//! no traffic leaves the machine.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use kiln_protocol::{CreateRun, EventBody, NetworkMode, RunStatus, SandboxSpec};
use kiln_scripted_model::Reply;
use kiln_tests::{Event, Options, TestApp, kinds, outcome, pick, token, worker_config};
use kiln_worker::ProviderKind;
use serde_json::{Value, json};

const LIMITS: &str = "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes; \
    cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max; \
    cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us";
const NETWORK: &str = "ls /sys/class/net; cat /proc/net/route";

/// Runs prompt `x` in `sandbox` (the deployment's when `None`) to its end.
async fn run(app: &TestApp, sandbox: Option<SandboxSpec>) -> Vec<Event> {
    let id = app.submit("alice", CreateRun { sandbox, ..CreateRun::new("x") }).await.id;
    app.events("alice", id).await
}

/// A sandbox of the deployment's but for `network`.
fn network(mode: NetworkMode) -> Option<SandboxSpec> {
    Some(SandboxSpec { network: Some(mode), ..Default::default() })
}

fn output(events: &[Event]) -> String {
    let result = pick!(events, EventBody::ToolResult { output, .. } => output).next();
    result.unwrap_or_else(|| panic!("{:?}", kinds(events))).clone()
}

fn lines(out: &str) -> Vec<&str> {
    out.lines().map(str::trim).collect()
}

#[tokio::test]
async fn a_run_can_lower_its_limits_but_not_raise_them() {
    let app = TestApp::spawn(Options {
        script: vec![
            Reply::tool("bash", json!({"command": LIMITS})),
            Reply::text("a"),
            Reply::tool("bash", json!({"command": LIMITS})),
            Reply::text("b"),
        ],
        ..Default::default()
    })
    .await;
    let narrowed = SandboxSpec { memory_mb: Some(256), pids: Some(64), cpus: Some(0.5), ..Default::default() };
    let narrowed = run(&app, Some(narrowed)).await;
    assert_eq!(outcome(&narrowed), Some(RunStatus::Succeeded));
    let out = output(&narrowed);
    let got = lines(&out);
    // The cgroup's limit is the run's memory plus room for the sandbox's
    // tmpfs mounts (so a full tmpfs is ENOSPC, not an OOM kill); that room
    // is the same in both runs, so the difference is the memory alone.
    let narrowed_limit: i64 = got[0].parse().unwrap();
    assert!(narrowed_limit >= 268435456, "memory: {out}");
    assert!(got.contains(&"64"), "pids: {out}");
    assert!(got.iter().any(|l| l.starts_with("50000")), "cpu quota (0.5 of a 100 ms period): {out}");

    // Asking for more than the deployment's 1 GiB gets the deployment's.
    let wider = SandboxSpec { memory_mb: Some(4096), pids: Some(100_000), ..Default::default() };
    let wider = run(&app, Some(wider)).await;
    let out = output(&wider);
    let got = lines(&out);
    let wider_limit: i64 = got[0].parse().unwrap();
    assert_eq!(wider_limit - narrowed_limit, (1024 - 256) << 20, "memory stays at the deployment's 1 GiB: {out}");
    assert!(got.contains(&"256"), "pids stay at the deployment's: {out}");
}

#[tokio::test]
async fn network_needs_the_deployments_consent() {
    // Not allowed (the default): the run fails before any model call.
    let app = TestApp::spawn(Options::default()).await;
    let refused = run(&app, network(NetworkMode::Bridge)).await;
    let last = refused.last().unwrap();
    let EventBody::RunFailed { error } = &last.body else { panic!("{:?}", kinds(&refused)) };
    assert!(error.contains("KILN_SANDBOX_ALLOW_NETWORK"), "{last:?}");
    assert!(app.model.requests().is_empty());

    // Allowed: a bridge run has an interface and a default route; a run
    // that does not ask still has neither.
    let app = TestApp::spawn(Options {
        worker: false,
        script: vec![
            Reply::tool("bash", json!({"command": NETWORK})),
            Reply::text("a"),
            Reply::tool("bash", json!({"command": NETWORK})),
            Reply::text("b"),
        ],
        ..Default::default()
    })
    .await;
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    config.sandbox.allow_network = true;
    app.start_worker(config).await;
    let bridged = output(&run(&app, network(NetworkMode::Bridge)).await);
    assert!(lines(&bridged).contains(&"eth0"), "{bridged}");
    assert!(bridged.lines().any(|l| l.split_whitespace().nth(1) == Some("00000000")), "a default route: {bridged}");
    let isolated = output(&run(&app, None).await);
    let interfaces: Vec<&str> = isolated.lines().take_while(|l| !l.starts_with("Iface")).collect();
    assert_eq!(interfaces, ["lo"], "{isolated}");
    assert_eq!(isolated.lines().filter(|l| !l.starts_with("Iface")).count(), 1, "no route: {isolated}");
}

#[tokio::test]
async fn bad_sandbox_requests_are_422() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    for sandbox in [
        json!({"network": "host"}),
        json!({"memory_mb": 1}),
        json!({"cpus": 0}),
        json!({"pids": 1}),
        json!({"privileged": true}),
    ] {
        let r = app
            .http
            .post(app.url("/v1/runs"))
            .bearer_auth(token("alice"))
            .json(&json!({"prompt": "x", "sandbox": sandbox}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 422, "{sandbox}");
        let body: Value = r.json().await.unwrap();
        assert!(body["error"]["message"].as_str().unwrap().contains("sandbox"), "{sandbox}: {body}");
    }
}
