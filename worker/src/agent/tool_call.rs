//! A tool call the model asked for, as the loop carries it from the model's
//! message through the gate and the sandbox to its result.

use std::time::Duration;

use kiln_protocol::{EventBody, Message, Part};
use serde_json::Value;

use crate::tools::ToolOutcome;

#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The model's id for the call, which its result must name.
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

impl ToolCall {
    /// The calls of `message`, in the model's order.
    pub fn all_in(message: &Message) -> Vec<ToolCall> {
        message
            .tool_calls()
            .map(|(id, name, arguments)| ToolCall {
                id: id.to_owned(),
                name: name.to_owned(),
                arguments: arguments.clone(),
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
        }
    }
}
