//! Hostile commands against a real sandbox (issue 3): each runs as a bash
//! call in a real session (API → queue → worker → Docker → toolbox) and the
//! test asserts the sandbox held *and* a following `echo ok` in the same
//! run works. Network checks are by inspection only: no test sends traffic
//! anywhere.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use kiln_protocol::{CreateRun, EventBody, RunStatus};
use kiln_scripted_model::Reply;
use kiln_tests::{Event, Options, TestApp, outcome, pick};
use serde_json::json;

/// One tool result as the model saw it.
#[derive(Debug)]
struct Result {
    output: String,
    is_error: bool,
}

fn bash(command: &str) -> Reply {
    Reply::tool("bash", json!({ "command": command }))
}

fn bash_with_timeout(command: &str, timeout_s: u64) -> Reply {
    Reply::tool("bash", json!({ "command": command, "timeout_s": timeout_s }))
}

/// Runs the scripted tool calls (then a final answer) in one run and returns
/// the run's events.
async fn run_script(mut script: Vec<Reply>) -> (TestApp, Vec<Event>) {
    script.push(Reply::text("done"));
    let app = TestApp::spawn(Options { script, ..Default::default() }).await;
    let id = app.submit("alice", CreateRun::new("hostile")).await.id;
    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", events.last());
    (app, events)
}

fn results(events: &[Event]) -> Vec<Result> {
    pick!(events, EventBody::ToolResult { output, is_error, .. } => Result { output: output.clone(), is_error: *is_error })
        .collect()
}

/// The text of every `tool.output` event, in order.
fn tool_output(events: &[Event]) -> impl Iterator<Item = &str> {
    pick!(events, EventBody::ToolOutput { text, .. } => text.as_str())
}

/// The hostile call, then `echo ok`, which must work.
async fn hostile_then_ok(hostile: Reply) -> Result {
    let (_app, events) = run_script(vec![hostile, bash("echo ok")]).await;
    let mut r = results(&events);
    assert_eq!(r.len(), 2, "{r:?}");
    let ok = r.pop().unwrap();
    assert!(!ok.is_error && ok.output.trim() == "ok", "the session still works: {ok:?}");
    r.pop().unwrap()
}

#[tokio::test]
async fn a_fork_bomb_is_contained_and_the_session_keeps_working() {
    // At the pids limit the bomb's forks fail, so its shell returns; what
    // it left in the background either burns out or keeps the sandbox at
    // the limit, and then the next call finds no process slot: the worker
    // kills every process of the command user and runs the call again.
    // The shell sleeps rather than `wait`s: `wait` only waits for its own
    // children, which return as soon as they have forked theirs, so the
    // shell could end before the bomb reached the limit and said so.
    let started = Instant::now();
    let (_app, events) =
        run_script(vec![bash_with_timeout(":(){ :|:& };:; sleep 3", 5), bash("echo ok"), bash("echo still ok")]).await;
    assert!(started.elapsed() < Duration::from_secs(60));
    let r = results(&events);
    let tail = &r[0].output[r[0].output.len().saturating_sub(300)..];
    assert!(r[0].output.contains("fork") || r[0].output.contains("timed out"), "{tail:?}");
    assert!(!r[1].is_error && r[1].output.starts_with("ok\n"), "{:?}", r[1]);
    assert!(!r[2].is_error && r[2].output.starts_with("still ok\n"), "{:?}", r[2]);
}

#[tokio::test]
async fn a_memory_bomb_is_killed_and_reported_as_a_tool_error() {
    let r = hostile_then_ok(bash("python3 -c \"x = 'a' * (4 * 1024 ** 3); print(len(x))\"")).await;
    assert!(r.is_error, "{r:?}");
    assert!(r.output.contains("SIGKILL") || r.output.contains("137") || r.output.contains("MemoryError"), "{r:?}");
}

#[tokio::test]
async fn filling_tmp_hits_its_size_limit() {
    let r = hostile_then_ok(bash("dd if=/dev/zero of=/tmp/fill bs=1M count=1024 2>&1; df -m /tmp | tail -1")).await;
    assert!(r.output.contains("No space left on device"), "{r:?}");
    // The tmpfs is 256 MiB by default: df shows its size in MiB.
    assert!(r.output.contains(" 256 "), "{r:?}");
}

#[tokio::test]
async fn printing_a_gigabyte_is_capped_for_the_model_and_the_worker() {
    let (_app, events) = run_script(vec![
        bash_with_timeout("yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c 1000000000; echo; echo END", 300),
        bash("echo ok"),
    ])
    .await;
    let r = results(&events);
    assert!(!r[0].is_error, "{:?}", &r[0].output[..200]);
    assert!(r[0].output.len() < 40_000, "model-facing output is bounded: {}", r[0].output.len());
    assert!(r[0].output.contains("bytes omitted"), "the cut is marked");
    assert!(r[0].output.trim_end().ends_with("END") || r[0].output.contains("END\n"), "the tail is kept");
    let streamed: usize = tool_output(&events).map(str::len).sum();
    assert!(streamed > 0 && streamed <= 2 * 1024 * 1024, "streamed output is bounded: {streamed}");
    assert_eq!(r[1].output.trim(), "ok");
    // The worker runs in this process: its memory never held the gigabyte.
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hwm_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    assert!(hwm_kb < 512 * 1024, "peak RSS {hwm_kb} kB");
}

#[tokio::test]
async fn background_children_are_killed_at_the_timeout() {
    let (_app, events) = run_script(vec![
        bash_with_timeout("sleep 600 & nohup sleep 600 >/dev/null 2>&1 & sleep 60", 2),
        bash("echo ok"),
        bash("ps -eo args="),
    ])
    .await;
    let r = results(&events);
    assert!(r[0].is_error && r[0].output.contains("timed out"), "{:?}", r[0]);
    assert_eq!(r[1].output.trim(), "ok");
    assert!(!r[2].output.contains("sleep 600"), "none left: {:?}", r[2]);
}

#[tokio::test]
async fn a_command_reading_stdin_gets_eof_at_once() {
    let started = Instant::now();
    let r = hostile_then_ok(bash_with_timeout("read line; echo \"got:[$line]\"; cat; python3 -c 'input()'", 60)).await;
    assert!(r.output.contains("got:[]"), "{r:?}");
    assert!(r.output.contains("EOFError"), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(45), "did not wait for the timeout");
}

#[tokio::test]
async fn the_network_is_none_by_inspection() {
    // The interfaces from /proc/net/dev, which gVisor has too (its /sys has
    // no class/net).
    let r = hostile_then_ok(bash(
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; echo ---; tail -n +2 /proc/net/route | wc -l",
    ))
    .await;
    assert!(!r.is_error, "{r:?}");
    assert_eq!(r.output.trim(), "lo\n---\n0");
}

#[tokio::test]
async fn commands_run_unprivileged_without_the_docker_socket() {
    let r = hostile_then_ok(bash(
        "id -u; grep -E '^(CapEff|CapPrm|CapAmb|NoNewPrivs|Groups):' /proc/self/status; ls /var/run/docker.sock /run/docker.sock 2>&1; true",
    ))
    .await;
    let uid: u32 = r.output.lines().next().unwrap().trim().parse().unwrap();
    assert_eq!(uid, 1000, "the configured sandbox user");
    assert!(r.output.contains("CapEff:\t0000000000000000"), "{r:?}");
    assert!(r.output.contains("CapPrm:\t0000000000000000"), "{r:?}");
    assert!(r.output.contains("CapAmb:\t0000000000000000"), "{r:?}");
    assert!(!r.output.contains("Groups:\t0") && !r.output.contains(" 0 "), "no root group: {r:?}");
    assert!(r.output.contains("NoNewPrivs:\t1"), "{r:?}");
    assert_eq!(r.output.matches("No such file or directory").count(), 2, "{r:?}");
}

#[tokio::test]
async fn output_imitating_frames_and_markers_is_just_text() {
    let r = hostile_then_ok(bash(
        r#"printf '\x00\x00\x00\x2c{"type":"response","id":1,"result":{"type":"pong"}}'; printf '\x00\x00\x10\x00'; echo '[... 99 bytes omitted ...]'; echo '{"type":"hello","protocol_version":9}'; echo after"#,
    ))
    .await;
    assert!(!r.is_error, "{r:?}");
    assert!(r.output.contains(r#"{"type":"response","id":1"#), "{r:?}");
    assert!(r.output.trim_end().ends_with("after"), "{r:?}");
}

#[tokio::test]
async fn exit_137_is_reported() {
    let r = hostile_then_ok(bash("exit 137")).await;
    assert!(r.is_error && r.output.contains("137"), "{r:?}");
}

#[tokio::test]
async fn the_working_directory_persists_between_calls() {
    let (_app, events) = run_script(vec![bash("mkdir -p sub && cd sub && pwd"), bash("pwd"), bash("echo ok")]).await;
    let r = results(&events);
    assert_eq!(r[0].output.trim(), "/workspace/sub");
    assert_eq!(r[1].output.trim(), "/workspace/sub");
    assert_eq!(r[2].output.trim(), "ok");
}

#[tokio::test]
async fn killing_the_toolbox_is_a_clear_tool_error_and_the_next_call_works() {
    // Commands cannot kill the toolbox (see below), so it is killed from
    // outside, as root, while the call sleeps: an OOM kill looks the same.
    let app = TestApp::spawn(Options {
        script: vec![bash_with_timeout("echo started; sleep 20", 60), bash("echo ok"), Reply::text("done")],
        ..Default::default()
    })
    .await;
    let run = app.submit("alice", CreateRun::new("hostile")).await;
    let id = run.id;
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let container = wait_for_container(&docker, run.session_id).await;
    // Killed once the command has started: its first output is stored.
    app.wait_for_event(id, "tool.output").await;
    let killed = docker_exec_root(&docker, &container, &["pkill", "-KILL", "-x", "kiln-toolbox"]).await;
    assert_eq!(killed, 0, "pkill as root found the toolbox");
    let events = app.events("alice", id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", events.last());
    let r = results(&events);
    assert!(r[0].is_error && r[0].output.contains("died during this call"), "{:?}", r[0]);
    assert!(!r[1].is_error && r[1].output.trim() == "ok", "{:?}", r[1]);
}

#[tokio::test]
async fn a_sandbox_that_stops_under_a_call_ends_the_call_and_the_run() {
    // The whole container is killed through the engine while a command
    // sleeps. Under gVisor that leaves the stream of the exec attached to
    // the toolbox open, so only the worker's watch on the sandbox ends the
    // call; under runc the stream ends and the worker must still say that
    // the sandbox stopped (the run cannot go on in it).
    let app = TestApp::spawn(Options {
        script: vec![bash_with_timeout("echo started; sleep 60", 120), bash("echo never"), Reply::text("done")],
        ..Default::default()
    })
    .await;
    let run = app.submit("alice", CreateRun::new("hostile")).await;
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let container = wait_for_container(&docker, run.session_id).await;
    app.wait_for_event(run.id, "tool.output").await;
    docker.kill_container(&container, None).await.unwrap();
    let killed = Instant::now();
    // A liveness bound, far under the command's 60 s.
    let events = tokio::time::timeout(Duration::from_secs(30), app.events("alice", run.id))
        .await
        .expect("the run ends instead of waiting on its dead sandbox");
    let took = killed.elapsed();
    eprintln!("the run ended {took:?} after its sandbox was killed");
    assert!(took < Duration::from_secs(30));
    let error = match events.last().map(|e| &e.body) {
        Some(EventBody::RunFailed { error }) => error.clone(),
        other => panic!("the run did not fail: {other:?}"),
    };
    assert!(error.contains("the sandbox stopped with exit code"), "{error}");
    assert!(results(&events).is_empty(), "no tool result, and no further call: {:?}", results(&events));
}

#[tokio::test]
async fn hundreds_of_processes_and_git_status_over_thousands_of_files_run_to_completion() {
    // Under gVisor (ptrace) the host sees its own threads, ~12 per process
    // in the sandbox: 150 background processes and git need far more than
    // the default 256 host tasks, and the sandbox died at that limit.
    let command = "for i in $(seq 150); do sleep 100 & done; \
        mkdir -p /tmp/many && cd /tmp/many && git init -q && \
        for d in $(seq 50); do mkdir $d; for f in $(seq 100); do echo $f > $d/$f.txt; done; done && \
        git add -A && git -c user.name=k -c user.email=k@k commit -qm files && echo more > 7/7.txt && \
        echo \"running: $(ps -e --no-headers | wc -l)\"; echo \"nproc: $(ulimit -u)\"; git status --short; \
        kill $(jobs -p); echo finished";
    let (_app, events) = run_script(vec![bash_with_timeout(command, 300), bash("echo ok")]).await;
    let r = results(&events);
    assert!(!r[0].is_error, "{:?}", r[0]);
    assert!(r[0].output.contains("M 7/7.txt") && r[0].output.contains("finished"), "{:?}", r[0]);
    let running: usize =
        r[0].output.split("running: ").nth(1).and_then(|s| s.lines().next()).unwrap().trim().parse().unwrap();
    assert!(running > 150, "{running} processes ran at once");
    // Under gVisor the user's processes are held at the pids limit inside
    // the sandbox (the host's limit leaves gVisor its threads).
    if kiln_tests::sandbox_runtime().as_deref() == Some("runsc") {
        assert!(r[0].output.contains("nproc: 256\n"), "{:?}", r[0]);
    }
    assert!(!r[1].is_error && r[1].output.trim() == "ok", "{:?}", r[1]);
}

/// The container of session `id`, once it has one (by name: a warm
/// container taken by the session keeps its old labels).
async fn wait_for_container(docker: &bollard::Docker, id: uuid::Uuid) -> String {
    let name = format!("^/kiln-session-{}$", id.simple());
    let filters = std::collections::HashMap::from([("name", vec![name])]);
    for _ in 0..1200 {
        let options = bollard::query_parameters::ListContainersOptionsBuilder::new().filters(&filters).build();
        if let Some(c) = docker.list_containers(Some(options)).await.unwrap().into_iter().next() {
            return c.id.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("session {id} got no container");
}

/// Runs `cmd` in `container` as root; its exit code.
async fn docker_exec_root(docker: &bollard::Docker, container: &str, cmd: &[&str]) -> i64 {
    use bollard::exec::{CreateExecOptions, StartExecOptions};
    let exec = docker
        .create_exec(container, CreateExecOptions { cmd: Some(cmd.to_vec()), user: Some("0:0"), ..Default::default() })
        .await
        .unwrap();
    docker.start_exec(&exec.id, Some(StartExecOptions { detach: true, ..Default::default() })).await.unwrap();
    for _ in 0..100 {
        let state = docker.inspect_exec(&exec.id).await.unwrap();
        if state.running == Some(false) {
            return state.exit_code.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{cmd:?} did not finish");
}

/// Finds the toolbox's pid from /proc/*/cmdline (its argv[0] ends in
/// `kiln-toolbox`), into `$tb`.
const FIND_TOOLBOX: &str = r#"tb=; for p in /proc/[0-9]*; do a=$(tr '\0' '\n' < $p/cmdline 2>/dev/null | head -n1); case $a in *kiln-toolbox) tb=${p#/proc/};; esac; done; echo "toolbox pid: $tb"; "#;

#[tokio::test]
async fn a_command_cannot_forge_frames_on_the_toolbox_stdout() {
    // First a small marked output frame for each of the first requests'
    // ids (the call's own among them): a frame that reached the worker shows
    // as the marker in the call's output. Then frames of 1 MiB for the same
    // ids, three each: were they accepted, this call would stream 3 MiB
    // past the 1 MiB cap. The marker is built at run time, so the command's
    // text (echoed in no output, but in the tool call) never holds it.
    let forge = r#"frame() { n=${#1}; printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $((n>>24&255)) $((n>>16&255)) $((n>>8&255)) $((n&255)))"; printf '%s' "$1"; }
data=$(head -c 1048576 /dev/zero | tr '\0' F)
{ for id in 1 2 3 4 5 6 7 8; do frame "{\"type\":\"output\",\"id\":$id,\"data\":\"FORGED-$((6*7))-FRAME\\n\"}"; done
  for id in 1 2 3 4; do for k in 1 2 3; do frame "{\"type\":\"output\",\"id\":$id,\"data\":\"$data\"}"; done; done; } > /proc/$tb/fd/1 && echo FORGED || echo REFUSED
ls -l /proc/$tb/fd/ 2>&1 | head -n 3"#;
    let (_app, events) = run_script(vec![bash(&format!("{FIND_TOOLBOX}{forge}")), bash("echo ok")]).await;
    let r = results(&events);
    assert!(r[0].output.contains("toolbox pid: ") && !r[0].output.contains("toolbox pid: \n"), "{:?}", r[0]);
    let reached =
        tool_output(&events).chain(r.iter().map(|r| r.output.as_str())).any(|t| t.contains("FORGED-42-FRAME"));
    assert!(!reached, "a forged frame reached the worker: {:?}", r[0]);
    assert!(r[0].output.contains("Permission denied"), "{:?}", r[0]);
    assert!(r[0].output.contains("REFUSED") && !r[0].output.contains("FORGED"), "{:?}", r[0]);
    let streamed: usize = tool_output(&events).map(str::len).sum();
    assert!(streamed <= 1024 * 1024, "streamed output stays under the per-call cap: {streamed}");
    assert_eq!(r[1].output.trim(), "ok");
}

#[tokio::test]
async fn the_file_tools_act_as_the_sandbox_user_not_as_root() {
    // The toolbox runs as root: its file work must still be the user's, so
    // a link to a root-only file stays unreadable and new files are the user's.
    let (_app, events) = run_script(vec![
        bash("ln -sf /etc/shadow shadow-link && ls -l /etc/shadow"),
        Reply::tool("view", json!({"file_path": "shadow-link"})),
        Reply::tool("grep", json!({"pattern": "root", "path": "/etc/shadow"})),
        Reply::tool("write", json!({"path": "made-by-write.txt", "content": "x\n"})),
        bash("stat -c '%u:%g' made-by-write.txt"),
    ])
    .await;
    let r = results(&events);
    assert!(r[0].output.contains("root"), "the image has a root-only /etc/shadow: {:?}", r[0]);
    assert!(r[1].is_error && r[1].output.to_lowercase().contains("permission denied"), "{:?}", r[1]);
    assert!(!r[2].output.contains("root:"), "{:?}", r[2]);
    assert!(!r[3].is_error, "{:?}", r[3]);
    assert_eq!(r[4].output.trim(), "1000:1000", "{:?}", r[4]);
}

#[tokio::test]
async fn a_command_cannot_kill_or_trace_the_toolbox() {
    let started = Instant::now();
    let r = hostile_then_ok(bash(&format!(
        "{FIND_TOOLBOX}kill -9 $tb; echo kill=$?; pkill -9 -x kiln-toolbox; echo pkill=$?; kill -9 -1; echo after; \
         cat /proc/$tb/environ >/dev/null; grep -c . /proc/$tb/maps; true"
    )))
    .await;
    assert!(!r.output.contains("died during this call"), "{r:?}");
    assert!(r.output.contains("kill=1") && r.output.contains("Operation not permitted"), "{r:?}");
    assert!(!r.output.contains("pkill=0"), "{r:?}");
    assert!(r.output.contains("/proc/") && r.output.contains("Permission denied"), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(60), "the next call answered through the toolbox");
}

#[tokio::test]
async fn edit_and_write_need_a_fresh_view_and_new_tools_work() {
    let (_app, events) = run_script(vec![
        Reply::tool("write", json!({"path": "a.txt", "content": "alpha\n"})),
        bash("echo beta > b.txt"),
        Reply::tool("edit", json!({"path": "b.txt", "old_string": "beta", "new_string": "gamma"})),
        Reply::tool("write", json!({"path": "b.txt", "content": "x\n"})),
        Reply::tool("view", json!({"file_path": "b.txt"})),
        Reply::tool("edit", json!({"path": "b.txt", "old_string": "beta", "new_string": "gamma"})),
        bash("echo changed >> b.txt"),
        Reply::tool("edit", json!({"path": "b.txt", "old_string": "gamma", "new_string": "delta"})),
        Reply::tool("ls", json!({})),
        Reply::tool("glob", json!({"pattern": "*.txt"})),
        Reply::tool("grep", json!({"pattern": "gamma", "include": "*.txt"})),
    ])
    .await;
    let r = results(&events);
    assert!(!r[0].is_error, "a new file needs no view: {:?}", r[0]);
    assert!(r[2].is_error && r[2].output.contains("view it first"), "{:?}", r[2]);
    assert!(r[3].is_error && r[3].output.contains("view it first"), "{:?}", r[3]);
    assert!(r[4].output.contains("     1\tbeta"), "{:?}", r[4]);
    assert!(!r[5].is_error, "{:?}", r[5]);
    assert!(r[7].is_error && r[7].output.contains("changed since"), "{:?}", r[7]);
    assert!(r[8].output.contains("a.txt") && r[8].output.contains("b.txt"), "{:?}", r[8]);
    assert_eq!(r[9].output, "a.txt\nb.txt\n");
    assert!(r[10].output.starts_with("b.txt:1:gamma"), "{:?}", r[10]);
}

#[tokio::test]
async fn bash_output_streams_as_tool_output_events() {
    let (_app, events) =
        run_script(vec![bash("for i in 1 2 3; do echo line$i; sleep 0.2; done"), bash("echo ok")]).await;
    let streamed: String = tool_output(&events).collect();
    assert_eq!(streamed, "line1\nline2\nline3\nok\n");
}

#[tokio::test]
async fn two_sessions_cannot_see_each_others_files_or_processes() {
    // A writes its file, says so, and waits (its process visible to a `ps`
    // that could see it) until the test lets it go.
    let a_app = TestApp::spawn(Options {
        script: vec![
            bash("echo secret-a > a-only.txt && echo written && until [ -e /tmp/go ]; do sleep 0.1; done && echo ok"),
            Reply::text("done"),
        ],
        ..Default::default()
    })
    .await;
    let a = a_app.submit("alice", CreateRun::new("hostile")).await.id;
    a_app
        .events_until(
            "alice",
            a,
            None,
            |e| matches!(&e.body, EventBody::ToolOutput { text, .. } if text.contains("written")),
        )
        .await;

    // B looks while A's file exists and A's command runs.
    let (_app, events) = run_script(vec![bash(
        "ls -a /workspace; ps -eo args; grep -rs secret-a /workspace /tmp /home 2>/dev/null; echo ok",
    )])
    .await;
    let b = &results(&events)[0];
    assert!(!b.output.contains("a-only.txt") && !b.output.contains("until ["), "{b:?}");
    assert!(!b.output.contains("secret-a\n"), "{b:?}");
    assert_eq!(a_app.run("alice", a).await.status, RunStatus::Running, "A was still running when B looked");

    let containers = a_app.containers_of(a).await;
    assert_eq!(containers.len(), 1, "{containers:?}");
    let (code, out) = kiln_tests::docker_exec(&containers[0], &["touch", "/tmp/go"]).await;
    assert_eq!(code, 0, "{out}");
    let events_a = a_app.events("alice", a).await;
    assert_eq!(outcome(&events_a), Some(RunStatus::Succeeded), "{:?}", events_a.last());
    assert_eq!(results(&events_a)[0].output.trim(), "written\nok");
}

// The disk bound's tests, per mechanism, are in sandbox_disk.rs.

#[tokio::test]
async fn without_a_toolbox_files_are_read_and_written_with_the_users_rights_only() {
    // No toolbox (none found, none in the image): view and write fall back
    // to the worker's own transfers. A symlink in the workspace to a
    // directory of root's must not let them act as root.
    let app = TestApp::spawn(Options {
        worker: false,
        script: vec![
            bash("ln -s /etc /workspace/etc-link && echo linked"),
            Reply::tool("view", json!({"path": "etc-link/shadow"})),
            Reply::tool("write", json!({"path": "etc-link/kiln-evil", "content": "x"})),
            Reply::tool("view", json!({"path": "etc-link/hostname"})),
            Reply::tool("write", json!({"path": "sub/new.txt", "content": "fresh\n"})),
            bash("stat -c '%U %a' sub/new.txt; cat sub/new.txt; ls /etc/kiln-evil 2>&1"),
            bash("seq 1 3000 > nums.txt"),
            Reply::tool("view", json!({"path": "nums.txt"})),
            Reply::tool("view", json!({"path": "nums.txt", "offset": 2001})),
            Reply::text("done"),
        ],
        ..Default::default()
    })
    .await;
    let mut config = kiln_tests::worker_config(kiln_worker::ProviderKind::OpenAi, Duration::from_secs(10));
    config.sandbox.toolbox_path = Some("/nonexistent/kiln-toolbox".into());
    app.start_worker(config).await;
    let id = app.submit("alice", CreateRun::new("read root's files")).await.id;
    let events = app.events("alice", id).await;
    let r = results(&events);
    assert!(!r[1].output.contains("root:"), "root-only content leaked: {:?}", r[1]);
    assert!(r[1].is_error && r[1].output.contains("Permission denied"), "{:?}", r[1]);
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", events.last());
    assert_eq!(r.len(), 9, "{r:?}");
    assert!(r[2].is_error, "{:?}", r[2]);
    // What the user may read, it still reads through the link.
    assert!(!r[3].is_error && r[3].output.contains("1 lines"), "{:?}", r[3]);
    let check = &r[5].output;
    assert!(check.starts_with("kiln 644\nfresh\n"), "{check}");
    assert!(check.contains("No such file or directory"), "nothing was written into /etc: {check}");
    // Paging reads as far as the page: the total is stated once the end is read.
    let first = &r[7].output;
    assert!(first.contains("at least 2001 lines") && !first.contains("3000"), "{first}");
    assert!(first.contains("  2000\t2000\n") && first.ends_with("call view with offset=2001]"), "{first}");
    let rest = &r[8].output;
    assert!(rest.starts_with("/workspace/nums.txt: 3000 lines") || rest.contains(": 3000 lines,"), "{rest}");
    assert!(rest.contains("  3000\t3000\n") && !rest.contains("read more"), "{rest}");
}

/// What a session's sandbox had at the toolbox's directory, and what its
/// users could do there.
struct ToolboxPlace {
    /// The mount at the toolbox's directory: type, read-write, source.
    mount: (String, bool, String),
    /// Exit code of root (in the sandbox) creating a file there.
    root_write: i64,
    /// The command user's attempts (`cp`, `touch`) and the commands' parent.
    user_output: String,
}

/// Runs a session with the worker's toolbox kept in `mount_dir` (`None`:
/// copied into each sandbox) and looks at the toolbox's place while a
/// command waits.
async fn toolbox_place(mount_dir: Option<std::path::PathBuf>) -> ToolboxPlace {
    const DIR: &str = "/usr/local/libexec/kiln";
    let app = TestApp::spawn(Options {
        worker: false,
        script: vec![
            bash("echo started; while [ ! -e /tmp/go ]; do sleep 0.05; done"),
            bash(&format!("cp /bin/true {DIR}/kiln-toolbox 2>&1; touch {DIR}/new 2>&1; cat /proc/$PPID/comm")),
            Reply::text("done"),
        ],
        ..Default::default()
    })
    .await;
    let mut config = kiln_tests::worker_config(kiln_worker::ProviderKind::OpenAi, Duration::from_secs(10));
    config.sandbox.toolbox_mount_dir = mount_dir;
    app.start_worker(config).await;
    let run = app.submit("alice", CreateRun::new("the toolbox's place")).await;
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let container = wait_for_container(&docker, run.session_id).await;
    app.wait_for_event(run.id, "tool.output").await;
    let info = docker.inspect_container(&container, None).await.unwrap();
    let mount = info.mounts.unwrap().into_iter().find(|m| m.destination.as_deref() == Some(DIR)).unwrap();
    let mount = (mount.typ.unwrap_or_default(), mount.rw.unwrap(), mount.source.unwrap_or_default());
    let root_write = docker_exec_root(&docker, &container, &["touch", &format!("{DIR}/by-root")]).await;
    assert_eq!(docker_exec_root(&docker, &container, &["touch", "/tmp/go"]).await, 0);
    let events = app.events("alice", run.id).await;
    assert_eq!(outcome(&events), Some(RunStatus::Succeeded), "{:?}", events.last());
    let user_output = results(&events).pop().unwrap().output;
    ToolboxPlace { mount, root_write, user_output }
}

#[tokio::test]
async fn the_toolbox_is_the_workers_binary_bound_read_only_not_a_copy_per_sandbox() {
    let kept = tempfile::tempdir().unwrap();
    let place = toolbox_place(Some(kept.path().to_owned())).await;
    let (typ, rw, source) = &place.mount;
    assert_eq!((typ.as_str(), *rw), ("bind", false), "{:?}", place.mount);
    // The worker's copy, in a directory named by the binary's hash.
    let binary = std::path::Path::new(source).join("kiln-toolbox");
    assert!(source.starts_with(kept.path().to_str().unwrap()), "{source}");
    let size = std::fs::metadata(&binary).unwrap().len();
    assert!(size > 1024 * 1024, "the toolbox binary itself: {size} bytes");
    // Nobody in the sandbox changes it, root included; commands run under it.
    assert_ne!(place.root_write, 0, "root in the sandbox wrote into the toolbox's directory");
    let out = &place.user_output;
    // (runc checks the mount first, gVisor the directory's owner first.)
    let refused = out.matches("Read-only file system").count() + out.matches("Permission denied").count();
    assert_eq!(refused, 2, "{out}");
    assert!(out.ends_with("kiln-toolbox\n"), "{out}");
    assert_eq!(std::fs::metadata(&binary).unwrap().len(), size);
}

#[tokio::test]
async fn without_a_place_to_keep_it_the_toolbox_is_copied_into_each_sandbox() {
    let place = toolbox_place(None).await;
    let (typ, rw, _) = &place.mount;
    assert_eq!((typ.as_str(), *rw), ("volume", true), "{:?}", place.mount);
    // Only the engine writes there: the command user cannot.
    let out = &place.user_output;
    assert_eq!(out.matches("Permission denied").count(), 2, "{out}");
    assert!(out.ends_with("kiln-toolbox\n"), "{out}");
}

/// The toolbox of a sandbox the worker made is bound exactly as its plan
/// says: nothing is asked of the engine on the cold start's path (the
/// sandbox named below does not exist, and nothing notices). One found on
/// the engine (adopted) is asked about, and is taken as bound only with
/// this worker's directory: one bound to another (another binary's, as
/// after a rolling upgrade) is refused, not kept.
#[tokio::test]
async fn only_a_found_sandbox_is_asked_about_its_toolbox_and_only_this_workers_bind_is_taken() {
    use kiln_worker::sandbox::backend::{BackendError, Provenance};
    use kiln_worker::sandbox::{DockerBackend, Sandbox, SandboxBackend};
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let backend = DockerBackend::new(docker.clone());
    let (older_dir, newer_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let keeping = |dir: &std::path::Path| {
        let mut config = kiln_tests::worker_config(kiln_worker::ProviderKind::OpenAi, Duration::from_secs(10)).sandbox;
        config.toolbox_mount_dir = Some(dir.to_owned());
        config
    };
    let (older, newer) = (keeping(older_dir.path()), keeping(newer_dir.path()));
    assert!(newer.toolbox_plan(&docker).await.unwrap().dir.is_some(), "the engine sees the worker's files");

    let missing = format!("kiln-test-missing-{}", uuid::Uuid::new_v4().simple());
    let made = backend.install_toolbox(&missing, b"", &newer, Provenance::Made).await;
    assert!(made.is_ok(), "a sandbox made here is not asked about: {made:?}");
    let found = backend.install_toolbox(&missing, b"", &newer, Provenance::Found).await;
    assert!(matches!(found, Err(BackendError::NotFound { .. })), "a found one is: {found:?}");

    // Made by a worker keeping its binary elsewhere, found by this one.
    let worker = format!("test-{}", uuid::Uuid::new_v4().simple());
    let sandbox = Sandbox::start_warm(&docker, &older, &worker).await.unwrap();
    let by_its_maker = backend.install_toolbox(sandbox.id(), b"", &older, Provenance::Found).await;
    let by_another = backend.install_toolbox(sandbox.id(), b"", &newer, Provenance::Found).await;
    sandbox.remove().await;
    assert!(by_its_maker.is_ok(), "{by_its_maker:?}");
    let Err(BackendError::ForeignToolbox { bound, ours }) = by_another else { panic!("kept: {by_another:?}") };
    assert!(bound.starts_with(older_dir.path().to_str().unwrap()), "{bound}");
    assert!(ours.starts_with(newer_dir.path().to_str().unwrap()), "{ours}");
}
