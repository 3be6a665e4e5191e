//! `task`: starts a sub-agent for a self-contained piece of work and
//! returns its final answer. The work is `subagent`'s; this is the tool's
//! face (name, description, schema).

use serde_json::Value;

use super::{Tool, ToolContext, ToolFailure, ToolOutcome, parse_arguments, schema_of};
use crate::subagent::TaskArgs;

pub const NAME: &str = "task";

pub struct Task;

#[async_trait::async_trait]
impl Tool for Task {
    fn name(&self) -> &'static str {
        NAME
    }

    fn description(&self) -> &'static str {
        "Start a sub-agent for a self-contained task and get back its final answer (only that: it sees none of \
         this conversation, and you see none of its steps). Kinds: `general` (default; the tools you have) and \
         `explore` (read-only: view, grep, glob, ls). Several task calls in one message run at the same time; \
         give each a complete prompt. Its spending counts against your budget."
    }

    fn schema(&self) -> Value {
        schema_of::<TaskArgs>()
    }

    /// The parent only waits; what a child changes goes through the
    /// child's own tools and their approval gate.
    fn is_mutating(&self) -> bool {
        false
    }

    async fn call(&self, ctx: &ToolContext<'_>, args: Value) -> Result<ToolOutcome, ToolFailure> {
        let args: TaskArgs = match parse_arguments(NAME, args) {
            Ok(args) => args,
            Err(outcome) => return Ok(outcome),
        };
        match ctx.subagents {
            Some(host) => Ok(host.run_task(ctx.call_id, args).await),
            None => Ok(ToolOutcome::error("the task tool is not available to this agent")),
        }
    }
}
