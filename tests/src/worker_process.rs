//! A worker as a process of its own (`kiln worker`, the real binary), for
//! tests that kill it (SIGKILL: nothing runs after it, the kernel closes its
//! connections) or pause it (SIGSTOP: it keeps its connections, says
//! nothing). A worker task in the test's own process cannot be either.

use std::process::Stdio;
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use uuid::Uuid;

use crate::TestApp;
use crate::kiln_bin::kiln_bin;

pub struct WorkerProcess {
    pub id: String,
    child: Child,
}

impl WorkerProcess {
    /// `kiln worker` against `app`'s database and scripted model (OpenAI
    /// wire format), with a lease of `lease_s` and the given settings on
    /// top. Returns once the worker holds its lock (its `workers` row says
    /// so): it is claiming.
    pub async fn start(app: &TestApp, lease_s: u64, env: &[(&str, &str)]) -> WorkerProcess {
        let id = format!("proc-{}", Uuid::new_v4().simple());
        let mut cmd = Command::new(kiln_bin());
        cmd.arg("worker")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("DATABASE_URL", &app.db_url)
            .env("KILN_WORKER_ID", &id)
            .env("KILN_LEASE_S", lease_s.to_string())
            .env("KILN_MODEL_PROVIDER", "openai")
            .env("KILN_MODEL_BASE_URL", app.model.openai_base_url())
            .env("OPENAI_API_KEY", "sk-test-openai")
            .env("KILN_MODEL", "scripted")
            .env("KILN_SANDBOX_IDLE_S", "0")
            .env("KILN_WORKER_MAX_SESSIONS", "2")
            .env("KILN_POLL_S", "1")
            .env(
                "KILN_SANDBOX_IMAGE",
                std::env::var("KILN_SANDBOX_IMAGE").unwrap_or_else(|_| "kiln-sandbox:latest".into()),
            )
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for var in ["HOME", "DOCKER_HOST", "KILN_TOOLBOX_PATH"] {
            if let Some(v) = std::env::var_os(var) {
                cmd.env(var, v);
            }
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start kiln worker");
        // Its log goes to the test's output (shown when a test fails), and is
        // read so the worker never blocks on a full pipe.
        let stderr = child.stderr.take().expect("piped stderr");
        let tag = id.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("[{tag}] {line}");
            }
        });
        app.owns_worker(&id);
        let worker = WorkerProcess { id, child };
        let sql = app.sql().await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let row = sql
                .query_opt("SELECT 1 FROM workers WHERE id = $1 AND lock_key IS NOT NULL", &[&worker.id])
                .await
                .expect("read workers");
            if row.is_some() {
                return worker;
            }
            assert!(tokio::time::Instant::now() < deadline, "kiln worker {} never took its lock", worker.id);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn signal(&self, signal: Signal) {
        let pid = self.child.id().and_then(|id| Pid::from_raw(id as i32)).expect("the worker is running");
        kill_process(pid, signal).expect("signal the worker");
    }

    /// SIGKILL, and waits until the process is gone.
    pub async fn kill(mut self) {
        self.signal(Signal::KILL);
        let _ = self.child.wait().await;
    }

    pub fn pause(&self) {
        self.signal(Signal::STOP);
    }

    pub fn resume(&self) {
        self.signal(Signal::CONT);
    }

    /// The process's peak resident memory so far (`VmHWM`), in bytes: the
    /// worker's own, not its children's (git, tar) nor the test's.
    pub fn peak_rss_bytes(&self) -> u64 {
        let pid = self.child.id().expect("the worker is running");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the worker's /proc status");
        let kib = status.lines().find_map(|l| l.strip_prefix("VmHWM:")).expect("VmHWM");
        kib.trim().trim_end_matches("kB").trim().parse::<u64>().expect("VmHWM in kB") * 1024
    }

    /// SIGTERM, and waits (up to a minute) until it has exited.
    pub async fn stop(mut self) {
        self.signal(Signal::TERM);
        let _ = tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await;
    }
}
