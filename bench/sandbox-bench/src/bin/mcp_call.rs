//! One MCP tool call against one built-in `view`, each as the agent loop
//! makes it (`Registry::call` with the run's tool context): `mcp__demo__add`
//! of a remote server on loopback (`tests/mcp/demo_server.py`, the official
//! MCP Python SDK under uvicorn, reached over streamable HTTP by the
//! worker's rmcp client with its secret header) against `view` of a 3-line
//! file through the sandbox's toolbox; and, to separate the server's own time
//! from the client's, the same `tools/call` as one plain HTTP POST (reqwest,
//! the session made by hand). The three alternate in each repetition.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use kiln_bench_sandbox::setup::{self, Common};
use kiln_bench_sandbox::stats;
use kiln_worker::mcp::McpConfig;
use kiln_worker::sandbox::Sandbox;
use kiln_worker::tools::{Registry, ToolContext};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

const TIMEOUT: Duration = Duration::from_secs(30);
const KEY: &str = "bench-key";

#[derive(Parser)]
#[command(about = "One remote MCP tool call vs one built-in view, through the worker's tool registry")]
struct Args {
    #[command(flatten)]
    common: Common,
    /// Python of the venv with the MCP SDK (scripts/ensure-pip-tool.sh mcp tests/tools/mcp.txt).
    #[arg(long, default_value = ".kiln/tools/mcp/bin/python")]
    python: PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = args.common.sandbox_config()?;
    if !args.python.is_file() {
        bail!("no MCP SDK venv at {} (scripts/ensure-pip-tool.sh mcp tests/tools/mcp.txt)", args.python.display());
    }
    let dir = tempfile::tempdir()?;
    let mut server = tokio::process::Command::new(&args.python)
        .arg("tests/mcp/demo_server.py")
        .arg(dir.path().join("headers.log"))
        .arg(KEY)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting tests/mcp/demo_server.py (run from the repository root)")?;
    let mut lines = BufReader::new(server.stdout.take().context("server stdout")?).lines();
    let port = loop {
        match lines.next_line().await? {
            Some(line) => {
                if let Some(port) = line.strip_prefix("LISTENING ") {
                    break port.trim().parse::<u16>()?;
                }
            }
            None => bail!("the MCP server exited before listening"),
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let servers = json!({"servers": {"demo": {
        "url": format!("http://127.0.0.1:{port}/mcp"), "headers": {"X-Api-Key": KEY}}}});
    let mcp = McpConfig::parse(&servers.to_string())?;

    let docker = setup::docker().await?;
    let sandbox = Sandbox::start(&docker, &config, &setup::owner()).await?;
    let url = format!("http://127.0.0.1:{port}/mcp");
    let result = measure(&sandbox, &mcp, &url, args.common.runs).await;
    sandbox.remove().await;
    let (remote, view, raw) = result?;

    println!("one tool call through the worker's registry, image {}:", args.common.image);
    let m = stats::report("MCP mcp__demo__add (remote, loopback)", &remote);
    let v = stats::report("built-in view of a 3-line file (toolbox)", &view);
    let r = stats::report("same tools/call as one plain HTTP POST", &raw);
    stats::ratio("MCP call / view", m, v, None);
    stats::ratio("MCP call / plain POST (client's share)", m, r, None);
    let requests = std::fs::read_to_string(dir.path().join("headers.log")).unwrap_or_default().lines().count();
    println!("HTTP requests the server saw in all: {requests} (for {} calls of each kind)", args.common.runs + 1);
    Ok(())
}

type Series = (Vec<Duration>, Vec<Duration>, Vec<Duration>);

async fn measure(sandbox: &Sandbox, mcp: &McpConfig, url: &str, runs: usize) -> anyhow::Result<Series> {
    let raw = RawSession::open(url).await?;
    setup::bash(sandbox, "printf 'one\\ntwo\\nthree\\n' > /workspace/small.txt", TIMEOUT).await?;
    let builtin = Registry::standard();
    let session = kiln_worker::mcp::connect(mcp, None, &builtin, sandbox).await;
    if !session.problems.is_empty() {
        bail!("MCP server unavailable: {:?}", session.problems);
    }
    let tools = builtin.with(session.tools.tools());
    let ctx = ToolContext { sandbox, output: None, call_id: "bench-1", subagents: None };
    let (mut remote, mut view, mut plain) = (vec![], vec![], vec![]);
    for rep in 0..=runs {
        let started = Instant::now();
        let out = tools.call(&ctx, "mcp__demo__add", json!({"a": rep, "b": 1})).await?;
        let took_remote = started.elapsed();
        if out.is_error || out.output != (rep + 1).to_string() {
            bail!("mcp__demo__add answered {out:?}");
        }

        let started = Instant::now();
        let out = tools.call(&ctx, "view", json!({"path": "/workspace/small.txt"})).await?;
        let took_view = started.elapsed();
        if out.is_error || !out.output.contains("three") {
            bail!("view answered {out:?}");
        }
        let started = Instant::now();
        let body = raw.call_add(rep, 1).await?;
        let took_plain = started.elapsed();
        if !body.contains(&format!("\"result\":{}", rep + 1)) {
            bail!("plain tools/call answered {body}");
        }
        if rep > 0 {
            remote.push(took_remote);
            view.push(took_view);
            plain.push(took_plain);
        }
    }
    Ok((remote, view, plain))
}

/// An MCP session made by hand with plain HTTP: the baseline.
struct RawSession {
    http: reqwest::Client,
    url: String,
    session: String,
}

impl RawSession {
    async fn open(url: &str) -> anyhow::Result<RawSession> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder().no_proxy().build()?;
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}});
        let r = Self::post(&http, url, None).json(&init).send().await?;
        let session = r
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .context("no mcp-session-id from initialize")?
            .to_owned();
        r.bytes().await?;
        let done = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        Self::post(&http, url, Some(&session)).json(&done).send().await?.bytes().await?;
        Ok(RawSession { http, url: url.to_owned(), session })
    }

    fn post(http: &reqwest::Client, url: &str, session: Option<&str>) -> reqwest::RequestBuilder {
        let mut r = http
            .post(url)
            .header("x-api-key", KEY)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25");
        if let Some(s) = session {
            r = r.header("mcp-session-id", s);
        }
        r
    }

    async fn call_add(&self, a: usize, b: usize) -> anyhow::Result<String> {
        let call = json!({"jsonrpc": "2.0", "id": 2 + a, "method": "tools/call",
            "params": {"name": "add", "arguments": {"a": a, "b": b}}});
        let r = Self::post(&self.http, &self.url, Some(&self.session)).json(&call).send().await?;
        Ok(r.text().await?)
    }
}
