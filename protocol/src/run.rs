//! Runs: what a client submits and what it gets back.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Longest prompt the API accepts, in bytes. A prompt is sent to the model on
/// every step, so an unbounded one is a cost and memory hazard.
pub const MAX_PROMPT_BYTES: usize = 64 * 1024;
/// Longest `model.name` accepted (provider model ids are far shorter).
pub const MAX_MODEL_NAME_CHARS: usize = 200;
/// Upper bound for `limits.max_steps`.
pub const MAX_STEPS_CEILING: u32 = 500;
/// Upper bound for `limits.timeout_s` (one day).
pub const TIMEOUT_CEILING_S: u32 = 86_400;
pub const DEFAULT_MAX_STEPS: u32 = 50;
pub const DEFAULT_TIMEOUT_S: u32 = 3_600;

/// Body of `POST /v1/runs`. Unknown fields are refused so that a typo in a
/// limit never silently falls back to a default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRun {
    pub prompt: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<RepoSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// Which tool calls wait for a person's approval (default: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalMode>,
    /// The only tools the model sees; all tools when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_tools: Option<Vec<String>>,
    /// Narrower sandbox limits, or network access where the deployment
    /// allows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxSpec>,
    /// Where to POST the run's final state when it ends (see
    /// [`crate::callback`]); the deployment must have a callback secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
}

/// A run's sandbox, within what the deployment allows: limits can only be
/// lowered (a larger value means the deployment's), and `bridge` networking
/// only works on workers with `KILN_SANDBOX_ALLOW_NETWORK`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkMode>,
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
    #[serde(default)]
    pub sandbox: SandboxSpec,
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
    #[error("prompt is {0} bytes; the limit is {MAX_PROMPT_BYTES}")]
    PromptTooLong(usize),
    #[error("limits.max_steps must be between 1 and {MAX_STEPS_CEILING}")]
    MaxSteps,
    #[error("limits.timeout_s must be between 1 and {TIMEOUT_CEILING_S}")]
    Timeout,
    #[error("allowed_tools must be a list of at most 64 tool names (letters, digits, _)")]
    AllowedTools,
    #[error("limits.max_tokens must be at least 1")]
    MaxRunTokens,
    #[error("limits.max_cost_usd must be a positive number of dollars")]
    MaxCost,
    #[error("repo.url must be an http(s), ssh or file URL without whitespace: {0}")]
    RepoUrl(String),
    #[error("repo.ref must be a plain git ref name: {0}")]
    RepoRef(String),
    #[error("model.provider must be \"openai\", \"openai-responses\" or \"anthropic\", not {0:?}")]
    Provider(String),
    #[error("model.max_tokens must be between 1 and 1000000")]
    MaxTokens,
    #[error("model.temperature must be between 0 and 2")]
    Temperature,
    #[error("model.context_window must be between 1000 and 10000000")]
    ContextWindow,
    #[error("model.name must be 1 to {MAX_MODEL_NAME_CHARS} characters without control characters")]
    ModelName,
    #[error("sandbox.{0}")]
    Sandbox(&'static str),
    #[error("callback_url {0}")]
    CallbackUrl(String),
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
            sandbox: self.sandbox.clone().unwrap_or_default(),
        }
    }

    /// Checks everything serde cannot: sizes, ranges and shapes of strings
    /// that later reach a command line.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.prompt.trim().is_empty() {
            return Err(SpecError::EmptyPrompt);
        }
        if self.prompt.len() > MAX_PROMPT_BYTES {
            return Err(SpecError::PromptTooLong(self.prompt.len()));
        }
        // Postgres text cannot hold NUL; refuse it here rather than fail later.
        if self.prompt.contains('\0') {
            return Err(SpecError::NulInPrompt);
        }
        if let Some(limits) = &self.limits {
            if limits.max_steps.is_some_and(|s| s == 0 || s > MAX_STEPS_CEILING) {
                return Err(SpecError::MaxSteps);
            }
            if limits.timeout_s.is_some_and(|t| t == 0 || t > TIMEOUT_CEILING_S) {
                return Err(SpecError::Timeout);
            }
            if limits.max_tokens == Some(0) {
                return Err(SpecError::MaxRunTokens);
            }
            if limits.max_cost_usd.is_some_and(|c| c.is_nan() || c <= 0.0 || c > 1_000_000.0) {
                return Err(SpecError::MaxCost);
            }
        }
        if let Some(tools) = &self.allowed_tools {
            let bad = tools.len() > 64
                || tools.iter().any(|t| {
                    t.is_empty() || t.len() > 64 || !t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                });
            if bad {
                return Err(SpecError::AllowedTools);
            }
        }
        if let Some(repo) = &self.repo {
            validate_repo_url(&repo.url)?;
            if let Some(r) = &repo.git_ref {
                validate_git_ref(r)?;
            }
        }
        if let Some(sandbox) = &self.sandbox {
            if sandbox.memory_mb.is_some_and(|m| !(64..=1_048_576).contains(&m)) {
                return Err(SpecError::Sandbox("memory_mb must be between 64 and 1048576"));
            }
            if sandbox.cpus.is_some_and(|c| !(0.05..=256.0).contains(&c) || c.is_nan()) {
                return Err(SpecError::Sandbox("cpus must be between 0.05 and 256"));
            }
            if sandbox.pids.is_some_and(|p| !(16..=1_000_000).contains(&p)) {
                return Err(SpecError::Sandbox("pids must be between 16 and 1000000"));
            }
        }
        if let Some(url) = &self.callback_url {
            crate::callback::validate_callback_url(url)?;
        }
        if let Some(model) = &self.model {
            let known = |p: &&str| matches!(*p, "openai" | "openai-responses" | "anthropic");
            if let Some(p) = model.provider.as_deref().filter(|p| !known(p)) {
                return Err(SpecError::Provider(p.to_owned()));
            }
            if model.max_tokens.is_some_and(|t| t == 0 || t > 1_000_000) {
                return Err(SpecError::MaxTokens);
            }
            if model.temperature.is_some_and(|t| !(0.0..=2.0).contains(&t) || t.is_nan()) {
                return Err(SpecError::Temperature);
            }
            if model.context_window.is_some_and(|w| !(1_000..=10_000_000).contains(&w)) {
                return Err(SpecError::ContextWindow);
            }
            // It goes to the provider, into logs and into metrics labels.
            let bad_name = |n: &&String| {
                n.is_empty() || n.chars().count() > MAX_MODEL_NAME_CHARS || n.chars().any(char::is_control)
            };
            if model.name.as_ref().is_some_and(|n| bad_name(&n)) {
                return Err(SpecError::ModelName);
            }
        }
        Ok(())
    }
}

fn is_default_sandbox(spec: &SandboxSpec) -> bool {
    *spec == SandboxSpec::default()
}

/// The URL is handed to `git clone` on the worker: refuse anything git could
/// read as an option or a helper invocation (`-u…`, `ext::…`).
fn validate_repo_url(url: &str) -> Result<(), SpecError> {
    let ok_scheme = ["https://", "http://", "ssh://", "git://", "file://"].iter().any(|s| url.starts_with(s));
    let scp_like = url.starts_with("git@") && url.contains(':');
    if url.len() > 2048 || !(ok_scheme || scp_like) || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(SpecError::RepoUrl(truncate(url)));
    }
    Ok(())
}

fn validate_git_ref(r: &str) -> Result<(), SpecError> {
    let bad = r.is_empty()
        || r.len() > 255
        || r.starts_with('-')
        || r.contains("..")
        || r.chars().any(|c| c.is_whitespace() || c.is_control() || "~^:?*[\\".contains(c));
    if bad {
        return Err(SpecError::RepoRef(truncate(r)));
    }
    Ok(())
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
    /// The sandbox the run asked for (see [`SandboxSpec`]).
    #[serde(default, skip_serializing_if = "is_default_sandbox")]
    pub sandbox: SandboxSpec,
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
}

#[cfg(test)]
mod tests {
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
        s.limits = Some(Limits { max_steps: Some(3), timeout_s: Some(TIMEOUT_CEILING_S + 1), ..Default::default() });
        assert_eq!(s.validate(), Err(SpecError::Timeout));
        let big = CreateRun { prompt: "a".repeat(MAX_PROMPT_BYTES + 1), ..Default::default() };
        assert_eq!(big.validate(), Err(SpecError::PromptTooLong(MAX_PROMPT_BYTES + 1)));
        let nul = CreateRun { prompt: "a\0b".into(), ..Default::default() };
        assert_eq!(nul.validate(), Err(SpecError::NulInPrompt));
        let blank = CreateRun { prompt: " \n".into(), ..Default::default() };
        assert_eq!(blank.validate(), Err(SpecError::EmptyPrompt));
    }

    #[test]
    fn allowed_tools_and_approval_parse_and_are_checked() {
        let s = spec(r#"{"prompt":"x","approval":"mutating","allowed_tools":["view","grep"]}"#).unwrap();
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(s.policy().approval, ApprovalMode::Mutating);
        assert!(spec(r#"{"prompt":"x","approval":"sometimes"}"#).is_err());
        let bad = spec(r#"{"prompt":"x","allowed_tools":["rm -rf"]}"#).unwrap();
        assert_eq!(bad.validate(), Err(SpecError::AllowedTools));
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
