//! `exec` through the real binary: streaming, state between calls, stdin,
//! timeouts and cancellation killing whole process groups, bounded memory.

mod common;

use std::time::{Duration, Instant};

use common::*;
use kiln_toolbox::protocol::*;

/// Catches a hang, nothing faster: speed is measured in bench/, and a loaded
/// two-core CI machine can stall any one call for seconds.
const HANG: Duration = Duration::from_secs(30);

#[test]
fn echo_streams_and_returns_merged_output() {
    let dir = tempfile::tempdir().unwrap();
    let mut tb = Toolbox::start(dir.path());
    assert_eq!(tb.hello.protocol_version, PROTOCOL_VERSION);
    assert_eq!(tb.hello.pid, tb.pid());

    let (r, streamed) =
        tb.exec_req(ExecRequest::new("echo hello; echo oops >&2; printf '\\033[1;31mred\\033[0m\\r\\n'"));
    assert_eq!(r.output, "hello\noops\nred\n");
    assert_eq!(streamed, r.output);
    assert_eq!((r.exit_code, r.signal, r.timed_out, r.cancelled), (Some(0), None, false, false));
    assert_eq!(r.cwd, dir.path().to_string_lossy());
}

#[test]
fn cwd_and_exported_variables_persist_between_calls() {
    let dir = tempfile::tempdir().unwrap();
    let mut tb = Toolbox::start(dir.path());
    let r = tb.exec("cd /tmp && pwd");
    assert_eq!((r.output.as_str(), r.cwd.as_str()), ("/tmp\n", "/tmp"));
    assert_eq!(tb.exec("pwd").output, "/tmp\n");

    // `exit` still records the state; so does a failing command.
    let r = tb.exec("cd / && export KILN_T=1 && exit 3");
    assert_eq!((r.exit_code, r.cwd.as_str()), (Some(3), "/"));
    assert_eq!(tb.exec("echo \"$KILN_T $PWD\"").output, "1 /\n");
    tb.exec("unset KILN_T");
    assert_eq!(tb.exec("echo \"[${KILN_T-unset}]\"").output, "[unset]\n");

    // Per-call variables apply to that call only.
    let mut req = ExecRequest::new("echo $ONCE");
    req.env = vec![("ONCE".into(), "x".into())];
    assert_eq!(tb.exec_req(req).0.output, "x\n");
    assert_eq!(tb.exec("echo \"[${ONCE-unset}]\"").output, "[unset]\n");
    // SHLVL does not creep up call after call.
    assert_eq!(tb.exec("echo $SHLVL").output, tb.exec("echo $SHLVL").output);

    // The plumbing stays invisible.
    assert_eq!(tb.exec("env | grep -c KILN_TOOLBOX; echo ${BASH_ENV-none}").output, "0\nnone\n");
    // A syntax error is reported with the user's own line.
    let r = tb.exec("echo a; fi");
    assert_eq!(r.exit_code, Some(2));
    assert!(r.output.contains("`echo a; fi'"), "{}", r.output);
}

#[test]
fn stdin_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let mut tb = Toolbox::start(dir.path());
    let started = Instant::now();
    let r = tb.exec("read x; echo \"rc=$?\"");
    assert_eq!(r.output, "rc=1\n");
    assert!(started.elapsed() < HANG);
}

#[test]
fn exit_codes_and_signals_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut tb = Toolbox::start(dir.path());
    let r = tb.exec("exit 137");
    assert_eq!((r.exit_code, r.signal, r.timed_out), (Some(137), None, false));
    let r = tb.exec("kill -9 $$");
    assert_eq!((r.exit_code, r.signal), (None, Some(9)));
    // SIGPIPE is back to its default in commands (Rust ignores it in the toolbox itself).
    let r = tb.exec("yes | head -n 2; echo \"${PIPESTATUS[0]}\"");
    assert_eq!(r.output, "y\ny\n141\n");
}

#[test]
fn timeout_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let mut tb = Toolbox::start(dir.path());
    let mut req =
        ExecRequest::new("echo $$; sleep 600 & echo $!; nohup sleep 600 >/dev/null 2>&1 & echo $!; sleep 600");
    req.timeout_ms = 1000;
    let started = Instant::now();
    let (r, _) = tb.exec_req(req);
    assert!(started.elapsed() < HANG);
    assert!(r.timed_out);
    assert_eq!((r.exit_code, r.signal), (None, Some(9)));
    let pids: Vec<u32> = r.output.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(pids.len(), 3, "{}", r.output);
    for pid in &pids {
        assert!(!process_exists(*pid), "process {pid} survived");
    }
    assert_eq!(group_members(pids[0]), Vec::<u32>::new());
    // The session goes on.
    assert_eq!(tb.exec("echo alive").output, "alive\n");
}

#[test]
fn cancel_kills_a_running_exec() {
    let dir = tempfile::tempdir().unwrap();
    let mut tb = Toolbox::start(dir.path());
    let started = Instant::now();
    let id = tb.send(RequestBody::Exec(ExecRequest::new("echo started; sleep 600 & sleep 600")));
    // Wait until it runs, then cancel it.
    let mut first = String::new();
    let out = tb.next_matching(|m| matches!(m, ServerMessage::Output(o) if o.id == id));
    if let ServerMessage::Output(o) = out {
        first = o.data;
    }
    assert_eq!(first, "started\n");
    let cancel = tb.send(RequestBody::Cancel(CancelRequest { target: id }));
    assert_eq!(tb.wait(cancel), Reply::Cancel(CancelResult { target: id, was_running: true }));
    let Reply::Exec(r) = tb.wait(id) else { panic!("expected an exec result") };
    assert!(r.cancelled && !r.timed_out);
    assert_eq!(r.signal, Some(9));
    assert!(started.elapsed() < HANG);
    // Cancelling what is not running says so.
    let again = tb.send(RequestBody::Cancel(CancelRequest { target: id }));
    assert_eq!(tb.wait(again), Reply::Cancel(CancelResult { target: id, was_running: false }));
}

#[test]
fn background_children_do_not_hold_the_call_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut tb = Toolbox::start(dir.path());
    let started = Instant::now();
    let r = tb.exec("sleep 600 & echo $!");
    assert!(started.elapsed() < HANG, "returned when the shell exited");
    let pid: u32 = r.output.trim().parse().unwrap();
    assert!(process_exists(pid), "a background process outlives its call");
    tb.exec(&format!("kill {pid}"));
}

#[test]
fn output_looking_like_frames_or_markers_is_returned_verbatim() {
    let dir = tempfile::tempdir().unwrap();
    let mut tb = Toolbox::start(dir.path());
    // A length prefix and a complete fake response frame, a fake hello, fake markers.
    let fake = r#"printf '\x00\x00\x00\x2e{"type":"response","id":1,"result":{"type":"pong"}}'; echo; echo '{"type":"hello","protocol_version":9}'; echo '__KILN_STATE__ /etc'; printf '%s\0' /etc"#;
    let (r, streamed) = tb.exec_req(ExecRequest::new(fake));
    assert_eq!(
        r.output,
        "\\x00\\x00\\x00.{\"type\":\"response\",\"id\":1,\"result\":{\"type\":\"pong\"}}\n{\"type\":\"hello\",\"protocol_version\":9}\n__KILN_STATE__ /etc\n/etc\\x00"
    );
    assert_eq!(streamed, r.output);
    assert_eq!(r.cwd, dir.path().to_string_lossy(), "markers in the output do not move the cwd");
    // The stream is still in sync.
    assert_eq!(tb.call(RequestBody::Ping), Reply::Pong);
    assert_eq!(tb.exec("echo ok").output, "ok\n");
}

#[test]
fn huge_output_is_capped_with_head_and_tail_and_memory_stays_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let mut tb = Toolbox::start(dir.path());
    // 200 MB, streamed only for its first MB.
    let mut req =
        ExecRequest::new("echo BEGIN; yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c 200000000; echo; echo END");
    req.stream_cap_bytes = Some(1_000_000);
    let mut streamed = 0usize;
    let id = tb.send(RequestBody::Exec(req));
    let Reply::Exec(r) = tb.wait_with(id, |d| streamed += d.len()) else { panic!("expected an exec result") };
    assert_eq!(r.exit_code, Some(0));
    assert!(r.output.starts_with("BEGIN\n0123456789"), "{}", &r.output[..100]);
    assert!(r.output.ends_with("0123456789abcde\nEND\n"), "{}", &r.output[r.output.len() - 100..]);
    assert!(r.output.contains(&format!("\n[... {} bytes omitted ...]\n", r.truncated_bytes)));
    assert_eq!(r.total_bytes, 6 + 200_000_000 + 1 + 4);
    assert_eq!(r.truncated_bytes, r.total_bytes - 30_000);
    assert!(r.output.len() < 30_100);
    assert!(streamed < 1_100_000, "streaming stopped at its cap ({streamed})");

    // And 20 MB streamed in full: the consumer's pace bounds the queue.
    let (r, streamed) = tb.exec_req(ExecRequest::new("yes abcdefghijklmnopqrstuvwxyz | head -c 20000000"));
    assert_eq!(streamed.len(), 20_000_000);
    assert_eq!(r.total_bytes, 20_000_000);

    let hwm_kib = status_kib(tb.pid(), "VmHWM:");
    assert!(hwm_kib < 64 * 1024, "toolbox peak RSS {hwm_kib} KiB");
}

#[test]
fn closing_stdin_stops_the_toolbox_and_its_command() {
    let dir = tempfile::tempdir().unwrap();
    let mut tb = Toolbox::start(dir.path());
    let id = tb.send(RequestBody::Exec(ExecRequest::new("echo $$; sleep 600")));
    let ServerMessage::Output(o) = tb.next_matching(|m| matches!(m, ServerMessage::Output(o) if o.id == id)) else {
        unreachable!()
    };
    let shell: u32 = o.data.trim().parse().unwrap();
    let started = Instant::now();
    let status = tb.close();
    assert!(status.success());
    assert!(started.elapsed() < HANG);
    assert!(group_members(shell).is_empty());
}

#[test]
fn file_tools_run_while_a_command_runs() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "a\n").unwrap();
    let mut tb = Toolbox::start(dir.path());
    // The command runs until the test lets it go; a watchdog lets it go
    // after a while so a toolbox that made the view wait still ends.
    let id = tb.send(RequestBody::Exec(ExecRequest::new("until [ -e release ]; do sleep 0.05; done; echo done")));
    let release = dir.path().join("release");
    let watchdog = {
        let release = release.clone();
        std::thread::spawn(move || {
            std::thread::sleep(HANG);
            let _ = std::fs::write(release, "");
        })
    };
    let v = tb.view(ViewRequest::new("a.txt"));
    assert!(v.text.contains("     1\ta"));
    assert!(!release.exists(), "the view waited for the command (let go by the watchdog)");
    std::fs::write(&release, "").unwrap();
    let Reply::Exec(r) = tb.wait(id) else { panic!() };
    assert_eq!(r.output, "done\n");
    drop(watchdog);
}

#[test]
fn a_command_runs_in_a_shell_started_before_it_arrived_with_the_sessions_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut tb = Toolbox::start(dir.path());
    tb.exec("mkdir -p sub && cd sub && export KILN_T=kept");
    let standbys = standby_pids(tb.pid(), 2);

    let command = "echo \"$$ $PWD $KILN_T $LINENO\"\necho \"[$BASH_EXECUTION_STRING]\"; read x; echo \"rc=$?\"";
    let r = tb.exec(command);
    let sub = dir.path().join("sub");
    let (pid, rest) = r.output.split_once(' ').unwrap();
    assert!(standbys.contains(&pid.parse().unwrap()), "ran in {pid}, not in a waiting shell of {standbys:?}");
    assert_eq!(rest, format!("{} kept 1\n[{command}]\nrc=1\n", sub.display()));
    assert_eq!(r.cwd, sub.to_string_lossy());

    // Errors read as `bash -c`'s do, with the user's own line and number.
    standby_pid(tb.pid());
    let r = tb.exec("true\necho a; fi");
    assert_eq!(r.exit_code, Some(2));
    assert!(r.output.contains("line 2: `echo a; fi'"), "{}", r.output);
    standby_pid(tb.pid());
    let r = tb.exec("exit 7");
    assert_eq!((r.exit_code, r.output.as_str()), (Some(7), ""));
}

/// Three shells wait ahead of the commands: each of three commands sent the
/// moment the one before it answered (three calls in one step) finds one
/// started before the first ran (with fewer, the last would find a shell
/// started after, still starting, or none), as long as the commands before
/// left the state as it was; when one changed the state, the shells
/// started before it run nothing and are killed.
#[test]
fn a_command_right_after_another_finds_a_shell_started_before_it_when_the_state_held() {
    let dir = tempfile::tempdir().unwrap();
    let mut tb = Toolbox::start(dir.path());
    tb.exec("true");
    let waiting = standby_pids(tb.pid(), kiln_toolbox::exec::STANDBYS);
    let pid = |r: ExecResult| -> u32 { r.output.split_whitespace().next().unwrap().parse().unwrap() };
    let first = pid(tb.exec("echo $$"));
    let second = pid(tb.exec("echo $$"));
    let third = pid(tb.exec("echo $$"));
    let ran = [first, second, third];
    assert!(
        ran.iter().all(|p| waiting.contains(p)) && first != second && second != third && first != third,
        "three commands at once ran in {ran:?}, not each in its own of the shells waiting before: {waiting:?}"
    );

    // A command that changes the state (a variable, then the directory):
    // the shell started before it cannot run the next one.
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let sub = dir.path().join("sub");
    for (change, expected) in [
        ("export KILN_T=changed", format!(" {} changed\n", dir.path().display())),
        ("cd sub", format!(" {} changed\n", sub.display())),
    ] {
        let waiting = standby_pids(tb.pid(), kiln_toolbox::exec::STANDBYS);
        let changing = pid(tb.exec(&format!("{change}; echo $$")));
        let stale: Vec<u32> = waiting.into_iter().filter(|&p| p != changing).collect();
        let r = tb.exec("echo $$ $PWD $KILN_T");
        assert!(r.output.ends_with(&expected), "after `{change}`: {}", r.output);
        assert!(!stale.contains(&pid(r)), "after `{change}` the command ran in a shell started before it");
        for old in stale {
            let deadline = Instant::now() + Duration::from_secs(5);
            while process_exists(old) && !is_zombie(old) {
                assert!(Instant::now() < deadline, "the stale standby {old} was not killed");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// A command sent the moment the one before it answered (two calls in one
/// step) runs with no shell starting beside it: while a shell waits for the
/// next command, the one replacing the shell just taken is put off, and a
/// command running then puts it off until that command is over. Then all
/// wait again.
#[test]
fn a_command_right_after_another_runs_with_no_shell_starting_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut tb = Toolbox::start(dir.path());
    // What the second command sees, after long enough for any shell started
    // beside it to be waiting: the toolbox's waiting shells but its own.
    let others = format!(
        r#"sleep 0.3; for p in $(cat /proc/{}/task/*/children); do
             [ "$p" != $$ ] && tr '\0' ' ' < /proc/$p/cmdline | grep -q __kiln_standby && echo $p
           done; true"#,
        tb.pid()
    );
    // A stall of the test between the two sends (a loaded CI machine) could
    // let the put-off shell start before the second command arrives: that
    // attempt does not count, and another is made. With no put-off, every
    // attempt sees a shell started after the first command answered.
    let mut new_ones = Vec::new();
    for _ in 0..3 {
        let before = standby_pids(tb.pid(), kiln_toolbox::exec::STANDBYS);
        tb.exec("true");
        // As a worker sends its next call (it records the result first):
        // long enough for a replacement started at the reply to be under
        // way, well within the put-off.
        std::thread::sleep(Duration::from_millis(10));
        let r = tb.exec(&others);
        let waiting: Vec<u32> = r.output.split_whitespace().map(|p| p.parse().unwrap()).collect();
        new_ones = waiting.into_iter().filter(|p| !before.contains(p)).collect();
        if new_ones.is_empty() {
            break;
        }
    }
    assert!(new_ones.is_empty(), "shells started while the second command ran: {new_ones:?}");
    standby_pids(tb.pid(), kiln_toolbox::exec::STANDBYS);
}

#[test]
fn a_killed_standby_or_a_replaced_directory_falls_back_to_a_new_shell() {
    let dir = tempfile::tempdir().unwrap();
    let mut tb = Toolbox::start(dir.path());
    tb.exec("mkdir d && cd d");

    // Killed while they waited (as `kill -9 -1` in the sandbox would).
    let standbys = standby_pids(tb.pid(), 2);
    for standby in &standbys {
        std::process::Command::new("kill").args(["-9", &standby.to_string()]).status().unwrap();
    }
    // SIGKILL lands asynchronously: wait until it has (a command handed to
    // a shell the signal is still on its way to would die with it).
    let deadline = Instant::now() + Duration::from_secs(5);
    while standbys.iter().any(|&s| process_exists(s) && !is_zombie(s)) {
        assert!(Instant::now() < deadline, "a standby outlived SIGKILL");
        std::thread::sleep(Duration::from_millis(5));
    }
    let r = tb.exec("echo $$");
    assert_eq!(r.exit_code, Some(0));
    assert!(!standbys.contains(&r.output.trim().parse().unwrap()), "ran in a killed standby: {}", r.output);

    // Its directory removed and made again: the command runs in the new one,
    // not in the removed directory the standby still sits in.
    standby_pid(tb.pid());
    let d = dir.path().join("d");
    std::fs::remove_dir(&d).unwrap();
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("new.txt"), "x").unwrap();
    assert_eq!(tb.exec("ls").output, "new.txt\n");

    // The standby that is replaced never shows up again. Taken once every
    // slot is filled and a started shell has had time to be pushed: none is
    // being started then, so none can join the waiting ones after the
    // command below discarded them.
    let old = standby_pids(tb.pid(), kiln_toolbox::exec::STANDBYS)[0];
    std::thread::sleep(Duration::from_millis(100));
    let mut req = ExecRequest::new("echo $$ $ONCE");
    req.env = vec![("ONCE".into(), "x".into())];
    let (r, _) = tb.exec_req(req);
    assert!(r.output.ends_with(" x\n") && !r.output.starts_with(&old.to_string()), "{}", r.output);
    assert!(!process_exists(old), "the discarded standby was killed");
}
