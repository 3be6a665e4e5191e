//! Sub-agents: the `task` tool starts a child run in the parent's session
//! and sandbox, with its own conversation, system prompt, tools (narrowed by
//! its [`kinds::AgentKind`]) and a budget carved from the parent's
//! ([`share`]). Only the child's final answer returns to the parent, as the
//! call's result; what the child spent counts in the parent's budget and
//! totals; its step- and tool-level events also appear, tagged, in the
//! parent's stream ([`forward`]).
//!
//! A child is driven inside its parent's worker task (see `child` and
//! docs/architecture.md, "Sub-agents", for why), under a lease of its own.

mod child;
pub mod forward;
pub mod kinds;
pub mod share;

use std::sync::{Arc, Mutex, PoisonError};

use kiln_protocol::{Limits, Run, Usage};
use kiln_store::Lease;
use serde::Deserialize;
use tokio::sync::Semaphore;

use crate::claim_loop::WorkerContext;
use crate::sandbox::Sandbox;
use crate::tools::ToolOutcome;

/// The deployment's sub-agent settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Children of one run (its whole tree) that run at once; more wait.
    pub max_parallel: usize,
    /// How deep the tree may go: 1 lets the main run start children, which
    /// cannot start their own.
    pub max_depth: u32,
    /// The kinds a `task` call may start (`KILN_AGENT_KINDS` and the
    /// built-in ones); a run's `agents` narrows them.
    pub kinds: Arc<kinds::AgentKinds>,
}

/// Default of [`Settings::max_parallel`].
pub const DEFAULT_MAX_PARALLEL: usize = 4;
/// Default of [`Settings::max_depth`].
pub const DEFAULT_MAX_DEPTH: u32 = 1;

impl Default for Settings {
    fn default() -> Self {
        Settings { max_parallel: DEFAULT_MAX_PARALLEL, max_depth: DEFAULT_MAX_DEPTH, kinds: Default::default() }
    }
}

/// The arguments of a `task` call.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskArgs {
    /// A short (3-8 words) description of the task, shown to people watching.
    pub description: String,
    /// The task for the sub-agent, complete and self-contained: it sees
    /// nothing of this conversation.
    pub prompt: String,
    /// The kind of sub-agent (the tool's description lists them).
    #[serde(default)]
    pub agent: Option<String>,
}

/// An agent's place in its run's tree of agents, and what starting a
/// child takes.
#[derive(Clone)]
pub struct Seat {
    pub ctx: Arc<WorkerContext>,
    /// 0 for the main run.
    pub depth: u32,
    /// `main` for the main run; a child's is its parent's plus its own part.
    pub path: String,
    /// Shared by the whole tree: children running at once.
    pub slots: Arc<Semaphore>,
}

impl Seat {
    /// The main run's seat.
    pub fn root(ctx: Arc<WorkerContext>) -> Self {
        let slots = Arc::new(Semaphore::new(ctx.config.subagents.max_parallel.max(1)));
        Seat { ctx, depth: 0, path: "main".to_owned(), slots }
    }

    /// Whether this agent may start children (the depth limit).
    pub fn may_spawn(&self) -> bool {
        self.depth < self.ctx.config.subagents.max_depth
    }
}

/// What the `task` calls of one step of a parent need.
pub struct StepHost<'a> {
    pub seat: &'a Seat,
    pub run: &'a Run,
    pub lease: &'a Lease,
    pub sandbox: &'a Sandbox,
    /// The parent's tools: a child's are narrowed from these, and it shares
    /// the parent's MCP servers (started and connected once per run).
    pub tools: &'a crate::tools::Toolset,
    /// The parent's `AGENTS.md`, which its children's prompts take too
    /// (`None`: not read yet, e.g. while a takeover re-runs `task` calls,
    /// and each child reads it).
    pub agents_md: Option<Option<String>>,
    /// What each child's budget is carved from.
    pub budget: Carving,
    /// What this step's children spent, for the parent's budget.
    pub spent: Mutex<Spend>,
}

/// What the parent has left for its children, and how many this step starts.
#[derive(Debug, Clone, Copy)]
pub struct Carving {
    pub limits: Limits,
    pub spent: share::Spent,
    /// The step's `task` calls.
    pub children: u32,
}

impl Carving {
    /// The budget of one child of `kind`, or why there is none.
    pub fn share(&self, kind: &kinds::AgentKind) -> Result<Limits, String> {
        share::share(&self.limits, &self.spent, self.children, kind.budget_share)
    }
}

/// Model spend of children.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spend {
    pub usage: Usage,
    /// `None` once a step had no price.
    pub cost_usd: Option<f64>,
    pub steps: u32,
}

impl Default for Spend {
    fn default() -> Self {
        Spend { usage: Usage::default(), cost_usd: Some(0.0), steps: 0 }
    }
}

impl Spend {
    pub fn add(&mut self, other: &Spend) {
        self.usage.add(&other.usage);
        self.cost_usd = match (self.cost_usd, other.cost_usd) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
        self.steps += other.steps;
    }
}

impl StepHost<'_> {
    /// Runs the child for the parent's call `call_id`: its final answer, or
    /// a tool error saying why there is none.
    pub async fn run_task(&self, call_id: &str, args: TaskArgs) -> ToolOutcome {
        child::run(self, call_id, args).await
    }

    /// What this step's children spent.
    pub fn take_spent(&self) -> Spend {
        std::mem::take(&mut *self.spent.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn record(&self, spend: &Spend) {
        self.spent.lock().unwrap_or_else(PoisonError::into_inner).add(spend);
    }
}
