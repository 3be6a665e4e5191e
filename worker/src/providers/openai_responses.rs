//! The OpenAI Responses API, streamed (`POST {base_url}/responses`).
//!
//! The stream is a sequence of typed events, each naming itself in its
//! `type`: the response is created, output items (a `message`, a
//! `reasoning` item, a `function_call`, server tools such as
//! `tool_search_call`) are added, filled with deltas and marked done under
//! their `output_index`, and one terminal event ends it: `response.completed`,
//! `response.incomplete` (the output limit or a content filter cut it short)
//! or `response.failed`. A body that ends without one of those is truncated.
//!
//! Requests are stateless: `store: false`, the whole conversation in
//! `input`, no `previous_response_id`. Reasoning is streamed (summaries and,
//! where a server sends it, raw reasoning text), and each reasoning item's
//! opaque `encrypted_content` (requested with `include`) is kept as the
//! reasoning part's signature, marked [`ENCRYPTED_PREFIX`], and sent back as
//! a `reasoning` input item on later requests: the only form the API
//! accepts without stored state, so a reasoning model's chain of thought
//! carries across tool calls. Other providers never see these parts'
//! signatures (the prefix cannot begin a base64 Anthropic signature).

use bytes::Bytes;
use futures::Stream;
use kiln_protocol::{Message, Part, Role, Usage};
use serde::Serialize;
use serde_json::Value;

use super::endpoint::{Endpoint, KeyHeader};
use super::sse::{self, Decoder, Flow, SseEvent};
use super::{FinishReason, ModelEvent, ModelProvider, ModelRequest, ModelStream, ProviderError, ToolSpec};

/// Marks a reasoning part's signature as Responses `encrypted_content`.
pub const ENCRYPTED_PREFIX: &str = "oai-enc:";

/// A Responses API endpoint. Its base URL runs up to and including the
/// version segment, as for [`super::openai_chat::OpenAiChat`] (e.g.
/// [`super::openai_chat::DEFAULT_BASE_URL`]); the key goes as a bearer token.
#[derive(Debug, Clone)]
pub struct OpenAiResponses {
    endpoint: Endpoint,
}

impl OpenAiResponses {
    pub fn new(endpoint: Endpoint) -> Self {
        OpenAiResponses { endpoint }
    }

    fn url(&self) -> String {
        format!("{}/responses", self.endpoint.base())
    }
}

#[async_trait::async_trait]
impl ModelProvider for OpenAiResponses {
    fn name(&self) -> &'static str {
        "openai-responses"
    }

    async fn stream(&self, request: &ModelRequest) -> Result<ModelStream, ProviderError> {
        let body = request_body(request);
        self.endpoint.stream(&self.url(), KeyHeader::Bearer, &[], &body, ResponsesDecoder::default()).await
    }
}

/// Decodes a Responses API event-stream body. Public so tests elsewhere can
/// replay recorded bytes through the production decoder.
pub fn decode_stream<S, E>(bytes: S) -> ModelStream
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
    E: Into<ProviderError> + Send + 'static,
{
    sse::decode_stream(bytes, ResponsesDecoder::default())
}

// ---------------------------------------------------------------------------
// Request

#[derive(Serialize)]
struct ResponsesRequest<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    instructions: &'a str,
    input: Vec<InputItem<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    max_output_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    stream: bool,
    /// Kiln keeps the conversation itself; nothing needs to live on the
    /// provider's side (and with `store: false` nothing does).
    store: bool,
    /// `reasoning.encrypted_content`: reasoning comes back in a form that
    /// can be sent again without server-side state.
    include: [&'static str; 1],
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum InputItem<'a> {
    Message {
        role: &'static str,
        content: Vec<Content<'a>>,
    },
    FunctionCall {
        call_id: &'a str,
        name: &'a str,
        /// The API wants the arguments as a JSON string, not an object.
        arguments: String,
    },
    FunctionCallOutput {
        call_id: &'a str,
        output: &'a str,
    },
    /// Earlier reasoning, returned as the API gave it.
    Reasoning {
        summary: Vec<Summary<'a>>,
        encrypted_content: &'a str,
    },
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Summary<'a> {
    SummaryText { text: &'a str },
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Content<'a> {
    /// Text of the user, the system or the developer.
    InputText { text: &'a str },
    /// Text the model said earlier.
    OutputText { text: &'a str },
}

#[derive(Serialize)]
struct WireTool<'a> {
    r#type: &'static str,
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
    /// Said explicitly: the Responses API defaults function tools to strict
    /// mode, which rejects any schema with optional properties or without
    /// `additionalProperties: false` (most of Kiln's).
    strict: bool,
}

fn request_body(request: &ModelRequest) -> ResponsesRequest<'_> {
    let mut input = Vec::new();
    for message in &request.messages {
        push_items(message, &mut input);
    }
    ResponsesRequest {
        model: &request.model,
        instructions: &request.system,
        input,
        tools: request.tools.iter().map(tool).collect(),
        max_output_tokens: request.max_tokens,
        temperature: request.temperature,
        stream: true,
        store: false,
        include: ["reasoning.encrypted_content"],
    }
}

fn tool(spec: &ToolSpec) -> WireTool<'_> {
    WireTool {
        r#type: "function",
        name: &spec.name,
        description: &spec.description,
        parameters: &spec.input_schema,
        strict: false,
    }
}

/// Maps one Kiln message to input items. Tool results become
/// `function_call_output` items, placed before any text of the same message
/// so they follow the calls that asked for them; an assistant turn becomes a
/// `message` item with its text, then one `function_call` item per call,
/// after the reasoning items that led to them (only those this API produced:
/// see the module docs).
fn push_items<'a>(message: &'a Message, out: &mut Vec<InputItem<'a>>) {
    if message.role == Role::Assistant {
        for part in &message.parts {
            if let Part::Reasoning { text, signature: Some(signature) } = part
                && let Some(encrypted_content) = signature.strip_prefix(ENCRYPTED_PREFIX)
            {
                let summary = if text.is_empty() { Vec::new() } else { vec![Summary::SummaryText { text }] };
                out.push(InputItem::Reasoning { summary, encrypted_content });
            }
        }
    }
    for part in &message.parts {
        if let Part::ToolResult { call_id, output, .. } = part {
            out.push(InputItem::FunctionCallOutput { call_id, output });
        }
    }
    let texts = message.parts.iter().filter_map(|part| match part {
        Part::Text { text } if !text.is_empty() => Some(text.as_str()),
        _ => None,
    });
    let (role, content): (&'static str, Vec<Content<'a>>) = match message.role {
        Role::System => ("system", texts.map(|text| Content::InputText { text }).collect()),
        Role::User => ("user", texts.map(|text| Content::InputText { text }).collect()),
        Role::Assistant => ("assistant", texts.map(|text| Content::OutputText { text }).collect()),
        // A tool message's text parts have no place on the wire.
        Role::Tool => return,
    };
    // Empty messages (a turn that was only reasoning) carry nothing.
    if !content.is_empty() {
        out.push(InputItem::Message { role, content });
    }
    if message.role == Role::Assistant {
        for (call_id, name, arguments) in message.tool_calls() {
            out.push(InputItem::FunctionCall { call_id, name, arguments: arguments.to_string() });
        }
    }
}

// ---------------------------------------------------------------------------
// Response

/// State of one streamed response.
#[derive(Default)]
struct ResponsesDecoder {
    /// Client function calls by `output_index`, in order of start. Argument
    /// deltas for any other output item (server tools, custom tools) are
    /// not Kiln's to run.
    calls: Vec<CallState>,
    /// Which reasoning stream the last reasoning delta belonged to, so a
    /// new summary part or reasoning item starts on a new paragraph.
    last_reasoning: Option<ReasoningKey>,
    /// Reasoning items whose encrypted content was passed on (by item id,
    /// or output index), so the final output's repeat is not taken twice.
    signed_reasoning: Vec<String>,
}

struct CallState {
    index: usize,
    /// The output item id (`fc_…`), which argument events also name.
    item_id: Option<String>,
    /// Whether any argument text was sent: `.done` events and the final
    /// item repeat the whole arguments, which are used only when no delta
    /// came (servers that send calls whole).
    has_arguments: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct ReasoningKey {
    output_index: Option<u64>,
    /// `summary_index` of a summary, `content_index` of raw reasoning text.
    part: Option<u64>,
    summary: bool,
}

impl Decoder for ResponsesDecoder {
    fn on_event(&mut self, event: &SseEvent, out: &mut Vec<ModelEvent>) -> Result<Flow, ProviderError> {
        let data = event.data.trim();
        if data.is_empty() {
            return Ok(Flow::Continue);
        }
        // The Responses API sends no `[DONE]`; a server that does sends it
        // after the terminal event, which has already ended the stream.
        if data == "[DONE]" {
            return Err(ProviderError::Truncated);
        }
        let json: Value = serde_json::from_str(data)
            .map_err(|e| ProviderError::decode(&format!("event data is not JSON ({e})"), data))?;
        // The data's own `type` is authoritative; the SSE event name is the
        // fallback for proxies that strip it.
        let kind = json.get("type").and_then(Value::as_str).unwrap_or(&event.event);
        match kind {
            "response.output_item.added" | "response.output_item.done" => {
                if let Some(item) = json.get("item") {
                    self.on_item(item, output_index(&json), kind == "response.output_item.done", out);
                }
            }
            "response.output_text.delta" | "response.refusal.delta" => {
                push_text(out, &json, "delta", ModelEvent::TextDelta);
            }
            "response.reasoning_summary_text.delta" => self.on_reasoning(&json, "summary_index", true, out),
            "response.reasoning_text.delta" => self.on_reasoning(&json, "content_index", false, out),
            "response.function_call_arguments.delta" => {
                if let Some(call) = self.call_for(&json)
                    && let Some(piece) = json.get("delta").and_then(Value::as_str).filter(|s| !s.is_empty())
                {
                    call.has_arguments = true;
                    out.push(ModelEvent::ToolCallDelta { index: call.index, arguments: piece.to_owned() });
                }
            }
            "response.function_call_arguments.done" => {
                if let Some(call) = self.call_for(&json) {
                    call.fill_arguments(json.get("arguments"), out);
                }
            }
            "response.completed" | "response.incomplete" => {
                let response = json.get("response");
                // The final output lists every item; one never announced
                // (a server that only reports the result) still counts.
                let items = response.and_then(|r| r.get("output")).and_then(Value::as_array);
                for (position, item) in items.into_iter().flatten().enumerate() {
                    self.on_item(item, Some(position), true, out);
                }
                if let Some(usage) = response.and_then(|r| r.get("usage")).and_then(usage) {
                    out.push(ModelEvent::Usage(usage));
                }
                out.push(ModelEvent::Finish(self.finish_reason(kind, response)));
                return Ok(Flow::Done);
            }
            "response.failed" => {
                // The error object sits in the response, like an HTTP error
                // body's: `{"error": {"code", "message"}}`.
                return Err(ProviderError::from_stream_error(json.get("response").unwrap_or(&Value::Null)));
            }
            // Top-level `code`/`message` per the API reference; some servers
            // nest an `error` object instead. Both are understood.
            "error" => return Err(ProviderError::from_stream_error(&json)),
            // response.created/in_progress/queued, content_part.*, *.done of
            // text, reasoning_summary_part.*, server tool items
            // (tool_search_call, web_search_call, …) and event types added
            // after this was written.
            _ => {}
        }
        Ok(Flow::Continue)
    }

    fn on_end(&mut self, _out: &mut Vec<ModelEvent>) -> Result<(), ProviderError> {
        Err(ProviderError::Truncated)
    }
}

impl CallState {
    /// Sends the whole arguments from a `.done` event or a finished item,
    /// unless deltas already did.
    fn fill_arguments(&mut self, arguments: Option<&Value>, out: &mut Vec<ModelEvent>) {
        if self.has_arguments {
            return;
        }
        let arguments = match arguments {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            // Some servers send the arguments as an object.
            Some(v @ Value::Object(o)) if !o.is_empty() => v.to_string(),
            _ => return,
        };
        self.has_arguments = true;
        out.push(ModelEvent::ToolCallDelta { index: self.index, arguments });
    }
}

impl ResponsesDecoder {
    /// An output item, added, done or listed in the final response. Only
    /// `function_call` items matter here: messages and reasoning arrive as
    /// deltas, and server-side tools are the provider's business.
    /// `done`: the item is complete (`output_item.done`, or the final
    /// output list); only then is a reasoning item's encrypted content final.
    fn on_item(&mut self, item: &Value, output_index: Option<usize>, done: bool, out: &mut Vec<ModelEvent>) {
        match item.get("type").and_then(Value::as_str) {
            Some("function_call") => {}
            Some("reasoning") if done => return self.on_reasoning_done(item, output_index, out),
            _ => return,
        }
        let item_id = item.get("id").and_then(Value::as_str).filter(|s| !s.is_empty());
        // The item id names an item across its events; the index is the
        // fallback for servers that leave the id out.
        let known = match item_id {
            Some(id) => self.calls.iter().position(|c| c.item_id.as_deref() == Some(id)),
            None => self.calls.iter().position(|c| Some(c.index) == output_index),
        };
        let position = match known {
            Some(position) => position,
            None => {
                // Two calls must never share an index: the second would be
                // merged into the first.
                let index = output_index
                    .filter(|i| !self.calls.iter().any(|c| c.index == *i))
                    .unwrap_or_else(|| self.calls.iter().map(|c| c.index).max().map_or(0, |m| m.saturating_add(1)));
                // `call_id` is what the call's result must name; the item id
                // and a made-up id are fallbacks for servers that omit it.
                let id = non_empty_str(item, "call_id")
                    .or(item_id)
                    .map_or_else(|| format!("call_{}", uuid::Uuid::new_v4().simple()), str::to_owned);
                let name = non_empty_str(item, "name").unwrap_or_default().to_owned();
                out.push(ModelEvent::ToolCallStart { index, id, name });
                self.calls.push(CallState { index, item_id: item_id.map(str::to_owned), has_arguments: false });
                self.calls.len() - 1
            }
        };
        self.calls[position].fill_arguments(item.get("arguments"), out);
    }

    /// The started call an argument event is about: by `output_index`, or
    /// by `item_id` when a server leaves the index out.
    fn call_for(&mut self, json: &Value) -> Option<&mut CallState> {
        if let Some(index) = output_index(json) {
            return self.calls.iter_mut().find(|c| c.index == index);
        }
        let item_id = json.get("item_id").and_then(Value::as_str)?;
        self.calls.iter_mut().find(|c| c.item_id.as_deref() == Some(item_id))
    }

    fn on_reasoning_done(&mut self, item: &Value, output_index: Option<usize>, out: &mut Vec<ModelEvent>) {
        let Some(encrypted) = non_empty_str(item, "encrypted_content") else { return };
        let key = match non_empty_str(item, "id") {
            Some(id) => id.to_owned(),
            None => format!("#{}", output_index.unwrap_or(usize::MAX)),
        };
        if self.signed_reasoning.contains(&key) {
            return;
        }
        self.signed_reasoning.push(key);
        // An item with no streamed text still gets a part of its own: an
        // empty delta opens one when the previous part is already signed.
        let streamed = self.last_reasoning.is_some_and(|k| k.output_index.map(|i| i as usize) == output_index);
        if !streamed {
            out.push(ModelEvent::ReasoningDelta(String::new()));
        }
        out.push(ModelEvent::ReasoningSignature(format!("{ENCRYPTED_PREFIX}{encrypted}")));
    }

    fn on_reasoning(&mut self, json: &Value, part_key: &str, summary: bool, out: &mut Vec<ModelEvent>) {
        let Some(text) = json.get("delta").and_then(Value::as_str).filter(|s| !s.is_empty()) else {
            return;
        };
        let key = ReasoningKey {
            output_index: json.get("output_index").and_then(Value::as_u64),
            part: json.get(part_key).and_then(Value::as_u64),
            summary,
        };
        if self.last_reasoning.is_some_and(|last| last != key) {
            out.push(ModelEvent::ReasoningDelta("\n\n".to_owned()));
        }
        self.last_reasoning = Some(key);
        out.push(ModelEvent::ReasoningDelta(text.to_owned()));
    }

    fn finish_reason(&self, kind: &str, response: Option<&Value>) -> FinishReason {
        if kind == "response.incomplete" {
            let reason =
                response.and_then(|r| r.pointer("/incomplete_details/reason")).and_then(Value::as_str).unwrap_or("");
            return match reason {
                "max_output_tokens" => FinishReason::MaxTokens,
                "" => FinishReason::Other("incomplete".to_owned()),
                other => FinishReason::Other(other.to_owned()),
            };
        }
        if self.calls.is_empty() { FinishReason::EndTurn } else { FinishReason::ToolUse }
    }
}

fn output_index(json: &Value) -> Option<usize> {
    json.get("output_index").and_then(Value::as_u64).and_then(|i| usize::try_from(i).ok())
}

fn non_empty_str<'v>(value: &'v Value, key: &str) -> Option<&'v str> {
    value.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// Pushes `make(value[key])` when that is a non-empty string.
fn push_text(out: &mut Vec<ModelEvent>, value: &Value, key: &str, make: fn(String) -> ModelEvent) {
    if let Some(text) = non_empty_str(value, key) {
        out.push(make(text.to_owned()));
    }
}

/// Like Chat Completions, the Responses API counts cached input tokens
/// inside `input_tokens` (and reasoning inside `output_tokens`); Kiln's
/// `input_tokens` excludes the cached ones, as for the other providers.
fn usage(usage: &Value) -> Option<Usage> {
    usage.as_object()?;
    let count = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
    let input = count(usage.get("input_tokens"));
    let cached = count(usage.pointer("/input_tokens_details/cached_tokens"));
    Some(Usage {
        input_tokens: input.saturating_sub(cached),
        output_tokens: count(usage.get("output_tokens")),
        cache_read_tokens: cached,
        cache_write_tokens: 0,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
#[path = "openai_responses_tests.rs"]
mod tests;
