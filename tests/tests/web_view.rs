//! The web view at `/`, in a real headless Chromium (WebDriver), against
//! the real API, worker, Postgres and Docker, with the scripted model.
//!
//! Skipped, loudly, only where Chromium is missing and
//! `KILN_REQUIRE_BROWSER` is unset (`scripts/test` installs it; `.ci/run`
//! sets the variable).
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::time::{Duration, Instant};

use fantoccini::Locator;
use kiln_protocol::changes::ChangeScope;
use kiln_tests::browser::{Browser, artifact};
use kiln_tests::changes::staged_change;
use kiln_tests::git_repo::{git, repo_with};
use kiln_tests::kiln_scripted_model::Reply;
use kiln_tests::netcut::CutProxy;
use kiln_tests::{Options, TestApp, token};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
const HOSTILE: &str = "<img src=x onerror=\"window.__pwned=1\"><script>window.__pwned=1</script>";

/// The `[data-from, data-to]` seq ranges of everything rendered on the run page.
const RANGES_JS: &str = "return Array.from(document.querySelectorAll('#timeline [data-from]'), \
                         (n) => [Number(n.dataset.from), Number(n.dataset.to)]);";

/// Whether the run page shows run `arguments[0]` and its end, as CSS
/// selector `arguments[1]` (`.end`, or `.end.succeeded`). The hash alone
/// does not say so: a link or `goto` changes it before the page's
/// `hashchange` handler has replaced the previous run's timeline.
const RUN_ENDED_JS: &str = "const t = document.getElementById('timeline'); \
                            return t.dataset.run === arguments[0] && !!t.querySelector(arguments[1]);";

/// Asserts the rendered ranges cover 1..=last exactly: no gap, no duplicate.
fn assert_exact_cover(ranges: &Value, last: i64) {
    let mut ranges: Vec<(i64, i64)> =
        ranges.as_array().unwrap().iter().map(|r| (r[0].as_i64().unwrap(), r[1].as_i64().unwrap())).collect();
    ranges.sort();
    let mut next = 1;
    for (from, to) in &ranges {
        assert_eq!(*from, next, "rendered events must be 1..={last} once each; {next} is missing or repeated");
        assert!(to >= from);
        next = to + 1;
    }
    assert_eq!(next - 1, last, "rendered events end at {}, the run's last is {last}", next - 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_followed_live_approved_steered_and_survives_a_network_cut() {
    let Some(b) = Browser::start("web_view::live_run", 1100, 1400).await else { return };
    let app = TestApp::spawn(Options {
        script: vec![
            Reply::tool("bash", json!({"command": "echo hello-from-the-sandbox"}))
                .with_text(format!("I will greet the sandbox first. {HOSTILE}")),
            Reply::tool("bash", json!({"command": "echo second-call"})).with_text("Now a second command."),
            Reply::text("All done: both commands ran."),
        ],
        // Stream tokens outlive no network cut here: the page must mint a
        // fresh one to resume (an old one in the URL would get 401).
        api: kiln_api::ApiSettings { stream_token_ttl: Duration::from_secs(2), ..Options::default().api },
        ..Default::default()
    })
    .await;

    // The page reaches the API through a proxy whose network the test cuts.
    let net = CutProxy::start(app.addr).await;
    let site = format!("http://{}", net.addr());
    // Sign in by pasting a token, start a run from the form.
    b.sign_in(&site, "alice").await;
    b.client.find(Locator::Css("#new-prompt")).await.unwrap().send_keys("greet the sandbox").await.unwrap();
    b.client.find(Locator::Css("#new-approval")).await.unwrap().select_by_value("mutating").await.unwrap();
    b.client.find(Locator::Css("#new-run-submit")).await.unwrap().click().await.unwrap();
    let hash =
        b.wait_js("the run page", WAIT, "return location.hash.startsWith('#/runs/') && location.hash;", vec![]).await;
    let id = hash.as_str().unwrap().trim_start_matches("#/runs/").to_owned();

    // The model's text and its tool call appear while the run waits for us.
    b.wait_js(
        "the streamed text",
        WAIT,
        "return [...document.querySelectorAll('#timeline .msg.assistant')].some((n) => n.textContent.includes('I will greet the sandbox first.'));",
        vec![],
    )
    .await;
    b.wait_js(
        "the first tool call awaiting approval",
        WAIT,
        "const c = document.querySelector('.tool[data-state=awaiting]'); \
         return !!c && c.querySelector('.tool-head').textContent === 'bash' \
           && c.querySelector('.args').textContent.includes('hello-from-the-sandbox');",
        vec![],
    )
    .await;
    assert_eq!(app.get_run("alice", &id).await["status"], "awaiting_approval", "the page is live, not a replay");
    assert_eq!(b.js("return document.getElementById('run-status').textContent;", vec![]).await, "awaiting approval");
    // Hostile model text is shown as text, never parsed.
    let hostile = b
        .js(
            "return { elements: document.querySelectorAll('#timeline img, #timeline script').length, \
                      pwned: window.__pwned === 1, \
                      shown: document.getElementById('timeline').textContent.includes(arguments[0]) };",
            vec![json!(HOSTILE)],
        )
        .await;
    assert_eq!(hostile, json!({"elements": 0, "pwned": false, "shown": true}));
    b.screenshot(&artifact("web-view-approval.png")).await;

    // Approve with the button; the command's output comes back.
    b.client
        .find(Locator::Css(".tool[data-state=awaiting] button[data-decision=approve]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.wait_js(
        "the first call's result",
        WAIT,
        "return [...document.querySelectorAll('.tool[data-state=ok] .result pre')].some((n) => n.textContent.includes('hello-from-the-sandbox'));",
        vec![],
    )
    .await;
    let second_call = b
        .wait_js(
            "the second call awaiting approval",
            WAIT,
            "const c = document.querySelectorAll('.tool')[1]; return c && c.dataset.state === 'awaiting' && c.dataset.call;",
            vec![],
        )
        .await;

    // Steer while the run waits.
    b.client.find(Locator::Css("#steer-text")).await.unwrap().send_keys("please also say goodbye").await.unwrap();
    b.client.find(Locator::Css("#steer-form button[type=submit]")).await.unwrap().click().await.unwrap();
    b.wait_js(
        "the steering message",
        WAIT,
        "return [...document.querySelectorAll('#timeline .msg.user')].some((n) => n.textContent === 'please also say goodbye');",
        vec![],
    )
    .await;

    // Cut the page's network: the EventSource drops.
    net.cut();
    b.wait_js(
        "the page to notice the cut",
        WAIT,
        "return Number(document.getElementById('run-conn').dataset.reconnects) >= 1;",
        vec![],
    )
    .await;
    // Meanwhile the run goes on and ends: approve from another client.
    let r = app
        .http
        .post(app.url(&format!("/v1/runs/{id}/approvals/{}", second_call.as_str().unwrap())))
        .bearer_auth(token("alice"))
        .json(&json!({"decision": "approve"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let deadline = Instant::now() + WAIT;
    let run = loop {
        let run = app.get_run("alice", &id).await;
        if run["status"] == "succeeded" {
            break run;
        }
        assert!(Instant::now() < deadline, "run did not succeed: {run}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Once a reconnect of the page's has failed after the run's end, check
    // it missed the end.
    let refused = net.refused();
    let deadline = Instant::now() + WAIT;
    while net.refused() <= refused {
        assert!(Instant::now() < deadline, "the page never tried to reconnect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let missed = b.js("return document.querySelector('#timeline .end') === null;", vec![]).await;
    assert_eq!(missed, true, "the page saw events while its network was cut: the cut did not take");

    // Network back: the page resumes after its last event and renders the rest once.
    net.restore();
    b.wait_js("the run's end", WAIT, "return !!document.querySelector('#timeline .end.succeeded');", vec![]).await;
    let last = run["last_event_seq"].as_i64().unwrap();
    assert_exact_cover(&b.js(RANGES_JS, vec![]).await, last);
    let page = b
        .js(
            "return { status: document.getElementById('run-status').textContent, \
                      conn: document.getElementById('run-conn').dataset.state, \
                      input: document.getElementById('tot-in').textContent, \
                      cost: document.getElementById('tot-cost').textContent, \
                      calls: document.querySelectorAll('.tool[data-state=ok]').length, \
                      end: document.querySelector('#timeline .end').textContent };",
            vec![],
        )
        .await;
    assert_eq!(page["status"], "succeeded");
    assert_eq!(page["conn"], "ended");
    assert_eq!(page["calls"], 2);
    assert!(page["end"].as_str().unwrap().contains("All done: both commands ran."), "{page}");
    assert_ne!(page["input"], "0", "token totals come from step.finished: {page}");
    let cost = page["cost"].as_str().unwrap().to_owned();
    assert!(cost.starts_with('$') && cost != "$0.0000", "the scripted model is priced: {page}");
    // The steering message reached the model.
    assert!(app.model.requests().iter().any(|r| r.body.to_string().contains("please also say goodbye")));

    b.js("window.scrollTo(0, 0);", vec![]).await;
    b.screenshot(&artifact("web-view.png")).await;

    // The runs list shows the run with its status and the same cost.
    b.client.goto(&format!("{site}/#/")).await.unwrap();
    let row = b
        .wait_js(
            "the run in the list with its cost",
            WAIT,
            "const r = document.querySelector(`#runs-body tr[data-run='${arguments[0]}']`); \
             return r && r.querySelector('.cost').textContent.startsWith('$') && \
               { status: r.querySelector('.status').textContent, prompt: r.querySelector('.prompt').textContent, cost: r.querySelector('.cost').textContent };",
            vec![json!(id)],
        )
        .await;
    assert_eq!(row, json!({"status": "succeeded", "prompt": "greet the sandbox", "cost": cost}));

    // A message to a finished run starts a follow-up run in its session,
    // and the page follows it there.
    b.client.goto(&format!("{site}/#/runs/{id}")).await.unwrap();
    b.wait_js("the finished run", WAIT, RUN_ENDED_JS, vec![json!(id), json!(".end")]).await;
    b.client.find(Locator::Css("#steer-text")).await.unwrap().send_keys("one more thing").await.unwrap();
    b.client.find(Locator::Css("#steer-form button[type=submit]")).await.unwrap().click().await.unwrap();
    let follow_up = b
        .wait_js(
            "the follow-up run's page",
            WAIT,
            "return location.hash !== '#/runs/' + arguments[0] && location.hash.startsWith('#/runs/') && location.hash.slice(7);",
            vec![json!(id)],
        )
        .await;
    let follow_up = follow_up.as_str().unwrap();
    b.wait_js("the follow-up run's end", WAIT, RUN_ENDED_JS, vec![json!(follow_up), json!(".end.succeeded")]).await;
    assert_eq!(app.get_run("alice", follow_up).await["session_id"], run["session_id"]);
    // Its prompt comes from its own read of the run, apart from the stream.
    b.wait_js(
        "the follow-up run's prompt",
        WAIT,
        "return document.getElementById('run-prompt').textContent === 'one more thing';",
        vec![],
    )
    .await;

    // Readable on a phone: nothing wider than the screen.
    b.client.set_window_size(390, 844).await.unwrap();
    b.client.goto(&format!("{site}/#/runs/{id}")).await.unwrap();
    b.wait_js("the run page on a phone", WAIT, RUN_ENDED_JS, vec![json!(id), json!(".end")]).await;
    let overflow = b.js("return document.documentElement.scrollWidth - window.innerWidth;", vec![]).await;
    assert!(overflow.as_i64().unwrap() <= 0, "the page scrolls sideways on a phone by {overflow} px");
    b.screenshot(&artifact("web-view-phone.png")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_serves_with_a_strict_policy_and_the_api_stays_json() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let page = app.http.get(app.url("/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
    let csp = page.headers()["content-security-policy"].to_str().unwrap().to_owned();
    for directive in ["default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"] {
        assert!(csp.contains(directive), "{csp}");
    }
    assert!(!csp.contains("unsafe"), "{csp}");
    assert_eq!(page.headers()["x-content-type-options"], "nosniff");
    let html = page.text().await.unwrap();
    assert!(html.contains("/web/app.js") && !html.contains("<script>"), "no inline script");
    let js = app.http.get(app.url("/web/app.js")).send().await.unwrap();
    assert!(js.headers()["content-type"].to_str().unwrap().starts_with("text/javascript"));
    assert!(!js.text().await.unwrap().contains("innerHTML"), "the script never parses text as HTML");
    // The API is unchanged: unknown routes and unauthenticated calls stay JSON errors.
    let missing = app.http.get(app.url("/v1/nope")).send().await.unwrap();
    assert_eq!(missing.status(), 404);
    assert_eq!(missing.json::<Value>().await.unwrap()["error"]["code"], "not_found");
    let anonymous = app.http.get(app.url("/v1/runs")).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    let elsewhere = app.http.get(app.url("/index.html")).send().await.unwrap();
    assert_eq!(elsewhere.status(), 404);
}

/// The events of a long run: 5,000 in all, with every kind the page draws,
/// two kinds it has no listener for (read back from the JSON page), a plan
/// and hostile text.
fn long_run_events(total: i64) -> Vec<(String, Value)> {
    let mut events: Vec<(String, Value)> = vec![
        ("run.started".into(), json!({"worker": "w1", "attempt": 1})),
        ("sandbox.ready".into(), json!({"container": "c1", "image": "kiln-sandbox:latest"})),
    ];
    let mut step = 0;
    // run.queued is seq 1; the terminal event is the last.
    while (events.len() as i64) < total - 60 {
        step += 1;
        let call = format!("call-{step}");
        events.push(("step.started".into(), json!({"step": step})));
        for i in 0..20 {
            let text = if i == 3 { HOSTILE.to_owned() } else { format!("word{i} of step {step}. ") };
            events.push(("text.delta".into(), json!({"text": text})));
        }
        events.push(("tool_call.started".into(), json!({"call_id": call, "name": "bash"})));
        for piece in ["{\"command\":", " \"echo ", &format!("step {step}\"}}")] {
            events.push(("tool_call.delta".into(), json!({"call_id": call, "arguments_delta": piece})));
        }
        events.push((
            "tool_call.ready".into(),
            json!({"call_id": call, "name": "bash", "arguments": {"command": format!("echo step {step}")}}),
        ));
        for i in 0..10 {
            events.push(("tool.output".into(), json!({"call_id": call, "text": format!("line {i}\n")})));
        }
        events.push((
            "tool.result".into(),
            json!({"call_id": call, "name": "bash", "output": "line 0\n…", "is_error": false, "duration_ms": 12}),
        ));
        if step % 10 == 0 {
            let items = json!([
                {"text": "read the code", "status": "done"},
                {"text": format!("step {step}"), "status": "in_progress"},
                {"text": "write tests", "status": "pending"}
            ]);
            events.push(("todo".into(), json!({ "items": items })));
            events.push(("mystery.kind".into(), json!({"note": HOSTILE})));
        }
        events.push((
            "step.finished".into(),
            json!({"step": step, "finish_reason": "tool_use",
                   "usage": {"input_tokens": 1000, "output_tokens": 50}, "cost_usd": 0.00105}),
        ));
    }
    while (events.len() as i64) < total - 3 {
        events.push(("text.delta".into(), json!({"text": "closing words. "})));
    }
    events.push(("another.unknown".into(), json!({})));
    events.push(("run.succeeded".into(), json!({"summary": "long run done"})));
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_of_5000_events_renders_quickly_and_exactly() {
    const TOTAL: i64 = 5000;
    let Some(b) = Browser::start("web_view::long_run", 1100, 1400).await else { return };
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let run = app.create_run("alice", json!({"prompt": "a long run"})).await;
    let id = run["id"].as_str().unwrap().to_owned();
    let events = long_run_events(TOTAL);
    assert_eq!(events.len() as i64, TOTAL - 1);
    let steps = events.iter().filter(|(k, _)| k == "step.finished").count() as i64;
    let seqs: Vec<i64> = (2..=TOTAL).collect();
    let kinds: Vec<String> = events.iter().map(|(k, _)| k.clone()).collect();
    let payloads: Vec<String> = events.iter().map(|(_, p)| p.to_string()).collect();
    let sql = app.sql().await;
    sql.execute(
        "INSERT INTO events (run_id, seq, kind, payload)
         SELECT $1::text::uuid, s, k, p::jsonb FROM unnest($2::bigint[], $3::text[], $4::text[]) AS t(s, k, p)",
        &[&id, &seqs, &kinds, &payloads],
    )
    .await
    .unwrap();
    sql.execute(
        "UPDATE runs SET status = 'succeeded', last_event_seq = $2, started_at = now(), finished_at = now()
         WHERE id = $1::text::uuid",
        &[&id, &TOTAL],
    )
    .await
    .unwrap();

    b.sign_in(&format!("http://{}", app.addr), "alice").await;
    let started = Instant::now();
    b.js("location.hash = '#/runs/' + arguments[0];", vec![json!(id)]).await;
    b.wait_js("the long run's end", WAIT, "return !!document.querySelector('#timeline .end.succeeded');", vec![]).await;
    let elapsed = started.elapsed();
    eprintln!("web view: {TOTAL} events ({steps} steps) rendered in {} ms", elapsed.as_millis());
    // Only a hang is caught: the time is printed, not asserted (speed
    // belongs in bench/: `--bin web_view` times a navigation to such a run
    // against the same events as a static page).
    assert!(elapsed < Duration::from_secs(60), "5,000 events took {elapsed:?} to render");

    assert_exact_cover(&b.js(RANGES_JS, vec![]).await, TOTAL);
    let page = b
        .js(
            "return { pwned: window.__pwned === 1, \
                      parsed: document.querySelectorAll('#timeline img, #timeline script').length, \
                      tools: document.querySelectorAll('#timeline .tool').length, \
                      plan: document.getElementById('plan').hidden ? null : \
                        [...document.querySelectorAll('#plan-items li')].map((li) => li.dataset.status), \
                      changes: !document.getElementById('diff').hidden, \
                      input: document.getElementById('tot-in').textContent, \
                      steps: document.getElementById('tot-steps').textContent };",
            vec![],
        )
        .await;
    // Counts as the page shows them, `12,345`: as the CLI shows them.
    let input = kiln_cli::render::totals::thousands(u64::try_from(steps * 1000).unwrap());
    assert_eq!(
        page,
        json!({"pwned": false, "parsed": 0, "tools": steps, "plan": ["done", "in_progress", "pending"],
               "changes": false, "input": input, "steps": steps.to_string()})
    );

    b.screenshot(&artifact("web-view-long-run.png")).await;
}

/// How long the page waits before its first retry of a failed stream
/// (`retryDelay`'s first value in app.js).
fn first_retry() -> Duration {
    let js = include_str!("../../api/src/web/app.js");
    let ms = js.split("retryDelay: ").nth(1).and_then(|r| r.split(',').next()).and_then(|v| v.trim().parse().ok());
    Duration::from_millis(ms.expect("app.js sets retryDelay"))
}

/// What a newcomer pastes (the whole `export …` line `kiln up` prints)
/// signs in; an unknown run id says so and leaves nothing of the previous
/// run's page behind: no status, no endless "reconnecting…", no message box.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pasted_export_line_signs_in_and_an_unknown_run_says_so() {
    let Some(b) = Browser::start("web_view::pasted_line", 1000, 900).await else { return };
    let app =
        TestApp::spawn(Options { script: vec![Reply::text("done").with_cached_input(1974)], ..Default::default() })
            .await;
    let site = app.url("");
    let site = site.trim_end_matches('/');
    b.client.goto(&format!("{site}/")).await.unwrap();
    let field = b.client.wait().at_most(WAIT).for_element(Locator::Css("#signin-token")).await.unwrap();
    field.send_keys(&format!("export KILN_URL={site} KILN_TOKEN={}", token("alice"))).await.unwrap();
    b.client.find(Locator::Css("#signin-form button[type=submit]")).await.unwrap().click().await.unwrap();
    b.wait_js("the runs list", WAIT, "return !document.getElementById('view-runs').hidden;", vec![]).await;

    // A run that ended: its page shows its status and its cached input.
    let id = app.submit("alice", kiln_protocol::CreateRun::new("hello")).await.id;
    app.events("alice", id).await;
    b.client.goto(&format!("{site}/#/runs/{id}")).await.unwrap();
    b.wait_js(
        "the run's status",
        WAIT,
        "return document.getElementById('run-status').textContent === 'succeeded';",
        vec![],
    )
    .await;
    // It had no repository, and the page says what that means.
    b.wait_js(
        "the run's repository line",
        WAIT,
        "return document.getElementById('run-repo').textContent.includes('empty workspace');",
        vec![],
    )
    .await;
    // The totals count its cached input (the step's 1,974 tokens).
    b.wait_js(
        "1,974 cached input tokens in the totals",
        WAIT,
        "return document.getElementById('tot-cached').textContent === '1,974';",
        vec![],
    )
    .await;

    // Then an id that is nobody's.
    let unknown = uuid::Uuid::now_v7().to_string();
    b.client.goto(&format!("{site}/#/runs/{unknown}")).await.unwrap();
    b.wait_js(
        "the not-found notice",
        WAIT,
        "return document.getElementById('notice').textContent.includes('No run with this id');",
        vec![],
    )
    .await;
    // From here the page asks nothing more about that run: after its first
    // retry's wait, twice over (a retry's request on loopback takes
    // milliseconds), it has made no request for it and not reconnected.
    // (Room in the page's timing buffer; a request under way since before
    // the notice is not counted.)
    let mark = b.js("performance.clearResourceTimings(); return performance.now();", vec![]).await;
    tokio::time::sleep(first_retry() * 2 + Duration::from_millis(500)).await;
    let asked = b
        .js(
            "return performance.getEntriesByType('resource').filter((e) => e.startTime >= arguments[0]).map((e) => e.name);",
            vec![mark],
        )
        .await;
    let asked: Vec<String> = serde_json::from_value(asked).unwrap();
    assert!(!asked.iter().any(|u| u.contains(&unknown)), "the page asked for the unknown run again: {asked:?}");
    let state = b
        .js(
            "return [document.getElementById('run-status').textContent, \
                     document.getElementById('run-conn').dataset.state, \
                     document.getElementById('steer-form').hidden, \
                     document.getElementById('run-cancel').hidden];",
            vec![],
        )
        .await;
    assert_eq!(state, json!(["", "ended", true, true]), "status, connection, message box hidden, cancel hidden");
    let repo = b.js("return document.getElementById('run-repo').textContent;", vec![]).await;
    assert_eq!(repo, json!(""), "nothing of the previous run's repository line stays");
}

#[tokio::test]
async fn a_sub_agent_appears_nested_and_live_under_its_call_and_opens() {
    let Some(b) = Browser::start("web_view::sub_agent", 1100, 1400).await else { return };
    let task = json!({"description": "find the files", "prompt": "WEBKID: list the workspace", "agent": "explore"});
    let app = TestApp::spawn(Options {
        script: vec![Reply::tool("task", task), Reply::text("The parent is done.")],
        ..Default::default()
    })
    .await;
    // The child's last answer takes a while: long enough to see it live.
    app.model.script_thread(
        "WEBKID",
        vec![
            Reply::tool("ls", json!({"path": "."})),
            Reply::text("the kid found nothing").with_delay(Duration::from_secs(8)),
        ],
    );
    let site = format!("http://{}", app.addr);
    b.sign_in(&site, "alice").await;
    let id = app.submit("alice", kiln_protocol::CreateRun::new("delegate")).await.id;
    b.client.goto(&format!("{site}/#/runs/{id}")).await.unwrap();

    // While the child runs, it sits inside the task call's card, with its
    // tool call's result, marked running.
    let child = b
        .wait_js(
            "the running sub-agent nested under its call",
            WAIT,
            "const k = document.querySelector('#timeline .tool .subagent[data-state=running]');
             return !!k && [...k.querySelectorAll('.child-line')].some((n) => n.textContent.includes('✓ ls')) && k.dataset.run;",
            vec![],
        )
        .await;
    let child = child.as_str().unwrap().to_owned();
    // Then it ends, in place, with its answer.
    b.wait_js("the parent's end", WAIT, "return !!document.querySelector('#timeline .end.succeeded');", vec![]).await;
    let end = b
        .js(
            "return document.querySelector('#timeline .tool .subagent[data-state=ok] .subagent-end')?.textContent;",
            vec![],
        )
        .await;
    assert!(end.as_str().unwrap().contains("the kid found nothing"), "{end}");
    let last = app.run("alice", id).await.last_event_seq;
    assert_exact_cover(&b.js(RANGES_JS, vec![]).await, last);
    b.screenshot(&artifact("web_view_sub_agent.png")).await;

    // Its link opens the child's own run, with its own whole stream.
    b.client.find(Locator::Css(".subagent .open-child")).await.unwrap().click().await.unwrap();
    b.wait_js("the child's own page", WAIT, RUN_ENDED_JS, vec![json!(child), json!(".end.succeeded")]).await;
    let child_last = app.run("alice", child.parse().unwrap()).await.last_event_seq;
    assert_exact_cover(&b.js(RANGES_JS, vec![]).await, child_last);
}

/// A run's change, file by file: names, statuses and counts; added and
/// removed lines coloured; a binary file named, not dumped; a hostile file
/// name shown as text; and the download is the API's patch, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_change_is_shown_file_by_file_and_downloads_as_the_apis_patch() {
    let downloads = tempfile::tempdir().unwrap();
    let Some(b) = Browser::start_downloading("web_view::changes", 1100, 1400, downloads.path()).await else {
        return;
    };
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let hostile_name = "<img src=x onerror=\"window.__pwned=1\">.md";
    let (repo, url) = repo_with(&[("README.md", "hello\n"), ("old.txt", "going\n")]);
    let base = git(repo.path(), &["rev-parse", "HEAD"]);
    let work = tempfile::tempdir().unwrap();
    git(work.path(), &["clone", "-q", &url, "."]);
    std::fs::write(work.path().join("README.md"), "hello\nworld\nagain\n").unwrap();
    std::fs::write(work.path().join("logo.bin"), [0u8, 159, 146, 150, 0, 1]).unwrap();
    std::fs::write(work.path().join(hostile_name), "boo\n").unwrap();
    std::fs::remove_file(work.path().join("old.txt")).unwrap();
    let change = staged_change(work.path(), &base, ChangeScope::Run);
    let id = app.run_with_change("alice", &url, &[change]).await;
    let patch =
        app.http.get(app.url(&format!("/v1/runs/{id}/patch"))).bearer_auth(token("alice")).send().await.unwrap();
    let patch = patch.bytes().await.unwrap().to_vec();

    b.sign_in(&format!("http://{}", app.addr), "alice").await;
    b.js("location.hash = '#/runs/' + arguments[0];", vec![json!(id)]).await;
    b.wait_js("the changes panel", WAIT, "return document.querySelectorAll('#diff .diff-file').length === 4;", vec![])
        .await;
    let panel = b
        .js(
            "const files = [...document.querySelectorAll('#diff .diff-file')].map((d) => ({ \
               path: d.dataset.path, status: d.dataset.status, summary: d.querySelector('summary').textContent, \
               added: [...d.querySelectorAll('.add')].map((n) => n.textContent), \
               removed: [...d.querySelectorAll('.del')].map((n) => n.textContent), \
               shown: !!d.querySelector('pre') })); \
             return { files, summary: document.getElementById('diff-summary').textContent, \
                      pwned: window.__pwned === 1, images: document.querySelectorAll('#diff img').length };",
            vec![],
        )
        .await;
    assert_eq!(panel["summary"], "4 files, +3 −1");
    assert_eq!((panel["pwned"].clone(), panel["images"].clone()), (json!(false), json!(0)));
    let files = panel["files"].as_array().unwrap();
    let file = |path: &str| files.iter().find(|f| f["path"] == path).unwrap_or_else(|| panic!("{path}: {files:?}"));
    assert_eq!(file("README.md")["added"], json!(["+world\n", "+again\n"]));
    assert_eq!(file("README.md")["summary"], "README.mdmodified+2−0");
    assert_eq!(
        (file("old.txt")["status"].clone(), file("old.txt")["removed"].clone()),
        (json!("deleted"), json!(["-going\n"]))
    );
    assert_eq!(file("logo.bin")["shown"], false, "a binary file is named, not dumped");
    assert_eq!(file("logo.bin")["summary"], "logo.binaddedbinary");
    assert_eq!(file(hostile_name)["added"], json!(["+boo\n"]));

    // The download is the API's patch, byte for byte.
    let link = b.client.find(Locator::Css("#diff-download")).await.unwrap();
    assert_eq!(link.attr("download").await.unwrap().unwrap(), format!("kiln-run-{id}.patch"));
    link.click().await.unwrap();
    let saved = downloads.path().join(format!("kiln-run-{id}.patch"));
    let deadline = Instant::now() + WAIT;
    while !saved.is_file() {
        assert!(
            Instant::now() < deadline,
            "nothing downloaded: {:?}",
            std::fs::read_dir(downloads.path()).unwrap().collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(std::fs::read(&saved).unwrap(), patch);
    b.screenshot(&artifact("web-view-changes.png")).await;
}

/// A real run, watched live: the panel fills when the run ends, from the
/// worker's own capture, and downloads the API's patch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_runs_change_appears_when_it_ends() {
    let downloads = tempfile::tempdir().unwrap();
    let Some(b) = Browser::start_downloading("web_view::real_change", 1100, 1400, downloads.path()).await else {
        return;
    };
    let edit = "printf 'world\\n' >> README.md && printf 'new\\n' > NEW.md";
    let app = TestApp::spawn(Options {
        script: vec![Reply::tool("bash", json!({ "command": edit })), Reply::text("Edited.")],
        ..Default::default()
    })
    .await;
    let (_repo, url) = repo_with(&[("README.md", "hello\n")]);
    let spec = json!({"prompt": "edit", "repo": {"url": url}, "approval": "mutating"});
    let id = app.create_run("alice", spec).await["id"].as_str().unwrap().to_owned();

    b.sign_in(&format!("http://{}", app.addr), "alice").await;
    b.js("location.hash = '#/runs/' + arguments[0];", vec![json!(id)]).await;
    b.wait_js("the call awaiting approval", WAIT, "return !!document.querySelector('.approval button');", vec![]).await;
    assert_eq!(b.js("return document.getElementById('diff').hidden;", vec![]).await, true, "no change before the end");
    b.client.find(Locator::Css(".approval button[data-decision=approve]")).await.unwrap().click().await.unwrap();
    b.wait_js("the changes panel", WAIT, "return document.querySelectorAll('#diff .diff-file').length === 2;", vec![])
        .await;
    let shown = b
        .js(
            "return [...document.querySelectorAll('#diff .diff-file')].map((d) => \
               [d.dataset.path, d.dataset.status, [...d.querySelectorAll('.add')].map((n) => n.textContent).join('')]);",
            vec![],
        )
        .await;
    assert_eq!(shown, json!([["NEW.md", "added", "+new\n"], ["README.md", "modified", "+world\n"]]));

    let patch =
        app.http.get(app.url(&format!("/v1/runs/{id}/patch"))).bearer_auth(token("alice")).send().await.unwrap();
    let patch = patch.bytes().await.unwrap().to_vec();
    b.client.find(Locator::Css("#diff-download")).await.unwrap().click().await.unwrap();
    let saved = downloads.path().join(format!("kiln-run-{id}.patch"));
    let deadline = Instant::now() + WAIT;
    while !saved.is_file() {
        assert!(Instant::now() < deadline, "nothing downloaded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(std::fs::read(&saved).unwrap(), patch);
}
