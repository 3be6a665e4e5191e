//! Best-of-N attempts (issue 29): a run submitted with `"attempts": N` is a
//! group of N runs of the same task, each in its own session and sandbox;
//! the group's stream nests their events as they happen, the group ends
//! when every attempt has, and choosing one makes its change the group's.
//! Real Postgres and Docker; the scripted model answers each attempt from
//! its own script, picked by the attempt's model (`attempt_models`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use kiln_protocol::{CreateRun, EventBody, GroupLimits, RepoSpec, Run, RunStatus};
use kiln_scripted_model::Reply;
use kiln_tests::git_repo::repo_with;
use kiln_tests::{Event, Options, TestApp, assert_dense, kinds, outcome, pick, token, worker_config};
use kiln_worker::ProviderKind;
use serde_json::{Value, json};
use uuid::Uuid;

const MODELS: [&str; 3] = ["model-one", "model-two", "model-three"];

/// An app whose one worker runs `slots` runs at once.
async fn app(slots: usize) -> TestApp {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let mut config = worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    config.concurrency = slots;
    app.start_worker(config).await;
    app
}

/// A group of `models.len()` attempts at `prompt` on `url`, one per model.
fn group(url: &str, prompt: &str, models: &[&str]) -> CreateRun {
    CreateRun {
        repo: Some(RepoSpec { url: url.to_owned(), git_ref: None }),
        attempts: Some(models.len() as u32),
        attempt_models: Some(models.iter().map(|m| (*m).to_owned()).collect()),
        ..CreateRun::new(prompt)
    }
}

/// An attempt that writes `attempt.txt` saying which model it was, then
/// answers; `pause` before its answer keeps it running a while.
fn writer(model: &str, pause: Duration) -> Vec<Reply> {
    vec![
        Reply::tool("bash", json!({"command": format!("echo from {model} > attempt.txt")})),
        Reply::text(format!("{model} wrote it")).with_delay(pause),
    ]
}

async fn patch(app: &TestApp, run: Uuid) -> (u16, String) {
    let r = app.http.get(app.url(&format!("/v1/runs/{run}/patch"))).bearer_auth(token("alice")).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn select(app: &TestApp, group: Uuid, attempt: u32) -> (u16, Value) {
    app.post_json("alice", &format!("/v1/runs/{group}/select"), json!({ "attempt": attempt })).await
}

/// The group's copies of its attempts' events: (attempt, kind of the
/// attempt's event), in the group's order.
fn nested(events: &[Event]) -> Vec<(u32, String)> {
    pick!(events, EventBody::AttemptEvent { attempt, event, .. } =>
        (*attempt, event["kind"].as_str().unwrap_or_default().to_owned()))
    .collect()
}

/// Where in the group's stream attempt `attempt`'s end is.
fn end_of(events: &[Event], attempt: u32) -> usize {
    events
        .iter()
        .position(|e| matches!(&e.body, EventBody::AttemptFinished { attempt: a, .. } if *a == attempt))
        .unwrap_or_else(|| panic!("no attempt.finished for {attempt}: {:?}", kinds(events)))
}

#[tokio::test]
async fn three_attempts_are_three_runs_in_three_sandboxes_with_three_patches_streamed_live_into_the_group() {
    let (_repo, url) = repo_with(&[("README", "hello\n")]);
    let app = app(3).await;
    // The first attempt answers at once; the others take their time, so
    // its tool result reaches the group while they are still running.
    app.model.script_model(MODELS[0], writer(MODELS[0], Duration::ZERO));
    app.model.script_model(MODELS[1], writer(MODELS[1], Duration::from_secs(4)));
    app.model.script_model(MODELS[2], writer(MODELS[2], Duration::from_secs(4)));
    let submitted = app.submit("alice", group(&url, "write attempt.txt", &MODELS)).await;
    let attempts = submitted.attempts.clone().expect("a group lists its attempts");
    assert_eq!(attempts.len(), 3);

    let events = app.events("alice", submitted.id).await;
    assert_dense(&events, 1);
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    // Live: attempt 1's tool result is in the group's stream before the
    // other attempts ended (their ends are written after they end).
    let copies = nested(&events);
    let first_result = events
        .iter()
        .position(
            |e| matches!(&e.body, EventBody::AttemptEvent { attempt: 1, event, .. } if event["kind"] == "tool.result"),
        )
        .unwrap_or_else(|| panic!("attempt 1's tool result is not in the group's stream: {copies:?}"));
    assert!(first_result < end_of(&events, 2) && first_result < end_of(&events, 3), "{:?}", kinds(&events));
    for attempt in 1..=3 {
        for kind in ["sandbox.ready", "step.started", "tool.result", "changes.captured"] {
            assert!(copies.contains(&(attempt, kind.to_owned())), "attempt {attempt} lacks {kind}: {copies:?}");
        }
    }
    assert!(!copies.iter().any(|(_, kind)| kind == "text.delta"), "streamed text stays in the attempt's stream");

    // Three runs, each its own session, container and patch, each with the
    // model it was given.
    let mut containers = BTreeSet::new();
    let mut sessions = BTreeSet::new();
    let mut patches = BTreeSet::new();
    for (k, id) in attempts.iter().enumerate() {
        let run: Run = app.run("alice", *id).await;
        assert_eq!((run.group_run_id, run.attempt_number), (Some(submitted.id), Some(k as u32 + 1)));
        assert_eq!(run.model.name.as_deref(), Some(MODELS[k]));
        assert_eq!(run.status, RunStatus::Succeeded);
        sessions.insert(run.session_id);
        let own = app.events("alice", *id).await;
        containers.extend(pick!(own, EventBody::SandboxReady { container, .. } => container.clone()));
        let (status, text) = patch(&app, *id).await;
        assert_eq!(status, 200);
        assert!(text.contains(&format!("+from {}", MODELS[k])), "{text}");
        patches.insert(text);
    }
    assert_eq!((containers.len(), sessions.len(), patches.len()), (3, 3, 3), "{containers:?}");
    assert!(!sessions.contains(&submitted.session_id));

    // The group's totals are the sum of its attempts'.
    let finished: Vec<(u64, u32)> = pick!(events, EventBody::AttemptFinished { usage, steps, .. } =>
        (usage.input_tokens + usage.output_tokens, *steps))
    .collect();
    assert_eq!(finished.len(), 3);
    let group = app.run("alice", submitted.id).await;
    let result = group.result.expect("the group's result");
    assert_eq!(result["steps"], json!(finished.iter().map(|(_, s)| s).sum::<u32>()));
    let tokens = result["usage"]["input_tokens"].as_u64().unwrap() + result["usage"]["output_tokens"].as_u64().unwrap();
    assert_eq!(tokens, finished.iter().map(|(t, _)| t).sum::<u64>());
    // Nothing is the group's change until one is chosen.
    assert_eq!(patch(&app, submitted.id).await.0, 404);
}

#[tokio::test]
async fn selecting_the_second_makes_the_group_patch_the_seconds_and_choosing_again_replaces_it() {
    let (_repo, url) = repo_with(&[("README", "hello\n")]);
    let app = app(3).await;
    for model in MODELS {
        app.model.script_model(model, writer(model, Duration::ZERO));
    }
    let submitted = app.submit("alice", group(&url, "write attempt.txt", &MODELS)).await;
    let attempts = submitted.attempts.clone().unwrap();
    let events = app.events("alice", submitted.id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));

    let (status, chosen) = select(&app, submitted.id, 2).await;
    assert_eq!(status, 200, "{chosen}");
    assert_eq!(chosen["selected_attempt"], 2);
    let second = patch(&app, attempts[1]).await.1;
    assert_eq!(patch(&app, submitted.id).await, (200, second.clone()));
    let group = app.run("alice", submitted.id).await;
    assert_eq!(group.changes.map(|c| c.files), Some(1), "the run object carries the chosen change's totals");

    // Choosing again before any delivery replaces the choice.
    assert_eq!(select(&app, submitted.id, 3).await.0, 200);
    let third = patch(&app, attempts[2]).await.1;
    assert_ne!(third, second);
    assert_eq!(patch(&app, submitted.id).await, (200, third));
    let stored = app.stored_events(submitted.id).await;
    let selected: Vec<u32> = pick!(stored, EventBody::AttemptSelected { attempt, .. } => *attempt).collect();
    assert_eq!(selected, [2, 3]);

    // What cannot be chosen, said clearly.
    let (status, body) = select(&app, submitted.id, 4).await;
    assert_eq!(status, 409, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("3 attempts"), "{body}");
    let (status, body) = select(&app, attempts[0], 1).await;
    assert_eq!(status, 409, "an attempt is not a group: {body}");
    let (status, _) = app.post_json("bob", &format!("/v1/runs/{}/select", submitted.id), json!({"attempt": 1})).await;
    assert_eq!(status, 404, "another subject's group");
}

#[tokio::test]
async fn one_environment_three_attempts_setup_runs_once() {
    let (_repo, url) = repo_with(&[("README", "hello\n")]);
    let app = app(3).await;
    let (status, env) = app
        .post_json("alice", "/v1/environments", json!({"name": "slow", "setup_script": "echo setting-up; sleep 3"}))
        .await;
    assert_eq!(status, 201, "{env}");
    let spec = CreateRun { environment: Some("slow".into()), ..group(&url, "look around", &MODELS) };
    let submitted = app.submit("alice", spec).await;
    let events = app.events("alice", submitted.id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));

    let mut starts = Vec::new();
    for id in submitted.attempts.unwrap() {
        let own = app.events("alice", id).await;
        assert_eq!(outcome(&own), Some(RunStatus::Succeeded), "{:?}", kinds(&own));
        starts.extend(pick!(own, EventBody::EnvironmentStarted { cache_key, hit, .. } => (cache_key.clone(), *hit)));
        let setups = pick!(own, EventBody::EnvironmentFinished { phase, .. } => phase.clone())
            .filter(|phase| phase == "setup")
            .count();
        assert!(setups <= 1);
    }
    let keys: BTreeSet<&String> = starts.iter().map(|(key, _)| key).collect();
    assert_eq!(keys.len(), 1, "one environment, one cache key: {starts:?}");
    let misses = starts.iter().filter(|(_, hit)| !hit).count();
    assert_eq!((starts.len(), misses), (3, 1), "setup ran once, the others were served from its cache: {starts:?}");
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let options = bollard::query_parameters::RemoveImageOptionsBuilder::new().force(true).build();
    let _ = docker.remove_image(&format!("kiln-env:{}", starts[0].0), Some(options), None).await;
}

#[tokio::test]
async fn a_group_budget_bounds_what_the_attempts_spend_together() {
    let app = app(3).await;
    // Each attempt would take ten steps.
    for model in MODELS {
        let busy = (0..10).map(|i| Reply::tool("bash", json!({"command": format!("echo {i}")})).with_usage(50, 5));
        app.model.script_model(model, busy.chain([Reply::text("done")]).collect());
    }
    let limits = GroupLimits { max_steps: Some(7), max_tokens: Some(1_000), ..Default::default() };
    let spec = CreateRun {
        attempts: Some(3),
        attempt_models: Some(MODELS.iter().map(|m| (*m).to_owned()).collect()),
        group_limits: Some(limits),
        ..CreateRun::new("keep busy")
    };
    let submitted = app.submit("alice", spec).await;
    assert_eq!(submitted.group_limits, Some(limits));
    let events = app.events("alice", submitted.id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Failed), "no attempt finished its task: {:?}", kinds(&events));

    let mut steps = 0;
    let mut tokens = 0;
    for id in submitted.attempts.unwrap() {
        let own = app.events("alice", id).await;
        assert_eq!(outcome(&own), Some(RunStatus::Failed), "{:?}", kinds(&own));
        steps += pick!(own, EventBody::StepFinished { .. } => ()).count() as u32;
        tokens +=
            pick!(own, EventBody::StepFinished { usage, .. } => usage.input_tokens + usage.output_tokens).sum::<u64>();
    }
    assert!(steps <= 7, "the attempts took {steps} steps together; the group's budget is 7");
    assert!(steps >= 6, "each attempt used its share: {steps}");
    // Each attempt stops before a step once its share of tokens is spent,
    // so together they overshoot by at most one step each (55 tokens).
    assert!(tokens <= 1_000 + 3 * 55, "{tokens} tokens");
    let result = app.run("alice", submitted.id).await.result.unwrap();
    assert_eq!(result["steps"], json!(steps), "the group's total is its attempts' sum");
}

#[tokio::test]
async fn cancelling_one_attempt_leaves_the_others_and_cancelling_the_group_ends_them_all() {
    let app = app(2).await;
    app.model.script_model("stuck", vec![Reply::hang()]);
    // Each request of a model takes its script's next reply.
    app.model.script_model("quick", vec![Reply::text("done quickly").with_delay(Duration::from_secs(2))]);
    let models = ["stuck", "quick", "quick"];
    let spec = CreateRun {
        attempts: Some(3),
        attempt_models: Some(models.iter().map(|m| (*m).to_owned()).collect()),
        ..CreateRun::new("try")
    };
    let one = app.submit("alice", spec.clone()).await;
    let stuck = one.attempts.clone().unwrap()[0];
    app.wait_for_event(stuck, "step.started").await;
    let (status, _) = app.post_json("alice", &format!("/v1/runs/{stuck}/cancel"), json!({})).await;
    assert_eq!(status, 202);
    let events = app.events("alice", one.id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let ends: Vec<(u32, String)> =
        pick!(events, EventBody::AttemptFinished { attempt, status, .. } => (*attempt, status.clone())).collect();
    let mut ends = ends;
    ends.sort();
    assert_eq!(
        ends,
        [(1, "cancelled".to_owned()), (2, "succeeded".to_owned()), (3, "succeeded".to_owned())],
        "{:?}",
        kinds(&events)
    );

    // The whole group: two attempts are running (two slots), one queued.
    app.model.script_model("stuck-too", vec![Reply::hang(), Reply::hang(), Reply::hang()]);
    let all = CreateRun { attempt_models: Some(vec!["stuck-too".into()]), ..spec };
    let group = app.submit("alice", all).await;
    for id in group.attempts.clone().unwrap().into_iter().take(2) {
        app.wait_for_event(id, "step.started").await;
    }
    let (status, body) = app.post_json("alice", &format!("/v1/runs/{}/cancel", group.id), json!({})).await;
    assert_eq!(status, 202, "{body}");
    let events = app.events("alice", group.id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Cancelled), "{:?}", kinds(&events));
    for id in group.attempts.unwrap() {
        assert_eq!(app.run("alice", id).await.status, RunStatus::Cancelled);
    }
}

#[tokio::test]
async fn bad_attempts_are_refused_with_a_reason() {
    let app = TestApp::spawn(Options {
        worker: false,
        api: kiln_api::ApiSettings { max_attempts: 2, ..Options::default().api },
        ..Default::default()
    })
    .await;
    for (body, says) in [
        (json!({"prompt": "x", "attempts": 0}), "attempts must be between 1 and 4"),
        (json!({"prompt": "x", "attempts": 5}), "attempts must be between 1 and 4"),
        (json!({"prompt": "x", "attempts": 3}), "at most 2 on this deployment"),
        (json!({"prompt": "x", "attempts": 2, "attempt_models": ["a", "b\u{7}"]}), "attempt_models"),
        (json!({"prompt": "x", "attempts": 2, "group_limits": {"max_steps": 0}}), "group_limits.max_steps"),
        // A group may push its chosen attempt's change: the delivery's own
        // rules apply to a group as to a run.
        (
            json!({"prompt": "x", "attempts": 2, "deliver": {"git": {"url": "https://example.com/r.git", "branch": "a..b"}}}),
            "deliver.git.branch",
        ),
    ] {
        let (status, answer) = app.post_json("alice", "/v1/runs", body.clone()).await;
        assert_eq!(status, 422, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{body}: {message}");
    }
    let (status, _) = app.post_json("alice", "/v1/runs", json!({"prompt": "x", "attempts": 2})).await;
    assert_eq!(status, 201);
}

/// Every attempt starts from the same base commit, even when the branch
/// moves between their checkouts: one slot, so the second attempt checks
/// out only after the branch moved under the first.
#[tokio::test]
async fn attempts_start_from_one_base_commit_when_the_branch_moves_between_checkouts() {
    let (repo, url) = repo_with(&[("README", "hello\n")]);
    let base = kiln_tests::git_repo::git(repo.path(), &["rev-parse", "HEAD"]);
    let app = app(1).await;
    for model in &MODELS[..2] {
        app.model.script_model(*model, writer(model, Duration::from_secs(2)));
    }
    let submitted = app.submit("alice", group(&url, "write attempt.txt", &MODELS[..2])).await;
    let attempts = submitted.attempts.clone().unwrap();
    // Once one attempt has its sandbox (its checkout done), the branch moves.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let events = app.stored_events(submitted.id).await;
        if nested(&events).iter().any(|(_, kind)| kind == "sandbox.ready") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no attempt started: {:?}", kinds(&events));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::fs::write(repo.path().join("moved.txt"), "the branch moved\n").unwrap();
    kiln_tests::git_repo::git(repo.path(), &["add", "moved.txt"]);
    kiln_tests::git_repo::git(repo.path(), &["commit", "-q", "-m", "move the branch"]);
    let moved = kiln_tests::git_repo::git(repo.path(), &["rev-parse", "HEAD"]);
    assert_ne!(moved, base);

    let events = app.events("alice", submitted.id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    for (k, id) in attempts.iter().enumerate() {
        let r =
            app.http.get(app.url(&format!("/v1/runs/{id}/changes"))).bearer_auth(token("alice")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let changes: Value = r.json().await.unwrap();
        assert_eq!(changes["base_commit"], json!(base), "attempt {} started elsewhere", k + 1);
        let (_, text) = patch(&app, *id).await;
        assert!(!text.contains("moved.txt"), "{text}");
    }
}
