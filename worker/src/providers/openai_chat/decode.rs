//! Decoding a streamed Chat Completions response: the chunks as typed
//! structs, and the state that turns them into [`ModelEvent`]s.

use serde::Deserialize;
use serde_json::Value;

use crate::providers::sse::{Decoder, Flow, SseEvent};
use crate::providers::wire::{self, Arguments, CachedTokens};
use crate::providers::{FinishReason, ModelEvent, ProviderError};

/// State of one streamed Chat Completions response.
#[derive(Default)]
pub(super) struct ChatDecoder {
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

/// One chunk, as far as Kiln reads it (leniently: see [`wire`]).
#[derive(Default, Deserialize)]
#[serde(default)]
struct Chunk {
    /// Any error that is not `null` ends the stream.
    error: Option<Value>,
    /// Azure's first chunk has `choices: []` and only filter results; usage
    /// chunks have `choices: []` too.
    #[serde(deserialize_with = "wire::lenient_list")]
    choices: Vec<Choice>,
    #[serde(deserialize_with = "wire::lenient")]
    usage: Option<ChatUsage>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct Choice {
    #[serde(deserialize_with = "wire::lenient")]
    index: Option<u64>,
    #[serde(deserialize_with = "wire::lenient")]
    delta: Option<Delta>,
    #[serde(deserialize_with = "wire::lenient")]
    finish_reason: Option<String>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct Delta {
    #[serde(deserialize_with = "wire::lenient")]
    content: Option<String>,
    /// vLLM and DeepSeek use `reasoning_content`; OpenRouter, newer vLLM and
    /// llama.cpp `reasoning`.
    #[serde(deserialize_with = "wire::lenient")]
    reasoning_content: Option<String>,
    #[serde(deserialize_with = "wire::lenient")]
    reasoning: Option<String>,
    #[serde(deserialize_with = "wire::lenient_list")]
    tool_calls: Vec<ToolCallDelta>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct ToolCallDelta {
    #[serde(deserialize_with = "wire::lenient")]
    index: Option<u64>,
    #[serde(deserialize_with = "wire::lenient")]
    id: Option<String>,
    #[serde(deserialize_with = "wire::lenient")]
    function: Option<FunctionDelta>,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct FunctionDelta {
    #[serde(deserialize_with = "wire::lenient")]
    name: Option<String>,
    #[serde(deserialize_with = "wire::lenient")]
    arguments: Option<Arguments>,
}

/// Chat Completions counts cached prompt tokens inside `prompt_tokens`.
#[derive(Default, Deserialize)]
#[serde(default)]
struct ChatUsage {
    #[serde(deserialize_with = "wire::lenient")]
    prompt_tokens: Option<u64>,
    #[serde(deserialize_with = "wire::lenient")]
    completion_tokens: Option<u64>,
    #[serde(deserialize_with = "wire::lenient")]
    prompt_tokens_details: Option<CachedTokens>,
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
        let chunk: Chunk = wire::parse(data, "chunk")?;
        if chunk.error.is_some() {
            return Err(wire::stream_error(data));
        }
        for choice in chunk.choices {
            // With n = 1 there is one choice; should a server send more, the
            // others would interleave their text into ours.
            if choice.index.is_some_and(|i| i != 0) {
                continue;
            }
            if let Some(delta) = choice.delta {
                self.on_delta(delta, out);
            }
            if let Some(reason) = choice.finish_reason {
                self.finish_reason = Some(reason);
            }
        }
        if let Some(usage) = chunk.usage {
            let cached = usage.prompt_tokens_details.as_ref();
            out.push(ModelEvent::Usage(wire::usage_with_cached_input(
                usage.prompt_tokens,
                usage.completion_tokens,
                cached,
            )));
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

    fn on_delta(&mut self, delta: Delta, out: &mut Vec<ModelEvent>) {
        wire::push_text(out, &delta.content, ModelEvent::TextDelta);
        // Servers that send both reasoning fields send the same text twice,
        // so only one is taken.
        let reasoning = wire::non_empty(&delta.reasoning_content).or_else(|| wire::non_empty(&delta.reasoning));
        if let Some(text) = reasoning {
            out.push(ModelEvent::ReasoningDelta(text.to_owned()));
        }
        for call in delta.tool_calls {
            self.on_tool_call_delta(call, out);
        }
    }

    fn on_tool_call_delta(&mut self, delta: ToolCallDelta, out: &mut Vec<ModelEvent>) {
        let id = wire::non_empty(&delta.id).map(str::to_owned);
        let (name, arguments) = match delta.function {
            Some(function) => (
                wire::non_empty(&function.name).map(str::to_owned),
                function.arguments.map(Arguments::into_text).unwrap_or_default(),
            ),
            None => (None, String::new()),
        };
        let index = self.call_index(delta.index, id.is_some());
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
            call.id = id;
        }
        if call.name.is_none() {
            call.name = name;
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
            let id = call.id.get_or_insert_with(wire::made_up_call_id).clone();
            out.push(ModelEvent::ToolCallStart { index, id, name });
            if !call.pending.is_empty() {
                out.push(ModelEvent::ToolCallDelta { index, arguments: std::mem::take(&mut call.pending) });
            }
        }
    }

    /// The wire `index` identifies a call; servers that omit it start a new
    /// call with each new id and otherwise continue the last one.
    fn call_index(&self, index: Option<u64>, has_id: bool) -> usize {
        if let Some(index) = index {
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
