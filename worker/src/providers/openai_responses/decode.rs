//! Decoding a streamed Responses API response: the events as typed
//! structs, and the state that turns them into [`ModelEvent`]s.

use serde::Deserialize;
use serde_json::Value;

use crate::providers::sse::{Decoder, Flow, SseEvent};
use crate::providers::wire::{self, Arguments, CachedTokens};
use crate::providers::{FinishReason, ModelEvent, ProviderError};

use super::ENCRYPTED_PREFIX;

/// State of one streamed response.
#[derive(Default)]
pub(super) struct ResponsesDecoder {
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

/// One event, as far as Kiln reads it (leniently: see [`wire`]). Each kind
/// of event fills a few of these fields.
#[derive(Default, Deserialize)]
#[serde(default)]
struct StreamEvent {
    #[serde(rename = "type", deserialize_with = "wire::lenient")]
    kind: Option<String>,
    #[serde(deserialize_with = "wire::lenient")]
    output_index: Option<u64>,
    /// The output item an argument event is about, for servers that leave
    /// out its index.
    #[serde(deserialize_with = "wire::lenient")]
    item_id: Option<String>,
    /// `output_item.added` and `.done`.
    #[serde(deserialize_with = "wire::lenient")]
    item: Option<Item>,
    /// Text, reasoning and argument deltas.
    #[serde(deserialize_with = "wire::lenient")]
    delta: Option<String>,
    #[serde(deserialize_with = "wire::lenient")]
    summary_index: Option<u64>,
    #[serde(deserialize_with = "wire::lenient")]
    content_index: Option<u64>,
    /// `function_call_arguments.done`: the whole arguments.
    #[serde(deserialize_with = "wire::lenient")]
    arguments: Option<Arguments>,
    /// The response as it ended (`response.completed`, `.incomplete`).
    #[serde(deserialize_with = "wire::lenient")]
    response: Option<FinalResponse>,
}

/// An output item: only function calls and reasoning matter to Kiln.
#[derive(Default, Deserialize)]
#[serde(default)]
struct Item {
    #[serde(rename = "type", deserialize_with = "wire::lenient")]
    kind: Option<String>,
    #[serde(deserialize_with = "wire::lenient")]
    id: Option<String>,
    #[serde(deserialize_with = "wire::lenient")]
    call_id: Option<String>,
    #[serde(deserialize_with = "wire::lenient")]
    name: Option<String>,
    #[serde(deserialize_with = "wire::lenient")]
    arguments: Option<Arguments>,
    #[serde(deserialize_with = "wire::lenient")]
    encrypted_content: Option<String>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct FinalResponse {
    #[serde(deserialize_with = "wire::lenient_list")]
    output: Vec<Item>,
    #[serde(deserialize_with = "wire::lenient")]
    usage: Option<ResponsesUsage>,
    #[serde(deserialize_with = "wire::lenient")]
    incomplete_details: Option<IncompleteDetails>,
}

/// Like Chat Completions, the Responses API counts cached input tokens
/// inside `input_tokens` (and reasoning inside `output_tokens`).
#[derive(Default, Deserialize)]
#[serde(default)]
struct ResponsesUsage {
    #[serde(deserialize_with = "wire::lenient")]
    input_tokens: Option<u64>,
    #[serde(deserialize_with = "wire::lenient")]
    output_tokens: Option<u64>,
    #[serde(deserialize_with = "wire::lenient")]
    input_tokens_details: Option<CachedTokens>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct IncompleteDetails {
    #[serde(deserialize_with = "wire::lenient")]
    reason: Option<String>,
}

impl StreamEvent {
    fn output_index(&self) -> Option<usize> {
        self.output_index.and_then(|i| usize::try_from(i).ok())
    }
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
        let json: StreamEvent = wire::parse(data, "event data")?;
        // The data's own `type` is authoritative; the SSE event name is the
        // fallback for proxies that strip it.
        let kind = json.kind.as_deref().unwrap_or(&event.event);
        match kind {
            "response.output_item.added" | "response.output_item.done" => {
                if let Some(item) = &json.item {
                    self.on_item(item, json.output_index(), kind == "response.output_item.done", out);
                }
            }
            "response.output_text.delta" | "response.refusal.delta" => {
                wire::push_text(out, &json.delta, ModelEvent::TextDelta);
            }
            "response.reasoning_summary_text.delta" => self.on_reasoning(&json, json.summary_index, true, out),
            "response.reasoning_text.delta" => self.on_reasoning(&json, json.content_index, false, out),
            "response.function_call_arguments.delta" => {
                if let Some(call) = self.call_for(&json)
                    && let Some(piece) = wire::non_empty(&json.delta)
                {
                    call.has_arguments = true;
                    out.push(ModelEvent::ToolCallDelta { index: call.index, arguments: piece.to_owned() });
                }
            }
            "response.function_call_arguments.done" => {
                if let Some(call) = self.call_for(&json) {
                    call.fill_arguments(json.arguments.as_ref(), out);
                }
            }
            "response.completed" | "response.incomplete" => {
                self.on_end_of_response(kind == "response.incomplete", json.response.unwrap_or_default(), out);
                return Ok(Flow::Done);
            }
            "response.failed" => return Err(failed(data)),
            // Top-level `code`/`message` per the API reference; some servers
            // nest an `error` object instead. Both are understood.
            "error" => return Err(wire::stream_error(data)),
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

/// `response.failed`: the error object sits in the response, like an HTTP
/// error body's: `{"error": {"code", "message"}}`.
fn failed(data: &str) -> ProviderError {
    let json: Value = serde_json::from_str(data).unwrap_or_default();
    ProviderError::from_stream_error(json.get("response").unwrap_or(&Value::Null))
}

impl CallState {
    /// Sends the whole arguments from a `.done` event or a finished item,
    /// unless deltas already did.
    fn fill_arguments(&mut self, arguments: Option<&Arguments>, out: &mut Vec<ModelEvent>) {
        if self.has_arguments {
            return;
        }
        let Some(arguments) = arguments.filter(|a| !a.is_empty()) else {
            return;
        };
        self.has_arguments = true;
        out.push(ModelEvent::ToolCallDelta { index: self.index, arguments: arguments.clone().into_text() });
    }
}

impl ResponsesDecoder {
    /// The terminal event of a complete response.
    fn on_end_of_response(&mut self, incomplete: bool, response: FinalResponse, out: &mut Vec<ModelEvent>) {
        // The final output lists every item; one never announced (a server
        // that only reports the result) still counts.
        for (position, item) in response.output.iter().enumerate() {
            self.on_item(item, Some(position), true, out);
        }
        if let Some(usage) = &response.usage {
            let cached = usage.input_tokens_details.as_ref();
            out.push(ModelEvent::Usage(wire::usage_with_cached_input(usage.input_tokens, usage.output_tokens, cached)));
        }
        let finish = if incomplete {
            match response.incomplete_details.and_then(|d| d.reason).as_deref() {
                Some("max_output_tokens") => FinishReason::MaxTokens,
                None | Some("") => FinishReason::Other("incomplete".to_owned()),
                Some(other) => FinishReason::Other(other.to_owned()),
            }
        } else if self.calls.is_empty() {
            FinishReason::EndTurn
        } else {
            FinishReason::ToolUse
        };
        out.push(ModelEvent::Finish(finish));
    }

    /// An output item, added, done or listed in the final response. Only
    /// `function_call` items matter here: messages and reasoning arrive as
    /// deltas, and server-side tools are the provider's business.
    /// `done`: the item is complete (`output_item.done`, or the final
    /// output list); only then is a reasoning item's encrypted content final.
    fn on_item(&mut self, item: &Item, output_index: Option<usize>, done: bool, out: &mut Vec<ModelEvent>) {
        match item.kind.as_deref() {
            Some("function_call") => {}
            Some("reasoning") if done => return self.on_reasoning_done(item, output_index, out),
            _ => return,
        }
        let item_id = wire::non_empty(&item.id);
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
                let id = wire::non_empty(&item.call_id).or(item_id).map_or_else(wire::made_up_call_id, str::to_owned);
                let name = wire::non_empty(&item.name).unwrap_or_default().to_owned();
                out.push(ModelEvent::ToolCallStart { index, id, name });
                self.calls.push(CallState { index, item_id: item_id.map(str::to_owned), has_arguments: false });
                self.calls.len() - 1
            }
        };
        self.calls[position].fill_arguments(item.arguments.as_ref(), out);
    }

    /// The started call an argument event is about: by `output_index`, or
    /// by `item_id` when a server leaves the index out.
    fn call_for(&mut self, event: &StreamEvent) -> Option<&mut CallState> {
        if let Some(index) = event.output_index() {
            return self.calls.iter_mut().find(|c| c.index == index);
        }
        let item_id = event.item_id.as_deref()?;
        self.calls.iter_mut().find(|c| c.item_id.as_deref() == Some(item_id))
    }

    fn on_reasoning_done(&mut self, item: &Item, output_index: Option<usize>, out: &mut Vec<ModelEvent>) {
        let Some(encrypted) = wire::non_empty(&item.encrypted_content) else { return };
        let key = match wire::non_empty(&item.id) {
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

    fn on_reasoning(&mut self, event: &StreamEvent, part: Option<u64>, summary: bool, out: &mut Vec<ModelEvent>) {
        let Some(text) = wire::non_empty(&event.delta) else {
            return;
        };
        let key = ReasoningKey { output_index: event.output_index, part, summary };
        if self.last_reasoning.is_some_and(|last| last != key) {
            out.push(ModelEvent::ReasoningDelta("\n\n".to_owned()));
        }
        self.last_reasoning = Some(key);
        out.push(ModelEvent::ReasoningDelta(text.to_owned()));
    }
}
