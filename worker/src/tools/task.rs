//! `task`: starts a sub-agent for a self-contained piece of work and
//! returns its final answer. This is the tool's face (name, description,
//! schema) and the interface it calls ([`TaskRunner`]); the work is
//! `subagent`'s, which implements it from above.

pub use kiln_protocol::agents::AgentKind;
use kiln_protocol::agents::GENERAL;
use serde::Deserialize;
use serde_json::Value;

use super::{Tool, ToolContext, ToolFailure, ToolOutcome, parse_arguments, schema_of};
use crate::providers::ToolSpec;

pub const NAME: &str = "task";

pub struct Task;

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

/// What runs a `task` call of one step (`subagent` implements it).
#[async_trait::async_trait]
pub trait TaskRunner: Send + Sync {
    /// Runs the child for the parent's call `call_id`: its final answer, or
    /// a tool error saying why there is none.
    async fn run_task(&self, call_id: &str, args: TaskArgs) -> ToolOutcome;
}

/// The kind a `task` call without `agent` starts: `general` when offered,
/// else the first offered.
pub fn default_kind<'k>(offered: &[&'k AgentKind]) -> Option<&'k AgentKind> {
    offered.iter().find(|k| k.name == GENERAL).or(offered.first()).copied()
}

/// What the model is told of the tool; [`spec_for`] adds the kinds.
const DESCRIPTION: &str = "Start a sub-agent for a self-contained task and get back its final answer (only that: \
     it sees none of this conversation, and you see none of its steps). Several task calls in one message run at \
     the same time; give each a complete prompt. Its spending counts against your budget.";

/// The tool as a run that offers `kinds` (not empty) shows it: the kinds
/// listed in the description and the only values `agent` takes.
pub fn spec_for(kinds: &[&AgentKind]) -> ToolSpec {
    let default = default_kind(kinds).map(|k| k.name.as_str()).unwrap_or_default();
    let mut description = format!("{DESCRIPTION}\n\nKinds of sub-agent (`agent`; default `{default}`):");
    for kind in kinds {
        description.push_str(&format!("\n- `{}`: {}", kind.name, kind.description));
    }
    let mut schema = schema_of::<TaskArgs>();
    if let Some(agent) = schema.pointer_mut("/properties/agent").and_then(Value::as_object_mut) {
        // `Option<String>` is `type: ["string", "null"]`; the enum says which strings.
        let names: Vec<Value> = kinds.iter().map(|k| Value::String(k.name.clone())).collect();
        agent.insert("type".into(), Value::String("string".into()));
        agent.insert("enum".into(), Value::Array(names));
        agent.insert("description".into(), Value::String(format!("The kind of sub-agent; default `{default}`.")));
    }
    ToolSpec { name: NAME.into(), description, input_schema: schema }
}

#[async_trait::async_trait]
impl Tool for Task {
    fn name(&self) -> &'static str {
        NAME
    }

    fn description(&self) -> &'static str {
        DESCRIPTION
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

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_protocol::agents::AgentKinds;

    #[test]
    fn the_spec_lists_only_the_offered_kinds() {
        let kinds = AgentKinds::builtin();
        let only = ["explore".to_owned()];
        let spec = spec_for(&kinds.offered(Some(&only)));
        assert_eq!(spec.input_schema["properties"]["agent"]["enum"], serde_json::json!(["explore"]));
        assert!(spec.description.contains("`explore`: read-only"), "{}", spec.description);
        assert!(!spec.description.contains("`general`"), "{}", spec.description);
        let all = spec_for(&kinds.offered(None));
        assert_eq!(all.input_schema["properties"]["agent"]["enum"], serde_json::json!(["explore", "general"]));
        assert!(all.description.contains("default `general`"));
    }
}
