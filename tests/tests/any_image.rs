//! Any image (issue 15, items 4–5; issue 30, part 2): the static toolbox
//! runs where there is no C library at all; a uid the image does not know
//! still gets a usable `HOME`; an image with busybox's `sh` but no bash runs
//! the `bash` tool with sh and tells the model so; an image with no shell at
//! all gets the file tools and a `bash` tool that says there is no shell,
//! and is refused only where the toolbox cannot run either; without any
//! toolbox the warm pool does not churn and the fallback is said once. Real
//! API, worker, Docker; the model is scripted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kiln_protocol::{CreateRun, EventBody, RunStatus};
use kiln_scripted_model::{RecordedRequest, Reply};
use kiln_tests::logs::Logs;
use kiln_tests::{Event, Options, TestApp, outcome, pick};
use kiln_worker::ProviderKind;
use kiln_worker::config::WorkerConfig;
use serde_json::json;
use tokio::sync::OnceCell;
use tracing_subscriber::filter::LevelFilter;

/// No glibc, no loader: bash-static and busybox-static only.
const STATIC_IMAGE: &str = "kiln-test-static:1";
/// The same without bash: busybox's POSIX sh.
const NOBASH_IMAGE: &str = "kiln-test-nobash:1";
/// No shell at all: an empty root filesystem and one static `sleep`.
const NOSHELL_IMAGE: &str = "kiln-test-noshell:1";

/// Builds the three test images unless they exist (the script skips what is done).
async fn images() {
    static BUILT: OnceCell<()> = OnceCell::const_new();
    BUILT
        .get_or_init(|| async {
            let script = workspace().join("sandbox-images/build-static-test-images.sh");
            let status = tokio::process::Command::new(&script).status().await.unwrap();
            assert!(status.success(), "{} failed: {status}", script.display());
        })
        .await;
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The static toolbox, built as `kiln up` builds it from a source tree.
async fn static_toolbox() -> PathBuf {
    static PATH: OnceCell<PathBuf> = OnceCell::const_new();
    PATH.get_or_init(|| async {
        let tree = kiln_cli::toolbox_build::SourceTree::of_current_exe().expect("tests run from the source tree");
        tree.build_static_toolbox().await.unwrap()
    })
    .await
    .clone()
}

fn config(image: &str, toolbox: Option<PathBuf>) -> WorkerConfig {
    let mut config = kiln_tests::worker_config(ProviderKind::OpenAi, Duration::from_secs(10));
    config.sandbox.image = image.to_owned();
    config.sandbox.toolbox_path = toolbox;
    config
}

fn bash(command: &str) -> Reply {
    Reply::tool("bash", json!({ "command": command }))
}

fn results(events: &[Event]) -> Vec<(String, bool)> {
    pick!(events, EventBody::ToolResult { output, is_error, .. } => (output.clone(), *is_error)).collect()
}

async fn run(script: Vec<Reply>, config: WorkerConfig) -> Vec<Event> {
    run_seen(script, config).await.0
}

/// The run's events and the requests the model was sent.
async fn run_seen(script: Vec<Reply>, config: WorkerConfig) -> (Vec<Event>, Vec<RecordedRequest>) {
    let app = TestApp::spawn(Options { worker: false, script, ..Default::default() }).await;
    app.start_worker(config).await;
    let id = app.submit("alice", CreateRun::new("work")).await.id;
    let events = app.events("alice", id).await;
    (events, app.model.requests())
}

/// The `bash` tool's description in the first request to the model (the
/// OpenAI Chat shape).
fn bash_description(requests: &[RecordedRequest]) -> String {
    let tools = requests[0].body["tools"].as_array().expect("tools offered");
    let bash = tools.iter().find(|t| t["function"]["name"] == "bash").expect("a bash tool");
    bash["function"]["description"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn bash_view_write_and_edit_work_through_the_static_toolbox_in_an_image_without_glibc() {
    images().await;
    let events = run(
        vec![
            // The command's parent is the toolbox (the exec fallback's
            // would be `timeout`); and there is no C library to load.
            bash("cat /proc/$PPID/comm; ls /lib /lib64 /usr/lib 2>&1 | head -3; echo $BASH_VERSION"),
            Reply::tool("write", json!({"path": "notes.txt", "content": "alpha\nbeta\n"})),
            Reply::tool("view", json!({"path": "notes.txt"})),
            Reply::tool("edit", json!({"path": "notes.txt", "old_string": "beta", "new_string": "gamma"})),
            bash("cat notes.txt"),
            Reply::text("done"),
        ],
        config(STATIC_IMAGE, Some(static_toolbox().await)),
    )
    .await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", events.last());
    let r = results(&events);
    assert_eq!(r.len(), 5, "{r:?}");
    assert!(r.iter().all(|(_, is_error)| !is_error), "{r:?}");
    let probe = &r[0].0;
    assert!(probe.starts_with("kiln-toolbox\n"), "commands run under the toolbox: {probe}");
    assert!(probe.contains("/lib: No such file or directory"), "no C library in the image: {probe}");
    assert!(probe.contains("/usr/lib: No such file or directory"), "{probe}");
    assert!(r[2].0.contains("beta"), "view: {:?}", r[2]);
    assert!(r[4].0.starts_with("alpha\ngamma\n"), "write then edit: {:?}", r[4]);
}

#[tokio::test]
async fn a_uid_missing_from_the_images_passwd_runs_commands_with_a_writable_home() {
    let mut config = config("kiln-sandbox:latest", Some(static_toolbox().await));
    // kiln-sandbox's /etc/passwd knows root and kiln (1000), not 4242.
    config.sandbox.user = "4242:4242".into();
    let events = run(
        vec![
            bash("id -u; grep -c ':4242:' /etc/passwd; echo home=$HOME; echo kept > ~/.probe && cat ~/.probe && ls -ld ~ | cut -c1-10"),
            Reply::text("done"),
        ],
        config,
    )
    .await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", events.last());
    let r = results(&events);
    let out = &r[0].0;
    assert!(!r[0].1, "{out}");
    assert!(out.starts_with("4242\n0\n"), "runs as the uid the image does not know: {out}");
    assert!(out.contains("home=/tmp/kiln-home\n"), "{out}");
    assert!(out.contains("kept\ndrwx------"), "HOME is the user's and writable: {out}");
}

#[tokio::test]
async fn an_image_without_bash_runs_the_bash_tool_with_its_sh_through_the_toolbox_and_the_model_is_told() {
    let r = runs_with_sh(Some(static_toolbox().await)).await;
    // The session's shell keeps its directory and exports, as bash does.
    assert!(r[1].starts_with("/tmp\nkept=yes\n"), "{:?}", r[1]);
}

#[tokio::test]
async fn an_image_without_bash_runs_the_bash_tool_with_its_sh_without_a_toolbox_too() {
    // The toolbox path is read once per process: this test has its own.
    let r = runs_with_sh(Some(PathBuf::from("/nonexistent/kiln-toolbox"))).await;
    // One docker exec per call: nothing carries over.
    assert!(r[1].starts_with("/workspace\nkept=\n"), "{:?}", r[1]);
}

/// Two commands in the busybox image without bash: both run with its sh,
/// and the model was told it has sh. The outputs.
async fn runs_with_sh(toolbox: Option<PathBuf>) -> Vec<String> {
    images().await;
    let (events, requests) = run_seen(
        vec![
            // `$0` is the shell running it (`/proc/$$/exe` reads empty under gVisor).
            bash("echo sh=$(readlink /bin/sh) zero=$0; test -e /bin/bash || echo no-bash; cd /tmp && export KEPT=yes"),
            bash("pwd; echo kept=$KEPT; case x in x) echo posix-case;; esac"),
            Reply::text("done"),
        ],
        config(NOBASH_IMAGE, toolbox),
    )
    .await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", events.last());
    let r = results(&events);
    assert_eq!(r.len(), 2, "{r:?}");
    assert!(r.iter().all(|(_, is_error)| !is_error), "{r:?}");
    let first = r[0].0.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("sh=busybox zero=") && first.ends_with("sh") && r[0].0.contains("\nno-bash\n"),
        "ran by busybox's sh: {:?}",
        r[0].0
    );
    assert!(r[1].0.ends_with("posix-case\n"), "{:?}", r[1].0);
    let description = bash_description(&requests);
    assert!(
        description.contains("with sh") && description.contains("no bash") && description.contains("POSIX"),
        "the model is told which shell it has: {description}"
    );
    r.into_iter().map(|(output, _)| output).collect()
}

#[tokio::test]
async fn an_image_with_no_shell_gets_the_file_tools_and_a_bash_tool_that_says_there_is_none() {
    images().await;
    let (events, requests) = run_seen(
        vec![
            Reply::tool("write", json!({"path": "notes.txt", "content": "alpha\nbeta\n"})),
            Reply::tool("view", json!({"path": "notes.txt"})),
            Reply::tool("edit", json!({"path": "notes.txt", "old_string": "beta", "new_string": "gamma"})),
            Reply::tool("ls", json!({})),
            Reply::tool("glob", json!({"pattern": "*.txt"})),
            Reply::tool("grep", json!({"pattern": "gam+a"})),
            bash("echo never"),
            Reply::text("done"),
        ],
        config(NOSHELL_IMAGE, Some(static_toolbox().await)),
    )
    .await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", events.last());
    let r = results(&events);
    assert_eq!(r.len(), 7, "{r:?}");
    assert!(r[..6].iter().all(|(_, is_error)| !is_error), "the file tools work: {r:?}");
    assert!(r[1].0.contains("beta"), "view: {:?}", r[1]);
    assert!(r[3].0.contains("notes.txt"), "ls: {:?}", r[3]);
    assert!(r[4].0.contains("notes.txt"), "glob: {:?}", r[4]);
    assert!(r[5].0.contains("notes.txt") && r[5].0.contains("gamma"), "grep sees the edit: {:?}", r[5]);
    let (said, is_error) = &r[6];
    assert!(*is_error, "{said}");
    assert!(said.contains("has no shell (neither bash nor sh)"), "said plainly: {said}");
    let description = bash_description(&requests);
    assert!(description.contains("no shell"), "the model is told before it tries: {description}");
}

#[tokio::test]
async fn an_image_with_no_shell_where_the_toolbox_cannot_run_either_is_refused_at_sandbox_start() {
    images().await;
    let toolbox = Some(PathBuf::from("/nonexistent/kiln-toolbox"));
    let events = run(vec![bash("echo never"), Reply::text("done")], config(NOSHELL_IMAGE, toolbox)).await;
    assert_eq!(outcome(&events), Some(RunStatus::Failed), "{:?}", events.last());
    let error = pick!(&events, EventBody::RunFailed { error, .. } => error.clone()).next().unwrap();
    assert!(
        error.contains("could not start the sandbox")
            && error.contains(&format!("{NOSHELL_IMAGE:?} has no shell (neither bash nor sh)"))
            && error.contains("the Kiln toolbox did not start"),
        "{error}"
    );
    assert!(results(&events).is_empty(), "no tool ran: {events:?}");
}

/// Ids of the containers Docker creates for `worker` from now on: from a
/// second before now, so that none is missed however late the
/// subscription is in place (Docker replays what it saw since then; the
/// worker's id is new, so nothing older is of it).
fn count_creations(worker: &str) -> Arc<Mutex<Vec<String>>> {
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let filters = HashMap::from([
        ("type".to_owned(), vec!["container".to_owned()]),
        ("event".to_owned(), vec!["create".to_owned()]),
        ("label".to_owned(), vec![format!("dev.kiln.worker={worker}")]),
    ]);
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() - 1;
    let options =
        bollard::query_parameters::EventsOptionsBuilder::new().since(&since.to_string()).filters(&filters).build();
    let created = Arc::new(Mutex::new(Vec::new()));
    let seen = created.clone();
    let mut stream = docker.events(Some(options));
    tokio::spawn(async move {
        while let Some(Ok(event)) = stream.next().await {
            if let Some(id) = event.actor.and_then(|a| a.id) {
                seen.lock().unwrap().push(id);
            }
        }
    });
    created
}

#[tokio::test]
async fn without_a_toolbox_runs_work_the_warm_pool_keeps_its_containers_and_the_fallback_is_said_once() {
    let logs = Logs::capture(LevelFilter::INFO);
    let mut config = config("kiln-sandbox:latest", Some(PathBuf::from("/nonexistent/kiln-toolbox")));
    config.warm_pool = 2;
    let created = count_creations(&config.worker_id);
    // The pool reports its size into the process's recorder: installed
    // before the worker starts, so none of it is lost.
    let metrics = kiln_cli::telemetry::prometheus();
    let app = TestApp::spawn(Options {
        worker: false,
        script: vec![bash("echo one"), Reply::text("first"), bash("echo two"), Reply::text("second")],
        ..Default::default()
    })
    .await;
    let pool_worker = config.worker_id.clone();
    app.start_worker(config).await;
    for (prompt, said) in [("first", "one"), ("second", "two")] {
        let id = app.submit("alice", CreateRun::new(prompt)).await.id;
        let events = app.events("alice", id).await;
        assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", events.last());
        assert!(results(&events)[0].0.starts_with(&format!("{said}\n")), "{:?}", results(&events));
    }
    // Two runs from a pool of two: each took one warm container and the
    // pool started one in its place, no more: 2 + 2, once the pool is full
    // again (a pool that dropped its containers as dead at each take has
    // made more by then).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let full = |m: &str| {
        m.lines()
            .filter_map(|l| l.strip_prefix("kiln_warm_pool_size"))
            .any(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) == Some(2.0))
    };
    while !(full(&metrics.render()) && created.lock().unwrap().len() >= 4) {
        assert!(tokio::time::Instant::now() < deadline, "the pool never refilled: {:?}", created.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Full, the pool waits for a take and starts nothing: a pool that went
    // on past its target would ask Docker for its next container at once
    // (a create is the first thing a start does), and Docker reports the
    // create within milliseconds; a second covers a busy machine.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let n = created.lock().unwrap().len();
    assert_eq!(n, 4, "containers created for worker {pool_worker}: {:?}", created.lock().unwrap());
    let text = logs.text();
    let warnings: Vec<&str> = text.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 1, "one warning, not one per container: {warnings:#?}");
    assert!(warnings[0].contains("no kiln-toolbox binary") && warnings[0].contains("one docker exec per call"));
    assert!(!text.contains("frame"), "Docker's error text is not read as frames: {text}");
}
