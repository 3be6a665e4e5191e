//! The remote MCP server of the MCP tests: `tests/mcp/demo_server.py`,
//! written with the official MCP Python SDK (pinned in
//! `tests/tools/mcp.txt`, installed by `scripts/test` into
//! `.kiln/tools/mcp`), run on loopback. It requires a key in `X-Api-Key`
//! and logs every request's key and MCP session id, so a test can check
//! what reached it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap()
}

/// The venv's Python with the SDK, or `None` (then the test is skipped,
/// unless `KILN_REQUIRE_MCP_TOOLS` makes the SDK required).
pub fn sdk_python() -> Option<PathBuf> {
    let state = std::env::var_os("KILN_STATE_DIR").map(PathBuf::from).unwrap_or_else(|| root().join(".kiln"));
    let python = state.join("tools/mcp/bin/python");
    if python.is_file() {
        return Some(python);
    }
    let required = std::env::var_os("KILN_REQUIRE_MCP_TOOLS").is_some_and(|v| !v.is_empty() && v != "0");
    assert!(!required, "KILN_REQUIRE_MCP_TOOLS is set but the MCP SDK venv is missing: scripts/test installs it");
    eprintln!("skipped: the MCP Python SDK is not installed (scripts/ensure-pip-tool.sh mcp tests/tools/mcp.txt)");
    None
}

/// The demo server, running until dropped.
pub struct DemoServer {
    /// Its streamable HTTP endpoint.
    pub url: String,
    header_log: PathBuf,
    _child: tokio::process::Child,
    _dir: tempfile::TempDir,
}

impl DemoServer {
    /// Starts the server with `python`, requiring `secret` in `X-Api-Key`.
    pub async fn start(python: &Path, secret: &str) -> DemoServer {
        let dir = tempfile::tempdir().unwrap();
        let header_log = dir.path().join("headers.log");
        let mut child = tokio::process::Command::new(python)
            .arg(root().join("tests/mcp/demo_server.py"))
            .arg(&header_log)
            .arg(secret)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let port = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(port) = line.strip_prefix("LISTENING ") {
                    return port.trim().parse::<u16>().unwrap();
                }
            }
            panic!("the MCP server exited before listening")
        })
        .await
        .expect("the MCP server did not start");
        // Keep reading its output so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        DemoServer { url: format!("http://127.0.0.1:{port}/mcp"), header_log, _child: child, _dir: dir }
    }

    /// The `X-Api-Key` of every request the server got.
    pub fn keys_seen(&self) -> Vec<String> {
        std::fs::read_to_string(&self.header_log).unwrap_or_default().lines().map(str::to_owned).collect()
    }

    /// The MCP session id of every POST the server got, a line each (empty:
    /// none, an `initialize`).
    pub fn sessions_seen(&self) -> String {
        std::fs::read_to_string(self.header_log.with_extension("log.sessions")).unwrap_or_default()
    }

    /// Connections made to the server: its `initialize` requests (the
    /// POSTs without a session id).
    pub fn initializations(&self) -> usize {
        self.sessions_seen().lines().filter(|l| l.is_empty()).count()
    }
}
