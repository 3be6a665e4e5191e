//! OpenAI Chat Completions, streamed: api.openai.com and the many servers
//! that copy it (vLLM, llama.cpp server, Ollama, OpenRouter, Azure, LiteLLM).
//!
//! The decoder is lenient where compatible servers differ (a tool call index
//! starting at 1, missing `[DONE]`, reasoning under `reasoning` or
//! `reasoning_content`, chunks with no choices) and strict where it matters:
//! a stream without a `finish_reason` is truncated, never complete.

mod decode;

use bytes::Bytes;
use futures::Stream;
use kiln_protocol::{Message, Part, Role};
use serde::Serialize;
use serde_json::Value;

use super::endpoint::{Endpoint, KeyHeader};
use super::sse;
use super::{ModelProvider, ModelRequest, ModelStream, ProviderError, ToolSpec};
use decode::ChatDecoder;

/// OpenAI's own API; the same base URL serves the Responses API.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// A Chat Completions endpoint. Its base URL runs up to and including the
/// version segment, e.g. [`DEFAULT_BASE_URL`] or `http://localhost:8000/v1`;
/// the key goes as a bearer token, and local servers often need none.
#[derive(Debug, Clone)]
pub struct OpenAiChat {
    endpoint: Endpoint,
}

impl OpenAiChat {
    pub fn new(endpoint: Endpoint) -> Self {
        OpenAiChat { endpoint }
    }

    fn url(&self) -> String {
        format!("{}/chat/completions", self.endpoint.base())
    }
}

#[async_trait::async_trait]
impl ModelProvider for OpenAiChat {
    fn name(&self) -> &'static str {
        "openai"
    }

    async fn stream(&self, request: &ModelRequest) -> Result<ModelStream, ProviderError> {
        let http = self.endpoint.post(&self.url(), KeyHeader::Bearer).json(&request_body(request));
        self.endpoint.stream(http, ChatDecoder::default()).await
    }
}

/// Decodes a Chat Completions event-stream body. Public so tests elsewhere
/// can replay recorded bytes through the production decoder.
pub fn decode_stream<S, E>(bytes: S) -> ModelStream
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: Into<ProviderError> + Send + 'static,
{
    sse::decode_stream(bytes, ChatDecoder::default())
}

// ---------------------------------------------------------------------------
// Request

#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: Vec<ChatMessage<'a>>,
    /// Omitted when empty: some compatible servers reject `"tools": []`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<ChatTool<'a>>,
    /// `max_tokens` rather than `max_completion_tokens`: vLLM, llama.cpp and
    /// Ollama understand only the older name.
    max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    stream: bool,
    stream_options: StreamOptions,
    /// Routes requests sharing a prefix to the same cache (the session id).
    /// Servers that do not know it ignore it (llama.cpp, vLLM, Ollama).
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_cache_key: Option<&'a str>,
}

#[derive(Serialize)]
struct StreamOptions {
    /// Asks for the final usage chunk (`choices: []`).
    include_usage: bool,
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum ChatMessage<'a> {
    System {
        content: String,
    },
    User {
        content: String,
    },
    Assistant {
        /// `null` when the turn is only tool calls.
        content: Option<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<WireToolCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: &'a str,
    },
}

#[derive(Serialize)]
struct WireToolCall<'a> {
    id: &'a str,
    r#type: &'static str,
    function: WireFunctionCall<'a>,
}

#[derive(Serialize)]
struct WireFunctionCall<'a> {
    name: &'a str,
    /// The API wants the arguments as a JSON string, not an object.
    arguments: String,
}

#[derive(Serialize)]
struct ChatTool<'a> {
    r#type: &'static str,
    function: ChatFunction<'a>,
}

#[derive(Serialize)]
struct ChatFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

fn request_body(request: &ModelRequest) -> ChatRequest<'_> {
    let mut messages = Vec::new();
    if !request.system.is_empty() {
        messages.push(ChatMessage::System { content: request.system.clone() });
    }
    for message in &request.messages {
        push_message(message, &mut messages);
    }
    ChatRequest {
        model: &request.model,
        messages,
        tools: request.tools.iter().map(tool).collect(),
        max_tokens: request.max_tokens,
        temperature: request.temperature,
        stream: true,
        stream_options: StreamOptions { include_usage: true },
        prompt_cache_key: request.cache_key.as_deref(),
    }
}

fn tool(spec: &ToolSpec) -> ChatTool<'_> {
    ChatTool {
        r#type: "function",
        function: ChatFunction { name: &spec.name, description: &spec.description, parameters: &spec.input_schema },
    }
}

/// Maps one Kiln message. Tool results become `role: tool` messages, placed
/// before any text of the same message because the API wants them right
/// after the assistant turn that asked. Reasoning is not sent back: the
/// Chat Completions API has no field for it.
fn push_message<'a>(message: &'a Message, out: &mut Vec<ChatMessage<'a>>) {
    for part in &message.parts {
        if let (Part::ToolResult { output, .. }, Some(tool_call_id)) = (part, part.wire_id()) {
            out.push(ChatMessage::Tool { tool_call_id, content: output });
        }
    }
    let text = message.text();
    match message.role {
        Role::System if !text.is_empty() => out.push(ChatMessage::System { content: text }),
        Role::User if !text.is_empty() => out.push(ChatMessage::User { content: text }),
        Role::Assistant => {
            let tool_calls: Vec<WireToolCall<'a>> = message
                .wire_tool_calls()
                .map(|(id, name, arguments)| WireToolCall {
                    id,
                    r#type: "function",
                    function: WireFunctionCall { name, arguments: arguments.to_string() },
                })
                .collect();
            // An assistant message with neither text nor calls (only
            // reasoning) is rejected by several servers; it carries nothing.
            if !text.is_empty() || !tool_calls.is_empty() {
                let content = (!text.is_empty()).then_some(text);
                out.push(ChatMessage::Assistant { content, tool_calls });
            }
        }
        // A tool message's text parts have no place on the wire.
        Role::System | Role::User | Role::Tool => {}
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
#[path = "openai_chat_tests.rs"]
mod tests;
