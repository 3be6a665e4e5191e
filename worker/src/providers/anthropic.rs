//! Anthropic Messages API, streamed.
//!
//! The stream is a sequence of typed events (`message_start`,
//! `content_block_start/delta/stop` per content block, `message_delta`,
//! `message_stop`, `ping`, `error`); only `message_stop` proves the answer
//! complete.

mod decode;

use std::borrow::Cow;

use bytes::Bytes;
use futures::Stream;
use kiln_protocol::{Message, Part, Role};
use serde::Serialize;
use serde_json::Value;

use super::endpoint::{Endpoint, KeyHeader};
use super::sse;
use super::{ModelProvider, ModelRequest, ModelStream, ProviderError, ToolSpec};
use decode::MessagesDecoder;

/// Anthropic's own API.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The API version whose event stream this module decodes.
const API_VERSION: &str = "2023-06-01";

/// The Messages API at `{base_url}/v1/messages`. Its base URL comes without
/// the `/v1` segment, e.g. [`DEFAULT_BASE_URL`]; the key goes as
/// `x-api-key`, and a proxy that adds its own may need none.
#[derive(Debug, Clone)]
pub struct Anthropic {
    endpoint: Endpoint,
}

impl Anthropic {
    pub fn new(endpoint: Endpoint) -> Self {
        Anthropic { endpoint }
    }

    fn url(&self) -> String {
        let base = self.endpoint.base();
        // Tolerate a base URL given with the version segment, as OpenAI
        // base URLs are written.
        let base = base.strip_suffix("/v1").unwrap_or(base);
        format!("{base}/v1/messages")
    }
}

#[async_trait::async_trait]
impl ModelProvider for Anthropic {
    fn name(&self) -> &'static str {
        "anthropic"
    }

    async fn stream(&self, request: &ModelRequest) -> Result<ModelStream, ProviderError> {
        let http = self
            .endpoint
            .post(&self.url(), KeyHeader::Named("x-api-key"))
            .header("anthropic-version", API_VERSION)
            .json(&request_body(request));
        self.endpoint.stream(http, MessagesDecoder::default()).await
    }
}

/// Decodes a Messages API event-stream body. Public so tests elsewhere can
/// replay recorded bytes through the production decoder.
pub fn decode_stream<S, E>(bytes: S) -> ModelStream
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: Into<ProviderError> + Send + 'static,
{
    sse::decode_stream(bytes, MessagesDecoder::default())
}

// ---------------------------------------------------------------------------
// Request

#[derive(Serialize)]
struct MessagesRequest<'a> {
    model: &'a str,
    max_tokens: u32,
    #[serde(skip_serializing_if = "String::is_empty")]
    system: String,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    stream: bool,
}

#[derive(Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    content: Vec<Block<'a>>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Thinking { thinking: &'a str, signature: &'a str },
    Text { text: &'a str },
    ToolUse { id: &'a str, name: &'a str, input: Cow<'a, Value> },
    ToolResult { tool_use_id: &'a str, content: &'a str, is_error: bool },
}

#[derive(Serialize)]
struct WireTool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
}

fn request_body(request: &ModelRequest) -> MessagesRequest<'_> {
    // The API takes system text only as a top-level field; Kiln system
    // messages (e.g. a compaction summary) are appended there.
    let mut system = request.system.clone();
    for message in request.messages.iter().filter(|m| m.role == Role::System) {
        let text = message.text();
        if !text.is_empty() {
            if !system.is_empty() {
                system.push_str("\n\n");
            }
            system.push_str(&text);
        }
    }
    MessagesRequest {
        model: &request.model,
        max_tokens: request.max_tokens,
        system,
        messages: wire_messages(&request.messages),
        tools: request.tools.iter().map(tool).collect(),
        temperature: request.temperature,
        stream: true,
    }
}

fn tool(spec: &ToolSpec) -> WireTool<'_> {
    WireTool { name: &spec.name, description: &spec.description, input_schema: &spec.input_schema }
}

/// Maps Kiln messages to the API's strictly alternating user/assistant
/// turns: tool results travel in a user turn, and consecutive turns of the
/// same role are merged.
fn wire_messages(messages: &[Message]) -> Vec<WireMessage<'_>> {
    let mut out: Vec<WireMessage<'_>> = Vec::new();
    for message in messages {
        let (role, content) = match message.role {
            Role::System => continue,
            Role::Assistant => ("assistant", assistant_blocks(message)),
            Role::User | Role::Tool => ("user", user_blocks(message)),
        };
        if content.is_empty() {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.role == role => last.content.extend(content),
            _ => out.push(WireMessage { role, content }),
        }
    }
    for message in out.iter_mut().filter(|m| m.role == "user") {
        // The API wants a user turn's tool results before its text (a
        // steering message queued after tool results merges into that turn).
        let (mut ordered, text): (Vec<_>, Vec<_>) =
            message.content.drain(..).partition(|b| matches!(b, Block::ToolResult { .. }));
        ordered.extend(text);
        message.content = ordered;
    }
    out
}

fn assistant_blocks(message: &Message) -> Vec<Block<'_>> {
    message
        .parts
        .iter()
        .filter_map(|part| match part {
            // Only thinking Anthropic signed may be sent back; unsigned
            // reasoning, or another provider's, would be rejected.
            Part::Reasoning { text, signature: Some(signature) }
                if !signature.is_empty() && !signature.starts_with(super::openai_responses::ENCRYPTED_PREFIX) =>
            {
                Some(Block::Thinking { thinking: text, signature })
            }
            Part::Text { text } if !text.is_empty() => Some(Block::Text { text }),
            Part::ToolCall { name, arguments, .. } => {
                // `input` must be an object; the assembler guarantees it,
                // this guards stored data from elsewhere.
                let input = if arguments.is_object() {
                    Cow::Borrowed(arguments)
                } else {
                    Cow::Owned(Value::Object(Default::default()))
                };
                // The provider's id: its results must name it.
                Some(Block::ToolUse { id: part.wire_id()?, name, input })
            }
            _ => None,
        })
        .collect()
}

fn user_blocks(message: &Message) -> Vec<Block<'_>> {
    message
        .parts
        .iter()
        .filter_map(|part| match part {
            // Empty text blocks are rejected by the API.
            Part::Text { text } if !text.is_empty() => Some(Block::Text { text }),
            Part::ToolResult { output, is_error, .. } => Some(Block::ToolResult {
                tool_use_id: part.wire_id()?,
                content: if output.is_empty() { "(no output)" } else { output },
                is_error: *is_error,
            }),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
#[path = "anthropic_tests.rs"]
mod tests;
