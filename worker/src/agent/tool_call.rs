//! A tool call the model asked for, as the loop carries it from the model's
//! message through the gate and the sandbox to its result.

use std::time::Duration;

use kiln_protocol::{EventBody, Message, Part};
use serde_json::Value;

use crate::tools::ToolOutcome;

#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// Kiln's id for the call, unique within the run: its events, its
    /// approval and its result name it.
    pub id: String,
    pub name: String,
    pub arguments: Value,
    /// The provider's id, which the result carries back on the wire
    /// (`None`: the same as `id`).
    pub provider_id: Option<String>,
}

impl ToolCall {
    /// The calls of `message`, in the model's order.
    pub fn all_in(message: &Message) -> Vec<ToolCall> {
        message
            .parts
            .iter()
            .filter_map(|part| match part {
                Part::ToolCall { id, name, arguments, provider_id } => Some(ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: arguments.clone(),
                    provider_id: provider_id.clone(),
                }),
                _ => None,
            })
            .collect()
    }

    /// `tool_call.ready`: the call is complete and about to go to the gate.
    pub fn ready_event(&self) -> EventBody {
        EventBody::ToolCallReady {
            call_id: self.id.clone(),
            name: self.name.clone(),
            arguments: self.arguments.clone(),
        }
    }

    /// `tool.result`: what the call came to.
    pub fn result_event(&self, outcome: &ToolOutcome, took: Duration) -> EventBody {
        EventBody::ToolResult {
            call_id: self.id.clone(),
            name: self.name.clone(),
            output: outcome.output.clone(),
            is_error: outcome.is_error,
            duration_ms: took.as_millis() as u64,
        }
    }

    /// The part of the tool message that answers the call.
    pub fn result_part(&self, outcome: ToolOutcome) -> Part {
        Part::ToolResult {
            call_id: self.id.clone(),
            name: self.name.clone(),
            output: outcome.output,
            is_error: outcome.is_error,
            provider_call_id: self.provider_id.clone(),
        }
    }
}
