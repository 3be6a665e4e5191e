//! The web view of a group of attempts (issue 29), in a real headless
//! Chromium against the real API, worker, Postgres and Docker, with the
//! scripted model answering each attempt from its own script: the attempts
//! side by side, each one's diff on demand, and Select making the group's
//! change the chosen attempt's.
//!
//! Skipped, loudly, only where Chromium is missing and
//! `KILN_REQUIRE_BROWSER` is unset (as `web_view.rs`).
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::time::Duration;

use kiln_protocol::{CreateRun, RepoSpec, RunStatus};
use kiln_tests::browser::{Browser, artifact};
use kiln_tests::git_repo::repo_with;
use kiln_tests::kiln_scripted_model::Reply;
use kiln_tests::{Options, TestApp, outcome, token, worker_config};
use kiln_worker::ProviderKind;
use serde_json::{Value, json};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(90);
const MODELS: [&str; 3] = ["model-one", "model-two", "model-three"];

async fn patch(app: &TestApp, run: Uuid) -> (u16, String) {
    let r = app.http.get(app.url(&format!("/v1/runs/{run}/patch"))).bearer_auth(token("alice")).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The added lines the group's own changes panel shows.
const GROUP_DIFF_JS: &str = "return [...document.querySelectorAll('#diff .diff-file .add')].map((n) => n.textContent);";

/// Which attempts are marked selected, and which Select buttons are enabled.
const MARKS_JS: &str = "return { selected: [...document.querySelectorAll('.attempt[data-selected]')].map((n) => \
                        Number(n.dataset.attempt)), enabled: [...document.querySelectorAll('.attempt')].filter((n) => \
                        !n.querySelector('.attempt-select').disabled).map((n) => Number(n.dataset.attempt)) };";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groups_attempts_show_side_by_side_with_their_diffs_and_select_makes_the_groups_change() {
    let Some(b) = Browser::start("web_view_attempts::group", 1300, 1400).await else { return };
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    config.concurrency = 3;
    app.start_worker(config).await;
    // Attempt K writes a file saying which model it was: three different
    // patches. The third makes one more call, so the counts differ too.
    for (k, model) in MODELS.iter().enumerate() {
        let mut script = vec![Reply::tool("bash", json!({"command": format!("echo from {model} > attempt.txt")}))];
        if k == 2 {
            script.push(Reply::tool("bash", json!({"command": "echo again >> attempt.txt"})));
        }
        script.push(Reply::text(format!("{model} wrote it")));
        app.model.script_model(*model, script);
    }
    let (_repo, url) = repo_with(&[("README", "hello\n")]);
    let spec = CreateRun {
        repo: Some(RepoSpec { url: url.clone(), git_ref: None }),
        attempts: Some(3),
        attempt_models: Some(MODELS.iter().map(|m| (*m).to_owned()).collect()),
        ..CreateRun::new("write attempt.txt")
    };
    let submitted = app.submit("alice", spec).await;
    let attempts = submitted.attempts.clone().expect("a group lists its attempts");

    b.sign_in(&format!("http://{}", app.addr), "alice").await;
    b.js("location.hash = '#/runs/' + arguments[0];", vec![json!(submitted.id)]).await;
    // The panel fills live from the group's stream: every attempt ended,
    // its Select enabled. What each spent comes with its `attempt.finished`
    // and its model from its own read: both are in once the group's end is
    // rendered (after every attempt's end, in seq order) and every card
    // names its model; its status alone can come from either.
    b.wait_js(
        "three ended attempts",
        WAIT,
        "const a = [...document.querySelectorAll('.attempt')]; return a.length === 3 && \
         a.every((n) => n.dataset.status === 'succeeded' && !n.querySelector('.attempt-select').disabled \
                        && n.querySelector('.attempt-model').textContent !== '') && \
         document.getElementById('timeline').dataset.run === arguments[0] && \
         !!document.querySelector('#timeline .end.succeeded');",
        vec![json!(submitted.id)],
    )
    .await;
    let cards = b
        .js(
            "return [...document.querySelectorAll('.attempt')].map((n) => ({ \
               attempt: Number(n.dataset.attempt), run: n.dataset.run, \
               href: n.querySelector('.attempt-open').getAttribute('href'), \
               status: n.querySelector('.status').textContent, model: n.querySelector('.attempt-model').textContent, \
               stats: [...n.querySelectorAll('.attempt-stats dd')].map((d) => d.textContent) }));",
            vec![],
        )
        .await;
    // The cost as the page says it: what each attempt's end recorded.
    let events = app.events("alice", submitted.id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded));
    let costs: Vec<(u32, String)> =
        kiln_tests::pick!(events, kiln_protocol::EventBody::AttemptFinished { attempt, cost_usd, .. } =>
        (*attempt, cost_usd.map_or_else(|| "n/a".to_owned(), |c| format!("${c:.4}"))))
        .collect();
    let cost = |k: usize| costs.iter().find(|(a, _)| *a as usize == k + 1).map(|(_, c)| c.clone()).unwrap();
    for (k, card) in cards.as_array().unwrap().iter().enumerate() {
        let steps = if k == 2 { "3" } else { "2" };
        let lines = if k == 2 { "+2" } else { "+1" };
        assert_eq!(
            card,
            &json!({
                "attempt": k + 1, "run": attempts[k].to_string(), "href": format!("#/runs/{}", attempts[k]),
                "status": "succeeded", "model": format!("Model: {}", MODELS[k]),
                "stats": [steps, cost(k), format!("1 file, {lines} −0")],
            }),
            "attempt {}",
            k + 1
        );
    }
    // Side by side: the cards share a row.
    let tops = b.js("return [...document.querySelectorAll('.attempt')].map((n) => n.offsetTop);", vec![]).await;
    assert_eq!(tops[0], tops[1], "{tops}");
    assert_eq!(tops[1], tops[2], "{tops}");
    // Nothing is the group's change yet.
    assert_eq!(patch(&app, submitted.id).await.0, 404);
    assert_eq!(b.js("return document.getElementById('diff').hidden;", vec![]).await, true);
    assert_eq!(b.js(MARKS_JS, vec![]).await, json!({"selected": [], "enabled": [1, 2, 3]}));

    // Each attempt's diff opens where it is.
    b.click(".attempt[data-attempt='2'] .attempt-diff summary").await;
    b.wait_js(
        "attempt 2's diff",
        WAIT,
        "return !!document.querySelector(\".attempt[data-attempt='2'] .attempt-diff .diff-file .add\");",
        vec![],
    )
    .await;
    let shown = b
        .js(
            "const d = document.querySelector(\".attempt[data-attempt='2'] .attempt-diff\"); \
             return { files: [...d.querySelectorAll('.diff-file')].map((f) => f.dataset.path), \
                      added: [...d.querySelectorAll('.add')].map((n) => n.textContent) };",
            vec![],
        )
        .await;
    assert_eq!(shown, json!({"files": ["attempt.txt"], "added": ["+from model-two\n"]}));

    // Select the second: the group's patch is the second's, on the page and in the API.
    b.click(".attempt[data-attempt='2'] .attempt-select").await;
    b.wait_js(
        "the group's change",
        WAIT,
        "return document.querySelectorAll('#diff .diff-file .add').length === 1;",
        vec![],
    )
    .await;
    assert_eq!(b.js(GROUP_DIFF_JS, vec![]).await, json!(["+from model-two\n"]));
    assert_eq!(b.js(MARKS_JS, vec![]).await, json!({"selected": [2], "enabled": [1, 3]}));
    let second = patch(&app, attempts[1]).await;
    assert_eq!(patch(&app, submitted.id).await, second, "the group's patch is attempt 2's");
    assert_eq!(app.run("alice", submitted.id).await.selected_attempt, Some(2));
    b.screenshot(&artifact("web-view-attempts.png")).await;

    // Selecting again replaces the choice, and the page follows.
    b.click(".attempt[data-attempt='3'] .attempt-select").await;
    b.wait_js(
        "attempt 3's change as the group's",
        WAIT,
        "return document.querySelectorAll('#diff .diff-file .add').length === 2;",
        vec![],
    )
    .await;
    assert_eq!(b.js(GROUP_DIFF_JS, vec![]).await, json!(["+from model-three\n", "+again\n"]));
    assert_eq!(b.js(MARKS_JS, vec![]).await, json!({"selected": [3], "enabled": [1, 2]}));
    assert_eq!(patch(&app, submitted.id).await, patch(&app, attempts[2]).await);
    let pwned: Value = b.js("return document.querySelectorAll('#attempts img').length;", vec![]).await;
    assert_eq!(pwned, json!(0));
}
