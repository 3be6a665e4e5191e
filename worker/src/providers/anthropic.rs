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
    #[serde(skip_serializing_if = "System::is_empty")]
    system: System,
    messages: Vec<MarkedMessage<'a>>,
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

/// The system prompt: plain text, or (with caching) one text block that
/// ends a cached prefix.
#[derive(Serialize)]
#[serde(untagged)]
enum System {
    Text(String),
    Blocks([SystemBlock; 1]),
}

impl System {
    fn is_empty(&self) -> bool {
        matches!(self, System::Text(text) if text.is_empty())
    }
}

#[derive(Serialize)]
struct SystemBlock {
    r#type: &'static str,
    text: String,
    cache_control: CacheControl,
}

/// A cache breakpoint: the prompt up to and including this block is
/// written to the cache, and a later request with the same prefix reads it.
#[derive(Serialize, Clone, Copy, Debug, PartialEq)]
struct CacheControl {
    r#type: &'static str,
}

const EPHEMERAL: CacheControl = CacheControl { r#type: "ephemeral" };

/// Breakpoints on the latest messages: the last one's prefix is the next
/// step's prefix, and the one before still matches when the last turn held
/// something sent once (a budget note). With the tools' and the system's,
/// four: the API's limit.
const MESSAGE_BREAKPOINTS: usize = 2;

#[derive(Serialize)]
struct MarkedMessage<'a> {
    role: &'static str,
    content: Vec<MarkedBlock<'a>>,
}

#[derive(Serialize)]
struct MarkedBlock<'a> {
    #[serde(flatten)]
    block: Block<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
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
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
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
    let cache = request.cache_key.is_some();
    let mut tools: Vec<WireTool<'_>> = request.tools.iter().map(tool).collect();
    // Tools come first in the prompt, then the system, then the messages:
    // each breakpoint caches everything before it.
    if cache && let Some(last) = tools.last_mut() {
        last.cache_control = Some(EPHEMERAL);
    }
    let system = if cache && !system.is_empty() {
        System::Blocks([SystemBlock { r#type: "text", text: system, cache_control: EPHEMERAL }])
    } else {
        System::Text(system)
    };
    let messages = mark_latest(wire_messages(&request.messages), if cache { MESSAGE_BREAKPOINTS } else { 0 });
    MessagesRequest {
        model: &request.model,
        max_tokens: request.max_tokens,
        system,
        messages,
        tools,
        temperature: request.temperature,
        stream: true,
    }
}

fn tool(spec: &ToolSpec) -> WireTool<'_> {
    WireTool { name: &spec.name, description: &spec.description, input_schema: &spec.input_schema, cache_control: None }
}

/// Puts a breakpoint on the last block of each of the last `count`
/// messages (a thinking block cannot carry one: the last block that can).
fn mark_latest(messages: Vec<WireMessage<'_>>, count: usize) -> Vec<MarkedMessage<'_>> {
    let marked_from = messages.len().saturating_sub(count);
    messages
        .into_iter()
        .enumerate()
        .map(|(index, message)| {
            let anchor = (index >= marked_from)
                .then(|| message.content.iter().rposition(|b| !matches!(b, Block::Thinking { .. })))
                .flatten();
            let content = message
                .content
                .into_iter()
                .enumerate()
                .map(|(at, block)| MarkedBlock { block, cache_control: (Some(at) == anchor).then_some(EPHEMERAL) })
                .collect();
            MarkedMessage { role: message.role, content }
        })
        .collect()
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
