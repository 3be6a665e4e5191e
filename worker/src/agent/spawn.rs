//! Starting sub-agents, as the loop sees it. The loop owns this interface
//! and `subagent` implements it from above ([`Spawner`] for an agent's seat
//! in its tree, [`StepTasks`] for the `task` calls of one step), so the loop
//! never imports the sub-agents that drive loops of their own.

use std::time::Duration;

use kiln_protocol::agents::AgentKind;
use kiln_protocol::{Limits, Run, Usage};
use kiln_store::Lease;

use crate::sandbox::Sandbox;
use crate::tools::task::TaskRunner;
use crate::toolset::Toolset;

/// An agent's place in its run's tree of agents: whether and what it may
/// start.
pub trait Spawner: Send + Sync {
    /// Whether this agent may start children (the depth limit).
    fn may_spawn(&self) -> bool;

    /// The kinds of child `run`'s `task` tool offers.
    fn offered<'s>(&'s self, run: &Run) -> Vec<&'s AgentKind>;

    /// What runs the `task` calls of one step.
    fn step<'s>(&'s self, step: Step<'s>) -> Box<dyn StepTasks + 's>;
}

/// The `task` calls of one step: run them, then say what they spent.
pub trait StepTasks: TaskRunner {
    /// What this step's children spent, for the parent's budget.
    fn take_spent(&self) -> Spend;
}

/// What a step's children start from.
pub struct Step<'a> {
    pub run: &'a Run,
    pub lease: &'a Lease,
    pub sandbox: &'a Sandbox,
    /// The parent's tools: a child's are narrowed from these, and it shares
    /// the parent's MCP servers (started and connected once per run).
    pub tools: &'a Toolset,
    /// The parent's `AGENTS.md`, which its children's prompts take too
    /// (`None`: not read yet, e.g. while a takeover re-runs `task` calls,
    /// and each child reads it).
    pub agents_md: Option<Option<String>>,
    /// The parent's limits, which the children's budgets are carved from.
    pub limits: Limits,
    pub spent: Spent,
    /// The step's `task` calls.
    pub children: u32,
}

/// What the parent has spent so far (its own steps and its children's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spent {
    pub steps: u32,
    pub tokens: u64,
    /// `None` when a step had no price.
    pub cost_usd: Option<f64>,
    pub elapsed: Duration,
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
