//! How a worker is tuned: its identity, sessions, leases and sandboxes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use kiln_protocol::{EgressMode, EgressPolicy};
use kiln_worker::WorkerConfig;
use kiln_worker::egress::host_firewall::{FirewallSetting, HostFirewall};
use kiln_worker::egress::{AddressRules, EgressSettings, parse_allow};
use kiln_worker::providers::pricing::PriceTable;
use kiln_worker::sandbox::SandboxConfig;
use kiln_worker::sandbox::disk::DiskMode;

use super::ModelArgs;

#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// Name of this worker in leases and container labels (default: host and pid).
    #[arg(long, env = "KILN_WORKER_ID")]
    pub worker_id: Option<String>,
    /// Sessions (runs, each with its sandbox) this worker drives at once; it
    /// claims runs only while it has a free slot.
    #[arg(long = "max-sessions", env = "KILN_WORKER_MAX_SESSIONS", default_value_t = 4)]
    pub concurrency: usize,
    /// Seconds a session's container stays after its last run ended, so a
    /// follow-up finds its workspace; 0 removes it when the run ends.
    #[arg(long, env = "KILN_SANDBOX_IDLE_S", default_value_t = 600)]
    pub sandbox_idle_s: u64,
    /// Started sandboxes kept ready for new sessions (default: 0, or 2 under `kiln up`).
    #[arg(long, env = "KILN_SANDBOX_WARM")]
    pub sandbox_warm: Option<usize>,
    /// Seconds a claim holds without a heartbeat.
    #[arg(long, env = "KILN_LEASE_S", default_value_t = 30)]
    pub lease_s: u64,
    /// Milliseconds between looks for dead workers (their advisory lock
    /// free), whose runs are then handed back at once; 0 turns it off and
    /// leaves their runs to their leases.
    #[arg(long, env = "KILN_DEAD_WORKER_CHECK_MS", default_value_t = 1000)]
    pub dead_worker_check_ms: u64,
    /// Seconds between claim attempts when no notification arrives.
    #[arg(long, env = "KILN_POLL_S", default_value_t = 2)]
    pub poll_s: u64,
    /// Seconds running steps get to finish after SIGTERM.
    #[arg(long, env = "KILN_SHUTDOWN_GRACE_S", default_value_t = 30)]
    pub shutdown_grace_s: u64,
    /// Address for this worker's own `GET /metrics` (e.g. 0.0.0.0:9090);
    /// unset serves none. Under `kiln up` the API's `/metrics` already
    /// includes the worker.
    #[arg(long, env = "KILN_METRICS_LISTEN")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Sandbox image.
    #[arg(long, env = "KILN_SANDBOX_IMAGE", default_value = "kiln-sandbox:latest")]
    pub sandbox_image: String,
    /// Sandbox memory limit in MiB (no swap).
    #[arg(long, env = "KILN_SANDBOX_MEMORY_MB", default_value_t = 1024)]
    pub sandbox_memory_mb: i64,
    /// Sandbox CPU limit, in CPUs.
    #[arg(long, env = "KILN_SANDBOX_CPUS", default_value_t = 1.0)]
    pub sandbox_cpus: f64,
    /// Sandbox process limit.
    #[arg(long, env = "KILN_SANDBOX_PIDS", default_value_t = 256)]
    pub sandbox_pids: i64,
    /// Size of the sandbox's /tmp (a tmpfs), in MiB.
    #[arg(long, env = "KILN_SANDBOX_TMPFS_MB", default_value_t = 256)]
    pub sandbox_tmpfs_mb: u64,
    /// What one session may write, in MiB (`/workspace` and the rest of its
    /// filesystem but `/tmp`); a write past it fails with ENOSPC.
    #[arg(long, env = "KILN_SANDBOX_DISK_MB", default_value_t = 1024)]
    pub sandbox_disk_mb: u64,
    /// How the disk bound is enforced: `auto` (the writable layer's size where
    /// the engine supports it, else a loop-mounted disk image per sandbox
    /// where the worker can make one, else a read-only root with tmpfs),
    /// `layer`, `loop`, `tmpfs`, or `unbounded` (no bound; needed on engines
    /// that support none).
    #[arg(long, env = "KILN_SANDBOX_DISK_MODE", default_value = "auto")]
    pub sandbox_disk_mode: DiskMode,
    /// Where the `loop` disk mechanism keeps sandboxes' disk images (sparse
    /// files, each at most KILN_SANDBOX_DISK_MB).
    #[arg(long, env = "KILN_SANDBOX_DISK_DIR", default_value = kiln_worker::sandbox::DEFAULT_DISK_DIR)]
    pub sandbox_disk_dir: PathBuf,
    /// Open files per sandbox process (`nofile` ulimit).
    #[arg(long, env = "KILN_SANDBOX_NOFILE", default_value_t = 4096)]
    pub sandbox_nofile: i64,
    /// OCI runtime for sandboxes, e.g. `runsc` (gVisor); the engine's default otherwise.
    #[arg(long, env = "KILN_SANDBOX_RUNTIME")]
    pub sandbox_runtime: Option<String>,
    /// Let runs ask for `bridge` networking (`"sandbox": {"network": "bridge"}`); off: no run gets a network.
    #[arg(long, env = "KILN_SANDBOX_ALLOW_NETWORK", default_value_t = false)]
    pub sandbox_allow_network: bool,
    /// The most egress any run may have, through Kiln's proxy: `none`,
    /// `allowlist` (the hosts of `KILN_EGRESS_ALLOW`) or `open` (any public
    /// address). Runs ask for theirs (`"sandbox": {"egress": …}`) and only narrow this.
    #[arg(long, env = "KILN_EGRESS_MODE", default_value = "none")]
    pub egress_mode: String,
    /// The hosts `allowlist` allows, comma-separated: `host`, `host:port`,
    /// `*.host`; `@common` stands for the preset of package registries and forges.
    #[arg(long, env = "KILN_EGRESS_ALLOW", default_value = "@common")]
    pub egress_allow: String,
    /// Non-public CIDR ranges sandboxes may reach anyway (an internal
    /// registry); loopback, private, link-local and metadata addresses are refused otherwise.
    #[arg(long, env = "KILN_EGRESS_ALLOW_RANGES", default_value = "")]
    pub egress_allow_ranges: String,
    /// CIDR ranges never reached, whatever else allows them: the
    /// deployment's own public addresses (API, load balancer).
    #[arg(long, env = "KILN_EGRESS_DENY_RANGES", default_value = "")]
    pub egress_deny_ranges: String,
    /// Names the proxy answers itself before DNS, `name=ip,…` (split-horizon names).
    #[arg(long, env = "KILN_EGRESS_HOSTS", default_value = "")]
    pub egress_hosts: String,
    /// Port of the egress proxy on each session network's gateway.
    #[arg(long, env = "KILN_EGRESS_PORT", default_value_t = 3128)]
    pub egress_port: u16,
    /// Connections one session's sandbox may hold open through the proxy at once.
    #[arg(long, env = "KILN_EGRESS_MAX_CONNECTIONS", default_value_t = 256)]
    pub egress_max_connections: usize,
    /// The host's firewall rules that close the host's own services to
    /// sandboxes with egress (all but the proxy's port): `auto` installs
    /// them when the worker can (host network namespace, CAP_NET_ADMIN,
    /// iptables) and warns at start otherwise; `on` refuses runs with egress
    /// without them; `off` never touches the firewall.
    #[arg(long, env = "KILN_EGRESS_HOST_FIREWALL", default_value = "auto")]
    pub egress_host_firewall: String,
    /// The kiln-toolbox binary copied into sandboxes; found next to `kiln` otherwise.
    #[arg(long, env = "KILN_TOOLBOX_PATH")]
    pub toolbox_path: Option<PathBuf>,
    /// Where the worker keeps the toolbox binary it binds read-only into
    /// every sandbox, when the engine sees this machine's files; empty:
    /// copy the binary into each sandbox instead.
    #[arg(long, env = "KILN_TOOLBOX_MOUNT_DIR", default_value = kiln_worker::sandbox::docker::toolbox_mount::DEFAULT_DIR)]
    pub toolbox_mount_dir: PathBuf,
    /// JSON file of model prices (USD per million tokens); built-in defaults otherwise.
    #[arg(long, env = "KILN_PRICES_FILE")]
    pub prices_file: Option<PathBuf>,
    /// Days to keep the events of ended runs (all but the terminal event); 0 keeps them forever.
    #[arg(long, env = "KILN_EVENT_RETENTION_DAYS", default_value_t = 0)]
    pub event_retention_days: u64,
    /// Allow `file://` repository URLs (they read this host's disk).
    #[arg(long, env = "KILN_ALLOW_FILE_REPOS", default_value_t = false)]
    pub allow_file_repos: bool,
    /// Largest checkout a run may bring into its sandbox, `.git` included,
    /// in MiB; a larger repository fails its run (checked while cloning).
    #[arg(long, env = "KILN_MAX_REPO_MB", default_value_t = kiln_worker::config::DEFAULT_MAX_REPO_MB)]
    pub max_repo_mb: u64,
    /// Claim the worker's next run in the statement that ends a run, and let
    /// ends that meet share one statement (speed only; `false` takes the
    /// plain path: end, then claim; see docs/architecture.md).
    #[arg(long, env = "KILN_WORKER_CLAIM_ON_END", default_value_t = true, action = clap::ArgAction::Set)]
    pub claim_on_end: bool,
    /// Tool calls of one model message that run; the rest are answered with
    /// an error (naming this limit) without running.
    #[arg(long, env = "KILN_MAX_TOOL_CALLS_PER_STEP", default_value_t = kiln_worker::config::DEFAULT_MAX_TOOL_CALLS_PER_STEP)]
    pub max_tool_calls_per_step: usize,
    /// Sub-agents (`task` calls) of one run that run at once, over its
    /// whole tree; more wait for a slot.
    #[arg(long, env = "KILN_SUBAGENT_MAX_PARALLEL", default_value_t = kiln_worker::config::DEFAULT_SUBAGENT_MAX_PARALLEL)]
    pub subagent_max_parallel: usize,
    /// How deep sub-agents may nest: 1 lets a run start sub-agents that
    /// cannot start their own; 0 turns the `task` tool off.
    #[arg(long, env = "KILN_SUBAGENT_MAX_DEPTH", default_value_t = kiln_worker::config::DEFAULT_SUBAGENT_MAX_DEPTH)]
    pub subagent_max_depth: u32,
    /// Bytes of events (as JSON) one run may store over all its attempts;
    /// when they are spent, no more are stored and the run fails.
    #[arg(long, env = "KILN_MAX_EVENT_BYTES_PER_RUN", default_value_t = kiln_worker::config::DEFAULT_MAX_EVENT_BYTES_PER_RUN)]
    pub max_event_bytes_per_run: u64,
    /// Largest patch of a run's change kept, in MiB; a larger change keeps
    /// only its per-file summary (`too_large`), never a truncated patch.
    #[arg(long, env = "KILN_MAX_PATCH_MB", default_value_t = kiln_worker::config::DEFAULT_MAX_PATCH_MB)]
    pub max_patch_mb: u64,
    /// Ask the model provider to cache the prompt's stable prefix (Anthropic
    /// `cache_control`, OpenAI `prompt_cache_key`); `false` for gateways that
    /// reject those fields.
    #[arg(long, env = "KILN_PROMPT_CACHE", default_value_t = true, action = clap::ArgAction::Set)]
    pub prompt_cache: bool,
    /// Prepared environment images (`kiln-env:*`) kept on this worker's
    /// engine, at most; past it, the least recently used go first.
    #[arg(long, env = "KILN_ENVIRONMENT_CACHE_MAX_IMAGES", default_value_t = 20)]
    pub environment_cache_max_images: usize,
    /// Megabytes the prepared environment images may take on this worker's
    /// engine, at most (their own size, shared base layers counted).
    #[arg(long, env = "KILN_ENVIRONMENT_CACHE_MAX_MB", default_value_t = 20 * 1024)]
    pub environment_cache_max_mb: u64,
    /// The cache those bounds apply to: prepared images are labelled with
    /// it, and only images of the same scope are counted and removed. Give
    /// each deployment sharing an engine its own.
    #[arg(long, env = "KILN_ENVIRONMENT_CACHE_SCOPE", default_value = "default")]
    pub environment_cache_scope: String,
    /// Containers kept started (restore done) from each hot environment's
    /// prepared image, so a run on it skips the container start; 0 turns
    /// this off.
    #[arg(long, env = "KILN_ENVIRONMENT_WARM", default_value_t = 1)]
    pub environment_warm: usize,
    /// Those warm containers in all, over every environment (the least
    /// recently used environment's go first).
    #[arg(long, env = "KILN_ENVIRONMENT_WARM_MAX", default_value_t = 4)]
    pub environment_warm_max: usize,
    /// JSON file of the MCP servers runs may use (URLs, headers with their
    /// credentials, timeouts, whether to trust read-only hints); none
    /// without it. See README, "MCP servers".
    #[arg(long, env = "KILN_MCP_SERVERS")]
    pub mcp_servers: Option<PathBuf>,
    /// Let an environment's remote MCP servers (defined by tenants through
    /// the API) be at loopback, private or link-local addresses. Off: such
    /// a server is refused (the model is told), so a tenant cannot make
    /// the worker a client of the internal network. The operator's own
    /// servers (KILN_MCP_SERVERS) are never vetted.
    #[arg(long, env = "KILN_MCP_ALLOW_PRIVATE", default_value_t = false)]
    pub mcp_allow_private: bool,
    /// Attempts at a `deliver.git` push, the first included: one that
    /// fails for a reason that may pass (the remote down or answering 5xx,
    /// a network error) is tried again, on any worker, until then.
    #[arg(long, env = "KILN_GIT_DELIVERY_ATTEMPTS", default_value_t = kiln_worker::git_delivery::DEFAULT_ATTEMPTS)]
    pub git_delivery_attempts: u32,
    /// Seconds before a failed push's second attempt; doubled after each
    /// further one (with jitter), up to an hour.
    #[arg(long, env = "KILN_GIT_DELIVERY_RETRY_S", default_value_t = kiln_worker::git_delivery::DEFAULT_RETRY_S)]
    pub git_delivery_retry_s: u64,
}

impl WorkerArgs {
    pub fn prices(&self) -> anyhow::Result<PriceTable> {
        match &self.prices_file {
            Some(path) => PriceTable::from_file(path).with_context(|| format!("reading {}", path.display())),
            None => Ok(PriceTable::default()),
        }
    }

    pub fn config(&self, model: &ModelArgs) -> anyhow::Result<WorkerConfig> {
        self.check_bounds(model)?;
        Ok(WorkerConfig {
            worker_id: self.worker_id.clone().unwrap_or_else(default_worker_id),
            concurrency: self.concurrency,
            sandbox_idle: Duration::from_secs(self.sandbox_idle_s),
            warm_pool: self.sandbox_warm.unwrap_or(0),
            lease: Duration::from_secs(self.lease_s),
            dead_worker_check: (self.dead_worker_check_ms > 0)
                .then(|| Duration::from_millis(self.dead_worker_check_ms.max(100))),
            poll_interval: Duration::from_secs(self.poll_s.max(1)),
            sandbox: self.sandbox_config()?,
            default_provider: model.provider()?,
            default_model: model.model.clone(),
            default_max_tokens: model.model_max_tokens,
            context_window: model.model_context_tokens,
            compaction_threshold: model.compaction_threshold,
            allow_file_repos: self.allow_file_repos,
            // Set from `RepoArgs` by `WorkerOptions::parts`.
            repo_rules: kiln_protocol::repo_url::RepoRules::default(),
            max_repo_mb: self.max_repo_mb,
            claim_on_end: self.claim_on_end,
            shutdown_grace: Duration::from_secs(self.shutdown_grace_s),
            event_retention: (self.event_retention_days > 0)
                .then(|| Duration::from_secs(self.event_retention_days.saturating_mul(86_400))),
            // Set from `GithubDeliveryArgs` and `CallbackArgs` by `WorkerOptions::parts`.
            github: None,
            callbacks: None,
            max_tool_calls_per_step: self.max_tool_calls_per_step,
            subagents: kiln_worker::config::SubagentSettings {
                max_parallel: self.subagent_max_parallel,
                max_depth: self.subagent_max_depth,
                // Set from `RepoArgs` by `WorkerOptions::parts`.
                kinds: Default::default(),
            },
            prompt_cache: self.prompt_cache,
            // Set from `RepoArgs` by `WorkerOptions::parts`.
            secrets_key: None,
            environment_cache: self.environment_cache(),
            environment_warm: self.environment_warm_settings(),
            max_event_bytes_per_run: self.max_event_bytes_per_run,
            max_patch_bytes: self.max_patch_mb.saturating_mul(1024 * 1024),
            // Set from `RepoArgs` by `WorkerOptions::parts`.
            environment_images: Default::default(),
            mcp: Arc::new(self.mcp_config()?),
            // Set from `RepoArgs` by `WorkerOptions::parts`.
            git_credentials: Default::default(),
            git_delivery: self.git_delivery(),
        })
    }
}

impl WorkerArgs {
    fn environment_cache(&self) -> kiln_worker::environment::cache::CacheBounds {
        kiln_worker::environment::cache::CacheBounds {
            max_images: self.environment_cache_max_images,
            max_bytes: self.environment_cache_max_mb.saturating_mul(1024 * 1024),
            scope: self.environment_cache_scope.clone(),
        }
    }

    fn environment_warm_settings(&self) -> kiln_worker::sandbox::environment_pools::WarmSettings {
        kiln_worker::sandbox::environment_pools::WarmSettings {
            per_environment: self.environment_warm,
            max_containers: self.environment_warm_max,
        }
    }

    /// The operator's MCP servers (KILN_MCP_SERVERS), if any, and whether
    /// tenants' servers may be at private addresses.
    fn mcp_config(&self) -> anyhow::Result<kiln_worker::mcp::McpConfig> {
        Ok(kiln_worker::mcp::McpConfig {
            allow_private: self.mcp_allow_private,
            ..match &self.mcp_servers {
                Some(path) => kiln_worker::mcp::McpConfig::load(path)?,
                None => Default::default(),
            }
        })
    }

    fn git_delivery(&self) -> kiln_worker::git_delivery::GitDeliverySettings {
        kiln_worker::git_delivery::GitDeliverySettings {
            max_attempts: self.git_delivery_attempts.max(1),
            base_delay: Duration::from_secs(self.git_delivery_retry_s.max(1)),
            ..Default::default()
        }
    }

    /// Settings out of their range are refused before anything starts.
    fn check_bounds(&self, model: &ModelArgs) -> anyhow::Result<()> {
        if self.concurrency == 0 {
            bail!("KILN_WORKER_MAX_SESSIONS must be at least 1");
        }
        if !(0.1..=1.0).contains(&model.compaction_threshold) {
            bail!("KILN_COMPACTION_THRESHOLD must be between 0.1 and 1");
        }
        if model.model_context_tokens < 1_000 {
            bail!("KILN_MODEL_CONTEXT_TOKENS must be at least 1000");
        }
        if self.sandbox_disk_mb < 16 {
            bail!("KILN_SANDBOX_DISK_MB must be at least 16");
        }
        if self.max_repo_mb == 0 {
            bail!("KILN_MAX_REPO_MB must be at least 1");
        }
        if self.lease_s < 3 {
            bail!("KILN_LEASE_S must be at least 3");
        }
        if self.max_tool_calls_per_step == 0 {
            bail!("KILN_MAX_TOOL_CALLS_PER_STEP must be at least 1");
        }
        if self.subagent_max_parallel == 0 {
            bail!("KILN_SUBAGENT_MAX_PARALLEL must be at least 1");
        }
        if self.subagent_max_depth > 4 {
            bail!("KILN_SUBAGENT_MAX_DEPTH must be at most 4");
        }
        if self.max_event_bytes_per_run < 64 * 1024 {
            bail!("KILN_MAX_EVENT_BYTES_PER_RUN must be at least 65536");
        }
        Ok(())
    }

    /// The sandboxes' image, limits, runtime, disk and egress.
    fn sandbox_config(&self) -> anyhow::Result<SandboxConfig> {
        Ok(SandboxConfig {
            image: self.sandbox_image.clone(),
            memory_bytes: self.sandbox_memory_mb * 1024 * 1024,
            nano_cpus: (self.sandbox_cpus * 1e9) as i64,
            pids_limit: self.sandbox_pids,
            tmpfs_mb: self.sandbox_tmpfs_mb,
            nofile: self.sandbox_nofile,
            runtime: self.sandbox_runtime.clone(),
            allow_network: self.sandbox_allow_network,
            toolbox_path: self.toolbox_path.clone(),
            toolbox_mount_dir: Some(self.toolbox_mount_dir.clone()).filter(|dir| !dir.as_os_str().is_empty()),
            disk_mb: self.sandbox_disk_mb,
            disk_mode: self.sandbox_disk_mode,
            disk_dir: self.sandbox_disk_dir.clone(),
            egress: Arc::new(self.egress()?),
            ..SandboxConfig::default()
        })
    }
}

impl WorkerArgs {
    fn egress(&self) -> anyhow::Result<EgressSettings> {
        use kiln_worker::egress::resolve::{parse_hosts, parse_ranges};
        let mode: EgressMode = serde_json::from_value(serde_json::Value::String(self.egress_mode.clone()))
            .map_err(|_| anyhow::anyhow!("KILN_EGRESS_MODE must be none, allowlist or open"))?;
        let allow = parse_allow(&self.egress_allow).map_err(|e| anyhow::anyhow!("KILN_EGRESS_ALLOW: {e}"))?;
        if self.egress_max_connections == 0 {
            bail!("KILN_EGRESS_MAX_CONNECTIONS must be at least 1");
        }
        let addresses = AddressRules {
            allow_ranges: parse_ranges(&self.egress_allow_ranges)
                .map_err(|e| anyhow::anyhow!("KILN_EGRESS_ALLOW_RANGES: {e}"))?,
            deny_ranges: parse_ranges(&self.egress_deny_ranges)
                .map_err(|e| anyhow::anyhow!("KILN_EGRESS_DENY_RANGES: {e}"))?,
            hosts: parse_hosts(&self.egress_hosts).map_err(|e| anyhow::anyhow!("KILN_EGRESS_HOSTS: {e}"))?,
        };
        let firewall: FirewallSetting =
            self.egress_host_firewall.parse().map_err(|e| anyhow::anyhow!("KILN_EGRESS_HOST_FIREWALL: {e}"))?;
        Ok(EgressSettings {
            deployment: EgressPolicy { mode, allow: Some(allow) },
            addresses: Arc::new(addresses),
            port: self.egress_port,
            max_connections: self.egress_max_connections,
            host_firewall: Arc::new(HostFirewall::new(firewall)),
        })
    }
}

fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_owned()).unwrap_or_default();
    let host = if host.is_empty() { "worker".to_owned() } else { host };
    format!("{host}-{}-{:04x}", std::process::id(), rand::random::<u16>())
}
