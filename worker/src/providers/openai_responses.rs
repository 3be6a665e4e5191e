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

mod decode;

use bytes::Bytes;
use futures::Stream;
use kiln_protocol::{Message, Part, Role};
use serde::Serialize;
use serde_json::Value;

use super::endpoint::{Endpoint, KeyHeader};
use super::sse;
use super::{ModelProvider, ModelRequest, ModelStream, ProviderError, ToolSpec};
use decode::ResponsesDecoder;

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
        let http = self.endpoint.post(&self.url(), KeyHeader::Bearer).json(&request_body(request));
        self.endpoint.stream(http, ResponsesDecoder::default()).await
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
    /// Routes requests sharing a prefix to the same cache (the session id).
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_cache_key: Option<&'a str>,
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
        prompt_cache_key: request.cache_key.as_deref(),
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
        if let (Part::ToolResult { output, .. }, Some(call_id)) = (part, part.wire_id()) {
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
        for (call_id, name, arguments) in message.wire_tool_calls() {
            out.push(InputItem::FunctionCall { call_id, name, arguments: arguments.to_string() });
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
#[path = "openai_responses_tests.rs"]
mod tests;
