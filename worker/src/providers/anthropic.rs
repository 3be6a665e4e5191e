//! Anthropic Messages API, streamed.
//!
//! The stream is a sequence of typed events (`message_start`,
//! `content_block_start/delta/stop` per content block, `message_delta`,
//! `message_stop`, `ping`, `error`); only `message_stop` proves the answer
//! complete.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use futures::Stream;
use kiln_protocol::{Message, Part, Role, Usage};
use serde::Serialize;
use serde_json::Value;

use super::sse::{self, Decoder, Flow, SseEvent};
use super::{FinishReason, ModelEvent, ModelProvider, ModelRequest, ModelStream, ProviderError, ToolSpec};

pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The API version whose event stream this module decodes.
const API_VERSION: &str = "2023-06-01";

/// The Messages API at `{base_url}/v1/messages`.
#[derive(Clone)]
pub struct Anthropic {
    pub client: reqwest::Client,
    /// Without the `/v1` segment, e.g. `https://api.anthropic.com`.
    pub base_url: String,
    /// Sent as `x-api-key`; a proxy that adds its own may need none.
    pub api_key: Option<String>,
}

impl Anthropic {
    /// The public API at [`DEFAULT_BASE_URL`].
    pub fn new(client: reqwest::Client, api_key: Option<String>) -> Self {
        Anthropic { client, base_url: DEFAULT_BASE_URL.to_owned(), api_key }
    }

    pub fn with_base_url(mut self, base_url: impl Into<String>) -> Self {
        self.base_url = base_url.into();
        self
    }

    fn url(&self) -> String {
        let base = self.base_url.trim_end_matches('/');
        // Tolerate a base URL given with the version segment, as OpenAI
        // base URLs are written.
        let base = base.strip_suffix("/v1").unwrap_or(base);
        format!("{base}/v1/messages")
    }
}

// Hand-written so the key never reaches a log line.
impl fmt::Debug for Anthropic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Anthropic")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .finish()
    }
}

#[async_trait::async_trait]
impl ModelProvider for Anthropic {
    fn name(&self) -> &'static str {
        "anthropic"
    }

    async fn stream(&self, request: &ModelRequest) -> Result<ModelStream, ProviderError> {
        let mut http =
            self.client.post(self.url()).header("anthropic-version", API_VERSION).json(&request_body(request));
        if let Some(key) = &self.api_key {
            http = http.header("x-api-key", key);
        }
        let response = sse::open(http, self.api_key.as_deref()).await?;
        Ok(decode_stream(response.bytes_stream()))
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
        decode_fixture_variants(decode_stream, &format!("anthropic/{name}")).await
    }

    async fn assembled_fixture(name: &str) -> Assembled {
        assemble_complete(&decode_fixture(name).await, name)
    }

    fn usage(input: u64, output: u64) -> Usage {
        Usage { input_tokens: input, output_tokens: output, cache_read_tokens: 0, cache_write_tokens: 0 }
    }

    #[tokio::test]
    async fn every_fixture_decodes() {
        let names = fixture_names("anthropic");
        assert_eq!(names.len(), 9, "{names:?}");
        for name in names {
            let items = decode_fixture(&name).await;
            if name == "docs_error_event.sse" {
                continue;
            }
            let a = assemble(&items);
            assert!(a.finish_reason.is_some(), "{name}");
            assert!(a.rejected_calls.is_empty(), "{name}: {:?}", a.rejected_calls);
        }
    }

    #[tokio::test]
    async fn docs_basic_text() {
        let a = assembled_fixture("docs_basic_text.sse").await;
        assert_eq!(a.message.parts, vec![Part::Text { text: "Hello!".into() }]);
        assert_eq!(a.finish_reason, Some(FinishReason::EndTurn));
        assert_eq!(a.usage, usage(25, 15));
    }

    #[tokio::test]
    async fn vercel_text() {
        let a = assembled_fixture("vercel_text.sse").await;
        assert_eq!(
            a.message.text(),
            "Hello! I'm doing well, thank you for asking. How are you doing today? Is there anything I can help you with?"
        );
        assert_eq!(a.usage, usage(12, 30));
        assert_eq!(a.finish_reason, Some(FinishReason::EndTurn));
    }

    #[tokio::test]
    async fn docs_tool_use() {
        let a = assembled_fixture("docs_tool_use.sse").await;
        assert_eq!(
            a.message.parts,
            vec![
                Part::Text { text: "Okay, let's check the weather for San Francisco, CA:".into() },
                Part::ToolCall {
                    id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".into(),
                    name: "get_weather".into(),
                    arguments: json!({"location": "San Francisco, CA"}),
                },
            ]
        );
        assert_eq!(a.finish_reason, Some(FinishReason::ToolUse));
        assert_eq!(a.usage, usage(472, 89));
    }

    #[tokio::test]
    async fn vercel_tool_use_alone_and_after_text() {
        let expected_args =
            json!({"elements": [{"location": "San Francisco", "temperature": 58, "condition": "sunny"}]});
        let a = assembled_fixture("vercel_tool_use.sse").await;
        assert_eq!(
            a.message.parts,
            vec![Part::ToolCall {
                id: "toolu_01KFbKqPYSuAKujiL6mTfzYA".into(),
                name: "json".into(),
                arguments: expected_args.clone()
            }]
        );
        assert_eq!(a.usage, usage(849, 47));
        assert_eq!(a.finish_reason, Some(FinishReason::ToolUse));

        let items = decode_fixture("vercel_text_then_tool_use.sse").await;
        assert!(items.contains(&Ok(ModelEvent::ToolCallStart {
            index: 1,
            id: "toolu_01KFbKqPYSuAKujiL6mTfzYA".into(),
            name: "json".into()
        })));
        let a = assemble(&items);
        assert_eq!(a.message.text(), "I'll invoke the JSON response tool.");
        assert_eq!(
            a.message.tool_calls().collect::<Vec<_>>(),
            vec![("toolu_01KFbKqPYSuAKujiL6mTfzYA", "json", &expected_args)]
        );
    }

    #[tokio::test]
    async fn tool_use_without_arguments_gets_an_empty_object() {
        let a = assembled_fixture("vercel_tool_use_no_args.sse").await;
        assert_eq!(a.message.text(), "I'll update the issue list for you.");
        assert_eq!(
            a.message.tool_calls().collect::<Vec<_>>(),
            vec![("toolu_01QE1WLsSVp5hy5Q3GmGTmjP", "updateIssueList", &json!({}))]
        );
        assert_eq!(a.usage, usage(565, 48));
    }

    #[tokio::test]
    async fn thinking_with_signature() {
        let a = assembled_fixture("vercel_thinking.sse").await;
        let Part::Reasoning { text, signature } = &a.message.parts[0] else { panic!("{:?}", a.message.parts) };
        assert_eq!(text, "The previous result was 925. Now I need to divide that by 5.\n\n925 ÷ 5 = 185");
        let signature = signature.as_deref().unwrap();
        assert!(signature.starts_with("EvQBCkYICxgCKkAxhD4N") && signature.ends_with("EhT6Ca17BgB"), "{signature}");
        assert_eq!(a.message.parts[1], Part::Text { text: "925 ÷ 5 = 185".into() });
        assert_eq!(a.message.parts.len(), 2);
        assert_eq!(a.usage, usage(69, 53));

        let a = assembled_fixture("docs_thinking.sse").await;
        assert_eq!(
            a.message.parts,
            vec![
                Part::Reasoning {
                    text: "I need to find the GCD of 1071 and 462 using the Euclidean algorithm.\n\n\
                           1071 = 2 × 462 + 147\n462 = 3 × 147 + 21\n147 = 7 × 21 + 0\n\
                           The remainder is 0, so GCD(1071, 462) = 21."
                        .into(),
                    signature: Some("EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds...".into()),
                },
                Part::Text { text: "The greatest common divisor of 1071 and 462 is **21**.".into() },
            ]
        );
        assert_eq!(a.usage, Usage::default(), "this docs example carries no usage");
        assert_eq!(a.finish_reason, Some(FinishReason::EndTurn));
    }

    #[tokio::test]
    async fn error_event_is_a_retryable_overload() {
        let items = decode_fixture("docs_error_event.sse").await;
        assert_eq!(
            items,
            vec![Err(ProviderError::Stream {
                kind: "overloaded_error".into(),
                message: "overloaded_error: Overloaded".into()
            })]
        );
        assert!(items[0].clone().unwrap_err().is_retryable());
    }

    #[tokio::test]
    async fn cut_before_message_stop_is_truncated() {
        for name in fixture_names("anthropic").into_iter().filter(|n| n != "docs_error_event.sse") {
            let text = String::from_utf8(fixture(&format!("anthropic/{name}"))).unwrap();
            let cut = text.find("event: message_stop").unwrap_or_else(|| panic!("{name}"));
            let items = decode_chunks(chunked(&text.as_bytes()[..cut], 7)).await;
            assert_eq!(items.last(), Some(&Err(ProviderError::Truncated)), "{name}");
            assert!(!items.iter().any(|i| matches!(i, Ok(ModelEvent::Finish(_)))), "{name}");
            let a = assemble(&items[..items.len() - 1]);
            assert_eq!(a.finish_reason, None);
            assert_eq!(a.message.tool_calls().count(), 0, "{name}: an unfinished call is never executable");
        }
    }

    #[tokio::test]
    async fn cut_inside_tool_arguments_is_truncated_and_rejected() {
        let text = String::from_utf8(fixture("anthropic/docs_tool_use.sse")).unwrap();
        let cut = text.find(r#""partial_json":" Francisc""#).unwrap();
        let items = decode_chunks(chunked(&text.as_bytes()[..cut], 64)).await;
        assert_eq!(items.last(), Some(&Err(ProviderError::Truncated)));
        let a = assemble(&items[..items.len() - 1]);
        assert_eq!(a.rejected_calls.len(), 1);
        assert_eq!(a.rejected_calls[0].id, "toolu_01T1x1fJ34qAmk2tNTrN7Up6");
    }

    #[tokio::test]
    async fn server_tool_input_is_not_a_client_call() {
        let body = "event: content_block_start\n\
            data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"server_tool_use\",\"id\":\"srvtoolu_1\",\"name\":\"web_search\",\"input\":{}}}\n\n\
            event: content_block_delta\n\
            data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"query\\\":\\\"x\\\"}\"}}\n\n\
            event: message_delta\n\
            data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"pause_turn\"},\"usage\":{\"output_tokens\":3}}\n\n\
            event: message_stop\n\
            data: {\"type\":\"message_stop\"}\n\n";
        let items = decode_chunks(chunked(body.as_bytes(), 13)).await;
        assert_eq!(
            items,
            vec![Ok(ModelEvent::Usage(usage(0, 3))), Ok(ModelEvent::Finish(FinishReason::Other("pause_turn".into()))),]
        );
    }

    #[tokio::test]
    async fn garbage_never_panics() {
        let bodies = [
            "data: {not json\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\"}\n\n",
            "data: {\"type\":\"content_block_delta\",\"index\":-1,\"delta\":{}}\n\n",
            "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":\"many\"}}}\n\n",
            "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":7}}\n\n",
            "data: 42\n\nevent: message_stop\ndata: {}\n\n",
            "data: {\"type\":\"error\"}\n\n",
        ];
        for body in bodies {
            let items = decode_chunks(chunked(body.as_bytes(), 3)).await;
            assert!(!items.is_empty(), "{body}");
            let _ = assemble(&items.iter().filter(|i| i.is_ok()).cloned().collect::<Vec<_>>());
        }
        // The SSE event name stands in for a missing `type`.
        let items = decode_chunks(chunked(b"event: message_stop\ndata: {}\n\n", 3)).await;
        assert_eq!(items, vec![Ok(ModelEvent::Finish(FinishReason::Other("unknown".into())))]);
    }

    fn conversation() -> ModelRequest {
        ModelRequest {
            model: "claude-x".into(),
            system: "You are Kiln.".into(),
            messages: vec![
                Message::user("fix it"),
                Message {
                    role: Role::Assistant,
                    parts: vec![
                        Part::Reasoning { text: "signed".into(), signature: Some("sig".into()) },
                        Part::Reasoning { text: "unsigned".into(), signature: None },
                        // The Responses API's encrypted reasoning: not Anthropic's to read.
                        Part::Reasoning { text: "openai".into(), signature: Some("oai-enc:E".into()) },
                        Part::Text { text: "Looking.".into() },
                        Part::ToolCall {
                            id: "toolu_1".into(),
                            name: "bash".into(),
                            arguments: json!({"command": "ls"}),
                        },
                        Part::ToolCall { id: "toolu_2".into(), name: "view".into(), arguments: json!("garbage") },
                    ],
                },
                Message {
                    role: Role::Tool,
                    parts: vec![
                        Part::ToolResult {
                            call_id: "toolu_1".into(),
                            name: "bash".into(),
                            output: "a\nb".into(),
                            is_error: false,
                        },
                        Part::ToolResult {
                            call_id: "toolu_2".into(),
                            name: "view".into(),
                            output: String::new(),
                            is_error: true,
                        },
                    ],
                },
                Message::user("also check b"),
                Message::system("Summary of earlier work."),
                Message { role: Role::User, parts: vec![Part::Text { text: String::new() }] },
            ],
            tools: vec![ToolSpec {
                name: "bash".into(),
                description: "Run a command".into(),
                input_schema: json!({"type": "object"}),
            }],
            max_tokens: 4096,
            temperature: None,
        }
    }

    #[test]
    fn request_shape() {
        let body = serde_json::to_value(request_body(&conversation())).unwrap();
        assert_eq!(
            body,
            json!({
                "model": "claude-x",
                "max_tokens": 4096,
                "system": "You are Kiln.\n\nSummary of earlier work.",
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "fix it"}]},
                    {"role": "assistant", "content": [
                        {"type": "thinking", "thinking": "signed", "signature": "sig"},
                        {"type": "text", "text": "Looking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}},
                        {"type": "tool_use", "id": "toolu_2", "name": "view", "input": {}},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a\nb", "is_error": false},
                        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "(no output)", "is_error": true},
                        {"type": "text", "text": "also check b"},
                    ]},
                ],
                "tools": [{"name": "bash", "description": "Run a command", "input_schema": {"type": "object"}}],
                "stream": true,
            })
        );
    }

    #[test]
    fn tool_results_come_first_in_a_merged_user_turn() {
        let mut request = conversation();
        // A steering message persisted before the tool results.
        request.messages.swap(2, 3);
        let body = serde_json::to_value(request_body(&request)).unwrap();
        let types: Vec<&str> =
            body["messages"][2]["content"].as_array().unwrap().iter().map(|b| b["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["tool_result", "tool_result", "text"]);
    }

    #[test]
    fn url_and_debug() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let p = Anthropic::new(reqwest::Client::new(), Some("sk-ant-secret".into()));
        assert_eq!(p.url(), "https://api.anthropic.com/v1/messages");
        assert_eq!(p.clone().with_base_url("http://h:1/").url(), "http://h:1/v1/messages");
        assert_eq!(p.clone().with_base_url("http://h:1/v1").url(), "http://h:1/v1/messages");
        assert!(!format!("{p:?}").contains("secret"));
    }
}
