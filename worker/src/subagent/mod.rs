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

use kiln_protocol::agents::AgentKind;
use kiln_protocol::{Limits, Run};
use kiln_store::Lease;
use tokio::sync::Semaphore;

pub use crate::agent::spawn::Spend;
use crate::agent::spawn::{Spawner, Step, StepTasks};
use crate::context::WorkerContext;
use crate::sandbox::Sandbox;
use crate::tools::ToolOutcome;
use crate::tools::task::{TaskArgs, TaskRunner};

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

impl Spawner for Seat {
    fn may_spawn(&self) -> bool {
        Seat::may_spawn(self)
    }

    fn offered<'s>(&'s self, run: &Run) -> Vec<&'s AgentKind> {
        kinds::offered(&self.ctx.config.subagents.kinds, run)
    }

    fn step<'s>(&'s self, step: Step<'s>) -> Box<dyn StepTasks + 's> {
        Box::new(StepHost {
            seat: self,
            run: step.run,
            lease: step.lease,
            sandbox: step.sandbox,
            tools: step.tools,
            agents_md: step.agents_md,
            budget: Carving { limits: step.limits, spent: step.spent, children: step.children },
            spent: Mutex::default(),
        })
    }
}

/// What the `task` calls of one step of a parent need.
pub struct StepHost<'a> {
    pub seat: &'a Seat,
    pub run: &'a Run,
    pub lease: &'a Lease,
    pub sandbox: &'a Sandbox,
    /// The parent's tools (see [`Step::tools`]).
    pub tools: &'a crate::toolset::Toolset,
    /// The parent's `AGENTS.md` (see [`Step::agents_md`]).
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

#[async_trait::async_trait]
impl TaskRunner for StepHost<'_> {
    /// Runs the child for the parent's call `call_id`: its final answer, or
    /// a tool error saying why there is none.
    async fn run_task(&self, call_id: &str, args: TaskArgs) -> ToolOutcome {
        child::run(self, call_id, args).await
    }
}

impl StepTasks for StepHost<'_> {
    fn take_spent(&self) -> Spend {
        std::mem::take(&mut *self.spent.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl StepHost<'_> {
    fn record(&self, spend: &Spend) {
        self.spent.lock().unwrap_or_else(PoisonError::into_inner).add(spend);
    }
}
