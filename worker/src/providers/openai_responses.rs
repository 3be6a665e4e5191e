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

use std::fmt;

use bytes::Bytes;
use futures::Stream;
use kiln_protocol::{Message, Part, Role, Usage};
use serde::Serialize;
use serde_json::Value;

use super::sse::{self, Decoder, Flow, SseEvent};
use super::{FinishReason, ModelEvent, ModelProvider, ModelRequest, ModelStream, ProviderError, ToolSpec};

/// Marks a reasoning part's signature as Responses `encrypted_content`.
pub const ENCRYPTED_PREFIX: &str = "oai-enc:";

/// A Responses API endpoint.
#[derive(Clone)]
pub struct OpenAiResponses {
    pub client: reqwest::Client,
    /// Up to and including the version segment, e.g.
    /// `https://api.openai.com/v1` (the same base URL as [`super::openai_chat::OpenAiChat`]).
    pub base_url: String,
    /// Sent as a bearer token.
    pub api_key: Option<String>,
}

impl OpenAiResponses {
    pub fn new(client: reqwest::Client, base_url: impl Into<String>, api_key: Option<String>) -> Self {
        OpenAiResponses { client, base_url: base_url.into(), api_key }
    }

    fn url(&self) -> String {
        format!("{}/responses", self.base_url.trim_end_matches('/'))
    }
}

// Hand-written so the key never reaches a log line.
impl fmt::Debug for OpenAiResponses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiResponses")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .finish()
    }
}

#[async_trait::async_trait]
impl ModelProvider for OpenAiResponses {
    fn name(&self) -> &'static str {
        "openai-responses"
    }

    async fn stream(&self, request: &ModelRequest) -> Result<ModelStream, ProviderError> {
        let mut http = self.client.post(self.url()).json(&request_body(request));
        if let Some(key) = &self.api_key {
            http = http.bearer_auth(key);
        }
        let response = sse::open(http, self.api_key.as_deref()).await?;
        Ok(decode_stream(response.bytes_stream()))
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
mod tests {
    use super::*;
    use crate::providers::assemble::Assembled;
    use crate::providers::sse::test_support::{self, *};
    use serde_json::json;

    async fn decode_chunks(
        chunks: Vec<Result<bytes::Bytes, std::io::Error>>,
    ) -> Vec<Result<ModelEvent, ProviderError>> {
        test_support::decode_chunks(decode_stream, chunks).await
    }

    async fn decode_fixture(name: &str) -> Vec<Result<ModelEvent, ProviderError>> {
        decode_fixture_variants(decode_stream, &format!("openai_responses/{name}")).await
    }

    async fn assembled_fixture(name: &str) -> Assembled {
        assemble_complete(&decode_fixture(name).await, name)
    }

    fn usage(input: u64, output: u64, cache_read: u64) -> Usage {
        Usage { input_tokens: input, output_tokens: output, cache_read_tokens: cache_read, cache_write_tokens: 0 }
    }

    /// The `data:` JSON of every event of a fixture, parsed without the
    /// decoder: an oracle that shares no code with it.
    fn raw_events(name: &str) -> Vec<Value> {
        String::from_utf8(fixture(&format!("openai_responses/{name}")))
            .unwrap()
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .map(|json| serde_json::from_str(json).unwrap())
            .collect()
    }

    /// Every complete function call of a fixture per its
    /// `response.function_call_arguments.done` events: (output_index, args).
    fn oracle_calls(name: &str) -> Vec<(usize, Value)> {
        raw_events(name)
            .into_iter()
            .filter(|e| e["type"] == "response.function_call_arguments.done")
            .map(|e| {
                let index = e["output_index"].as_u64().unwrap() as usize;
                (index, serde_json::from_str(e["arguments"].as_str().unwrap()).unwrap())
            })
            .collect()
    }

    #[tokio::test]
    async fn every_fixture_decodes_and_finishes() {
        let names = fixture_names("openai_responses");
        assert_eq!(names.len(), 5, "{names:?}");
        for name in names {
            let items = decode_fixture(&name).await;
            let a = assembled_fixture(&name).await;
            assert!(a.finish_reason.is_some(), "{name}");
            assert!(a.rejected_calls.is_empty(), "{name}: {:?}", a.rejected_calls);
            // Calls carry their output_index and the arguments the server
            // itself reported complete.
            let starts: Vec<usize> = items
                .iter()
                .filter_map(|i| match i {
                    Ok(ModelEvent::ToolCallStart { index, .. }) => Some(*index),
                    _ => None,
                })
                .collect();
            let oracle = oracle_calls(&name);
            assert_eq!(starts, oracle.iter().map(|(i, _)| *i).collect::<Vec<_>>(), "{name}");
            let args: Vec<&Value> = a.message.tool_calls().map(|c| c.2).collect();
            assert_eq!(args, oracle.iter().map(|(_, v)| v).collect::<Vec<_>>(), "{name}");
            let expected = if oracle.is_empty() { FinishReason::EndTurn } else { FinishReason::ToolUse };
            assert_eq!(a.finish_reason, Some(expected), "{name}");
        }
    }

    #[tokio::test]
    async fn text_message() {
        let a = assembled_fixture("vercel_text_message.sse").await;
        assert_eq!(a.message.parts, vec![Part::Text { text: "The final result is **570**.".into() }]);
        let done = raw_events("vercel_text_message.sse")
            .into_iter()
            .find(|e| e["type"] == "response.output_text.done")
            .unwrap();
        assert_eq!(a.message.text(), done["text"].as_str().unwrap());
        assert_eq!(a.finish_reason, Some(FinishReason::EndTurn));
        assert_eq!(a.usage, usage(299, 12, 0));
    }

    #[tokio::test]
    async fn reasoning_summary_then_function_call() {
        let items = decode_fixture("vercel_reasoning_then_function_call.sse").await;
        assert!(items.contains(&Ok(ModelEvent::ToolCallStart {
            index: 1,
            id: "call_AB6AaRZ1FYZB2RwS6A5vbdqn".into(),
            name: "calculator".into()
        })));
        // The final encrypted content (from `output_item.done`, not the
        // different one `added` carried), once, though `completed` repeats it.
        let signatures: Vec<&String> = items
            .iter()
            .filter_map(|i| match i {
                Ok(ModelEvent::ReasoningSignature(s)) => Some(s),
                _ => None,
            })
            .collect();
        assert_eq!(signatures.len(), 1, "{signatures:?}");
        assert!(signatures[0].starts_with("oai-enc:gAAAAABpPDIVOKrsHNZ0Gwso"), "{}", signatures[0]);
        let a = assemble(&items);
        let signature = Some(signatures[0].clone());
        assert_eq!(
            a.message.parts,
            vec![
                Part::Reasoning {
                    text: "**Calculating step-by-step using calculator**\n\nI'll compute 12 plus 7, then multiply the \
                           result by 3, and finally multiply that by 10, reporting the final product."
                        .into(),
                    signature
                },
                Part::ToolCall {
                    id: "call_AB6AaRZ1FYZB2RwS6A5vbdqn".into(),
                    name: "calculator".into(),
                    arguments: json!({"a": 12, "b": 7, "op": "add"}),
                },
            ]
        );
        assert_eq!(a.finish_reason, Some(FinishReason::ToolUse));
        assert_eq!(a.usage, usage(134, 28, 0));
    }

    #[tokio::test]
    async fn function_call_alone() {
        let a = assembled_fixture("vercel_function_call_step2.sse").await;
        assert_eq!(
            a.message.parts,
            vec![Part::ToolCall {
                id: "call_Q6pW65MUgW9vF59BmItYGos3".into(),
                name: "calculator".into(),
                arguments: json!({"a": 19, "b": 3, "op": "multiply"}),
            }]
        );
        assert_eq!(a.finish_reason, Some(FinishReason::ToolUse));
        assert_eq!(a.usage, usage(221, 26, 0));
    }

    #[tokio::test]
    async fn azure_function_call_with_content_filters() {
        let a = assembled_fixture("vercel_azure_function_call.sse").await;
        assert_eq!(
            a.message.tool_calls().collect::<Vec<_>>(),
            vec![("call_H5DxLSFnsGhiROnUiDHmgyc8", "weather", &json!({"location": "San Francisco"}))]
        );
        assert_eq!(a.message.parts.len(), 1);
        assert_eq!(a.finish_reason, Some(FinishReason::ToolUse));
        assert_eq!(a.usage, usage(45, 24, 0));
    }

    #[tokio::test]
    async fn server_tool_search_items_are_ignored() {
        // tool_search_call has `"call_id": null` and object `arguments`, and
        // is run by the server: it must not become a Kiln tool call.
        let items = decode_fixture("vercel_tool_search_then_function_call.sse").await;
        assert_eq!(
            items,
            vec![
                Ok(ModelEvent::ToolCallStart {
                    index: 2,
                    id: "call_pddfxhfOx4gY56zn4vIIEbFp".into(),
                    name: "get_weather".into()
                }),
                Ok(ModelEvent::ToolCallDelta { index: 2, arguments: "{\"".into() }),
                Ok(ModelEvent::ToolCallDelta { index: 2, arguments: "location".into() }),
                Ok(ModelEvent::ToolCallDelta { index: 2, arguments: "\":\"".into() }),
                Ok(ModelEvent::ToolCallDelta { index: 2, arguments: "San".into() }),
                Ok(ModelEvent::ToolCallDelta { index: 2, arguments: " Francisco".into() }),
                Ok(ModelEvent::ToolCallDelta { index: 2, arguments: ",".into() }),
                Ok(ModelEvent::ToolCallDelta { index: 2, arguments: " CA".into() }),
                Ok(ModelEvent::ToolCallDelta { index: 2, arguments: "\",\"".into() }),
                Ok(ModelEvent::ToolCallDelta { index: 2, arguments: "unit".into() }),
                Ok(ModelEvent::ToolCallDelta { index: 2, arguments: "\":\"".into() }),
                Ok(ModelEvent::ToolCallDelta { index: 2, arguments: "fahren".into() }),
                Ok(ModelEvent::ToolCallDelta { index: 2, arguments: "heit".into() }),
                Ok(ModelEvent::ToolCallDelta { index: 2, arguments: "\"}".into() }),
                Ok(ModelEvent::Usage(usage(640, 46, 0))),
                Ok(ModelEvent::Finish(FinishReason::ToolUse)),
            ]
        );
        let a = assemble(&items);
        assert_eq!(
            a.message.tool_calls().collect::<Vec<_>>(),
            vec![(
                "call_pddfxhfOx4gY56zn4vIIEbFp",
                "get_weather",
                &json!({"location": "San Francisco, CA", "unit": "fahrenheit"})
            )]
        );
    }

    #[tokio::test]
    async fn cut_before_the_terminal_event_is_truncated() {
        for name in fixture_names("openai_responses") {
            let text = String::from_utf8(fixture(&format!("openai_responses/{name}"))).unwrap();
            let cut = text.find("event: response.completed").unwrap_or_else(|| panic!("{name}"));
            let items = decode_chunks(chunked(&text.as_bytes()[..cut], 7)).await;
            assert_eq!(items.last(), Some(&Err(ProviderError::Truncated)), "{name}");
            assert!(!items.iter().any(|i| matches!(i, Ok(ModelEvent::Finish(_)))), "{name}");
            let a = assemble(&items[..items.len() - 1]);
            assert_eq!(a.finish_reason, None);
            assert_eq!(a.message.tool_calls().count(), 0, "{name}: an unfinished call is never executable");
            // Cut in the middle of the terminal event's data line: the
            // event is never dispatched.
            let mid = cut + 200;
            let items = decode_chunks(chunked(&text.as_bytes()[..mid], 64)).await;
            assert_eq!(items.last(), Some(&Err(ProviderError::Truncated)), "{name} cut at {mid}");
        }
    }

    #[tokio::test]
    async fn cut_inside_tool_arguments_is_truncated_and_rejected() {
        let text = String::from_utf8(fixture("openai_responses/vercel_azure_function_call.sse")).unwrap();
        let cut = text.find(r#""delta":" Francisco""#).unwrap();
        let items = decode_chunks(chunked(&text.as_bytes()[..cut], 64)).await;
        assert_eq!(items.last(), Some(&Err(ProviderError::Truncated)));
        let a = assemble(&items[..items.len() - 1]);
        assert_eq!(a.rejected_calls.len(), 1);
        assert_eq!(a.rejected_calls[0].id, "call_H5DxLSFnsGhiROnUiDHmgyc8");
        assert_eq!(a.rejected_calls[0].raw_arguments, "{\"location\":\"San");
    }

    #[tokio::test]
    async fn finish_comes_after_usage() {
        let items = decode_fixture("vercel_text_message.sse").await;
        let n = items.len();
        assert!(matches!(items[n - 2], Ok(ModelEvent::Usage(_))), "{:?}", &items[n - 2..]);
        assert_eq!(items[n - 1], Ok(ModelEvent::Finish(FinishReason::EndTurn)));
    }

    /// A hand-made stream: `event:` lines named after each data `type`, as
    /// the API sends them.
    fn stream_of(events: &[Value]) -> String {
        events.iter().map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or("message"))).collect()
    }

    fn text_delta(text: &str) -> Value {
        json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": text})
    }

    #[tokio::test]
    async fn error_event_mid_stream() {
        // Top-level code and message, as the API reference documents it.
        let body = stream_of(&[
            text_delta("Hel"),
            json!({"type": "error", "code": "server_error", "message": "The server had an error.", "param": null, "sequence_number": 5}),
            text_delta("never"),
        ]);
        let items = decode_chunks(chunked(body.as_bytes(), 11)).await;
        assert_eq!(items.len(), 2, "{items:?}");
        assert_eq!(items[0], Ok(ModelEvent::TextDelta("Hel".into())));
        let err = items[1].clone().unwrap_err();
        assert_eq!(
            err,
            ProviderError::Stream {
                kind: "server_error".into(),
                message: "server_error: The server had an error.".into()
            }
        );
        assert!(err.is_retryable());

        // A nested error object, as some servers send it: a request that no
        // retry can fix.
        let body = stream_of(&[json!({"type": "error", "sequence_number": 2, "error": {
            "type": "invalid_request_error", "code": "context_length_exceeded",
            "message": "Your input exceeds the context window of this model.", "param": "input"}})]);
        let items = decode_chunks(chunked(body.as_bytes(), 7)).await;
        let err = items[0].clone().unwrap_err();
        assert!(matches!(&err, ProviderError::Stream { kind, .. } if kind == "context_length_exceeded"), "{err:?}");
        assert!(!err.is_retryable());
    }

    #[tokio::test]
    async fn response_failed() {
        let failed = |error: Value| {
            stream_of(&[
                json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "output": []}}),
                text_delta("Partial"),
                json!({"type": "response.failed", "response": {"id": "resp_1", "status": "failed", "error": error,
                    "output": [], "usage": null}}),
            ])
        };
        let body = failed(json!({"code": "server_error", "message": "Something went wrong."}));
        let items = decode_chunks(chunked(body.as_bytes(), 64)).await;
        assert_eq!(
            items,
            vec![
                Ok(ModelEvent::TextDelta("Partial".into())),
                Err(ProviderError::Stream {
                    kind: "server_error".into(),
                    message: "server_error: Something went wrong.".into()
                }),
            ]
        );
        assert!(items[1].clone().unwrap_err().is_retryable());

        let body = failed(json!({"code": "rate_limit_exceeded", "message": "Slow down."}));
        let err = decode_chunks(chunked(body.as_bytes(), 64)).await.pop().unwrap().unwrap_err();
        assert!(
            matches!(&err, ProviderError::Stream { kind, .. } if kind == "rate_limit_exceeded") && err.is_retryable()
        );

        let body = failed(Value::Null);
        let err = decode_chunks(chunked(body.as_bytes(), 64)).await.pop().unwrap().unwrap_err();
        assert!(matches!(&err, ProviderError::Stream { kind, .. } if kind == "unknown_error"), "{err:?}");
    }

    #[tokio::test]
    async fn incomplete_responses() {
        let incomplete = |reason: Value| {
            stream_of(&[
                json!({"type": "response.output_item.added", "output_index": 0,
                    "item": {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "write", "arguments": ""}}),
                json!({"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 0,
                    "delta": "{\"path\":\"a\",\"content\":\"lo"}),
                json!({"type": "response.incomplete", "response": {"status": "incomplete",
                    "incomplete_details": reason,
                    "usage": {"input_tokens": 50, "input_tokens_details": {"cached_tokens": 20}, "output_tokens": 16}}}),
            ])
        };
        let items = decode_chunks(chunked(incomplete(json!({"reason": "max_output_tokens"})).as_bytes(), 7)).await;
        assert_eq!(items[items.len() - 2], Ok(ModelEvent::Usage(usage(30, 16, 20))));
        assert_eq!(items.last(), Some(&Ok(ModelEvent::Finish(FinishReason::MaxTokens))));
        let a = assemble(&items);
        assert_eq!(a.finish_reason, Some(FinishReason::MaxTokens));
        assert_eq!(a.message.tool_calls().count(), 0, "arguments cut by the limit never run");
        assert_eq!(a.rejected_calls.len(), 1);

        let items = decode_chunks(chunked(incomplete(json!({"reason": "content_filter"})).as_bytes(), 64)).await;
        assert_eq!(items.last(), Some(&Ok(ModelEvent::Finish(FinishReason::Other("content_filter".into())))));
        let items = decode_chunks(chunked(incomplete(Value::Null).as_bytes(), 64)).await;
        assert_eq!(items.last(), Some(&Ok(ModelEvent::Finish(FinishReason::Other("incomplete".into())))));
    }

    #[tokio::test]
    async fn cached_tokens_are_read_from_the_cache() {
        let body = stream_of(&[
            text_delta("ok"),
            json!({"type": "response.completed", "response": {"status": "completed", "usage": {
                "input_tokens": 2006, "input_tokens_details": {"cached_tokens": 1920},
                "output_tokens": 300, "output_tokens_details": {"reasoning_tokens": 256}, "total_tokens": 2306}}}),
        ]);
        let items = decode_chunks(chunked(body.as_bytes(), 9)).await;
        assert_eq!(
            items,
            vec![
                Ok(ModelEvent::TextDelta("ok".into())),
                Ok(ModelEvent::Usage(usage(86, 300, 1920))),
                Ok(ModelEvent::Finish(FinishReason::EndTurn)),
            ]
        );
    }

    #[tokio::test]
    async fn calls_sent_whole_are_taken_once() {
        // One call announced with no deltas (arguments only in `.done`), one
        // only in the final output, and one streamed normally whose `.done`
        // and final item repeat the arguments.
        let body = stream_of(&[
            json!({"type": "response.output_item.added", "output_index": 0,
                "item": {"id": "fc_a", "type": "function_call", "call_id": "call_a", "name": "view", "arguments": ""}}),
            json!({"type": "response.function_call_arguments.done", "item_id": "fc_a", "output_index": 0,
                "arguments": "{\"path\":\"a\"}"}),
            json!({"type": "response.output_item.added", "output_index": 1,
                "item": {"id": "fc_b", "type": "function_call", "call_id": "call_b", "name": "bash", "arguments": ""}}),
            json!({"type": "response.function_call_arguments.delta", "item_id": "fc_b", "delta": "{\"command\":"}),
            json!({"type": "response.function_call_arguments.delta", "item_id": "fc_b", "output_index": 1, "delta": "\"ls\"}"}),
            json!({"type": "response.function_call_arguments.done", "item_id": "fc_b", "output_index": 1,
                "arguments": "{\"command\":\"ls\"}"}),
            json!({"type": "response.output_item.done", "output_index": 1,
                "item": {"id": "fc_b", "type": "function_call", "call_id": "call_b", "name": "bash",
                    "arguments": "{\"command\":\"ls\"}"}}),
            json!({"type": "response.completed", "response": {"status": "completed", "output": [
                {"id": "fc_a", "type": "function_call", "call_id": "call_a", "name": "view", "arguments": "{\"path\":\"a\"}"},
                {"id": "fc_b", "type": "function_call", "call_id": "call_b", "name": "bash", "arguments": "{\"command\":\"ls\"}"},
                {"id": "fc_c", "type": "function_call", "call_id": "call_c", "name": "grep", "arguments": "{\"pattern\":\"x\"}"},
            ]}}),
        ]);
        let items = decode_chunks(chunked(body.as_bytes(), 13)).await;
        let a = assemble(&items);
        assert_eq!(
            a.message.tool_calls().collect::<Vec<_>>(),
            vec![
                ("call_a", "view", &json!({"path": "a"})),
                ("call_b", "bash", &json!({"command": "ls"})),
                ("call_c", "grep", &json!({"pattern": "x"})),
            ]
        );
        assert_eq!(a.finish_reason, Some(FinishReason::ToolUse));
        assert!(a.rejected_calls.is_empty());
    }

    #[tokio::test]
    async fn reasoning_parts_are_separated_and_refusals_are_text() {
        let summary = |output_index: u64, summary_index: u64, delta: &str| {
            json!({"type": "response.reasoning_summary_text.delta", "item_id": "rs", "output_index": output_index,
                "summary_index": summary_index, "delta": delta})
        };
        let body = stream_of(&[
            summary(0, 0, "First"),
            summary(0, 0, " part."),
            summary(0, 1, "Second."),
            json!({"type": "response.reasoning_text.delta", "item_id": "rs2", "output_index": 1, "content_index": 0,
                "delta": "raw"}),
            json!({"type": "response.refusal.delta", "item_id": "msg", "output_index": 2, "content_index": 0,
                "delta": "I can't help with that."}),
            json!({"type": "response.completed", "response": {"status": "completed"}}),
        ]);
        let a = assemble(&decode_chunks(chunked(body.as_bytes(), 5)).await);
        assert_eq!(
            a.message.parts,
            vec![
                Part::Reasoning { text: "First part.\n\nSecond.\n\nraw".into(), signature: None },
                Part::Text { text: "I can't help with that.".into() },
            ]
        );
        assert_eq!(a.finish_reason, Some(FinishReason::EndTurn));
        assert_eq!(a.usage, Usage::default());
    }

    #[tokio::test]
    async fn done_marker_and_bare_data_events() {
        // `[DONE]` before any terminal event is a cut stream, not an end.
        let body = format!("{}data: [DONE]\n\n", stream_of(&[text_delta("hi")]));
        let items = decode_chunks(chunked(body.as_bytes(), 3)).await;
        assert_eq!(items, vec![Ok(ModelEvent::TextDelta("hi".into())), Err(ProviderError::Truncated)]);
        // Without `event:` lines the data's `type` is enough; without a
        // `type` the event name stands in.
        let body = "data: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"a\"}\n\n\
            event: response.completed\ndata: {\"response\":{}}\n\n";
        let items = decode_chunks(chunked(body.as_bytes(), 4)).await;
        assert_eq!(items, vec![Ok(ModelEvent::TextDelta("a".into())), Ok(ModelEvent::Finish(FinishReason::EndTurn))]);
    }

    #[tokio::test]
    async fn garbage_never_panics() {
        let bodies = [
            "data: {not json\n\n",
            "data: null\n\n",
            "data: []\n\n",
            "data: {\"type\":\"response.output_item.added\"}\n\n",
            "data: {\"type\":\"response.output_item.added\",\"output_index\":-1,\"item\":{\"type\":\"function_call\",\"call_id\":7}}\n\n",
            "data: {\"type\":\"response.output_item.added\",\"output_index\":18446744073709551615,\"item\":{\"type\":\"function_call\"}}\n\n",
            "data: {\"type\":\"response.function_call_arguments.delta\",\"output_index\":0,\"delta\":5}\n\n",
            "data: {\"type\":\"response.function_call_arguments.delta\",\"delta\":\"{}\"}\n\n",
            "data: {\"type\":\"response.output_text.delta\",\"delta\":null}\n\n",
            "data: {\"type\":\"response.completed\",\"response\":{\"output\":\"x\",\"usage\":{\"input_tokens\":-3}}}\n\n",
            "data: {\"type\":\"response.completed\",\"response\":{\"output\":[null,1,{\"type\":\"function_call\"}]}}\n\n",
            "data: {\"type\":\"response.failed\"}\n\n",
            "data: {\"type\":\"error\"}\n\n",
            "data: 42\n\n",
        ];
        for body in bodies {
            let items = decode_chunks(chunked(body.as_bytes(), 3)).await;
            assert!(!items.is_empty(), "{body}");
            let _ = assemble(&items.iter().filter(|i| i.is_ok()).cloned().collect::<Vec<_>>());
        }
    }

    fn conversation() -> ModelRequest {
        ModelRequest {
            model: "gpt-x".into(),
            system: "You are Kiln.".into(),
            messages: vec![
                Message::user("list files"),
                Message {
                    role: Role::Assistant,
                    parts: vec![
                        // Anthropic's signature: never sent here.
                        Part::Reasoning { text: "hmm".into(), signature: Some("opaque".into()) },
                        Part::Reasoning { text: "plan".into(), signature: Some("oai-enc:ENC1".into()) },
                        Part::Reasoning { text: String::new(), signature: Some("oai-enc:ENC2".into()) },
                        Part::Text { text: "Looking.".into() },
                        Part::ToolCall {
                            id: "call_1".into(),
                            name: "bash".into(),
                            arguments: json!({"command": "ls"}),
                        },
                        Part::ToolCall { id: "call_2".into(), name: "view".into(), arguments: json!({"path": "a"}) },
                    ],
                },
                Message {
                    role: Role::Tool,
                    parts: vec![
                        Part::ToolResult {
                            call_id: "call_1".into(),
                            name: "bash".into(),
                            output: "a\nb".into(),
                            is_error: false,
                        },
                        Part::ToolResult {
                            call_id: "call_2".into(),
                            name: "view".into(),
                            output: "nope".into(),
                            is_error: true,
                        },
                    ],
                },
                Message {
                    role: Role::Assistant,
                    parts: vec![Part::Reasoning { text: "only".into(), signature: None }],
                },
                Message::system("Summary of earlier work."),
                Message::user("thanks"),
            ],
            tools: vec![ToolSpec {
                name: "bash".into(),
                description: "Run a command".into(),
                input_schema: json!({"type": "object", "properties": {"command": {"type": "string"}}}),
            }],
            max_tokens: 1000,
            temperature: Some(0.5),
        }
    }

    #[test]
    fn request_shape() {
        let body = serde_json::to_value(request_body(&conversation())).unwrap();
        assert_eq!(
            body,
            json!({
                "model": "gpt-x",
                "instructions": "You are Kiln.",
                "input": [
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
                    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}],
                        "encrypted_content": "ENC1"},
                    {"type": "reasoning", "summary": [], "encrypted_content": "ENC2"},
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
                    {"type": "function_call", "call_id": "call_1", "name": "bash", "arguments": "{\"command\":\"ls\"}"},
                    {"type": "function_call", "call_id": "call_2", "name": "view", "arguments": "{\"path\":\"a\"}"},
                    {"type": "function_call_output", "call_id": "call_1", "output": "a\nb"},
                    {"type": "function_call_output", "call_id": "call_2", "output": "nope"},
                    {"type": "message", "role": "system", "content": [
                        {"type": "input_text", "text": "Summary of earlier work."}
                    ]},
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
                ],
                "tools": [{
                    "type": "function", "name": "bash", "description": "Run a command",
                    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
                    "strict": false,
                }],
                "max_output_tokens": 1000,
                "temperature": 0.5,
                "stream": true,
                "store": false,
                "include": ["reasoning.encrypted_content"],
            })
        );
    }

    #[tokio::test]
    async fn reasoning_items_without_streamed_text_keep_their_own_encrypted_content() {
        let item = |index: u64, id: &str, enc: &str| {
            json!({"type": "response.output_item.done", "output_index": index,
                "item": {"type": "reasoning", "id": id, "summary": [], "encrypted_content": enc}})
        };
        let body = stream_of(&[
            json!({"type": "response.reasoning_summary_text.delta", "item_id": "rs1", "output_index": 0,
                "summary_index": 0, "delta": "thinking"}),
            item(0, "rs1", "E1"),
            item(1, "rs2", "E2"),
            json!({"type": "response.completed", "response": {"status": "completed", "output": [
                {"type": "reasoning", "id": "rs1", "encrypted_content": "E1"},
                {"type": "reasoning", "id": "rs2", "encrypted_content": "E2"},
            ]}}),
        ]);
        let a = assemble(&decode_chunks(chunked(body.as_bytes(), 7)).await);
        assert_eq!(
            a.message.parts,
            vec![
                Part::Reasoning { text: "thinking".into(), signature: Some("oai-enc:E1".into()) },
                Part::Reasoning { text: String::new(), signature: Some("oai-enc:E2".into()) },
            ]
        );
    }

    #[test]
    fn tool_only_turn_and_optional_fields() {
        let request = ModelRequest {
            model: "m".into(),
            system: String::new(),
            messages: vec![Message {
                role: Role::Assistant,
                parts: vec![
                    Part::Text { text: String::new() },
                    Part::ToolCall { id: "c".into(), name: "bash".into(), arguments: json!({}) },
                ],
            }],
            tools: vec![],
            max_tokens: 10,
            temperature: None,
        };
        let body = serde_json::to_value(request_body(&request)).unwrap();
        assert_eq!(
            body["input"],
            json!([{"type": "function_call", "call_id": "c", "name": "bash", "arguments": "{}"}])
        );
        for key in ["instructions", "tools", "temperature"] {
            assert!(body.get(key).is_none(), "{key}: {body}");
        }
    }

    #[test]
    fn url_and_debug() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let p = OpenAiResponses::new(reqwest::Client::new(), "http://h/v1/", Some("sk-secret-key".into()));
        assert_eq!(p.url(), "http://h/v1/responses");
        assert_eq!(p.name(), "openai-responses");
        assert!(!format!("{p:?}").contains("secret"));
    }
}
