//! The terminal client, as a person and a script use it: the real `kiln`
//! binary against a real Kiln (Postgres, Docker, the scripted model), under
//! a pseudo-terminal for the live display and through pipes for plain lines
//! and `--json`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kiln_scripted_model::{Reply, ScriptedCall};
use kiln_tests::kiln_bin::kiln_bin;
use kiln_tests::netcut::CutProxy;
use kiln_tests::{Ev, Options, TestApp, assert_dense, kinds, token};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

const ROWS: u16 = 200;
const COLS: u16 = 140;

/// `kiln ARGS` against `app`, as subject `sub`, with nothing from the
/// environment that would point it elsewhere.
fn kiln(app_url: &str, sub: &str, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(kiln_bin());
    cmd.args(args)
        .env("KILN_URL", app_url)
        .env("KILN_TOKEN", token(sub))
        .env_remove("NO_COLOR")
        .env_remove("CLICOLOR_FORCE")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

async fn output(mut cmd: tokio::process::Command) -> Output {
    tokio::time::timeout(Duration::from_secs(180), cmd.output()).await.expect("kiln finished in time").unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// What a terminal showed: `kiln ARGS` run on a pseudo-terminal of
/// ROWS x COLS, its output rendered as a screen (cursor movement and
/// erasing applied, as a person would see it at the end), and the raw bytes.
struct Terminal {
    status: ExitStatus,
    screen: String,
    raw: String,
    stderr: String,
}

fn open_pty() -> (OwnedFd, OwnedFd) {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC).expect("openpt");
    grantpt(&master).unwrap();
    unlockpt(&master).unwrap();
    let name = ptsname(&master, Vec::new()).unwrap();
    let flags = rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::CLOEXEC;
    let slave = rustix::fs::open(name.as_c_str(), flags, rustix::fs::Mode::empty()).expect("open the pty's slave");
    let size = rustix::termios::Winsize { ws_row: ROWS, ws_col: COLS, ws_xpixel: 0, ws_ypixel: 0 };
    rustix::termios::tcsetwinsize(&slave, size).unwrap();
    (master, slave)
}

/// `kiln` running on a pseudo-terminal.
struct Running {
    child: tokio::process::Child,
    /// Everything written to the terminal so far.
    written: Arc<Mutex<Vec<u8>>>,
    /// Ends once the child has exited and the terminal is read to its end.
    reader: tokio::task::JoinHandle<()>,
}

impl Running {
    fn start(mut cmd: tokio::process::Command) -> Running {
        let (master, slave) = open_pty();
        cmd.stdout(Stdio::from(slave)).stderr(Stdio::piped()).env("TERM", "xterm-256color");
        let child = cmd.spawn().expect("start kiln");
        // `cmd` holds the parent's copy of the slave side: drop it so that
        // the master's reads end (EIO) once the child has exited.
        drop(cmd);
        let written = Arc::new(Mutex::new(Vec::new()));
        let sink = written.clone();
        let reader = tokio::task::spawn_blocking(move || {
            let mut master = std::fs::File::from(master);
            let mut buf = [0u8; 4096];
            loop {
                match master.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => sink.lock().unwrap().extend_from_slice(&buf[..n]),
                }
            }
        });
        Running { child, written, reader }
    }

    fn written(&self) -> String {
        String::from_utf8_lossy(&self.written.lock().unwrap()).into_owned()
    }

    /// Waits until the terminal has been sent `text` (a minute at most).
    async fn wait_for(&self, text: &str) {
        for _ in 0..600 {
            if self.written().contains(text) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the terminal never showed {text:?}: {}", self.written());
    }

    /// Ctrl-C, as the terminal's line discipline would send it.
    fn interrupt(&self) {
        let pid = rustix::process::Pid::from_raw(self.child.id().unwrap() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
    }

    async fn finish(self) -> Terminal {
        let out = tokio::time::timeout(Duration::from_secs(180), self.child.wait_with_output())
            .await
            .expect("kiln finished in time")
            .unwrap();
        self.reader.await.unwrap();
        let raw = std::mem::take(&mut *self.written.lock().unwrap());
        let mut parser = vt100::Parser::new(ROWS.try_into().unwrap(), COLS.try_into().unwrap(), 0);
        parser.process(&raw);
        Terminal {
            status: out.status,
            // Row by row: a row written to its last column counts as
            // wrapped for `contents()`, which would join it to the next.
            screen: parser.screen().rows(0, COLS).map(|row| row.trim_end().to_owned()).collect::<Vec<_>>().join("\n"),
            raw: String::from_utf8_lossy(&raw).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

async fn in_terminal(cmd: tokio::process::Command) -> Terminal {
    Running::start(cmd).finish().await
}

fn with_commas(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The run id `kiln run` printed first: `run <id> <status>: <prompt>`.
fn run_id_in(line: &str) -> String {
    line.split_whitespace().nth(1).expect("run line names the run").to_owned()
}

fn as_streamed(events: &[Ev]) -> Vec<Value> {
    events.iter().map(|e| json!({"seq": e.seq, "kind": e.kind, "payload": e.data})).collect()
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}"))).collect()
}

#[tokio::test]
async fn on_a_terminal_run_follow_shows_live_progress_text_tool_lines_with_durations_and_totals() {
    let app = TestApp::spawn(Options {
        script: vec![
            Reply::tool(
                "todo",
                json!({"items": [
                    {"text": "look around", "status": "in_progress"},
                    {"text": "say hello", "status": "pending"}
                ]}),
            )
            .with_text("First a plan.\nThen the work."),
            Reply::tools(vec![ScriptedCall::new("bash", json!({"command": "sleep 0.3; echo hello-from-bash"}))])
                .with_text("Running a command now."),
            Reply::text("All done: the command said hello."),
        ],
        ..Default::default()
    })
    .await;
    let term = in_terminal(kiln(&app.url(""), "alice", &["run", "--prompt", "say hello", "--follow"])).await;
    let screen = &term.screen;
    assert!(term.status.success(), "exit {:?}\n{screen}\nstderr: {}", term.status, term.stderr);

    let id = run_id_in(screen.lines().next().unwrap());
    let events = app.events_to_end("alice", &id).await;
    // The model's streamed text, each line once, as written.
    for text in ["First a plan.", "Then the work.", "Running a command now.", "All done: the command said hello."] {
        assert_eq!(screen.lines().filter(|l| l.trim_end() == text).count(), 1, "{text:?} in\n{screen}");
    }
    // The plan.
    assert!(screen.contains("[>] look around") && screen.contains("[ ] say hello"), "{screen}");
    // One line per tool call, with the duration the worker measured.
    let duration = |name: &str| {
        events.iter().find(|e| e.kind == "tool.result" && e.data["name"] == name).unwrap().data["duration_ms"]
            .as_u64()
            .unwrap()
    };
    let bash_ms = duration("bash");
    assert!(bash_ms >= 300, "{bash_ms}");
    let bash_line = format!("✓ bash sleep 0.3; echo hello-from-bash · {bash_ms} ms");
    assert_eq!(screen.lines().filter(|l| l.trim_end() == bash_line).count(), 1, "{bash_line:?} in\n{screen}");
    let todo_line = format!("✓ todo 2 items · {} ms", duration("todo"));
    assert!(screen.lines().any(|l| l == todo_line), "{todo_line:?} in\n{screen}");
    // The totals: steps, tool calls, tokens and cost as the steps reported them, wall time, the end.
    let steps: Vec<&Ev> = events.iter().filter(|e| e.kind == "step.finished").collect();
    assert_eq!(steps.len(), 3);
    let tokens = |field: &str| steps.iter().map(|e| e.data["usage"][field].as_u64().unwrap()).sum::<u64>();
    let cost: f64 = steps.iter().map(|e| e.data["cost_usd"].as_f64().unwrap()).sum();
    let totals = format!(
        "✓ 3 steps · 2 tool calls · {} tokens in / {} out · ${cost:.4} · ",
        with_commas(tokens("input_tokens")),
        with_commas(tokens("output_tokens"))
    );
    let last = screen.lines().rev().find(|l| !l.trim().is_empty()).unwrap();
    assert!(last.starts_with(&totals) && last.ends_with(" s · succeeded"), "{last:?} should start {totals:?}");
    // It was live: the spinner line showed the step as it went, and was
    // cleared from the screen at the end.
    assert!(term.raw.contains("step 2"), "no spinner was drawn");
    assert!(!screen.contains("step 2") && !screen.contains("thinking"), "the spinner was left behind:\n{screen}");
    assert!(term.raw.contains("\u{1b}["), "a terminal gets colours and cursor movement");
}

#[tokio::test]
async fn json_output_is_exactly_the_streamed_events_and_plain_output_has_no_escapes() {
    let app = TestApp::spawn(Options {
        script: vec![
            Reply::tool("bash", json!({"command": "echo one; echo two"})).with_text("Let me look."),
            Reply::text("Finished."),
        ],
        ..Default::default()
    })
    .await;
    let out = output(kiln(&app.url(""), "alice", &["run", "--prompt", "look", "--follow", "--json"])).await;
    assert!(out.status.success(), "{out:?}");
    let printed = json_lines(&stdout(&out));
    let id = run_id_in(String::from_utf8_lossy(&out.stderr).lines().next().unwrap());
    let streamed = app.events_to_end("alice", &id).await;
    assert_dense(&streamed, 1);
    assert_eq!(printed, as_streamed(&streamed));
    assert_eq!(kinds(&streamed).last(), Some(&"run.succeeded"));

    // `kiln logs` of the finished run: the same events, read as pages.
    let logs = output(kiln(&app.url(""), "alice", &["logs", &id, "--json"])).await;
    assert!(logs.status.success(), "{logs:?}");
    assert_eq!(json_lines(&stdout(&logs)), as_streamed(&streamed));

    // Without a terminal and without --json: plain lines, no escape codes.
    let plain = output(kiln(&app.url(""), "alice", &["logs", &id])).await;
    let text = stdout(&plain);
    assert!(plain.status.success() && !text.contains('\u{1b}'), "{text}");
    assert!(text.contains("Let me look.\n→ bash {\"command\":\"echo one; echo two\"}\n  ✓ bash ("), "{text}");
    assert!(text.lines().last().unwrap().starts_with("● 2 steps · 1 tool call · "), "{text}");
    assert!(text.trim_end().ends_with(" s · succeeded"), "{text}");
}

#[tokio::test]
async fn logs_follow_a_running_run_until_kiln_cancel_ends_it_and_exit_non_zero() {
    let app = TestApp::spawn(Options {
        script: vec![Reply::tool("bash", json!({"command": "sleep 60"})).with_text("Waiting a minute.")],
        ..Default::default()
    })
    .await;
    let run = app.create_run("alice", json!({"prompt": "wait"})).await;
    let id = run["id"].as_str().unwrap().to_owned();
    let mut logs = kiln(&app.url(""), "alice", &["logs", &id, "--follow"]).stdout(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(logs.stdout.take().unwrap()).lines();
    // The follower shows the call while it runs.
    let mut seen = Vec::new();
    while let Some(line) = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await.unwrap().unwrap() {
        seen.push(line.clone());
        if line.starts_with("→ bash") {
            break;
        }
    }
    assert_eq!(seen.last().map(String::as_str), Some("→ bash {\"command\":\"sleep 60\"}"), "{seen:?}");

    let cancel = output(kiln(&app.url(""), "alice", &["cancel", &id])).await;
    assert!(cancel.status.success(), "{cancel:?}");
    assert_eq!(stdout(&cancel), format!("run {id}: cancellation requested; its worker is stopping it\n"));

    let status = tokio::time::timeout(Duration::from_secs(60), logs.wait()).await.unwrap().unwrap();
    while let Some(line) = lines.next_line().await.unwrap() {
        seen.push(line);
    }
    assert_eq!(status.code(), Some(1), "a cancelled run is not a success: {seen:?}");
    assert!(seen.contains(&"● run cancelled: cancelled by client".to_owned()), "{seen:?}");
    // The summary says how it ended; the reason is said once, on the line above.
    assert!(seen.last().unwrap().ends_with(" s · cancelled"), "{seen:?}");
    assert_eq!(seen.iter().filter(|l| l.contains("cancelled by client")).count(), 1, "{seen:?}");

    // Cancelling again is refused, and says why.
    let again = output(kiln(&app.url(""), "alice", &["cancel", &id])).await;
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already finished"), "{again:?}");
    // Someone else's run does not exist for them.
    let other = output(kiln(&app.url(""), "mallory", &["logs", &id])).await;
    assert!(!other.status.success() && String::from_utf8_lossy(&other.stderr).contains("404"), "{other:?}");
}

#[tokio::test]
async fn the_approve_command_a_waiting_call_prints_is_the_one_that_decides_it() {
    let app = TestApp::spawn(Options {
        script: vec![
            Reply::tool("bash", json!({"command": "echo approved-ran"})),
            Reply::tool("bash", json!({"command": "rm -rf /workspace"})),
            Reply::text("done"),
        ],
        ..Default::default()
    })
    .await;
    let url = app.url("");
    let mut run = kiln(&url, "alice", &["run", "--prompt", "work", "--approval", "mutating", "--follow"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(run.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    let mut decided = 0;
    while let Some(line) = tokio::time::timeout(Duration::from_secs(90), lines.next_line()).await.unwrap().unwrap() {
        seen.push(line.clone());
        // `  kiln approve RUN CALL   (or --deny --reason …)`: run it as printed.
        let Some(hint) = line.trim().strip_prefix("kiln approve ") else { continue };
        let args: Vec<&str> = hint.split_whitespace().take(2).collect();
        let mut argv = vec!["approve", args[0], args[1]];
        if decided == 1 {
            argv.extend(["--deny", "--reason", "too risky"]);
        }
        let decision = output(kiln(&url, "alice", &argv)).await;
        assert!(decision.status.success(), "{decision:?}");
        let word = if decided == 0 { "approved" } else { "denied" };
        assert_eq!(stdout(&decision), format!("call {} of run {} {word}\n", args[1], args[0]));
        decided += 1;
    }
    let status = run.wait().await.unwrap();
    assert!(status.success(), "{seen:?}");
    assert_eq!(decided, 2, "{seen:?}");
    let text = seen.join("\n");
    // The call is printed once (`→`), then that it waits, then how to decide it.
    assert_eq!(text.matches("echo approved-ran\"}").count(), 1, "{text}");
    assert!(text.contains("→ bash {\"command\":\"echo approved-ran\"}\n⏸ bash waits for approval\n"), "{text}");
    assert!(text.contains("  approved\n  ✓ bash ("), "{text}");
    assert!(text.contains("approved-ran"), "{text}");
    assert!(text.contains("  denied: too risky\n  ✗ bash ("), "{text}");
    // A call that is not waiting cannot be decided.
    let id = run_id_in(&seen[0]);
    let late = output(kiln(&url, "alice", &["approve", &id, "call_nope"])).await;
    assert!(!late.status.success() && String::from_utf8_lossy(&late.stderr).contains("404"), "{late:?}");
}

#[tokio::test]
async fn runs_lists_id_status_age_cost_and_prompt() {
    let app = TestApp::spawn(Options {
        script: vec![Reply::text("ok"), Reply::tool("bash", json!({"command": "true"}))],
        ..Default::default()
    })
    .await;
    let done = app.create_run("alice", json!({"prompt": "the finished one"})).await;
    let done_id = done["id"].as_str().unwrap().to_owned();
    let events = app.events_to_end("alice", &done_id).await;
    let cost = events.iter().find(|e| e.kind == "step.finished").unwrap().data["cost_usd"].as_f64().unwrap();
    // A second run that waits for approval of its first call.
    let waiting =
        app.create_run("alice", json!({"prompt": "the waiting one\nwith a second line", "approval": "always"})).await;
    let waiting_id = waiting["id"].as_str().unwrap().to_owned();
    app.sse_until(app.addr, "alice", &waiting_id, None, usize::MAX, |e| e.kind == "approval.requested").await;
    app.create_run("bob", json!({"prompt": "not alice's"})).await;

    let out = output(kiln(&app.url(""), "alice", &["runs"])).await;
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "a header and alice's two runs:\n{text}");
    let columns =
        |line: &str| line.split("  ").map(str::trim).filter(|c| !c.is_empty()).map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(columns(lines[0]), ["ID", "STATUS", "AGE", "COST", "PROMPT"]);
    // Newest first.
    let waiting_row = columns(lines[1]);
    assert_eq!(waiting_row[0], waiting_id);
    assert_eq!(waiting_row[1], "awaiting_approval");
    assert!(waiting_row[2].ends_with('s'), "{waiting_row:?}");
    assert_eq!(waiting_row[4], "the waiting one with a second line");
    let done_row = columns(lines[2]);
    assert_eq!(
        done_row,
        [done_id.clone(), "succeeded".into(), done_row[2].clone(), format!("${cost:.4}"), "the finished one".into()]
    );

    let json = output(kiln(&app.url(""), "alice", &["runs", "--json", "--status", "succeeded"])).await;
    let runs = json_lines(&stdout(&json));
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["id"], done_id.as_str());
    assert_eq!(runs[0]["status"], "succeeded");
    let cancel = output(kiln(&app.url(""), "alice", &["cancel", &waiting_id])).await;
    assert!(cancel.status.success(), "{cancel:?}");
    assert_eq!(app.events_to_end("alice", &waiting_id).await.last().unwrap().kind, "run.cancelled");
}

#[tokio::test]
async fn following_resumes_after_a_dropped_connection_with_nothing_missed_or_repeated() {
    let app = TestApp::spawn(Options {
        script: vec![
            Reply::tool("bash", json!({"command": "sleep 2; echo after-the-cut"})).with_text("Before the cut."),
            Reply::text("After the cut."),
        ],
        ..Default::default()
    })
    .await;
    let proxy = CutProxy::start(app.addr).await;
    let run = app.create_run("alice", json!({"prompt": "p"})).await;
    let id = run["id"].as_str().unwrap().to_owned();
    let mut logs = kiln(&format!("http://{}", proxy.addr()), "alice", &["logs", &id, "--follow", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(logs.stdout.take().unwrap()).lines();
    let mut printed = Vec::new();
    while let Some(line) = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await.unwrap().unwrap() {
        let event: Value = serde_json::from_str(&line).unwrap();
        let ready = event["kind"] == "tool_call.ready";
        printed.push(event);
        if ready {
            break;
        }
    }
    // The network drops while the command runs, and comes back.
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.restore();
    let status = tokio::time::timeout(Duration::from_secs(90), logs.wait()).await.unwrap().unwrap();
    while let Some(line) = lines.next_line().await.unwrap() {
        printed.push(serde_json::from_str(&line).unwrap());
    }
    assert!(status.success(), "{printed:?}");
    let streamed = app.events_to_end("alice", &id).await;
    assert_eq!(printed, as_streamed(&streamed));
}

#[tokio::test]
async fn on_a_terminal_a_waiting_call_shows_the_command_that_approves_it() {
    let app = TestApp::spawn(Options {
        script: vec![Reply::tool("bash", json!({"command": "echo approved-ran"})), Reply::text("Done.")],
        ..Default::default()
    })
    .await;
    let running =
        Running::start(kiln(&app.url(""), "alice", &["run", "--prompt", "work", "--approval", "mutating", "--follow"]));
    // The run kiln submitted: the id on the first line it printed.
    running.wait_for(" queued: work").await;
    let id = running.written().lines().next().map(run_id_in).unwrap();
    let waiting = app.sse_until(app.addr, "alice", &id, None, usize::MAX, |e| e.kind == "approval.requested").await;
    let call = waiting.last().unwrap().data["call_id"].as_str().unwrap().to_owned();
    running.wait_for("waiting for approval").await;
    let r = app
        .http
        .post(app.url(&format!("/v1/runs/{id}/approvals/{call}")))
        .bearer_auth(token("alice"))
        .json(&json!({"decision": "approve"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let term = running.finish().await;
    let screen = &term.screen;
    assert!(term.status.success(), "{screen}\n{}", term.stderr);
    let lines: Vec<&str> = screen.lines().collect();
    let at = lines.iter().position(|l| *l == "⏸ bash echo approved-ran waits for approval").expect(screen);
    assert_eq!(lines[at + 1], format!("  kiln approve {id} {call}   (or --deny --reason …)"));
    assert_eq!(lines[at + 2], "  approved");
    assert!(lines[at + 3].starts_with("✓ bash echo approved-ran · ") && lines[at + 3].ends_with(" ms"), "{screen}");
    assert!(!screen.contains("waiting for approval"), "{screen}");
}

#[tokio::test]
async fn ctrl_c_stops_following_not_the_run_and_clears_the_spinner() {
    let app = TestApp::spawn(Options {
        script: vec![Reply::tool("bash", json!({"command": "sleep 60"})).with_text("Waiting a minute.")],
        ..Default::default()
    })
    .await;
    let run = app.create_run("alice", json!({"prompt": "wait"})).await;
    let id = run["id"].as_str().unwrap().to_owned();
    let running = Running::start(kiln(&app.url(""), "alice", &["logs", &id, "--follow"]));
    running.wait_for("sleep 60").await;
    running.interrupt();
    let term = running.finish().await;
    assert_eq!(term.status.code(), Some(130), "{}\n{}", term.screen, term.stderr);
    assert!(term.screen.contains("Waiting a minute."), "{}", term.screen);
    assert!(term.raw.contains("step 1"), "the spinner was drawn");
    assert!(!term.screen.contains("step 1"), "and cleared:\n{}", term.screen);
    assert!(
        term.stderr.contains(&format!("stopped following; run {id} goes on: kiln logs {id} --follow")),
        "{}",
        term.stderr
    );
    assert_eq!(app.get_run("alice", &id).await["status"], "running");
    // End it, so its worker removes its container before the test's end stops that worker.
    let cancel = output(kiln(&app.url(""), "alice", &["cancel", &id])).await;
    assert!(cancel.status.success(), "{cancel:?}");
    assert_eq!(app.events_to_end("alice", &id).await.last().unwrap().kind, "run.cancelled");
}

/// What a model or a command prints must not drive the person's terminal:
/// a clipboard write (OSC 52), a cleared screen, a colour through the 8-bit
/// CSI, a carriage return that would overwrite a line with a forged one.
#[tokio::test]
async fn terminal_escapes_from_the_model_and_its_commands_never_reach_the_terminal() {
    let text = "Before\u{1b}]52;c;aGFja2Vk\u{7} after.\nSafe line\rFORGED\n\u{1b}[2JStill \u{9b}31mhere.\n";
    let app = TestApp::spawn(Options {
        script: vec![
            Reply::tool("bash", json!({"command": "printf 'out\\033]52;c;%s%s\\007put\\n' Q0xJ UEJP; exit 3"}))
                .with_text(text),
            Reply::text("Done."),
        ],
        ..Default::default()
    })
    .await;
    let term = in_terminal(kiln(&app.url(""), "alice", &["run", "--prompt", "p\u{1b}[2Jq", "--follow"])).await;
    let screen = &term.screen;
    assert!(term.status.success(), "exit {:?}\n{screen}\nstderr: {}", term.status, term.stderr);
    for line in ["Before after.", "Safe lineFORGED", "Still here.", "Done."] {
        assert_eq!(screen.lines().filter(|l| l.trim_end() == line).count(), 1, "{line:?} in\n{screen}");
    }
    assert!(screen.lines().any(|l| l.ends_with("output [exit code 3]")), "{screen}");
    assert!(screen.lines().next().unwrap().ends_with(": pq"), "{screen}");
    // (The command's payload is printed in two halves, so only its output holds it whole.)
    for escape in ["\u{1b}]52", "aGFja2Vk", "Q0xJUEJP", "\u{1b}[2J", "\u{9b}", "line\r"] {
        assert!(!term.raw.contains(escape), "{escape:?} reached the terminal: {:?}", term.raw);
    }

    // Plain lines: the same text, and no control characters but newlines.
    let id = run_id_in(screen.lines().next().unwrap());
    let plain = output(kiln(&app.url(""), "alice", &["logs", &id])).await;
    let out = stdout(&plain);
    assert!(plain.status.success(), "{out}");
    assert!(out.contains("\nBefore after.\nSafe lineFORGED\nStill here.\n→ bash"), "{out:?}");
    assert!(out.contains(": output [exit code 3]"), "{out:?}");
    assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out:?}");
    // `kiln runs` lists the prompt cleaned.
    let runs = stdout(&output(kiln(&app.url(""), "alice", &["runs"])).await);
    assert!(runs.contains("  pq") && !runs.chars().any(|c| c.is_control() && c != '\n'), "{runs:?}");

    // --json: the events, which decode to what was streamed, with every
    // control character written as an escape.
    let json = stdout(&output(kiln(&app.url(""), "alice", &["logs", &id, "--json"])).await);
    assert!(!json.chars().any(|c| c.is_control() && c != '\n'), "{json:?}");
    assert!(json_lines(&json).iter().any(|e| e["payload"]["text"].as_str().is_some_and(|t| t.contains('\u{9b}'))));
}

/// `kiln ARGS` with nothing from the caller's environment that names a Kiln.
fn bare_kiln(args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(kiln_bin());
    cmd.args(args)
        .env_remove("KILN_URL")
        .env_remove("KILN_TOKEN")
        .env_remove("KILN_JWT_SECRET")
        .env_remove("KILN_STATE_DIR")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).unwrap()
}

/// A loopback address where nothing listens (the port was just free).
fn nothing_listening() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

#[tokio::test]
async fn client_errors_say_what_to_do() {
    let token = token("alice");
    // (KILN_URL, args, what the error must say)
    let cases: Vec<(Option<String>, Vec<&str>, Vec<&str>)> = vec![
        (
            Some(nothing_listening()),
            vec!["runs"],
            vec!["cannot reach Kiln at http://127.0.0.1:", "Connection refused", "kiln up", "KILN_URL"],
        ),
        (Some("127.0.0.1:8080".into()), vec!["runs"], vec!["\"127.0.0.1:8080\"", "like http://127.0.0.1:8080"]),
        (
            Some("http://127.0.0.1:8080/v1".into()),
            vec!["runs"],
            vec!["without the API's path: use http://127.0.0.1:8080"],
        ),
        (None, vec!["logs", "not-a-run"], vec!["\"not-a-run\" is not a run id", "kiln runs"]),
        (None, vec!["cancel", "0192"], vec!["\"0192\" is not a run id"]),
    ];
    for (url, args, wanted) in cases {
        let mut cmd = bare_kiln(&args);
        cmd.env("KILN_TOKEN", &token);
        if let Some(url) = &url {
            cmd.env("KILN_URL", url);
        }
        let out = output(cmd).await;
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?} with {url:?} succeeded");
        for w in wanted {
            assert!(err.contains(w), "{args:?} with {url:?}: {w:?} missing from:\n{err}");
        }
        // A person's message, not a library's internals.
        assert!(!err.contains("relative URL without a base") && !err.contains("invalid character"), "{err}");
    }
}

#[tokio::test]
async fn without_a_token_the_error_names_kiln_token_and_kiln_up() {
    let mut cmd = bare_kiln(&["runs"]);
    cmd.env("KILN_URL", nothing_listening());
    let out = output(cmd).await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "a usage error: {err}");
    for w in ["KILN_TOKEN", "kiln up", "kiln token --sub NAME", ".kiln/jwt-secret"] {
        assert!(err.contains(w), "{w:?} missing from:\n{err}");
    }
    assert!(!err.contains("required arguments were not provided"), "{err}");
}

#[tokio::test]
async fn kiln_token_signs_with_kiln_ups_secret_when_none_is_set() {
    let state = tempfile::tempdir().unwrap();
    // Without a secret anywhere: say where one comes from.
    let out = output({
        let mut cmd = bare_kiln(&["token", "--sub", "alice"]);
        cmd.current_dir(state.path());
        cmd
    })
    .await;
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("KILN_JWT_SECRET") && err.contains("jwt-secret"), "{err}");

    // With `kiln up`'s state: a token the API (holding that secret) accepts.
    let secret = "0123456789abcdef0123456789abcdef";
    std::fs::create_dir(state.path().join(".kiln")).unwrap();
    std::fs::write(state.path().join(".kiln/jwt-secret"), format!("{secret}\n")).unwrap();
    let out = output({
        let mut cmd = bare_kiln(&["token", "--sub", "alice"]);
        cmd.current_dir(state.path());
        cmd
    })
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let token = stdout(&out).trim().to_owned();
    let config = kiln_api::auth::AuthConfig::Hs256 { secret: secret.as_bytes().to_vec().into() };
    let api = kiln_api::auth::Authenticator::new(&config, None, None).unwrap();
    assert_eq!(api.verify(&token).unwrap(), "alice");
}

/// The Kiln containers labelled with `worker`, running or not.
async fn containers_of_worker(worker: &str) -> Vec<String> {
    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let filters = std::collections::HashMap::from([("label".to_owned(), vec![format!("dev.kiln.worker={worker}")])]);
    let options = bollard::query_parameters::ListContainersOptionsBuilder::new().all(true).filters(&filters).build();
    docker.list_containers(Some(options)).await.unwrap().into_iter().filter_map(|c| c.id).collect()
}

/// Processes whose command line mentions `needle` (the process table).
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let line = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if line.contains(needle) {
            found.push(line);
        }
    }
    found
}

fn port_is_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// `kiln up` with its own state directory, Postgres port and scripted model.
fn kiln_up(state: &Path, pg_port: u16, args: &[&str]) -> tokio::process::Command {
    let mut cmd = bare_kiln(&[&["up"], args].concat());
    cmd.env("KILN_STATE_DIR", state)
        .env("KILN_LOCAL_PG_PORT", pg_port.to_string())
        .env("KILN_LISTEN", "127.0.0.1:0")
        .env("KILN_MODEL_PROVIDER", "scripted")
        .env_remove("DATABASE_URL")
        .env_remove("KILN_WORKER_ID")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// A long-running `kiln up` (as [`kiln_up`], no demo) and its log up to the
/// banner's last line, the export line to paste (or to its end, if it
/// exits first). The rest of its log is read on into [`UpLog`], so it never
/// blocks on a full pipe.
async fn start_kiln_up(state: &Path, pg_port: u16) -> (tokio::process::Child, String) {
    let (up, banner, _) = start_kiln_up_logged(state, pg_port).await;
    (up, banner)
}

/// What a `kiln up` logged after its banner.
type UpLog = Arc<Mutex<String>>;

async fn start_kiln_up_logged(state: &Path, pg_port: u16) -> (tokio::process::Child, String, UpLog) {
    let mut up = kiln_up(state, pg_port, &[]).spawn().unwrap();
    let mut lines = BufReader::new(up.stderr.take().unwrap()).lines();
    let mut banner = String::new();
    while let Some(line) = tokio::time::timeout(Duration::from_secs(120), lines.next_line()).await.unwrap().unwrap() {
        banner.push_str(&line);
        banner.push('\n');
        if line.trim_start().starts_with("export KILN_URL=") {
            break;
        }
    }
    let log = UpLog::default();
    let rest = log.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            rest.lock().unwrap().push_str(&format!("{line}\n"));
        }
    });
    (up, banner, log)
}

#[tokio::test]
async fn kiln_up_leaves_nothing_running_and_kiln_down_stops_and_resets_everything() {
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().join("state");
    std::fs::create_dir(&state_dir).unwrap();
    let worker = kiln_cli::up::down::up_worker_id(&state_dir).unwrap();
    let pg_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();

    // The demo ends: its containers, its model server and its cluster end with it.
    let out = output(kiln_up(&state_dir, pg_port, &["--demo"])).await;
    let err = stderr(&out);
    assert!(out.status.success(), "kiln up --demo failed:\n{err}");
    let data = err
        .lines()
        .find_map(|l| l.split("data in ").nth(1))
        .and_then(|rest| rest.split(',').next())
        .expect("kiln up says where the cluster's data is")
        .to_owned();
    assert!(err.contains("stopped the local Postgres"), "{err}");
    assert!(port_is_free(pg_port), "the cluster still listens on {pg_port}");
    assert!(processes_mentioning(&data).is_empty(), "{:?}", processes_mentioning(&data));
    assert!(containers_of_worker(&worker).await.is_empty(), "the demo's containers are gone");

    // A long-running `kiln up`, stopped by `kiln down` from another shell.
    let (mut up, banner) = start_kiln_up(&state_dir, pg_port).await;
    assert!(banner.contains("the web view is at http://127.0.0.1:"), "{banner}");
    assert!(banner.contains("kiln down --reset"), "{banner}");
    assert!(!port_is_free(pg_port), "kiln up runs its cluster");
    // Its warm pool fills (2 containers under `kiln up`).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while containers_of_worker(&worker).await.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "kiln up started no warm containers");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut down = bare_kiln(&["down"]);
    down.env("KILN_STATE_DIR", &state_dir);
    let out = output(down).await;
    let said = stderr(&out);
    assert!(out.status.success(), "kiln down failed:\n{said}");
    assert!(said.contains("stopped kiln up"), "{said}");
    let status = tokio::time::timeout(Duration::from_secs(30), up.wait()).await.expect("kiln up exited").unwrap();
    assert!(status.success(), "kiln up exits cleanly when stopped: {status}");
    assert!(port_is_free(pg_port), "kiln down stops the cluster");
    assert!(processes_mentioning(&data).is_empty(), "{:?}", processes_mentioning(&data));
    assert!(containers_of_worker(&worker).await.is_empty(), "kiln down leaves no container");
    assert!(processes_mentioning(&state_dir.display().to_string()).is_empty(), "no process of this state is left");

    // Reset: the cluster's files and the secret are gone.
    let mut reset = bare_kiln(&["down", "--reset"]);
    reset.env("KILN_STATE_DIR", &state_dir);
    let out = output(reset).await;
    assert!(out.status.success(), "kiln down --reset failed:\n{}", stderr(&out));
    assert!(!Path::new(&data).exists(), "{data} deleted");
    assert!(!state_dir.join("jwt-secret").exists());
}

#[tokio::test]
async fn run_repo_takes_a_relative_local_path() {
    let app = TestApp::spawn(Options {
        script: vec![Reply::tool("bash", json!({"command": "cat marker.txt"})), Reply::text("Done.")],
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("projects/demo-repo");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::write(repo.join("marker.txt"), "from the local checkout\n").unwrap();
    for args in [&["init", "-q"][..], &["add", "."], &["commit", "-q", "-m", "one"]] {
        let status = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
            .args(args)
            .current_dir(&repo)
            .status()
            .unwrap();
        assert!(status.success());
    }
    let mut cmd =
        kiln(&app.url(""), "alice", &["run", "--prompt", "read it", "--repo", "projects/demo-repo", "--follow"]);
    cmd.current_dir(dir.path());
    let out = output(cmd).await;
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("from the local checkout"), "{}", stdout(&out));
}

#[tokio::test]
async fn cached_input_shows_in_each_step_and_in_the_totals() {
    let app = TestApp::spawn(Options {
        script: vec![
            Reply::tool("bash", json!({"command": "true"})).with_cached_input(1974),
            Reply::text("Done.").with_cached_input(1974),
        ],
        ..Default::default()
    })
    .await;
    let out = output(kiln(&app.url(""), "alice", &["run", "--prompt", "go", "--follow", "--json"])).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let cached: Vec<u64> = json_lines(&stdout(&out))
        .iter()
        .filter(|e| e["kind"] == "step.finished")
        .map(|e| e["payload"]["usage"]["cache_read_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(cached, [1974, 1974], "step.finished carries the cached input");
    let id = run_id_in(String::from_utf8_lossy(&out.stderr).lines().next().unwrap());
    let plain = output(kiln(&app.url(""), "alice", &["logs", &id])).await;
    let last = stdout(&plain).lines().last().unwrap().to_owned();
    assert!(last.contains(" tokens in + 3,948 cached / "), "{last}");
}

#[tokio::test]
async fn a_second_kiln_up_on_a_taken_address_says_so_before_starting_anything() {
    let state = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let pg_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut cmd = kiln_up(state.path(), pg_port, &[]);
    cmd.env("KILN_LISTEN", &addr);
    let out = output(cmd).await;
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains(&format!("cannot listen on {addr}")) && err.contains("KILN_LISTEN"), "{err}");
    assert!(!err.contains("Postgres") && !err.contains("model"), "nothing was started first: {err}");
    assert!(port_is_free(pg_port));
}

/// The commands hints print are the ones the user can type: `kiln …` for
/// an installed binary, `cargo run -- …` under `cargo run` (the README's
/// way), where `kiln` is not on the PATH.
#[tokio::test]
async fn hints_name_the_command_the_user_ran() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let submit = |under_cargo: bool| {
        let mut cmd = kiln(&app.url(""), "alice", &["run", "--prompt", "wait"]);
        // What `cargo run` gives the binary it runs (its package's variables).
        if under_cargo {
            cmd.env("CARGO", "cargo").env("CARGO_PKG_NAME", "kiln-cli");
        } else {
            cmd.env_remove("CARGO").env_remove("CARGO_PKG_NAME");
        }
        output(cmd)
    };
    let installed = submit(false).await;
    let said = String::from_utf8_lossy(&installed.stdout);
    assert!(said.contains("follow it: kiln logs --follow "), "{said}");
    let under_cargo = submit(true).await;
    let said = String::from_utf8_lossy(&under_cargo.stdout);
    assert!(said.contains("follow it: cargo run -- logs --follow "), "{said}");
    assert!(said.contains("(cancel: cargo run -- cancel "), "{said}");

    // The same for the hint of an error, with no server to reach.
    let mut down = kiln("http://127.0.0.1:9", "alice", &["runs"]);
    down.env("CARGO", "cargo").env("CARGO_PKG_NAME", "kiln-cli");
    let err = String::from_utf8_lossy(&output(down).await.stderr).into_owned();
    assert!(err.contains("Start it with `cargo run -- up`"), "{err}");
}

/// The newcomer's path, as near as a test can afford (a real fresh clone
/// builds the whole workspace; README and the report give those figures):
/// the `kiln` built in this tree, with no toolbox configured, run as
/// `kiln up --demo` builds the static toolbox itself and hands it to its
/// worker; the demo creates no more than the warm pool (2) + 1 containers,
/// and none is left after it exits.
#[tokio::test]
async fn kiln_up_from_a_source_tree_builds_the_static_toolbox_and_creates_no_more_than_warm_plus_one() {
    use futures::StreamExt;
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().join("state");
    std::fs::create_dir(&state_dir).unwrap();
    let worker = kiln_cli::up::down::up_worker_id(&state_dir).unwrap();
    let pg_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();

    let docker = bollard::Docker::connect_with_local_defaults().unwrap();
    let filters = std::collections::HashMap::from([
        ("type".to_owned(), vec!["container".to_owned()]),
        ("event".to_owned(), vec!["create".to_owned()]),
        ("label".to_owned(), vec![format!("dev.kiln.worker={worker}")]),
    ]);
    let options = bollard::query_parameters::EventsOptionsBuilder::new().filters(&filters).build();
    let created = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = created.clone();
    let mut events = docker.events(Some(options));
    let watch = tokio::spawn(async move {
        while let Some(Ok(event)) = events.next().await {
            seen.lock().unwrap().extend(event.actor.and_then(|a| a.id));
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut up = kiln_up(&state_dir, pg_port, &["--demo"]);
    up.env_remove("KILN_TOOLBOX_PATH").env("RUST_LOG", "warn,kiln_worker::sandbox=info");
    // The first build of the static toolbox may take minutes on a busy machine.
    let out = tokio::time::timeout(Duration::from_secs(900), up.output()).await.expect("kiln up finished").unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "kiln up --demo failed:\n{err}");
    assert!(err.contains("building the sandbox toolbox"), "{err}");
    let used = err.lines().find(|l| l.contains("using the toolbox binary")).unwrap_or_else(|| panic!("{err}"));
    let triple = kiln_worker::sandbox::static_toolbox_target().unwrap();
    assert!(used.contains(&format!("/{triple}/")), "the static build: {used}");
    assert!(!err.contains("docker exec per call"), "{err}");

    // Docker reports events asynchronously: the last create may trail the exit.
    tokio::time::sleep(Duration::from_secs(1)).await;
    watch.abort();
    let created = created.lock().unwrap().clone();
    assert!(!created.is_empty() && created.len() <= 3, "containers created for {worker}: {created:?}");
    assert!(containers_of_worker(&worker).await.is_empty(), "none is left after kiln up exits");
}

/// A run that fails says why once, in the words of the step that failed:
/// `could not prepare the workspace: could not clone the repository`, not
/// with a second `workspace:` prefix and not again in the summary.
#[tokio::test]
async fn a_failed_run_says_its_error_once_without_a_doubled_prefix() {
    let app = TestApp::spawn(Options { script: vec![Reply::text("never reached")], ..Default::default() }).await;
    // A directory, so `--repo` takes it (as file://), but no repository.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README"), "not a git repository\n").unwrap();
    let not_a_repo = dir.path().to_str().unwrap();
    let args = ["run", "--prompt", "read it", "--repo", not_a_repo, "--follow"];

    // Plain lines: the run's end with its reason, then the summary without it.
    let out = output(kiln(&app.url(""), "alice", &args)).await;
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(1), "a failed run exits 1:\n{said}");
    assert_eq!(said.matches("could not prepare the workspace").count(), 1, "{said}");
    assert!(!said.contains("workspace: workspace:"), "{said}");
    let failed = said.lines().find(|l| l.starts_with("● run failed: ")).unwrap_or_else(|| panic!("{said}"));
    assert!(failed.starts_with("● run failed: could not prepare the workspace: could not clone"), "{failed}");
    assert!(said.lines().last().unwrap().ends_with(" s · failed"), "{said}");

    // On a terminal: the summary line says it, once.
    let term = in_terminal(kiln(&app.url(""), "alice", &args)).await;
    let shown = format!("{}\n{}", term.screen, term.stderr);
    assert_eq!(term.status.code(), Some(1), "{shown}");
    assert_eq!(shown.matches("could not prepare the workspace").count(), 1, "{shown}");
    assert!(!shown.contains("workspace: workspace:"), "{shown}");
}

/// A run without `--repo` works in an empty /workspace: the user is told
/// so, once, on stderr (stdout stays the run's, for scripts); with `--repo`
/// nothing is said.
#[tokio::test]
async fn run_without_repo_says_the_workspace_is_empty() {
    let app = TestApp::spawn(Options { worker: false, ..Default::default() }).await;
    let note = "no --repo: the run starts in an empty workspace";
    let out = output(kiln(&app.url(""), "alice", &["run", "--prompt", "look around"])).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stderr(&out).lines().filter(|l| l.starts_with(note)).count(), 1, "{}", stderr(&out));
    assert!(!stdout(&out).contains(note), "{}", stdout(&out));
    // Under --json the run line comes first on stderr, as scripts read it.
    let out = output(kiln(&app.url(""), "alice", &["run", "--prompt", "look around", "--json"])).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains(note), "{}", stderr(&out));

    let dir = tempfile::tempdir().unwrap();
    let out =
        output(kiln(&app.url(""), "alice", &["run", "--prompt", "look", "--repo", dir.path().to_str().unwrap()])).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("no --repo"), "{}", stderr(&out));
}

/// A second `kiln up` for a state directory whose `kiln up` still runs
/// refuses before starting anything, naming the running one's pid and how
/// to stop it; the first goes on.
#[tokio::test]
async fn a_second_kiln_up_for_a_running_state_says_so_with_its_pid() {
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().join("state");
    std::fs::create_dir(&state_dir).unwrap();
    let pg_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();

    let (mut first, banner) = start_kiln_up(&state_dir, pg_port).await;
    assert!(banner.contains("Ctrl-C stops Kiln"), "the first kiln up never got ready:\n{banner}");
    let pid = first.id().unwrap();

    // Another address, so only the running `kiln up` stands in the way.
    let second = tokio::time::timeout(Duration::from_secs(30), kiln_up(&state_dir, pg_port, &[]).output())
        .await
        .expect("the second kiln up refused at once")
        .unwrap();
    let err = stderr(&second);
    assert!(!second.status.success(), "{err}");
    assert!(err.contains("already running") && err.contains(&format!("(pid {pid})")), "{err}");
    assert!(err.contains("kiln down"), "{err}");
    assert!(!err.contains("Postgres") && !err.contains("API at"), "nothing was started first: {err}");
    assert!(first.try_wait().unwrap().is_none(), "the first kiln up goes on");
    assert_eq!(std::fs::read_to_string(state_dir.join("up.pid")).unwrap().trim(), pid.to_string());

    let mut down = bare_kiln(&["down"]);
    down.env("KILN_STATE_DIR", &state_dir);
    let out = output(down).await;
    assert!(out.status.success(), "kiln down failed:\n{}", stderr(&out));
    let status = tokio::time::timeout(Duration::from_secs(30), first.wait()).await.expect("kiln up exited").unwrap();
    assert!(status.success(), "{status}");
}

/// The `kiln up` a new user meets: quiet after its banner, whose last line
/// is the one to paste (and `kiln up --print-env` prints it again); its
/// scripted model plays every run the demo's whole script; its prepared
/// environment images carry its own cache scope, and `kiln down --reset`
/// removes them.
#[tokio::test]
async fn kiln_up_is_quiet_serves_every_run_the_whole_script_and_down_reset_removes_its_prepared_images() {
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().join("state");
    std::fs::create_dir(&state_dir).unwrap();
    let pg_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (mut up, banner, log) = start_kiln_up_logged(&state_dir, pg_port).await;
    let last = banner.lines().last().unwrap().trim().to_owned();
    assert!(last.starts_with("export KILN_URL=http://127.0.0.1:") && last.contains(" KILN_TOKEN="), "{banner}");
    let url = last.split_whitespace().nth(1).unwrap().strip_prefix("KILN_URL=").unwrap().to_owned();
    let mut print_env = bare_kiln(&["up", "--print-env"]);
    print_env.env("KILN_STATE_DIR", &state_dir);
    let out = output(print_env).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let again = stdout(&out).trim().to_owned();
    assert!(again.starts_with(&format!("export KILN_URL={url} KILN_TOKEN=")), "{again}");
    let token = again.rsplit("KILN_TOKEN=").next().unwrap().to_owned();

    let client = |args: &[&str]| {
        let mut cmd = bare_kiln(args);
        cmd.env("KILN_URL", &url).env("KILN_TOKEN", &token);
        cmd
    };
    let repo = tempfile::tempdir().unwrap();
    std::fs::write(repo.path().join("README.md"), "# demo\n").unwrap();
    std::fs::write(repo.path().join("Cargo.lock"), "version = 1\n").unwrap();
    kiln_tests::git_repo::git(repo.path(), &["init", "-q"]);
    kiln_tests::git_repo::git(repo.path(), &["add", "."]);
    kiln_tests::git_repo::git(repo.path(), &["commit", "-q", "-m", "one"]);
    let repo_arg = repo.path().to_str().unwrap();
    for n in 0..2 {
        let out = output(client(&["run", "--prompt", "notes", "--repo", repo_arg, "--follow"])).await;
        let said = format!("{}{}", stdout(&out), stderr(&out));
        assert!(out.status.success(), "run {n}: {said}");
        assert!(said.contains("NOTES.md") && !said.contains("script exhausted"), "run {n}: {said}");
        assert_eq!(said.matches("  ✓ ").count(), 4, "run {n} made the script's calls: {said}");
    }

    // An environment's prepared image carries this state's cache scope.
    let out = output(client(&["env", "create", "prepared", "--setup", "echo prepared"])).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let out =
        output(client(&["run", "--prompt", "notes", "--repo", repo_arg, "--environment", "prepared", "--follow"]))
            .await;
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("  │ prepared\n"), "{}", stdout(&out));
    let scope = kiln_cli::up::down::up_cache_scope(&state_dir).unwrap();
    let images = || async {
        let docker = bollard::Docker::connect_with_local_defaults().unwrap();
        let labels = vec![format!("dev.kiln.env-scope={scope}")];
        let filters = std::collections::HashMap::from([("label".to_owned(), labels)]);
        let options = bollard::query_parameters::ListImagesOptionsBuilder::new().filters(&filters).build();
        docker.list_images(Some(options)).await.unwrap().len()
    };
    assert_eq!(images().await, 1, "one prepared image of scope {scope}");

    // Quiet: nothing was logged after the banner for those requests.
    let logged = log.lock().unwrap().clone();
    assert!(!logged.contains("/v1/runs") && !logged.contains("finished processing request"), "{logged}");

    let mut down = bare_kiln(&["down", "--reset"]);
    down.env("KILN_STATE_DIR", &state_dir);
    let out = output(down).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("removed 1 prepared environment image(s)"), "{}", stderr(&out));
    assert_eq!(images().await, 0, "kiln down --reset removed the prepared images");
    let status = tokio::time::timeout(Duration::from_secs(30), up.wait()).await.expect("kiln up exited").unwrap();
    assert!(status.success(), "{status}");
    let mut print_env = bare_kiln(&["up", "--print-env"]);
    print_env.env("KILN_STATE_DIR", &state_dir);
    let out = output(print_env).await;
    assert!(!out.status.success() && stderr(&out).contains("no kiln up is serving"), "{}", stderr(&out));
}
