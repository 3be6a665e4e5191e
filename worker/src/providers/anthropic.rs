//! Anthropic Messages API, streamed.
//!
//! The stream is a sequence of typed events (`message_start`,
//! `content_block_start/delta/stop` per content block, `message_delta`,
//! `message_stop`, `ping`, `error`); only `message_stop` proves the answer
//! complete.

use std::borrow::Cow;

use bytes::Bytes;
use futures::Stream;
use kiln_protocol::{Message, Part, Role, Usage};
use serde::Serialize;
use serde_json::Value;

use super::endpoint::{Endpoint, KeyHeader};
use super::sse::{self, Decoder, Flow, SseEvent};
use super::{FinishReason, ModelEvent, ModelProvider, ModelRequest, ModelStream, ProviderError, ToolSpec};

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
        let body = request_body(request);
        let (key, headers) = (KeyHeader::Named("x-api-key"), [("anthropic-version", API_VERSION)]);
        self.endpoint.stream(&self.url(), key, &headers, &body, MessagesDecoder::default()).await
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
            Part::ToolCall { id, name, arguments } => {
                // `input` must be an object; the assembler guarantees it,
                // this guards stored data from elsewhere.
                let input = if arguments.is_object() {
                    Cow::Borrowed(arguments)
                } else {
                    Cow::Owned(Value::Object(Default::default()))
                };
                Some(Block::ToolUse { id, name, input })
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
            Part::ToolResult { call_id, output, is_error, .. } => Some(Block::ToolResult {
                tool_use_id: call_id,
                content: if output.is_empty() { "(no output)" } else { output },
                is_error: *is_error,
            }),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Response

/// State of one streamed Messages response.
#[derive(Default)]
struct MessagesDecoder {
    /// Usage so far: `message_start` reports input and cache tokens,
    /// `message_delta` the cumulative output (and, on newer API versions,
    /// input again). Sent whole each time so a later report supersedes.
    usage: Usage,
    stop_reason: Option<String>,
    /// Content block indexes that are client tool calls. `input_json_delta`
    /// for other blocks (server tools) must not reach the assembler.
    tool_blocks: Vec<usize>,
}

impl Decoder for MessagesDecoder {
    fn on_event(&mut self, event: &SseEvent, out: &mut Vec<ModelEvent>) -> Result<Flow, ProviderError> {
        let data = event.data.trim();
        if data.is_empty() {
            return Ok(Flow::Continue);
        }
        let json: Value = serde_json::from_str(data)
            .map_err(|e| ProviderError::decode(&format!("event data is not JSON ({e})"), data))?;
        // The data's own `type` is authoritative; the SSE event name is the
        // fallback for proxies that strip it.
        let kind = json.get("type").and_then(Value::as_str).unwrap_or(&event.event);
        match kind {
            "message_start" => {
                if let Some(usage) = json.get("message").and_then(|m| m.get("usage")) {
                    self.merge_usage(usage, out);
                }
            }
            "content_block_start" => self.on_block_start(&json, out)?,
            "content_block_delta" => self.on_block_delta(&json, out)?,
            "message_delta" => {
                if let Some(reason) = json.get("delta").and_then(|d| d.get("stop_reason")).and_then(Value::as_str) {
                    self.stop_reason = Some(reason.to_owned());
                }
                if let Some(usage) = json.get("usage") {
                    self.merge_usage(usage, out);
                }
            }
            "message_stop" => {
                out.push(ModelEvent::Finish(self.finish_reason()));
                return Ok(Flow::Done);
            }
            "error" => return Err(ProviderError::from_stream_error(&json)),
            // ping, content_block_stop, and event types added after this was
            // written.
            _ => {}
        }
        Ok(Flow::Continue)
    }

    fn on_end(&mut self, _out: &mut Vec<ModelEvent>) -> Result<(), ProviderError> {
        Err(ProviderError::Truncated)
    }
}

impl MessagesDecoder {
    fn on_block_start(&mut self, json: &Value, out: &mut Vec<ModelEvent>) -> Result<(), ProviderError> {
        let index = block_index(json)?;
        let Some(block) = json.get("content_block") else {
            return Ok(());
        };
        match block.get("type").and_then(Value::as_str) {
            Some("text") => push_text(out, block, "text", ModelEvent::TextDelta),
            Some("thinking") => {
                push_text(out, block, "thinking", ModelEvent::ReasoningDelta);
                push_text(out, block, "signature", ModelEvent::ReasoningSignature);
            }
            Some("tool_use") => {
                let field = |key: &str| block.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
                self.tool_blocks.push(index);
                out.push(ModelEvent::ToolCallStart { index, id: field("id"), name: field("name") });
                // Streaming starts `input` as `{}` and sends the JSON as
                // deltas; should a server put the whole input here instead,
                // it is the call's arguments.
                if let Some(input) = block.get("input").filter(|i| i.as_object().is_some_and(|o| !o.is_empty())) {
                    out.push(ModelEvent::ToolCallDelta { index, arguments: input.to_string() });
                }
            }
            // redacted_thinking, server_tool_use, web search results…: Kiln
            // has no part for them and must not run server tools itself.
            _ => {}
        }
        Ok(())
    }

    fn on_block_delta(&mut self, json: &Value, out: &mut Vec<ModelEvent>) -> Result<(), ProviderError> {
        let index = block_index(json)?;
        let Some(delta) = json.get("delta") else {
            return Ok(());
        };
        match delta.get("type").and_then(Value::as_str) {
            Some("text_delta") => push_text(out, delta, "text", ModelEvent::TextDelta),
            Some("thinking_delta") => push_text(out, delta, "thinking", ModelEvent::ReasoningDelta),
            Some("signature_delta") => push_text(out, delta, "signature", ModelEvent::ReasoningSignature),
            Some("input_json_delta") if self.tool_blocks.contains(&index) => {
                if let Some(piece) = delta.get("partial_json").and_then(Value::as_str).filter(|s| !s.is_empty()) {
                    out.push(ModelEvent::ToolCallDelta { index, arguments: piece.to_owned() });
                }
            }
            // citations_delta and future kinds.
            _ => {}
        }
        Ok(())
    }

    /// Fields present in a usage report replace ours; absent or null ones
    /// keep what an earlier report said.
    fn merge_usage(&mut self, report: &Value, out: &mut Vec<ModelEvent>) {
        let Some(report) = report.as_object() else {
            return;
        };
        let fields: [(&str, &mut u64); 4] = [
            ("input_tokens", &mut self.usage.input_tokens),
            ("output_tokens", &mut self.usage.output_tokens),
            ("cache_read_input_tokens", &mut self.usage.cache_read_tokens),
            ("cache_creation_input_tokens", &mut self.usage.cache_write_tokens),
        ];
        for (key, slot) in fields {
            if let Some(n) = report.get(key).and_then(Value::as_u64) {
                *slot = n;
            }
        }
        out.push(ModelEvent::Usage(self.usage));
    }

    fn finish_reason(&self) -> FinishReason {
        match self.stop_reason.as_deref() {
            Some("end_turn" | "stop_sequence") => FinishReason::EndTurn,
            Some("tool_use") => FinishReason::ToolUse,
            Some("max_tokens") => FinishReason::MaxTokens,
            Some(other) => FinishReason::Other(other.to_owned()),
            // A message_stop with no stop_reason before it: complete, but
            // with nothing to say why it stopped.
            None => FinishReason::Other("unknown".to_owned()),
        }
    }
}

fn block_index(json: &Value) -> Result<usize, ProviderError> {
    json.get("index")
        .and_then(Value::as_u64)
        .and_then(|i| usize::try_from(i).ok())
        .ok_or_else(|| ProviderError::decode("content block event without an index", &json.to_string()))
}

/// Pushes `make(value[key])` when that is a non-empty string.
fn push_text(out: &mut Vec<ModelEvent>, value: &Value, key: &str, make: fn(String) -> ModelEvent) {
    if let Some(text) = value.get(key).and_then(Value::as_str).filter(|s| !s.is_empty()) {
        out.push(make(text.to_owned()));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
#[path = "anthropic_tests.rs"]
mod tests;
