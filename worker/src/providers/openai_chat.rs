//! OpenAI Chat Completions, streamed: api.openai.com and the many servers
//! that copy it (vLLM, llama.cpp server, Ollama, OpenRouter, Azure, LiteLLM).
//!
//! The decoder is lenient where compatible servers differ (a tool call index
//! starting at 1, missing `[DONE]`, reasoning under `reasoning` or
//! `reasoning_content`, chunks with no choices) and strict where it matters:
//! a stream without a `finish_reason` is truncated, never complete.

use bytes::Bytes;
use futures::Stream;
use kiln_protocol::{Message, Part, Role, Usage};
use serde::Serialize;
use serde_json::Value;

use super::endpoint::{Endpoint, KeyHeader};
use super::sse::{self, Decoder, Flow, SseEvent};
use super::{FinishReason, ModelEvent, ModelProvider, ModelRequest, ModelStream, ProviderError, ToolSpec};

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
        let body = request_body(request);
        self.endpoint.stream(&self.url(), KeyHeader::Bearer, &[], &body, ChatDecoder::default()).await
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
        if let Part::ToolResult { call_id, output, .. } = part {
            out.push(ChatMessage::Tool { tool_call_id: call_id, content: output });
        }
    }
    let text = message.text();
    match message.role {
        Role::System if !text.is_empty() => out.push(ChatMessage::System { content: text }),
        Role::User if !text.is_empty() => out.push(ChatMessage::User { content: text }),
        Role::Assistant => {
            let tool_calls: Vec<WireToolCall<'a>> = message
                .tool_calls()
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

// ---------------------------------------------------------------------------
// Response

/// State of one streamed Chat Completions response.
#[derive(Default)]
struct ChatDecoder {
    /// The `finish_reason` once seen. `Finish` is held back until `[DONE]`
    /// (or the end of the body) because the usage chunk comes after it.
    finish_reason: Option<String>,
    /// Tool calls by their wire `index`, in order of first appearance.
    calls: Vec<CallState>,
}

struct CallState {
    index: usize,
    id: Option<String>,
    name: Option<String>,
    started: bool,
    /// Argument pieces that arrived before the call's name: held until the
    /// `ToolCallStart` can be sent, so deltas never precede their start.
    pending: String,
}

impl Decoder for ChatDecoder {
    fn on_event(&mut self, event: &SseEvent, out: &mut Vec<ModelEvent>) -> Result<Flow, ProviderError> {
        let data = event.data.trim();
        if data.is_empty() {
            return Ok(Flow::Continue);
        }
        if data == "[DONE]" {
            out.push(ModelEvent::Finish(self.finish()?));
            return Ok(Flow::Done);
        }
        let chunk: Value =
            serde_json::from_str(data).map_err(|e| ProviderError::decode(&format!("chunk is not JSON ({e})"), data))?;
        if chunk.get("error").is_some_and(|e| !e.is_null()) {
            return Err(ProviderError::from_stream_error(&chunk));
        }
        // Azure's first chunk has `choices: []` and only filter results;
        // usage chunks have `choices: []` too.
        for choice in chunk.get("choices").and_then(Value::as_array).into_iter().flatten() {
            // With n = 1 there is one choice; should a server send more, the
            // others would interleave their text into ours.
            if choice.get("index").and_then(Value::as_u64).is_some_and(|i| i != 0) {
                continue;
            }
            if let Some(delta) = choice.get("delta") {
                self.on_delta(delta, out);
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                self.finish_reason = Some(reason.to_owned());
            }
        }
        if let Some(usage) = chunk.get("usage").and_then(usage) {
            out.push(ModelEvent::Usage(usage));
        }
        Ok(Flow::Continue)
    }

    fn on_end(&mut self, out: &mut Vec<ModelEvent>) -> Result<(), ProviderError> {
        // No `[DONE]` (some servers and proxies drop it, or leave the last
        // event unterminated): a finish_reason already proves the answer
        // complete.
        out.push(ModelEvent::Finish(self.finish()?));
        Ok(())
    }
}

impl ChatDecoder {
    fn finish(&self) -> Result<FinishReason, ProviderError> {
        let reason = self.finish_reason.as_deref().ok_or(ProviderError::Truncated)?;
        Ok(match reason {
            // Some servers (older Ollama, Gemini's compatibility layer) say
            // `stop` after tool calls; the calls are what the model meant.
            "stop" if self.calls.iter().any(|c| c.started) => FinishReason::ToolUse,
            "stop" => FinishReason::EndTurn,
            "tool_calls" | "function_call" => FinishReason::ToolUse,
            "length" => FinishReason::MaxTokens,
            other => FinishReason::Other(other.to_owned()),
        })
    }

    fn on_delta(&mut self, delta: &Value, out: &mut Vec<ModelEvent>) {
        if let Some(text) = non_empty_str(delta, "content") {
            out.push(ModelEvent::TextDelta(text.to_owned()));
        }
        // vLLM and DeepSeek use `reasoning_content`; OpenRouter, newer vLLM
        // and llama.cpp `reasoning`. Servers that send both send the same
        // text twice, so only one is taken.
        if let Some(text) = non_empty_str(delta, "reasoning_content").or_else(|| non_empty_str(delta, "reasoning")) {
            out.push(ModelEvent::ReasoningDelta(text.to_owned()));
        }
        for call in delta.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
            self.on_tool_call_delta(call, out);
        }
    }

    fn on_tool_call_delta(&mut self, delta: &Value, out: &mut Vec<ModelEvent>) {
        let function = delta.get("function");
        let id = non_empty_str(delta, "id");
        let name = function.and_then(|f| non_empty_str(f, "name"));
        let arguments = match function.and_then(|f| f.get("arguments")) {
            Some(Value::String(s)) => s.clone(),
            // Some servers send the arguments as an object in one piece.
            Some(v @ Value::Object(_)) => v.to_string(),
            _ => String::new(),
        };
        let index = self.call_index(delta, id.is_some());
        let position = match self.calls.iter().position(|c| c.index == index) {
            Some(position) => position,
            None => {
                self.calls.push(CallState { index, id: None, name: None, started: false, pending: String::new() });
                self.calls.len() - 1
            }
        };
        let call = &mut self.calls[position];
        // Once known, id and name stay: some servers repeat them on every
        // delta.
        if call.id.is_none() {
            call.id = id.map(str::to_owned);
        }
        if call.name.is_none() {
            call.name = name.map(str::to_owned);
        }
        if call.started {
            if !arguments.is_empty() {
                out.push(ModelEvent::ToolCallDelta { index, arguments });
            }
            return;
        }
        call.pending.push_str(&arguments);
        if let Some(name) = call.name.clone() {
            call.started = true;
            // A call must have an id for its result to refer to; a few local
            // servers leave it out.
            let id = call.id.get_or_insert_with(|| format!("call_{}", uuid::Uuid::new_v4().simple())).clone();
            out.push(ModelEvent::ToolCallStart { index, id, name });
            if !call.pending.is_empty() {
                out.push(ModelEvent::ToolCallDelta { index, arguments: std::mem::take(&mut call.pending) });
            }
        }
    }

    /// The wire `index` identifies a call; servers that omit it start a new
    /// call with each new id and otherwise continue the last one.
    fn call_index(&self, delta: &Value, has_id: bool) -> usize {
        if let Some(index) = delta.get("index").and_then(Value::as_u64) {
            return usize::try_from(index).unwrap_or(usize::MAX);
        }
        let last = self.calls.last().map(|c| c.index);
        match (last, has_id) {
            (Some(last), false) => last,
            (Some(last), true) if self.calls.last().is_some_and(|c| c.id.is_none()) => last,
            (Some(_), true) => self.calls.iter().map(|c| c.index).max().map_or(0, |m| m.saturating_add(1)),
            (None, _) => 0,
        }
    }
}

fn non_empty_str<'v>(value: &'v Value, key: &str) -> Option<&'v str> {
    value.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// Chat Completions counts cached prompt tokens inside `prompt_tokens`;
/// Kiln's `input_tokens` (like Anthropic's) excludes them, so costs priced
/// per kind of token add up the same for both providers.
fn usage(usage: &Value) -> Option<Usage> {
    usage.as_object()?;
    let count = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
    let prompt = count(usage.get("prompt_tokens"));
    let cached = count(usage.get("prompt_tokens_details").and_then(|d| d.get("cached_tokens")));
    Some(Usage {
        input_tokens: prompt.saturating_sub(cached),
        output_tokens: count(usage.get("completion_tokens")),
        cache_read_tokens: cached,
        cache_write_tokens: 0,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
#[path = "openai_chat_tests.rs"]
mod tests;
