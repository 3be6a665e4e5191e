//! Model providers: one trait, one streaming method, one event type.
//!
//! Each provider, named for its wire format ([`anthropic`] Messages,
//! [`openai_chat`] Chat Completions, [`openai_responses`] Responses), turns
//! that format's event stream into a stream of [`ModelEvent`]s; the agent
//! loop never sees a provider's JSON. A provider file builds the request;
//! its `decode` module reads the answer. What they share lives beside them:
//! the [`Endpoint`] that sends a request with its key, the SSE framing
//! (`sse`), lenient typed reading of events (`wire`).
//! [`assemble::AssistantBuilder`] folds the stream into the assistant
//! [`Message`] that is persisted.

pub mod anthropic;
pub mod assemble;
mod endpoint;
pub mod error;
pub mod kind;
pub mod openai_chat;
pub mod openai_responses;
pub mod pricing;
mod registry;
mod sse;
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod test_support;
mod wire;

use futures::stream::BoxStream;
use kiln_protocol::{Message, Usage};

pub use endpoint::Endpoint;
pub use error::ProviderError;
pub use registry::{DEFAULT_MODEL_READ_TIMEOUT, ProviderEndpoints, Providers};

/// A tool as the model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON schema of the arguments object.
    pub input_schema: serde_json::Value,
}

/// One model call.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    pub model: String,
    pub system: String,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    pub max_tokens: u32,
    pub temperature: Option<f32>,
    /// Cache the prompt's stable prefix under this key (the session id):
    /// Anthropic gets `cache_control` breakpoints, OpenAI `prompt_cache_key`.
    /// `None`: no caching fields are sent.
    pub cache_key: Option<String>,
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// The model finished its turn.
    EndTurn,
    /// The model wants its tool calls run.
    ToolUse,
    /// The output limit cut the answer short.
    MaxTokens,
    /// Anything else the provider reported (content filter, refusal, …).
    Other(String),
}

impl FinishReason {
    pub fn as_str(&self) -> &str {
        match self {
            FinishReason::EndTurn => "end_turn",
            FinishReason::ToolUse => "tool_use",
            FinishReason::MaxTokens => "max_tokens",
            FinishReason::Other(s) => s,
        }
    }
}

/// What a provider stream yields, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelEvent {
    TextDelta(String),
    ReasoningDelta(String),
    /// Signature of the reasoning block so far (Anthropic thinking).
    ReasoningSignature(String),
    /// A tool call begins. `index` identifies it among this response's calls.
    ToolCallStart {
        index: usize,
        id: String,
        name: String,
    },
    /// A piece of the call's JSON arguments; pieces may split anywhere.
    ToolCallDelta {
        index: usize,
        arguments: String,
    },
    /// Usage so far; later reports supersede earlier ones field by field.
    Usage(Usage),
    /// The response ended normally. Always the last event of a complete
    /// stream; a stream that ends without it is an error, never a success.
    Finish(FinishReason),
}

pub type ModelStream = BoxStream<'static, Result<ModelEvent, ProviderError>>;

/// A streaming model API.
#[async_trait::async_trait]
pub trait ModelProvider: Send + Sync {
    /// Provider name for logs and events (`openai`, `anthropic`).
    fn name(&self) -> &'static str;

    /// Sends the request and returns the response as events. Errors before
    /// the first byte (HTTP status, connection) come back as `Err`; errors
    /// mid-stream come as an `Err` item.
    async fn stream(&self, request: &ModelRequest) -> Result<ModelStream, ProviderError>;
}
