//! Decoding a streamed Messages API response: the events as typed
//! structs, and the state that turns them into [`ModelEvent`]s.

use kiln_protocol::Usage;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::providers::sse::{Decoder, Flow, SseEvent};
use crate::providers::wire;
use crate::providers::{FinishReason, ModelEvent, ProviderError};

/// State of one streamed Messages response.
#[derive(Default)]
pub(super) struct MessagesDecoder {
    /// Usage so far: `message_start` reports input and cache tokens,
    /// `message_delta` the cumulative output (and, on newer API versions,
    /// input again). Sent whole each time so a later report supersedes.
    usage: Usage,
    stop_reason: Option<String>,
    /// Content block indexes that are client tool calls. `input_json_delta`
    /// for other blocks (server tools) must not reach the assembler.
    tool_blocks: Vec<usize>,
}

/// One event, as far as Kiln reads it (leniently: see [`wire`]). Each kind
/// of event fills a few of these fields.
#[derive(Default, Deserialize)]
#[serde(default)]
struct StreamEvent {
    #[serde(rename = "type", deserialize_with = "wire::lenient")]
    kind: Option<String>,
    /// The content block a `content_block_*` event is about.
    #[serde(deserialize_with = "wire::lenient")]
    index: Option<u64>,
    /// `message_start`: the message so far, with the input's usage.
    #[serde(deserialize_with = "wire::lenient")]
    message: Option<MessageStart>,
    #[serde(deserialize_with = "wire::lenient")]
    content_block: Option<ContentBlock>,
    /// A block's delta, or `message_delta`'s stop reason.
    #[serde(deserialize_with = "wire::lenient")]
    delta: Option<Delta>,
    /// `message_delta`: the cumulative usage.
    #[serde(deserialize_with = "wire::lenient")]
    usage: Option<UsageReport>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct MessageStart {
    #[serde(deserialize_with = "wire::lenient")]
    usage: Option<UsageReport>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct ContentBlock {
    #[serde(rename = "type", deserialize_with = "wire::lenient")]
    kind: Option<String>,
    #[serde(deserialize_with = "wire::lenient")]
    text: Option<String>,
    #[serde(deserialize_with = "wire::lenient")]
    thinking: Option<String>,
    #[serde(deserialize_with = "wire::lenient")]
    signature: Option<String>,
    #[serde(deserialize_with = "wire::lenient")]
    id: Option<String>,
    #[serde(deserialize_with = "wire::lenient")]
    name: Option<String>,
    /// A tool call's input: `{}` when streamed as deltas.
    #[serde(deserialize_with = "wire::lenient")]
    input: Option<Map<String, Value>>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct Delta {
    #[serde(rename = "type", deserialize_with = "wire::lenient")]
    kind: Option<String>,
    #[serde(deserialize_with = "wire::lenient")]
    text: Option<String>,
    #[serde(deserialize_with = "wire::lenient")]
    thinking: Option<String>,
    #[serde(deserialize_with = "wire::lenient")]
    signature: Option<String>,
    #[serde(deserialize_with = "wire::lenient")]
    partial_json: Option<String>,
    #[serde(deserialize_with = "wire::lenient")]
    stop_reason: Option<String>,
}

/// Fields present in a usage report replace what earlier reports said.
#[derive(Default, Deserialize)]
#[serde(default)]
struct UsageReport {
    #[serde(deserialize_with = "wire::lenient")]
    input_tokens: Option<u64>,
    #[serde(deserialize_with = "wire::lenient")]
    output_tokens: Option<u64>,
    #[serde(deserialize_with = "wire::lenient")]
    cache_read_input_tokens: Option<u64>,
    #[serde(deserialize_with = "wire::lenient")]
    cache_creation_input_tokens: Option<u64>,
}

impl Decoder for MessagesDecoder {
    fn on_event(&mut self, event: &SseEvent, out: &mut Vec<ModelEvent>) -> Result<Flow, ProviderError> {
        let data = event.data.trim();
        if data.is_empty() {
            return Ok(Flow::Continue);
        }
        let json: StreamEvent = wire::parse(data, "event data")?;
        // The data's own `type` is authoritative; the SSE event name is the
        // fallback for proxies that strip it.
        let kind = json.kind.as_deref().unwrap_or(&event.event);
        match kind {
            "message_start" => {
                if let Some(usage) = json.message.and_then(|m| m.usage) {
                    self.merge_usage(&usage, out);
                }
            }
            "content_block_start" => {
                let index = block_index(&json, data)?;
                if let Some(block) = json.content_block {
                    self.on_block_start(index, block, out);
                }
            }
            "content_block_delta" => {
                let index = block_index(&json, data)?;
                if let Some(delta) = json.delta {
                    self.on_block_delta(index, delta, out);
                }
            }
            "message_delta" => {
                if let Some(reason) = json.delta.and_then(|d| d.stop_reason) {
                    self.stop_reason = Some(reason);
                }
                if let Some(usage) = &json.usage {
                    self.merge_usage(usage, out);
                }
            }
            "message_stop" => {
                out.push(ModelEvent::Finish(self.finish_reason()));
                return Ok(Flow::Done);
            }
            "error" => return Err(wire::stream_error(data)),
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
    fn on_block_start(&mut self, index: usize, block: ContentBlock, out: &mut Vec<ModelEvent>) {
        match block.kind.as_deref() {
            Some("text") => wire::push_text(out, &block.text, ModelEvent::TextDelta),
            Some("thinking") => {
                wire::push_text(out, &block.thinking, ModelEvent::ReasoningDelta);
                wire::push_text(out, &block.signature, ModelEvent::ReasoningSignature);
            }
            Some("tool_use") => {
                self.tool_blocks.push(index);
                let (id, name) = (block.id.unwrap_or_default(), block.name.unwrap_or_default());
                out.push(ModelEvent::ToolCallStart { index, id, name });
                // Streaming starts `input` as `{}` and sends the JSON as
                // deltas; should a server put the whole input here instead,
                // it is the call's arguments.
                if let Some(input) = block.input.filter(|input| !input.is_empty()) {
                    out.push(ModelEvent::ToolCallDelta { index, arguments: Value::Object(input).to_string() });
                }
            }
            // redacted_thinking, server_tool_use, web search results…: Kiln
            // has no part for them and must not run server tools itself.
            _ => {}
        }
    }

    fn on_block_delta(&mut self, index: usize, delta: Delta, out: &mut Vec<ModelEvent>) {
        match delta.kind.as_deref() {
            Some("text_delta") => wire::push_text(out, &delta.text, ModelEvent::TextDelta),
            Some("thinking_delta") => wire::push_text(out, &delta.thinking, ModelEvent::ReasoningDelta),
            Some("signature_delta") => wire::push_text(out, &delta.signature, ModelEvent::ReasoningSignature),
            Some("input_json_delta") if self.tool_blocks.contains(&index) => {
                wire::push_text(out, &delta.partial_json, |arguments| ModelEvent::ToolCallDelta { index, arguments });
            }
            // citations_delta and future kinds.
            _ => {}
        }
    }

    /// Fields present in a usage report replace ours; absent or null ones
    /// keep what an earlier report said.
    fn merge_usage(&mut self, report: &UsageReport, out: &mut Vec<ModelEvent>) {
        let fields = [
            (report.input_tokens, &mut self.usage.input_tokens),
            (report.output_tokens, &mut self.usage.output_tokens),
            (report.cache_read_input_tokens, &mut self.usage.cache_read_tokens),
            (report.cache_creation_input_tokens, &mut self.usage.cache_write_tokens),
        ];
        for (reported, slot) in fields {
            if let Some(n) = reported {
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

fn block_index(event: &StreamEvent, data: &str) -> Result<usize, ProviderError> {
    event
        .index
        .and_then(|i| usize::try_from(i).ok())
        .ok_or_else(|| ProviderError::decode("content block event without an index", data))
}
