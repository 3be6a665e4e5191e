//! Drives the real `kiln-toolbox` binary as a local process over its protocol.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]
// Test helpers: a failure here is a test failure, so unwrap is the point.

use std::collections::VecDeque;
use std::io::Write;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread;
use std::time::Duration;

use kiln_toolbox::framing::{FrameReader, encode_frame, encode_json};
use kiln_toolbox::protocol::*;

/// Long enough for a debug build on a busy 2-core machine.
pub const WAIT: Duration = Duration::from_secs(60);

pub struct Toolbox {
    pub child: Child,
    stdin: Option<ChildStdin>,
    rx: Receiver<ServerMessage>,
    /// Messages received while waiting for something else.
    stash: VecDeque<ServerMessage>,
    next_id: u64,
    pub hello: Hello,
}

impl Toolbox {
    /// Starts the toolbox in `dir` and reads its `Hello`.
    pub fn start(dir: &Path) -> Toolbox {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kiln-toolbox"))
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let mut reader = FrameReader::new(stdout);
            while let Some(frame) = reader.read_frame() {
                let msg: ServerMessage = serde_json::from_slice(&frame.unwrap()).unwrap();
                if tx.send(msg).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        let hello = match rx.recv_timeout(WAIT).unwrap() {
            ServerMessage::Hello(h) => h,
            other => panic!("expected hello, got {other:?}"),
        };
        Toolbox { child, stdin, rx, stash: VecDeque::new(), next_id: 1, hello }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn write_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    /// Sends a request and returns its id without waiting.
    pub fn send(&mut self, body: RequestBody) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let frame = encode_json(&Request { id, body }).unwrap();
        self.write_raw(&frame);
        id
    }

    pub fn send_json(&mut self, value: serde_json::Value) {
        let frame = encode_frame(&serde_json::to_vec(&value).unwrap()).unwrap();
        self.write_raw(&frame);
    }

    /// The next message that satisfies `want`, stashing the others.
    pub fn next_matching(&mut self, mut want: impl FnMut(&ServerMessage) -> bool) -> ServerMessage {
        if let Some(pos) = self.stash.iter().position(&mut want) {
            return self.stash.remove(pos).unwrap();
        }
        loop {
            let msg = self.rx.recv_timeout(WAIT).expect("toolbox answered in time");
            if want(&msg) {
                return msg;
            }
            self.stash.push_back(msg);
        }
    }

    /// Waits for the response to `id`, handing each output chunk of it to `on_output`.
    pub fn wait_with(&mut self, id: u64, mut on_output: impl FnMut(&str)) -> Reply {
        loop {
            match self.next_matching(|m| match m {
                ServerMessage::Output(o) => o.id == id,
                ServerMessage::Response(r) => r.id == id,
                _ => false,
            }) {
                ServerMessage::Output(o) => on_output(&o.data),
                ServerMessage::Response(r) => return r.result,
                _ => unreachable!(),
            }
        }
    }

    pub fn wait(&mut self, id: u64) -> Reply {
        self.wait_with(id, |_| {})
    }

    pub fn call(&mut self, body: RequestBody) -> Reply {
        let id = self.send(body);
        self.wait(id)
    }

    /// Runs a command; returns the result and everything streamed for it.
    pub fn exec_req(&mut self, req: ExecRequest) -> (ExecResult, String) {
        let id = self.send(RequestBody::Exec(req));
        let mut streamed = String::new();
        match self.wait_with(id, |d| streamed.push_str(d)) {
            Reply::Exec(r) => (r, streamed),
            other => panic!("expected an exec result, got {other:?}"),
        }
    }

    pub fn exec(&mut self, command: &str) -> ExecResult {
        self.exec_req(ExecRequest::new(command)).0
    }

    pub fn view(&mut self, req: ViewRequest) -> ViewResult {
        match self.call(RequestBody::View(req)) {
            Reply::View(v) => v,
            other => panic!("expected a view result, got {other:?}"),
        }
    }

    pub fn error(&mut self, body: RequestBody) -> ToolError {
        match self.call(body) {
            Reply::Error(e) => e,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    /// Closes stdin and waits for the toolbox to exit.
    pub fn close(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        self.child.wait().unwrap()
    }
}

impl Drop for Toolbox {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// Whether process `pid` still exists (a zombie counts as existing, as for `kill -0`).
pub fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Whether `pid` has exited and waits to be reaped.
pub fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(") ").map(|(_, rest)| rest.starts_with('Z')))
        .unwrap_or(false)
}

/// Pids of every process whose process group is `pgid`.
pub fn group_members(pgid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // Fields after the parenthesised command name: state ppid pgrp …
        let Some(rest) = stat.rsplit_once(") ").map(|(_, r)| r) else { continue };
        if rest.split(' ').nth(2).and_then(|g| g.parse::<u32>().ok()) == Some(pgid) {
            found.push(pid);
        }
    }
    found
}

/// A `VmHWM`-style field of /proc/<pid>/status, in KiB.
pub fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The toolbox's standby shell (started ahead of the next command), once
/// there is one; panics after 5 s without.
pub fn standby_pid(toolbox: u32) -> u32 {
    standby_pids(toolbox, 1)[0]
}

/// The toolbox's standby shells, once there are at least `n`; panics after
/// 5 s with fewer.
pub fn standby_pids(toolbox: u32, n: usize) -> Vec<u32> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let mut found = Vec::new();
        // Children are listed per thread; a standby is started by whichever
        // thread finished the last command, or by the reaper's.
        for task in std::fs::read_dir(format!("/proc/{toolbox}/task")).unwrap().flatten() {
            let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for pid in children.split_whitespace().filter_map(|p| p.parse::<u32>().ok()) {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                if String::from_utf8_lossy(&cmdline).contains("__kiln_standby") {
                    found.push(pid);
                }
            }
        }
        if found.len() >= n {
            return found;
        }
        assert!(std::time::Instant::now() < deadline, "{} standby shells, not {n}", found.len());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
