//! A run's change (issue 28): captured in the sandbox when the run ends,
//! whatever the end, kept with the run (`run_changes`), and exactly what
//! `git apply` needs to rebuild the sandbox's tree on a fresh clone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use kiln_protocol::changes::{ChangeScope, FileStatus};
use kiln_protocol::{CreateRun, EventBody, Limits, RepoSpec, RunStatus};
use kiln_scripted_model::Reply;
use kiln_tests::git_repo::{git, repo_with};
use kiln_tests::logs::Logs;
use kiln_tests::{Event, Options, TestApp, docker_exec, kinds, outcome, pick, token, worker_config};
use kiln_worker::{ProviderKind, WorkerConfig};
use serde_json::json;
use tracing_subscriber::filter::LevelFilter;
use uuid::Uuid;

/// Keeps the session's container after the run, to look inside it.
fn config() -> WorkerConfig {
    WorkerConfig {
        sandbox_idle: Duration::from_secs(120),
        ..worker_config(ProviderKind::OpenAi, Duration::from_secs(10))
    }
}

async fn app_with(script: Vec<Reply>, config: WorkerConfig) -> TestApp {
    let app = TestApp::spawn(Options { worker: false, script, ..Default::default() }).await;
    app.start_worker(config).await;
    app
}

fn on_repo(url: &str, prompt: &str) -> CreateRun {
    CreateRun { repo: Some(RepoSpec { url: url.to_owned(), git_ref: None }), ..CreateRun::new(prompt) }
}

fn captured(events: &[Event]) -> Vec<(u64, u64, u64, bool)> {
    pick!(events, EventBody::ChangesCaptured { files, additions, deletions, too_large } =>
        (*files, *additions, *deletions, *too_large))
    .collect()
}

/// `git ls-files -s` of the session's workspace, everything staged (on a
/// copy in the container's `/tmp`, after the run: the test's exec may not
/// write the workspace).
async fn sandbox_index(app: &TestApp, run: Uuid) -> String {
    let container = app.containers_of(run).await.pop().expect("the session's container");
    let (code, out) = docker_exec(
        &container,
        &["sh", "-c", "rm -rf /tmp/ws && cp -R --preserve=mode,links /workspace /tmp/ws && cd /tmp/ws && git -c safe.directory='*' add -A \
          && git -c safe.directory='*' ls-files -s"],
    )
    .await;
    assert_eq!(code, 0, "{out}");
    out.trim().to_owned()
}

/// `git ls-files -s` of a fresh clone of `url` with `patch` applied.
fn applied_index(url: &str, patch: &[u8]) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    git(dir.path(), &["clone", "-q", url, "c"]);
    let clone = dir.path().join("c");
    let file = dir.path().join("p.patch");
    std::fs::write(&file, patch).unwrap();
    git(&clone, &["apply", "--index", file.to_str().unwrap()]);
    let index = git(&clone, &["ls-files", "-s"]);
    (dir, index)
}

const EDITS: &str = "set -e
printf 'one more line\\n' >> a.txt
rm gone.txt
mv old.txt renamed.txt
chmod +x tool.sh
printf '\\000\\001\\002\\377binary' > blob.bin
ln -s a.txt link
mkdir -p dir && echo new > dir/new.txt";

/// The capture is asked of the sandbox's toolbox over its connection (no
/// exec through the engine).
#[tokio::test]
async fn a_runs_patch_applied_to_a_fresh_clone_gives_the_sandboxs_tree() {
    let logs = Logs::capture(LevelFilter::INFO);
    assert_eq!(patch_rebuilds_the_sandboxs_tree(config()).await, "toolbox");
    assert_eq!(ways_in(&logs), ["toolbox call"], "the capture's log line says how it ran");
    // Over the run's own connection: the run's end (its processes killed)
    // left the toolbox running, so no start of a new one (an exec) was paid.
    let restarts: Vec<String> =
        logs.text().lines().filter(|l| l.contains("restarting it")).map(str::to_owned).collect();
    assert!(restarts.is_empty(), "{restarts:#?}");
}

/// Where the worker's toolbox does not run the sandbox's tools (here: the
/// worker has no toolbox binary, so every tool is one exec), the capture is
/// the shell script, and its change is as exact.
#[tokio::test]
async fn without_the_workers_toolbox_the_script_takes_the_same_change() {
    let logs = Logs::capture(LevelFilter::INFO);
    let mut config = config();
    config.sandbox.toolbox_path = Some("/nonexistent/kiln-toolbox".into());
    assert_eq!(patch_rebuilds_the_sandboxs_tree(config).await, "script");
    assert_eq!(ways_in(&logs), ["script"]);
}

/// The `way` of every capture the worker logged, in order.
fn ways_in(logs: &Logs) -> Vec<String> {
    logs.text()
        .lines()
        .filter(|l| l.contains("took the run's change"))
        .filter_map(|l| l.split(" way=\"").nth(1).and_then(|rest| rest.split('"').next()).map(str::to_owned))
        .collect()
}

/// Runs [`EDITS`] on a repository with `config` and checks that the run's
/// patch, applied to a fresh clone, gives exactly the sandbox's tree, and
/// its summary is what git says of it; says which capture ran.
async fn patch_rebuilds_the_sandboxs_tree(config: WorkerConfig) -> &'static str {
    let long: String = (0..40).map(|i| format!("line {i}\n")).collect();
    let (repo, url) = repo_with(&[("a.txt", "a\n"), ("gone.txt", "bye\n"), ("old.txt", &long), ("tool.sh", "echo\n")]);
    let app = app_with(vec![Reply::tool("bash", json!({ "command": EDITS })), Reply::text("done")], config).await;
    let id = app.submit("alice", on_repo(&url, "edit")).await.id;
    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let n = events.len();
    assert!(
        matches!(events[n - 2].body, EventBody::ChangesCaptured { .. }),
        "right before the end: {:?}",
        kinds(&events)
    );

    let patch = app.store.run_patch(id, ChangeScope::Run).await.unwrap().expect("a stored patch");
    assert!(!patch.too_large);
    let (clone_dir, applied) = applied_index(&url, patch.patch.as_deref().unwrap());
    assert_eq!(applied, sandbox_index(&app, id).await, "the patch rebuilds the sandbox's tree");
    let changes = app.store.run_changes(id, ChangeScope::Run).await.unwrap().unwrap();
    assert_summary_is_gits(&changes, &clone_dir.path().join("c"));
    assert_eq!(changes.base_commit.as_deref(), Some(git(repo.path(), &["rev-parse", "HEAD"]).as_str()));
    let [(files, additions, deletions, false)] = captured(&events)[..] else { panic!("{:?}", captured(&events)) };
    assert_eq!(
        (files, additions, deletions),
        (changes.totals.files, changes.totals.additions, changes.totals.deletions)
    );
    // A first run's session change is its own.
    let session = app.store.run_patch(id, ChangeScope::Session).await.unwrap().unwrap();
    assert_eq!(session.patch, patch.patch);
    capture_that_ran(&app, id).await
}

/// The summary is what `git diff --numstat` says of the same change,
/// applied in `clone`.
fn assert_summary_is_gits(changes: &kiln_protocol::changes::RunChanges, clone: &std::path::Path) {
    let mut numstat: Vec<String> =
        git(clone, &["diff", "--cached", "-M", "--numstat"]).lines().map(str::to_owned).collect();
    numstat.sort();
    let mut ours: Vec<String> = changes
        .files
        .iter()
        .map(|f| {
            let path = match &f.old_path {
                Some(old) => format!("{old} => {}", f.path),
                None => f.path.clone(),
            };
            match f.binary {
                true => format!("-\t-\t{path}"),
                false => format!("{}\t{}\t{path}", f.additions, f.deletions),
            }
        })
        .collect();
    ours.sort();
    assert_eq!(ours, numstat);
    let status = |p: &str| changes.files.iter().find(|f| f.path == p).map(|f| f.status);
    assert_eq!(status("renamed.txt"), Some(FileStatus::Renamed));
    assert_eq!(status("gone.txt"), Some(FileStatus::Deleted));
    assert_eq!(status("link"), Some(FileStatus::Added));
}

/// Which capture took the run's change: the script leaves its hashes and
/// tree in files of its output directory, the toolbox keeps them.
async fn capture_that_ran(app: &TestApp, run: Uuid) -> &'static str {
    let container = app.containers_of(run).await.pop().expect("the session's container");
    let (code, _) = docker_exec(&container, &["test", "-e", "/tmp/kiln-capture/out/sum"]).await;
    if code == 0 { "script" } else { "toolbox" }
}

#[tokio::test]
async fn a_hostile_repository_configuration_runs_nothing_during_the_capture() {
    let marker = format!("/tmp/kiln-hostile-{}", Uuid::new_v4().simple());
    let (_repo, url) = repo_with(&[("a.txt", "a\n"), (".gitattributes", "* filter=evil diff=evil\n")]);
    // The agent sets the repository's configuration up; the marker would
    // be created by whichever git reads it (in the sandbox, or on the
    // worker's side if the capture ran git there).
    let hostile = format!(
        "set -e
git config core.fsmonitor 'touch {marker}-fsmonitor; false'
mkdir -p .hooks && printf '#!/bin/sh\\ntouch {marker}-hook\\n' > .hooks/post-index-change && chmod +x .hooks/post-index-change
git config core.hooksPath .hooks
git config diff.evil.textconv 'touch {marker}-textconv; cat'
git config diff.evil.command 'touch {marker}-extdiff; true'
git config filter.evil.clean 'touch {marker}-clean; cat'
git config filter.evil.required true
echo changed >> a.txt"
    );
    let app = app_with(vec![Reply::tool("bash", json!({ "command": hostile })), Reply::text("done")], config()).await;
    let id = app.submit("alice", on_repo(&url, "edit")).await.id;
    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let container = app.containers_of(id).await.pop().unwrap();
    let (_, found) = docker_exec(&container, &["sh", "-c", &format!("ls {marker}* 2>/dev/null; true")]).await;
    assert_eq!(found.trim(), "", "the repository's commands ran in the sandbox during the capture");
    let here: Vec<_> = std::fs::read_dir("/tmp")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().to_string_lossy().starts_with(&marker))
        .collect();
    assert!(here.is_empty(), "the repository's commands ran on the worker's side: {here:?}");
    let changes = app.store.run_changes(id, ChangeScope::Run).await.unwrap().expect("captured");
    let paths: Vec<&str> = changes.files.iter().map(|f| f.path.as_str()).collect();
    assert!(paths.contains(&"a.txt"), "{paths:?}");
}

#[tokio::test]
async fn a_change_over_the_bound_keeps_its_summary_and_no_patch() {
    let (_repo, url) = repo_with(&[("a.txt", "a\n")]);
    let big = "head -c 300000 /dev/urandom | base64 > big.txt; echo b >> a.txt";
    let config = WorkerConfig { max_patch_bytes: 64 * 1024, ..config() };
    let app = app_with(vec![Reply::tool("bash", json!({ "command": big })), Reply::text("done")], config).await;
    let id = app.submit("alice", on_repo(&url, "edit")).await.id;
    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let [(2, _, _, true)] = captured(&events)[..] else { panic!("{:?}", captured(&events)) };
    let patch = app.store.run_patch(id, ChangeScope::Run).await.unwrap().unwrap();
    assert!(patch.too_large && patch.patch.is_none());
    assert!(patch.patch_bytes > 64 * 1024, "{}", patch.patch_bytes);
    let changes = app.store.run_changes(id, ChangeScope::Run).await.unwrap().unwrap();
    assert!(changes.too_large);
    assert!(changes.files.iter().any(|f| f.path == "big.txt" && f.additions > 1000));
}

async fn wait_for_change_file(app: &TestApp, id: Uuid) {
    app.events_until(
        "alice",
        id,
        None,
        |e| matches!(&e.body, EventBody::ToolOutput { text, .. } if text.contains("written")),
    )
    .await;
}

#[tokio::test]
async fn cancelled_and_timed_out_runs_keep_their_change() {
    let logs = Logs::capture(LevelFilter::INFO);
    let (_repo, url) = repo_with(&[("a.txt", "a\n")]);
    let slow =
        |file: &str| Reply::tool("bash", json!({ "command": format!("echo x > {file}; echo written; sleep 600") }));
    let app = app_with(vec![slow("cancelled.txt"), slow("timed_out.txt")], config()).await;

    let cancelled = app.submit("alice", on_repo(&url, "c")).await.id;
    wait_for_change_file(&app, cancelled).await;
    let r = app.http.post(app.url(&format!("/v1/runs/{cancelled}/cancel"))).bearer_auth(token("alice")).send().await;
    assert!(r.unwrap().status().is_success());
    let events = app.events("alice", cancelled).await;
    assert_eq!(outcome(&events), Some(RunStatus::Cancelled), "{:?}", kinds(&events));

    let spec = CreateRun { limits: Some(Limits { timeout_s: Some(4), ..Default::default() }), ..on_repo(&url, "t") };
    let timed_out = app.submit("alice", spec).await.id;
    let events = app.events("alice", timed_out).await;
    assert_eq!(outcome(&events), Some(RunStatus::TimedOut), "{:?}", kinds(&events));

    for (id, file) in [(cancelled, "cancelled.txt"), (timed_out, "timed_out.txt")] {
        let changes = app.store.run_changes(id, ChangeScope::Run).await.unwrap().expect("captured");
        let paths: Vec<&str> = changes.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, [file]);
    }
    // The run's own handle was held past the end of its work (a cancel and
    // the clock drop it), so both asked the run's toolbox.
    assert_eq!(ways_in(&logs), ["toolbox call", "toolbox call"]);
}

#[tokio::test]
async fn a_follow_up_has_its_own_change_and_the_sessions() {
    let (_repo, url) = repo_with(&[("a.txt", "a\n")]);
    let script = vec![
        Reply::tool("bash", json!({ "command": "echo one > one.txt" })),
        Reply::text("first"),
        Reply::tool("bash", json!({ "command": "echo two > two.txt; echo more >> one.txt" })),
        Reply::text("second"),
    ];
    let app = app_with(script, config()).await;
    let first = app.submit("alice", on_repo(&url, "one")).await.id;
    assert_eq!(outcome(&app.events("alice", first).await), Some(RunStatus::Succeeded));
    let second = follow_up(&app, first, "two").await;
    assert_eq!(outcome(&app.events("alice", second).await), Some(RunStatus::Succeeded));

    let files =
        |c: &kiln_protocol::changes::RunChanges| c.files.iter().map(|f| (f.path.clone(), f.status)).collect::<Vec<_>>();
    let own = app.store.run_changes(second, ChangeScope::Run).await.unwrap().unwrap();
    assert_eq!(files(&own), [("one.txt".to_owned(), FileStatus::Modified), ("two.txt".to_owned(), FileStatus::Added)]);
    let session = app.store.run_changes(second, ChangeScope::Session).await.unwrap().unwrap();
    assert_eq!(files(&session), [("one.txt".to_owned(), FileStatus::Added), ("two.txt".to_owned(), FileStatus::Added)]);
    // The session's patch applies to the base; the run's on top of the first run's.
    let first_patch = app.store.run_patch(first, ChangeScope::Run).await.unwrap().unwrap().patch.unwrap();
    let own_patch = app.store.run_patch(second, ChangeScope::Run).await.unwrap().unwrap().patch.unwrap();
    let session_patch = app.store.run_patch(second, ChangeScope::Session).await.unwrap().unwrap().patch.unwrap();
    let (stepwise_dir, stepwise) = applied_index(&url, &first_patch);
    let (_at_once_dir, at_once) = applied_index(&url, &session_patch);
    let dir = stepwise_dir.path().join("c");
    let file = stepwise_dir.path().join("own.patch");
    std::fs::write(&file, &own_patch).unwrap();
    git(&dir, &["apply", "--index", file.to_str().unwrap()]);
    assert_ne!(stepwise, at_once);
    assert_eq!(git(&dir, &["ls-files", "-s"]), at_once);
    assert_eq!(at_once, sandbox_index(&app, second).await);
}

/// The capture starts from a stat cache the sandbox holds (the
/// repository's `.git/index`, then its own index kept in the sandbox's
/// `/tmp`): one whose entries say "assume unchanged" or "skip worktree"
/// would make `git add -A` pass over a changed file. Such an index is
/// dropped for the slow path, so every change is still captured, in the
/// first run (the repository's index) and in a follow-up (the kept one,
/// replaced by the agent).
#[tokio::test]
async fn an_index_that_hides_changes_does_not_hide_them_from_the_capture() {
    let files = [("a.txt", "a\n"), ("b.txt", "b\n"), ("c.txt", "c\n"), ("d.txt", "d\n")];
    let (_repo, url) = repo_with(&files);
    let hide = "set -e
echo changed >> a.txt; echo changed >> b.txt
git status > /dev/null
git update-index --assume-unchanged a.txt
git update-index --skip-worktree b.txt";
    let hide_again = "set -e
echo changed >> c.txt; echo changed >> d.txt
git update-index --assume-unchanged c.txt
git update-index --skip-worktree d.txt
cp .git/index /tmp/kiln-capture/index";
    let script = vec![
        Reply::tool("bash", json!({ "command": hide })),
        Reply::text("first"),
        Reply::tool("bash", json!({ "command": hide_again })),
        Reply::text("second"),
    ];
    let app = app_with(script, config()).await;
    let first = app.submit("alice", on_repo(&url, "hide")).await.id;
    let events = app.events("alice", first).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    assert_eq!(
        changed_paths(&app, first, ChangeScope::Run).await,
        ["a.txt", "b.txt"],
        "the repository's index hid a change"
    );

    let second = follow_up(&app, first, "again").await;
    let events = app.events("alice", second).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    assert_eq!(changed_paths(&app, second, ChangeScope::Run).await, ["c.txt", "d.txt"], "the kept index hid a change");
    assert_eq!(changed_paths(&app, second, ChangeScope::Session).await, ["a.txt", "b.txt", "c.txt", "d.txt"]);
}

/// The capture passes over its flag check only for a seed index whose
/// whole content hashes to what the worker kept from the session's last
/// capture. An agent that edits that kept index between two runs (marks a
/// file it changed assume-unchanged, then puts back the index's old
/// trailing checksum, which git does not verify on reading) has it checked
/// again, and the change is captured.
#[tokio::test]
async fn an_edited_kept_index_is_not_taken_on_trust() {
    let files = [("a.txt", "a\n"), ("c.txt", "c\n")];
    let (_repo, url) = repo_with(&files);
    let forge = "set -e
echo changed >> c.txt
I=/tmp/kiln-capture/index
tail -c 20 $I > /tmp/trailer
GIT_INDEX_FILE=$I git update-index --assume-unchanged c.txt
GIT_INDEX_FILE=$I git ls-files -v c.txt | grep -q '^h c.txt'
head -c -20 $I > /tmp/forged && cat /tmp/trailer >> /tmp/forged && cp /tmp/forged $I
cmp -s -i $(($(stat -c %s $I) - 20)):0 $I /tmp/trailer";
    let script = vec![
        Reply::tool("bash", json!({ "command": "echo changed >> a.txt" })),
        Reply::text("first"),
        Reply::tool("bash", json!({ "command": forge })),
        Reply::text("second"),
    ];
    let app = app_with(script, config()).await;
    let first = app.submit("alice", on_repo(&url, "change")).await.id;
    assert_eq!(outcome(&app.events("alice", first).await), Some(RunStatus::Succeeded));
    assert_eq!(changed_paths(&app, first, ChangeScope::Run).await, ["a.txt"]);

    let second = follow_up_whose_tool_ran(&app, first, "again", "the agent's forgery ran").await;
    assert_eq!(changed_paths(&app, second, ChangeScope::Run).await, ["c.txt"], "the edited kept index hid a change");
    assert_eq!(changed_paths(&app, second, ChangeScope::Session).await, ["a.txt", "c.txt"]);
}

/// A follow-up of `run` that succeeds with its one tool call run without an
/// error (`what`: what that call did, for the failure's message): its id.
async fn follow_up_whose_tool_ran(app: &TestApp, run: Uuid, text: &str, what: &str) -> Uuid {
    let id = follow_up(app, run, text).await;
    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", kinds(&events));
    let tool: Vec<_> = pick!(events, EventBody::ToolResult { is_error, output, .. } => (*is_error, output)).collect();
    assert!(tool.len() == 1 && !tool[0].0, "{what}: {tool:?}");
    id
}

/// The paths the run's change of `scope` touched.
async fn changed_paths(app: &TestApp, run: Uuid, scope: ChangeScope) -> Vec<String> {
    let change = app.store.run_changes(run, scope).await.unwrap().expect("captured");
    change.files.into_iter().map(|f| f.path).collect()
}

/// A follow-up run of `run`'s session, asked for with `text`: its id.
async fn follow_up(app: &TestApp, run: Uuid, text: &str) -> Uuid {
    let body = app.send_message("alice", run, text).await;
    body["run"]["id"].as_str().unwrap().parse().unwrap()
}

/// The capture keeps a git directory of its own in the sandbox, which the
/// agent can write between runs. What it writes there is not taken: an
/// `info/exclude` that hides a new file from `add -A` (without the fix the
/// second run's change lacks `hidden.txt`), and a configuration of its own
/// (`core.ignoreStat`, which has git mark entries assume-unchanged; with
/// the image's git 2.39 the third run's change was captured even without
/// the fix, so that part checks only that a capture after such a
/// configuration is whole).
#[tokio::test]
async fn the_captures_own_git_directory_is_not_the_agents_to_configure() {
    let (_repo, url) = repo_with(&[("a.txt", "a\n"), ("c.txt", "c\n")]);
    let configure = "set -e
G=/tmp/kiln-capture/git
printf '[core]\\n\\tignoreStat = true\\n' >> $G/config
mkdir -p $G/info && echo hidden.txt > $G/info/exclude
echo x > hidden.txt && echo changed >> c.txt";
    let script = vec![
        Reply::tool("bash", json!({ "command": "echo changed >> a.txt" })),
        Reply::text("first"),
        Reply::tool("bash", json!({ "command": configure })),
        Reply::text("second"),
        Reply::tool("bash", json!({ "command": "echo again >> c.txt" })),
        Reply::text("third"),
    ];
    let app = app_with(script, config()).await;
    let first = app.submit("alice", on_repo(&url, "change")).await.id;
    assert_eq!(outcome(&app.events("alice", first).await), Some(RunStatus::Succeeded));
    let second = follow_up_whose_tool_ran(&app, first, "again", "the agent's configuration was written").await;
    assert_eq!(
        changed_paths(&app, second, ChangeScope::Run).await,
        ["c.txt", "hidden.txt"],
        "the capture's git directory's info/exclude hid a file"
    );
    let third = follow_up(&app, second, "once more").await;
    assert_eq!(outcome(&app.events("alice", third).await), Some(RunStatus::Succeeded));
    assert_eq!(
        changed_paths(&app, third, ChangeScope::Run).await,
        ["c.txt"],
        "an index written under the agent's configuration hid a change"
    );
}
