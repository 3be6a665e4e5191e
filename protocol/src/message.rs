//! The conversation: messages are the durable state the agent loop reloads
//! to resume.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// One piece of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    Text {
        text: String,
    },
    Reasoning {
        text: String,
        /// Providers that sign their reasoning (Anthropic) need the
        /// signature echoed back on the next request.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    ToolCall {
        /// Kiln's id for the call, unique within its run: events, approvals
        /// and the API name the call by it.
        id: String,
        name: String,
        /// Parsed JSON arguments. A call whose JSON never parsed is never
        /// stored as a tool call.
        arguments: serde_json::Value,
        /// The provider's id for the call, which only travels back to the
        /// provider (its results must name it there). Providers repeat ids
        /// (`call_0` every step, one id twice in an answer), so nothing of
        /// Kiln's keys on it. `None`: the same as `id` (a message stored
        /// before Kiln issued its own ids).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        provider_id: Option<String>,
    },
    ToolResult {
        /// Kiln's id of the call answered.
        call_id: String,
        name: String,
        output: String,
        is_error: bool,
        /// The provider's id of the call answered (see [`Part::ToolCall`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        provider_call_id: Option<String>,
    },
}

impl Part {
    /// The id the provider knows a tool call or result by: what goes on
    /// the wire. `None` for the other parts.
    pub fn wire_id(&self) -> Option<&str> {
        match self {
            Part::ToolCall { id, provider_id, .. } => Some(provider_id.as_deref().unwrap_or(id)),
            Part::ToolResult { call_id, provider_call_id, .. } => Some(provider_call_id.as_deref().unwrap_or(call_id)),
            Part::Text { .. } | Part::Reasoning { .. } => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub parts: Vec<Part>,
}

impl Message {
    pub fn user(text: impl Into<String>) -> Self {
        Message { role: Role::User, parts: vec![Part::Text { text: text.into() }] }
    }

    pub fn system(text: impl Into<String>) -> Self {
        Message { role: Role::System, parts: vec![Part::Text { text: text.into() }] }
    }

    /// All text parts joined, for summaries and logs.
    pub fn text(&self) -> String {
        self.parts
            .iter()
            .filter_map(|p| match p {
                Part::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("")
    }

    /// The tool calls, each with Kiln's id, its name and its arguments.
    pub fn tool_calls(&self) -> impl Iterator<Item = (&str, &str, &serde_json::Value)> {
        self.parts.iter().filter_map(|p| match p {
            Part::ToolCall { id, name, arguments, .. } => Some((id.as_str(), name.as_str(), arguments)),
            _ => None,
        })
    }

    /// The tool calls as the provider knows them: its id (see
    /// [`Part::wire_id`]), the name and the arguments.
    pub fn wire_tool_calls(&self) -> impl Iterator<Item = (&str, &str, &serde_json::Value)> {
        self.parts.iter().filter_map(|p| match (p, p.wire_id()) {
            (Part::ToolCall { name, arguments, .. }, Some(id)) => Some((id, name.as_str(), arguments)),
            _ => None,
        })
    }
}

/// Token usage of one model call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(default)]
    pub cache_read_tokens: u64,
    #[serde(default)]
    pub cache_write_tokens: u64,
}

impl Usage {
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cache_read_tokens += other.cache_read_tokens;
        self.cache_write_tokens += other.cache_write_tokens;
    }
}
