//! Warm containers per hot environment (issue 15): after a run prepared an
//! environment, the worker keeps a container of the prepared image started
//! with setup's trees already restored; the next run on that environment
//! takes it and only moves the workspace to its commit and runs the
//! maintenance script. Those containers go when the environment's cache is
//! reset, when their image is evicted and when the worker stops, and never
//! number more than the bound. Real Postgres, real Docker; only the model
//! is scripted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use bollard::query_parameters::{ListContainersOptionsBuilder, RemoveImageOptionsBuilder};
use kiln_protocol::{CreateRun, EventBody, RepoSpec, RunStatus};
use kiln_scripted_model::Reply;
use kiln_tests::git_repo::git;
use kiln_tests::{Event, Options, TestApp, kinds, outcome, pick, worker_config};
use kiln_worker::sandbox::environment_pools::WarmSettings;
use kiln_worker::{ProviderKind, WorkerConfig};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

fn repo() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    git(d, &["init", "-q", "-b", "main"]);
    std::fs::write(d.join(".gitignore"), "deps/\n").unwrap();
    std::fs::write(d.join("README"), "hello\n").unwrap();
    git(d, &["add", "."]);
    git(d, &["commit", "-q", "-m", "first"]);
    let url = format!("file://{}", d.display());
    (dir, url)
}

struct Warm {
    app: TestApp,
    worker: String,
    stop: CancellationToken,
    handle: Option<JoinHandle<()>>,
    keys: Vec<String>,
}

/// An app whose worker keeps `per` warm containers per environment, `max`
/// in all; `max_images` bounds the prepared images (in a scope of the
/// test's own: the engine is shared).
async fn warm_app(script: Vec<Reply>, per: usize, max: usize, max_images: usize) -> Warm {
    let app = TestApp::spawn(Options { script, worker: false, ..Default::default() }).await;
    let config = WorkerConfig {
        environment_warm: WarmSettings { per_environment: per, max_containers: max },
        environment_cache: kiln_worker::environment::cache::CacheBounds {
            max_images,
            max_bytes: u64::MAX,
            scope: format!("warm-test-{}", Uuid::new_v4().simple()),
        },
        ..worker_config(ProviderKind::OpenAi, Duration::from_secs(10))
    };
    let worker = config.worker_id.clone();
    let stop = CancellationToken::new();
    let handle = app.start_worker_until(config, stop.clone()).await;
    Warm { app, worker, stop, handle: Some(handle), keys: Vec::new() }
}

impl Warm {
    async fn environment(&self, name: &str, setup: &str, maintenance: Option<&str>) {
        let body = json!({"name": name, "setup_script": setup, "maintenance_script": maintenance});
        let (status, env) = self.app.post_json("alice", "/v1/environments", body).await;
        assert_eq!(status, 201, "{env}");
    }

    /// Runs on `environment` to its end; its events and cache key.
    async fn run(&mut self, url: &str, environment: &str) -> (Vec<Event>, String) {
        let spec = CreateRun {
            repo: Some(RepoSpec { url: url.to_owned(), git_ref: None }),
            environment: Some(environment.to_owned()),
            ..CreateRun::new("work on the repository")
        };
        let id = self.app.submit("alice", spec).await.id;
        let events = self.app.events("alice", id).await;
        assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
        let key = pick!(events, EventBody::EnvironmentStarted { cache_key, .. } => cache_key.clone()).last().unwrap();
        if !self.keys.contains(&key) {
            self.keys.push(key.clone());
        }
        (events, key)
    }

    /// This worker's warm containers not yet any session's: `(id, image)`.
    async fn warm_containers(&self) -> Vec<(String, String)> {
        let docker = bollard::Docker::connect_with_local_defaults().unwrap();
        let labels = vec!["dev.kiln.pool=true".to_owned(), format!("dev.kiln.worker={}", self.worker)];
        let filters = std::collections::HashMap::from([("label".to_owned(), labels)]);
        let options = ListContainersOptionsBuilder::new().all(true).filters(&filters).build();
        let list = docker.list_containers(Some(options)).await.unwrap();
        list.into_iter()
            .filter(|c| c.names.iter().flatten().all(|n| n.starts_with("/kiln-warm-")))
            .map(|c| (c.id.unwrap(), c.image.unwrap_or_default()))
            .collect()
    }

    /// Waits (up to a minute) until this worker's warm containers are of
    /// exactly `images` (prepared image tags, in any order); checks on
    /// every look that they never number more than `bound`.
    async fn wait_for_warm(&self, images: &[String], bound: usize) -> Vec<(String, String)> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut want: Vec<&String> = images.iter().collect();
        want.sort();
        loop {
            let now = self.warm_containers().await;
            assert!(now.len() <= bound, "more warm containers than the bound {bound}: {now:?}");
            let mut have: Vec<&String> = now.iter().map(|(_, image)| image).collect();
            have.sort();
            if have == want {
                return now;
            }
            assert!(Instant::now() < deadline, "warm containers are {now:?}, not of {want:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the worker and waits for it to exit.
    async fn stop_worker(&mut self) {
        self.stop.cancel();
        if let Some(handle) = self.handle.take() {
            tokio::time::timeout(Duration::from_secs(60), handle).await.expect("the worker stops").unwrap();
        }
    }

    async fn clean_up(mut self) {
        self.stop_worker().await;
        let docker = bollard::Docker::connect_with_local_defaults().unwrap();
        for key in &self.keys {
            let options = RemoveImageOptionsBuilder::new().force(true).build();
            let _ = docker.remove_image(&tag(key), Some(options), None).await;
        }
    }
}

fn tag(key: &str) -> String {
    format!("kiln-env:{key}")
}

fn sandbox_ready(events: &[Event]) -> (String, String) {
    pick!(events, EventBody::SandboxReady { container, origin, .. } => (container.clone(), origin.clone().unwrap_or_default()))
        .last()
        .unwrap_or_else(|| panic!("no sandbox.ready: {:?}", kinds(events)))
}

const SETUP: &str = r#"echo setting-up
mkdir -p deps && echo dep-installed > deps/lib.txt
mkdir -p "$HOME/.tool" && printf '#!/bin/sh\necho tool-ok\n' > "$HOME/.tool/tool" && chmod +x "$HOME/.tool/tool""#;

#[tokio::test]
async fn a_second_run_takes_the_warm_container_made_before_it_at_its_new_commit_after_maintenance() {
    let (dir, url) = repo();
    let look = "cat deps/lib.txt; $HOME/.tool/tool; git log --format=%s -1; cat new.txt 2>&1";
    let script =
        vec![Reply::text("first done"), Reply::tool("bash", json!({"command": look})), Reply::text("second done")];
    let mut w = warm_app(script, 1, 4, 20).await;
    w.environment("web", SETUP, Some("echo maintenance-ran; git log --format=%s -1")).await;
    let (first, key) = w.run(&url, "web").await;
    assert_eq!(sandbox_ready(&first).1, "new", "the first run sets up and starts its own sandbox");
    // The container is there, restore done, before the second run exists.
    let warm = w.wait_for_warm(&[tag(&key)], 1).await;

    std::fs::write(dir.path().join("new.txt"), "brand-new\n").unwrap();
    git(dir.path(), &["add", "."]);
    git(dir.path(), &["commit", "-q", "-m", "second"]);
    let (second, second_key) = w.run(&url, "web").await;
    assert_eq!(second_key, key);
    assert_eq!(sandbox_ready(&second), (warm[0].0.clone(), "warm".to_owned()), "not served by the warm container");
    let maintenance: String =
        pick!(second, EventBody::EnvironmentOutput { phase, text } => (phase.clone(), text.clone()))
            .filter(|(phase, _)| phase == "maintenance")
            .map(|(_, text)| text)
            .collect();
    assert!(maintenance.contains("maintenance-ran") && maintenance.contains("second"), "{maintenance}");
    let out: String = pick!(second, EventBody::ToolResult { output, .. } => output.clone()).collect();
    assert!(out.contains("dep-installed") && out.contains("tool-ok"), "setup's trees are not there: {out}");
    assert!(out.contains("second") && out.contains("brand-new"), "the workspace is not at the new commit: {out}");
    // The pool makes a replacement for the next run.
    w.wait_for_warm(&[tag(&key)], 1).await;
    w.clean_up().await;
}

#[tokio::test]
async fn resetting_the_cache_and_stopping_the_worker_each_remove_the_warm_containers() {
    let (_dir, url) = repo();
    let mut w = warm_app(vec![Reply::text("one"), Reply::text("two")], 1, 4, 20).await;
    w.environment("web", SETUP, None).await;
    let (_, key) = w.run(&url, "web").await;
    w.wait_for_warm(&[tag(&key)], 1).await;
    let (status, body) = w.app.post_json("alice", "/v1/environments/web/reset-cache", json!({})).await;
    assert_eq!(status, 200, "{body}");
    w.wait_for_warm(&[], 1).await;

    // Set up again under the new key: warm again, until the worker stops.
    let (_, new_key) = w.run(&url, "web").await;
    assert_ne!(new_key, key);
    let warm = w.wait_for_warm(&[tag(&new_key)], 1).await;
    w.stop_worker().await;
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    assert!(
        docker.inspect_container(&warm[0].0, None).await.is_err(),
        "a warm container outlived the worker's shutdown"
    );
    w.clean_up().await;
}

#[tokio::test]
async fn an_evicted_image_takes_its_warm_containers_with_it_and_the_bound_holds() {
    let (_dir, url) = repo();
    let mut w = warm_app((0..5).map(|i| Reply::text(format!("done {i}"))).collect(), 1, 2, 2).await;
    for n in 1..=3 {
        w.environment(&format!("e{n}"), &format!("echo {n} > deps.txt"), None).await;
    }
    let (_, k1) = w.run(&url, "e1").await;
    w.wait_for_warm(&[tag(&k1)], 2).await;
    let (_, k2) = w.run(&url, "e2").await;
    w.wait_for_warm(&[tag(&k1), tag(&k2)], 2).await;
    // A third environment: its image evicts e1's (least recently used),
    // and e1's warm container goes with it, not kept as a use of it.
    let (_, k3) = w.run(&url, "e3").await;
    w.wait_for_warm(&[tag(&k2), tag(&k3)], 2).await;
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    assert!(docker.inspect_image(&tag(&k1)).await.is_err(), "e1's image was not evicted");
    // e2 hits (warm), e1 sets up again: with two containers in all, the
    // coldest environment's pool (e3's) makes room.
    w.run(&url, "e2").await;
    let (_, again) = w.run(&url, "e1").await;
    w.wait_for_warm(&[tag(&k2), tag(&again)], 2).await;
    w.clean_up().await;
}
