//! A run narrows its sandbox: lower limits apply, higher ones do not widen
//! the deployment's, and network access needs the deployment's consent.
//! Checked by inspection from inside (cgroup files, interfaces, routes);
//! no traffic leaves the machine.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use kiln_scripted_model::Reply;
use kiln_tests::{Ev, Options, TestApp, kinds, token, worker_config};
use kiln_worker::ProviderKind;
use serde_json::{Value, json};

const LIMITS: &str = "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes; \
    cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max; \
    cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us";
const NETWORK: &str = "ls /sys/class/net; cat /proc/net/route";

async fn run(app: &TestApp, body: Value) -> Vec<Ev> {
    let run = app.create_run("alice", body).await;
    app.events_to_end("alice", run["id"].as_str().unwrap()).await
}

fn output(events: &[Ev]) -> String {
    let result = events.iter().find(|e| e.kind == "tool.result").unwrap_or_else(|| panic!("{:?}", kinds(events)));
    result.data["output"].as_str().unwrap().to_owned()
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
    let narrowed = run(&app, json!({"prompt": "x", "sandbox": {"memory_mb": 256, "pids": 64, "cpus": 0.5}})).await;
    assert_eq!(narrowed.last().unwrap().kind, "run.succeeded");
    let out = output(&narrowed);
    let got = lines(&out);
    assert!(got.contains(&"268435456"), "memory: {out}");
    assert!(got.contains(&"64"), "pids: {out}");
    assert!(got.iter().any(|l| l.starts_with("50000")), "cpu quota (0.5 of a 100 ms period): {out}");

    // Asking for more than the deployment's 1 GiB gets the deployment's.
    let wider = run(&app, json!({"prompt": "x", "sandbox": {"memory_mb": 4096, "pids": 100000}})).await;
    let out = output(&wider);
    let got = lines(&out);
    assert!(got.contains(&"1073741824"), "memory stays at the deployment's: {out}");
    assert!(got.contains(&"256"), "pids stay at the deployment's: {out}");
}

#[tokio::test]
async fn network_needs_the_deployments_consent() {
    // Not allowed (the default): the run fails before any model call.
    let app = TestApp::spawn(Options::default()).await;
    let refused = run(&app, json!({"prompt": "x", "sandbox": {"network": "bridge"}})).await;
    let last = refused.last().unwrap();
    assert_eq!(last.kind, "run.failed", "{:?}", kinds(&refused));
    assert!(last.data["error"].as_str().unwrap().contains("KILN_SANDBOX_ALLOW_NETWORK"), "{}", last.data);
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
    let bridged = output(&run(&app, json!({"prompt": "x", "sandbox": {"network": "bridge"}})).await);
    assert!(lines(&bridged).contains(&"eth0"), "{bridged}");
    assert!(bridged.lines().any(|l| l.split_whitespace().nth(1) == Some("00000000")), "a default route: {bridged}");
    let isolated = output(&run(&app, json!({"prompt": "x"})).await);
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
