//! Runs: what a client submits and what it gets back.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize};
use uuid::Uuid;

use crate::egress::{EgressMode, EgressPolicy};
use crate::input;
use crate::rules::{List, Text};

pub use crate::input::MAX_PROMPT_CHARS;
/// A prompt Kiln builds itself (from a GitHub issue) is cut to this many
/// bytes, which are never more characters than [`MAX_PROMPT_CHARS`].
pub const MAX_PROMPT_BYTES: usize = MAX_PROMPT_CHARS;
pub const DEFAULT_MAX_STEPS: u32 = 50;
pub const DEFAULT_TIMEOUT_S: u32 = 3_600;

/// Body of `POST /v1/runs`. Unknown fields are refused so that a typo in a
/// limit never silently falls back to a default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRun {
    pub prompt: String,
    #[serde(default, deserialize_with = "crate::nested::object", skip_serializing_if = "Option::is_none")]
    pub repo: Option<RepoSpec>,
    #[serde(default, deserialize_with = "crate::nested::object", skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelSpec>,
    #[serde(default, deserialize_with = "crate::nested::object", skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// Which tool calls wait for a person's approval (default: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalMode>,
    /// The only tools the model sees; all tools when absent. A name may hold
    /// `*` (any run of characters): `mcp__github__*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_tools: Option<Vec<String>>,
    /// The operator's MCP servers (`KILN_MCP_SERVERS`: remote ones, and
    /// ones started inside the run's sandbox as its user) whose tools the
    /// run gets, by name; all of them when absent, none when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<Vec<String>>,
    /// The kinds of sub-agent the run's `task` tool offers, by name (the
    /// built-in `general` and `explore`, and the operator's,
    /// `KILN_AGENT_KINDS`); all of them when absent, none (no `task` tool)
    /// when empty. A name the deployment does not know is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<Vec<String>>,
    /// Narrower sandbox limits, or network access where the deployment
    /// allows it.
    #[serde(default, deserialize_with = "crate::nested::object", skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxSpec>,
    /// Where to POST the run's final state when it ends (see
    /// [`crate::callback`]); the deployment must have a callback secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    /// The caller's environment (`/v1/environments`) the sandbox is
    /// prepared with; the deployment's bare image when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
    /// Where else the run's change goes when it ends (`deliver.git`: a
    /// branch on a git remote; see [`crate::deliver`]).
    #[serde(default, deserialize_with = "crate::nested::object", skip_serializing_if = "Option::is_none")]
    pub deliver: Option<crate::deliver::Deliver>,
    /// Runs the task as a group of this many attempts, each a run of its
    /// own (its own session and sandbox, the same prompt and repository),
    /// of which `POST /v1/runs/{id}/select` chooses one. The deployment may
    /// allow fewer (`KILN_MAX_ATTEMPTS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// The model of each attempt, in order (one name per attempt); the
    /// run's `model` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_models: Option<Vec<String>>,
    /// What the attempts may spend together; `limits` applies to each.
    #[serde(default, deserialize_with = "crate::nested::object", skip_serializing_if = "Option::is_none")]
    pub group_limits: Option<crate::attempts::GroupLimits>,
}

/// A run's sandbox, within what the deployment allows: limits can only be
/// lowered (a larger value means the deployment's), and `bridge` networking
/// only works on workers with `KILN_SANDBOX_ALLOW_NETWORK`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkMode>,
    /// Traffic through Kiln's egress proxy, within the deployment's egress
    /// policy (which it only narrows); absent: none. Not with `network`.
    #[serde(default, deserialize_with = "crate::nested::object", skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u32>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// No interface but loopback.
    #[default]
    None,
    /// Docker's default bridge: outbound access.
    Bridge,
}

/// Which tool calls need a person's approval before they run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalMode {
    /// Nothing waits.
    #[default]
    Never,
    /// Calls that change things (bash, edit, write) wait.
    Mutating,
    /// Every call waits.
    Always,
}

/// What a run may do, stored with it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Policy {
    #[serde(default)]
    pub approval: ApprovalMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_tools: Option<Vec<String>>,
    /// The MCP servers the run uses (see [`CreateRun::mcp`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<Vec<String>>,
    /// The sub-agent kinds the run offers (see [`CreateRun::agents`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<Vec<String>>,
    #[serde(default)]
    pub sandbox: SandboxSpec,
    /// The environment's name, as the run named it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
    /// Where else the run's change goes (see [`CreateRun::deliver`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver: Option<crate::deliver::Deliver>,
    /// A group's budget for its attempts together (see [`CreateRun::group_limits`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_limits: Option<crate::attempts::GroupLimits>,
}

/// A repository to clone into the sandbox's `/workspace`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RepoSpec {
    pub url: String,
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    pub git_ref: Option<String>,
}

/// Per-run model overrides; anything left out comes from the worker's
/// configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// `openai` (Chat Completions), `openai-responses` or `anthropic`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    // Read as a 64-bit number and checked before it is narrowed, so that a
    // value just over the limit is not rounded into it.
    #[serde(default, deserialize_with = "temperature", skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// The model's context window in tokens, when the deployment's default
    /// (`KILN_MODEL_CONTEXT_TOKENS`) is wrong for it; compaction keeps each
    /// step's input under a share of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u32>,
}

/// Budgets of one run. A budget that is spent stops the run before the next
/// model call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Model calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
    /// Wall-clock seconds from the run's first start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<u32>,
    /// Input plus output tokens over the whole run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Model spend in US dollars, priced with the worker's price table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
}

impl Limits {
    pub fn max_steps(&self) -> u32 {
        self.max_steps.unwrap_or(DEFAULT_MAX_STEPS)
    }
    pub fn timeout_s(&self) -> u32 {
        self.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S)
    }
}

/// Why a submitted run is not acceptable. Messages are shown to clients.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("prompt must not be empty")]
    EmptyPrompt,
    #[error("prompt must not contain NUL characters")]
    NulInPrompt,
    #[error("prompt is {chars} characters ({bytes} bytes); the limit is {MAX_PROMPT_CHARS} characters")]
    PromptTooLong { chars: usize, bytes: usize },
    #[error("limits.max_steps must be between {} and {}", input::MAX_STEPS.min, input::MAX_STEPS.max)]
    MaxSteps,
    #[error("limits.timeout_s must be between {} and {}", input::TIMEOUT_S.min, input::TIMEOUT_S.max)]
    Timeout,
    #[error(
        "allowed_tools must be a list of at most {} tool names of at most {} letters, digits, _ or - (* for any run of them)",
        input::ALLOWED_TOOLS.max_items,
        input::TOOL_NAME.max_chars
    )]
    AllowedTools,
    #[error(
        "mcp must be a list of at most {} server names of 1 to {} characters: {}",
        input::MCP_SERVERS.max_items,
        input::MCP_SERVER_NAME.max_chars,
        input::MCP_SERVER_NAME_RULE
    )]
    McpServers,
    #[error(
        "agents must be a list of at most {} agent kind names of 1 to {} letters, digits, _ or -",
        input::AGENTS.max_items,
        input::AGENT_KIND_NAME.max_chars
    )]
    Agents,
    #[error("limits.max_tokens must be between {} and {}", input::RUN_MAX_TOKENS.min, input::RUN_MAX_TOKENS.max)]
    MaxRunTokens,
    #[error("limits.max_cost_usd must be a positive number of dollars, at most {}", input::MAX_COST_USD.max)]
    MaxCost,
    #[error("repo.url must be an http(s), ssh, git or file URL (or git@host:path) without whitespace: {0}")]
    RepoUrl(String),
    #[error("repo.ref must be a plain git ref name: {0}")]
    RepoRef(String),
    /// A URL of the right shape that Kiln still does not clone (credentials).
    #[error(transparent)]
    Repo(#[from] crate::repo_url::RepoUrlError),
    #[error("model.provider must be one of {known:?}, not {0:?}", known = input::MODEL_PROVIDER.0)]
    Provider(String),
    #[error("model.max_tokens must be between {} and {}", input::MODEL_MAX_TOKENS.min, input::MODEL_MAX_TOKENS.max)]
    MaxTokens,
    #[error("model.temperature must be between {} and {}", input::TEMPERATURE.min, input::TEMPERATURE.max)]
    Temperature,
    #[error("model.context_window must be between {} and {}", input::CONTEXT_WINDOW.min, input::CONTEXT_WINDOW.max)]
    ContextWindow,
    #[error(
        "model.name must be {} to {} characters without control characters",
        input::MODEL_NAME.min_chars,
        input::MODEL_NAME.max_chars
    )]
    ModelName,
    #[error("sandbox.{0}")]
    Sandbox(String),
    #[error("callback_url {0}")]
    CallbackUrl(String),
    #[error(transparent)]
    Deliver(#[from] crate::deliver::DeliverError),
    #[error("environment must be the name of one of your environments (lower-case letters, digits, '.', '_', '-')")]
    EnvironmentName,
    #[error(transparent)]
    Attempts(#[from] crate::attempts::AttemptsError),
}

impl CreateRun {
    /// A run of `prompt` with every other setting left to the defaults.
    pub fn new(prompt: impl Into<String>) -> Self {
        CreateRun { prompt: prompt.into(), ..Default::default() }
    }

    /// The policy stored with the run.
    pub fn policy(&self) -> Policy {
        Policy {
            approval: self.approval.unwrap_or_default(),
            allowed_tools: self.allowed_tools.clone(),
            mcp: self.mcp.clone(),
            agents: self.agents.clone(),
            sandbox: self.sandbox.clone().unwrap_or_default(),
            environment: self.environment.clone(),
            deliver: self.deliver.clone(),
            group_limits: self.group_limits,
        }
    }

    /// Checks everything serde cannot: sizes, ranges and shapes of strings
    /// that later reach a command line. Each check is a rule of
    /// [`crate::input`], which the OpenAPI document states too.
    pub fn validate(&self) -> Result<(), SpecError> {
        if !input::PROMPT.accepts(&self.prompt) {
            return Err(prompt_error(&self.prompt));
        }
        if let Some(limits) = &self.limits {
            limits.validate()?;
        }
        let names_ok = |names: &Option<Vec<String>>, list: &List, name: &Text| {
            names.as_deref().is_none_or(|names| list.accepts(names, name))
        };
        if !names_ok(&self.allowed_tools, &input::ALLOWED_TOOLS, &input::TOOL_NAME) {
            return Err(SpecError::AllowedTools);
        }
        if !names_ok(&self.mcp, &input::MCP_SERVERS, &input::MCP_SERVER_NAME) {
            return Err(SpecError::McpServers);
        }
        if !names_ok(&self.agents, &input::AGENTS, &input::AGENT_KIND_NAME) {
            return Err(SpecError::Agents);
        }
        if let Some(repo) = &self.repo {
            // Credentials first: the other refusal quotes the URL.
            let parsed = crate::repo_url::parse_repo_url(&repo.url);
            if let Err(e @ crate::repo_url::RepoUrlError::Credentials) = parsed {
                return Err(e.into());
            }
            if !input::REPO_URL.accepts(&repo.url) {
                return Err(SpecError::RepoUrl(truncate(&repo.url)));
            }
            parsed?;
            if let Some(r) = repo.git_ref.as_deref().filter(|r| !input::GIT_REF.accepts(r)) {
                return Err(SpecError::RepoRef(truncate(r)));
            }
        }
        if let Some(sandbox) = &self.sandbox {
            sandbox.validate()?;
        }
        if let Some(url) = &self.callback_url {
            crate::callback_url::check(url).map_err(SpecError::CallbackUrl)?;
        }
        if let Some(model) = &self.model {
            model.validate()?;
        }
        if let Some(git) = self.deliver.as_ref().and_then(|d| d.git.as_ref()) {
            git.validate()?;
        }
        if self.environment.as_deref().is_some_and(|e| !input::ENVIRONMENT_NAME.accepts(e)) {
            return Err(SpecError::EnvironmentName);
        }
        crate::attempts::validate(self.attempts, self.attempt_models.as_deref(), self.group_limits.as_ref())?;
        Ok(())
    }
}

/// Why `prompt` broke [`input::PROMPT`].
fn prompt_error(prompt: &str) -> SpecError {
    let chars = prompt.chars().count();
    if prompt.trim().is_empty() {
        SpecError::EmptyPrompt
    } else if chars > input::PROMPT.max_chars {
        SpecError::PromptTooLong { chars, bytes: prompt.len() }
    } else {
        // Postgres text cannot hold NUL; refused here rather than failing later.
        SpecError::NulInPrompt
    }
}

impl Limits {
    fn validate(&self) -> Result<(), SpecError> {
        if self.max_steps.is_some_and(|s| !input::MAX_STEPS.contains(s)) {
            return Err(SpecError::MaxSteps);
        }
        if self.timeout_s.is_some_and(|t| !input::TIMEOUT_S.contains(t)) {
            return Err(SpecError::Timeout);
        }
        if self.max_tokens.is_some_and(|t| !input::RUN_MAX_TOKENS.contains(t)) {
            return Err(SpecError::MaxRunTokens);
        }
        if self.max_cost_usd.is_some_and(|c| !input::MAX_COST_USD.contains(c)) {
            return Err(SpecError::MaxCost);
        }
        Ok(())
    }
}

impl SandboxSpec {
    pub(crate) fn validate(&self) -> Result<(), SpecError> {
        fn out_of<T: fmt::Display>(field: &str, range: &crate::rules::Range<T>) -> SpecError {
            SpecError::Sandbox(format!("{field} must be between {} and {}", range.min, range.max))
        }
        if self.memory_mb.is_some_and(|m| !input::SANDBOX_MEMORY_MB.contains(m)) {
            return Err(out_of("memory_mb", &input::SANDBOX_MEMORY_MB));
        }
        if self.cpus.is_some_and(|c| !input::SANDBOX_CPUS.contains(c)) {
            return Err(out_of("cpus", &input::SANDBOX_CPUS));
        }
        if self.pids.is_some_and(|p| !input::SANDBOX_PIDS.contains(p)) {
            return Err(out_of("pids", &input::SANDBOX_PIDS));
        }
        if let Some(egress) = &self.egress {
            if self.network == Some(NetworkMode::Bridge) && egress.mode != EgressMode::None {
                return Err(SpecError::Sandbox("egress and network = \"bridge\" do not go together".into()));
            }
            egress.validate().map_err(|e| SpecError::Sandbox(format!("egress: {e}")))?;
        }
        Ok(())
    }
}

impl ModelSpec {
    fn validate(&self) -> Result<(), SpecError> {
        if let Some(p) = self.provider.as_deref().filter(|p| !input::MODEL_PROVIDER.contains(p)) {
            return Err(SpecError::Provider(p.to_owned()));
        }
        if self.max_tokens.is_some_and(|t| !input::MODEL_MAX_TOKENS.contains(t)) {
            return Err(SpecError::MaxTokens);
        }
        if self.temperature.is_some_and(|t| !input::TEMPERATURE.contains(f64::from(t))) {
            return Err(SpecError::Temperature);
        }
        if self.context_window.is_some_and(|w| !input::CONTEXT_WINDOW.contains(w)) {
            return Err(SpecError::ContextWindow);
        }
        if self.name.as_deref().is_some_and(|n| !input::MODEL_NAME.accepts(n)) {
            return Err(SpecError::ModelName);
        }
        Ok(())
    }
}

/// `model.temperature`, checked as the 64-bit number it was sent as: read
/// as an `f32` first, `2.0000000001` would round into the range.
fn temperature<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<f32>, D::Error> {
    let Some(t) = Option::<f64>::deserialize(deserializer)? else {
        return Ok(None);
    };
    if !input::TEMPERATURE.contains(t) {
        return Err(serde::de::Error::custom(SpecError::Temperature));
    }
    Ok(Some(t as f32))
}

fn is_default_sandbox(spec: &SandboxSpec) -> bool {
    *spec == SandboxSpec::default()
}

fn truncate(s: &str) -> String {
    s.chars().take(100).collect()
}

/// The lifecycle of a run. Every transition is one SQL statement that checks
/// the expected current status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Queued,
    Running,
    AwaitingApproval,
    Succeeded,
    Failed,
    Cancelled,
    TimedOut,
}

impl RunStatus {
    pub const ALL: [RunStatus; 7] = [
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::AwaitingApproval,
        RunStatus::Succeeded,
        RunStatus::Failed,
        RunStatus::Cancelled,
        RunStatus::TimedOut,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::AwaitingApproval => "awaiting_approval",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::TimedOut => "timed_out",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, RunStatus::Succeeded | RunStatus::Failed | RunStatus::Cancelled | RunStatus::TimedOut)
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown run status {0:?}; expected one of queued, running, awaiting_approval, succeeded, failed, cancelled, timed_out"
)]
pub struct UnknownStatus(pub String);

impl FromStr for RunStatus {
    type Err = UnknownStatus;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RunStatus::ALL.into_iter().find(|st| st.as_str() == s).ok_or_else(|| UnknownStatus(s.to_owned()))
    }
}

/// Where a run came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    Api,
    Github,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Api => "api",
            Trigger::Github => "github",
        }
    }
}

/// A run as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Run {
    pub id: Uuid,
    pub session_id: Uuid,
    pub status: RunStatus,
    pub prompt: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repo: Option<RepoSpec>,
    pub model: ModelSpec,
    pub limits: Limits,
    pub approval: ApprovalMode,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_tools: Option<Vec<String>>,
    /// The MCP servers the run asked for; all the worker's when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<Vec<String>>,
    /// The sub-agent kinds the run's `task` tool offers; all when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<Vec<String>>,
    /// The sandbox the run asked for (see [`SandboxSpec`]).
    #[serde(default, skip_serializing_if = "is_default_sandbox")]
    pub sandbox: SandboxSpec,
    /// The environment the run's sandbox is prepared with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
    /// Where else the run's change goes when it ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver: Option<crate::deliver::Deliver>,
    pub trigger: Trigger,
    pub attempt: i32,
    pub cancel_requested: bool,
    pub created_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    /// The agent's final answer, once the run succeeded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Where the run's final state is POSTed when it ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    /// Seq of the newest event; a client that has seen this many events has
    /// seen them all.
    pub last_event_seq: i64,
    /// For a sub-agent: the run whose `task` call started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<Uuid>,
    /// For a sub-agent: where it sits in the tree of agents, e.g.
    /// `main/explore[1-1]` (its kind and the parent's call id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_path: Option<String>,
    /// What the run changed (files, lines added and removed), once its
    /// change was captured at its end; `GET /v1/runs/{id}/changes` has
    /// the files, `/patch` the patch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes: Option<crate::changes::ChangeTotals>,
    /// For an attempt: the group it is one of (`attempts` on the group
    /// lists them all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_run_id: Option<Uuid>,
    /// For an attempt: which of its group's attempts it is (1 for the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_number: Option<u32>,
    /// For a group: its attempts' run ids, the first attempt's first. The
    /// group itself runs no agent: it ends when every attempt has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<Vec<Uuid>>,
    /// For a group: the attempt chosen as its result (its change is the
    /// group's `patch` and `changes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selected_attempt: Option<u32>,
    /// For a group: what its attempts may spend together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_limits: Option<crate::attempts::GroupLimits>,
}

/// What a group's settings give each of its attempts (`crate::attempts`).
impl CreateRun {
    /// The model and budget of attempt `number` (1 for the first) of
    /// `attempts`: the run's own, with the attempt's model of
    /// `attempt_models` and its share of `group_limits`.
    pub fn attempt_settings(&self, number: u32, attempts: u32) -> (Option<ModelSpec>, Option<Limits>) {
        let mut model = self.model.clone();
        if let Some(name) = self.attempt_models.as_deref().and_then(|models| crate::attempts::model_of(models, number))
        {
            model.get_or_insert_with(ModelSpec::default).name = Some(name.clone());
        }
        let limits = match &self.group_limits {
            Some(group) => Some(group.share(&self.limits.unwrap_or_default(), number, attempts)),
            None => self.limits,
        };
        (model, limits)
    }
}

impl crate::attempts::GroupLimits {
    /// Attempt `number`'s budget (1 for the first) out of `attempts`: its
    /// own `limits`, narrowed to its share of the group's. Steps and tokens
    /// are shared out whole, the first attempts taking the remainder, so the
    /// shares add up to the group's exactly; an attempt whose share is 0
    /// (more attempts than steps) ends at once, its budget spent.
    pub fn share(&self, limits: &Limits, number: u32, attempts: u32) -> Limits {
        let n = u64::from(attempts.max(1));
        let k = u64::from(number.clamp(1, attempts.max(1)));
        let whole = |total: u64| total / n + u64::from(k <= total % n);
        let narrow = |own: Option<u64>, group: Option<u64>| match (own, group.map(whole)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let cost = match (limits.max_cost_usd, self.max_cost_usd.map(|c| c / n as f64)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let steps = narrow(limits.max_steps.map(u64::from), self.max_steps.map(u64::from));
        Limits {
            max_steps: steps.map(|s| u32::try_from(s).unwrap_or(u32::MAX)),
            timeout_s: limits.timeout_s,
            max_tokens: narrow(limits.max_tokens, self.max_tokens),
            max_cost_usd: cost,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spec(json: &str) -> Result<CreateRun, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn minimal_spec_parses_and_validates() {
        let s = spec(r#"{"prompt":"fix it"}"#).unwrap();
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(s.limits.unwrap_or_default().max_steps(), DEFAULT_MAX_STEPS);
    }

    #[test]
    fn unknown_fields_are_refused_at_every_level() {
        assert!(spec(r#"{"prompt":"x","promt":"y"}"#).is_err());
        assert!(spec(r#"{"prompt":"x","limits":{"max_step":3}}"#).is_err());
        assert!(spec(r#"{"prompt":"x","repo":{"url":"https://a/b","branch":"m"}}"#).is_err());
    }

    #[test]
    fn ranges_and_sizes_are_checked() {
        let mut s = spec(r#"{"prompt":"x","limits":{"max_steps":0}}"#).unwrap();
        assert_eq!(s.validate(), Err(SpecError::MaxSteps));
        let timeout_s = Some(input::TIMEOUT_S.max + 1);
        s.limits = Some(Limits { max_steps: Some(3), timeout_s, ..Default::default() });
        assert_eq!(s.validate(), Err(SpecError::Timeout));
        let big = CreateRun { prompt: "a".repeat(MAX_PROMPT_CHARS + 1), ..Default::default() };
        let (chars, bytes) = (MAX_PROMPT_CHARS + 1, MAX_PROMPT_CHARS + 1);
        assert_eq!(big.validate(), Err(SpecError::PromptTooLong { chars, bytes }));
        let nul = CreateRun { prompt: "a\0b".into(), ..Default::default() };
        assert_eq!(nul.validate(), Err(SpecError::NulInPrompt));
        let blank = CreateRun { prompt: " \n".into(), ..Default::default() };
        assert_eq!(blank.validate(), Err(SpecError::EmptyPrompt));
    }

    #[test]
    fn mcp_servers_are_names_and_carried_into_the_policy() {
        let policy = names_are_checked("mcp", &["demo", "git-hub_2"], &input::MCP_SERVERS, SpecError::McpServers);
        assert_eq!(policy.mcp, Some(vec!["demo".to_owned(), "git-hub_2".to_owned()]));
    }

    #[test]
    fn agent_kinds_are_names_and_carried_into_the_policy() {
        let policy = names_are_checked("agents", &["explore", "code-reviewer"], &input::AGENTS, SpecError::Agents);
        assert_eq!(policy.agents, Some(vec!["explore".to_owned(), "code-reviewer".to_owned()]));
    }

    /// A spec whose list `field` holds `good` validates (its policy is
    /// returned); one with a bad name, or more names than `list` allows,
    /// fails with `error`.
    fn names_are_checked(field: &str, good: &[&str], list: &List, error: SpecError) -> Policy {
        let s = spec(&json!({"prompt": "x", field: good}).to_string()).unwrap();
        assert_eq!(s.validate(), Ok(()));
        let many: Vec<String> = (0..=list.max_items).map(|i| format!("s{i}")).collect();
        for bad in [json!([""]), json!(["a b"]), json!(["x*"]), json!(many)] {
            let s = spec(&json!({"prompt": "x", field: bad}).to_string()).unwrap();
            assert_eq!(s.validate(), Err(error.clone()), "{field}: {bad}");
        }
        s.policy()
    }

    #[test]
    fn allowed_tools_and_approval_parse_and_are_checked() {
        let s = spec(r#"{"prompt":"x","approval":"mutating","allowed_tools":["view","grep"]}"#).unwrap();
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(s.policy().approval, ApprovalMode::Mutating);
        assert!(spec(r#"{"prompt":"x","approval":"sometimes"}"#).is_err());
        let bad = spec(r#"{"prompt":"x","allowed_tools":["rm -rf"]}"#).unwrap();
        assert_eq!(bad.validate(), Err(SpecError::AllowedTools));
        let pattern = spec(r#"{"prompt":"x","allowed_tools":["mcp__git-hub__*"]}"#).unwrap();
        assert_eq!(pattern.validate(), Ok(()));
    }

    #[test]
    fn repo_urls_that_git_could_misread_are_refused() {
        for url in ["-uevil", "ext::sh -c id", "https://x/y z", "/etc/passwd", "https://a/\nb"] {
            let s = CreateRun {
                prompt: "x".into(),
                repo: Some(RepoSpec { url: url.into(), git_ref: None }),
                ..Default::default()
            };
            assert!(matches!(s.validate(), Err(SpecError::RepoUrl(_))), "{url}");
        }
        for r in ["--upload-pack=x", "a..b", "a b", ""] {
            let s = CreateRun {
                prompt: "x".into(),
                repo: Some(RepoSpec { url: "https://example.invalid/r.git".into(), git_ref: Some(r.into()) }),
                ..Default::default()
            };
            assert!(matches!(s.validate(), Err(SpecError::RepoRef(_))), "{r}");
        }
    }

    #[test]
    fn callback_url_is_validated_with_the_spec() {
        let s = spec(r#"{"prompt":"x","callback_url":"https://hooks.example.com/kiln"}"#).unwrap();
        assert_eq!(s.validate(), Ok(()));
        let bad = spec(r#"{"prompt":"x","callback_url":"https://me:pw@hooks.example.com/"}"#).unwrap();
        assert!(matches!(bad.validate(), Err(SpecError::CallbackUrl(_))));
    }

    #[test]
    fn status_round_trips_through_its_string() {
        for st in RunStatus::ALL {
            assert_eq!(st.as_str().parse::<RunStatus>(), Ok(st));
            assert_eq!(serde_json::to_value(st).unwrap(), st.as_str());
        }
        assert!("done".parse::<RunStatus>().is_err());
    }
}
