//! The web view says every event in words (issue 31): an environment's
//! setup and maintenance as foldable logs with phase, exit code and time;
//! network decisions naming host and rule; MCP calls with their server; a
//! `write` as the file's content and an `edit` as a diff; an unknown kind as
//! a readable line. And its new-run form chooses an environment and the
//! network. Real headless Chromium against the real API and Postgres.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::time::Duration;

use fantoccini::Locator;
use kiln_tests::browser::{Browser, artifact};
use kiln_tests::{Options, TestApp, token};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

/// A run's events as a worker would have written them: an environment that
/// missed and stored its setup, a maintenance script that failed, network
/// decisions, an MCP call, a write, an edit and a kind from the future.
fn events() -> Vec<(&'static str, Value)> {
    vec![
        ("run.queued", json!({"prompt": "words"})),
        ("run.started", json!({"worker": "w1", "attempt": 1})),
        (
            "environment.started",
            json!({"environment": "web", "cache_key": "0123456789abcdef", "hit": false, "image": "kiln-sandbox"}),
        ),
        ("environment.output", json!({"phase": "setup", "text": "installing deps\n"})),
        ("environment.output", json!({"phase": "setup", "text": "done <b>bold</b>\n"})),
        (
            "environment.finished",
            json!({"phase": "setup", "exit_code": 0, "duration_ms": 5067, "stored": true, "cached": true}),
        ),
        ("environment.output", json!({"phase": "maintenance", "text": "refreshing\n"})),
        (
            "environment.finished",
            json!({"phase": "maintenance", "exit_code": 3, "duration_ms": 40, "stored": false, "cached": false}),
        ),
        (
            "network.denied",
            json!({"host": "evil.example", "port": 443, "layer": "run", "rule": "not in the allowlist"}),
        ),
        ("network.allowed", json!({"host": "registry.npmjs.org", "port": 443})),
        ("step.started", json!({"step": 1})),
        ("tool_call.started", json!({"call_id": "1-1", "name": "mcp__github__create_issue"})),
        (
            "tool_call.ready",
            json!({"call_id": "1-1", "name": "mcp__github__create_issue", "arguments": {"title": "t"}}),
        ),
        ("tool_call.started", json!({"call_id": "1-2", "name": "write"})),
        (
            "tool_call.ready",
            json!({"call_id": "1-2", "name": "write", "arguments": {"path": "NOTES.md", "content": "# Notes\n\"quoted\" line\n"}}),
        ),
        ("future.kind", json!({"some_field": "plain words", "count": 2})),
        ("tool_call.started", json!({"call_id": "1-3", "name": "edit"})),
        (
            "tool_call.ready",
            json!({"call_id": "1-3", "name": "edit", "arguments": {"path": "NOTES.md", "old_string": "# Notes", "new_string": "# Notes\nmore"}}),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_kind_reads_as_words_and_setup_is_a_foldable_log() {
    let Some(b) = Browser::start("web_view_words::events", 1100, 1400).await else { return };
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let run = app.create_run("alice", json!({"prompt": "words"})).await;
    let id = run["id"].as_str().unwrap().to_owned();
    let events = events();
    let sql = app.sql().await;
    for (seq, (kind, payload)) in events.iter().enumerate() {
        sql.execute(
            "INSERT INTO events (run_id, seq, kind, payload) VALUES ($1::text::uuid, $2, $3, $4::text::jsonb)
             ON CONFLICT (run_id, seq) DO UPDATE SET kind = EXCLUDED.kind, payload = EXCLUDED.payload",
            &[&id, &(seq as i64 + 1), kind, &payload.to_string()],
        )
        .await
        .unwrap();
    }
    let last = events.len() as i64;
    sql.execute("UPDATE runs SET status = 'running', last_event_seq = $2 WHERE id = $1::text::uuid", &[&id, &last])
        .await
        .unwrap();

    b.sign_in(&format!("http://{}", app.addr), "alice").await;
    b.js("location.hash = '#/runs/' + arguments[0];", vec![json!(id)]).await;
    b.wait_js(
        "the last event",
        WAIT,
        "return document.querySelectorAll('#timeline [data-to=\"18\"]').length > 0;",
        vec![],
    )
    .await;
    let page = b
        .js(
            "const log = (p) => { const d = document.querySelector(`.env-log[data-phase=${p}]`); \
               return d && { summary: d.querySelector('summary').textContent, out: d.querySelector('pre').textContent, \
                             open: d.open, state: d.dataset.state }; }; \
             const tool = (n) => document.querySelector(`.tool[data-call=\"${n}\"]`); \
             const lines = [...document.querySelectorAll('#timeline .ev-meta')].map((n) => n.textContent); \
             return { setup: log('setup'), maintenance: log('maintenance'), lines, \
               mcp: tool('1-1').querySelector('.tool-head').textContent, \
               write: { view: tool('1-2').querySelector('.args').dataset.view, text: tool('1-2').querySelector('.args').textContent }, \
               edit: { view: tool('1-3').querySelector('.args').dataset.view, \
                       del: [...tool('1-3').querySelectorAll('.args .del')].map((n) => n.textContent), \
                       add: [...tool('1-3').querySelectorAll('.args .add')].map((n) => n.textContent) }, \
               bold: document.querySelectorAll('#timeline b').length };",
            vec![],
        )
        .await;
    b.screenshot(&artifact("web-view-words.png")).await;
    assert_eq!(
        page["setup"],
        json!({"summary": "setup · exit 0 · 5.1 s · stored in the cache", "out": "installing deps\ndone <b>bold</b>\n",
               "open": false, "state": "ok"})
    );
    assert_eq!(
        page["maintenance"],
        json!({"summary": "maintenance · exit 3 · 40 ms", "out": "refreshing\n", "open": true, "state": "error"})
    );
    assert_eq!(page["bold"], 0, "output is text, never HTML");
    let lines: Vec<&str> = page["lines"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
    let has = |needle: &str| lines.iter().any(|l| l.contains(needle));
    assert!(has("Environment web (kiln-sandbox): cache miss: setting up"), "{lines:?}");
    assert!(has("Network denied: evil.example:443 by the run policy: not in the allowlist"), "{lines:?}");
    assert!(has("Network allowed: registry.npmjs.org:443"), "{lines:?}");
    assert!(lines.contains(&"future kind: count 2; some field plain words"), "{lines:?}");
    assert!(lines.iter().all(|l| !l.contains('{')), "no JSON dump: {lines:?}");
    assert_eq!(page["mcp"], "mcp__github__create_issue · tool \"create_issue\" of the MCP server \"github\"");
    assert_eq!(page["write"], json!({"view": "file", "text": "NOTES.md\n# Notes\n\"quoted\" line\n"}));
    assert_eq!(page["edit"], json!({"view": "diff", "del": ["-# Notes\n"], "add": ["+# Notes\n", "+more\n"]}));

    // Every event is on the page once.
    let ranges = b
        .js(
            "return Array.from(document.querySelectorAll('#timeline [data-from]'), \
             (n) => [Number(n.dataset.from), Number(n.dataset.to)]);",
            vec![],
        )
        .await;
    let mut covered: Vec<i64> =
        ranges.as_array().unwrap().iter().flat_map(|r| r[0].as_i64().unwrap()..=r[1].as_i64().unwrap()).collect();
    covered.sort();
    assert_eq!(covered, (1..=last).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_new_run_form_chooses_a_listed_environment_and_the_network() {
    let Some(b) = Browser::start("web_view_words::form", 1100, 1000).await else { return };
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let (status, _) = app.post_json("alice", "/v1/environments", json!({"name": "web", "setup_script": "true"})).await;
    assert_eq!(status, 201);
    let (status, _) = app.post_json("bob", "/v1/environments", json!({"name": "bobs", "setup_script": "true"})).await;
    assert_eq!(status, 201);
    b.sign_in(&format!("http://{}", app.addr), "alice").await;
    let options = b
        .wait_js(
            "the environments listed",
            WAIT,
            "const o = [...document.querySelectorAll('#new-environment option')].map((n) => n.value); \
             return o.length > 1 && o;",
            vec![],
        )
        .await;
    assert_eq!(options, json!(["", "web"]), "the caller's environments only");
    b.client.find(Locator::Css("#new-prompt")).await.unwrap().send_keys("use the environment").await.unwrap();
    b.client.find(Locator::Css("#new-environment")).await.unwrap().select_by_value("web").await.unwrap();
    b.client.find(Locator::Css("#new-egress")).await.unwrap().select_by_value("allowlist").await.unwrap();
    b.client
        .find(Locator::Css("#new-allow"))
        .await
        .unwrap()
        .send_keys("registry.npmjs.org, *.example.org:8443")
        .await
        .unwrap();
    b.client.find(Locator::Css("#new-approval")).await.unwrap().select_by_value("always").await.unwrap();
    b.client.find(Locator::Css("#new-run-submit")).await.unwrap().click().await.unwrap();
    let hash =
        b.wait_js("the run page", WAIT, "return location.hash.startsWith('#/runs/') && location.hash;", vec![]).await;
    let id = hash.as_str().unwrap().trim_start_matches("#/runs/").to_owned();
    let run = app.get_run("alice", &id).await;
    assert_eq!(run["environment"], "web");
    assert_eq!(run["approval"], "always");
    assert_eq!(
        run["sandbox"]["egress"],
        json!({"mode": "allowlist", "allow": [{"host": "registry.npmjs.org"}, {"host": "*.example.org", "ports": [8443]}]})
    );
}

/// Sets a form field's value as typing would (clearing it first).
async fn type_into(b: &Browser, id: &str, text: &str) {
    let field = b.client.find(Locator::Id(id)).await.unwrap();
    field.clear().await.unwrap();
    field.send_keys(text).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environments_page_creates_edits_and_resets_with_secrets_write_only_and_lists_last_runs() {
    let Some(b) = Browser::start("web_view_words::environments", 1100, 1200).await else { return };
    let mut options = Options { worker: false, ..Default::default() };
    let key = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
    options.api.secrets_key = Some(std::sync::Arc::new(kiln_store::secrets::SecretsKey::from_hex(key).unwrap()));
    let app = TestApp::spawn(options).await;
    let secret = "s3cret-never-on-the-page";
    b.sign_in(&format!("http://{}", app.addr), "alice").await;
    b.client.find(Locator::Id("nav-envs")).await.unwrap().click().await.unwrap();
    b.wait_js("the environments page", WAIT, "return !document.getElementById('view-envs').hidden;", vec![]).await;

    type_into(&b, "env-name", "web").await;
    type_into(&b, "env-setup", "npm ci").await;
    type_into(&b, "env-variables", "NODE_ENV=development").await;
    type_into(&b, "env-secrets", &format!("NPM_TOKEN={secret}")).await;
    b.client.find(Locator::Id("env-submit")).await.unwrap().click().await.unwrap();
    b.wait_js("the new row", WAIT, "return !!document.querySelector('#envs-body tr[data-env=web]');", vec![]).await;
    let (status, env) = kiln_get(&app, "/v1/environments/web").await;
    assert_eq!(status, 200);
    assert_eq!((&env["setup_script"], &env["secret_names"]), (&json!("npm ci"), &json!(["NPM_TOKEN"])));
    assert_eq!(env["variables"], json!({"NODE_ENV": "development"}));

    // A run on it is listed under its last runs.
    let run = app.create_run("alice", json!({"prompt": "on web", "environment": "web"})).await;
    b.client.find(Locator::Id("env-new")).await.unwrap().click().await.unwrap();
    b.js("location.hash = '#/'; location.hash = '#/environments';", vec![]).await;
    b.wait_js(
        "the run under the environment",
        WAIT,
        "const a = document.querySelector('#envs-body tr[data-env=web] .runs a'); return !!a && a.getAttribute('href');",
        vec![],
    )
    .await;
    let href = b
        .js("return document.querySelector('#envs-body tr[data-env=web] .runs a').getAttribute('href');", vec![])
        .await;
    assert_eq!(href, json!(format!("#/runs/{}", run["id"].as_str().unwrap())));

    // Editing shows every field but the secrets' values, and keeps them.
    b.click("#envs-body tr[data-env=web] button[data-action=edit]").await;
    let form = b
        .js(
            "return { setup: document.getElementById('env-setup').value, secrets: document.getElementById('env-secrets').value, \
                      hint: document.getElementById('env-secrets').placeholder, name: document.getElementById('env-name').readOnly };",
            vec![],
        )
        .await;
    assert_eq!(form["setup"], "npm ci");
    assert_eq!(form["secrets"], "", "secrets are write-only");
    assert!(form["hint"].as_str().unwrap().contains("stored: NPM_TOKEN"), "{form}");
    assert_eq!(form["name"], true);
    type_into(&b, "env-setup", "npm install").await;
    b.client.find(Locator::Id("env-submit")).await.unwrap().click().await.unwrap();
    b.wait_js("saved", WAIT, "return document.getElementById('env-said').textContent === 'Saved web';", vec![]).await;
    let (_, env) = kiln_get(&app, "/v1/environments/web").await;
    assert_eq!((&env["setup_script"], &env["secret_names"]), (&json!("npm install"), &json!(["NPM_TOKEN"])));

    b.click("#envs-body tr[data-env=web] button[data-action=reset]").await;
    b.wait_js(
        "the reset",
        WAIT,
        "const g = document.querySelector('#envs-body tr[data-env=web] .generation'); return !!g && g.textContent === '1';",
        vec![],
    )
    .await;
    let page = b
        .js(
            "return document.body.innerText + [...document.querySelectorAll('input, textarea')].map((n) => n.value).join(' ');",
            vec![],
        )
        .await;
    assert!(!page.as_str().unwrap().contains(secret), "the secret's value never comes back to the page");
    b.screenshot(&artifact("web-view-environments.png")).await;
}

async fn kiln_get(app: &TestApp, path: &str) -> (u16, Value) {
    let r = app.http.get(app.url(path)).bearer_auth(token("alice")).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}
