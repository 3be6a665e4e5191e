//! Folds a provider's [`ModelEvent`]s into the assistant [`Message`] that is
//! persisted, plus the usage and finish reason of the step.
//!
//! Tool call arguments arrive as JSON text in pieces split anywhere, so they
//! are kept as raw text and parsed once, at the end. A call is executable
//! only if the stream finished and its arguments parse to a JSON object;
//! anything else is reported in [`Assembled::rejected_calls`] so the loop
//! can tell the model, and is never stored as a tool call.
//!
//! Built for an agent step ([`AssistantBuilder::for_step`]), each call gets
//! Kiln's own id, `{step}-{n}` (the n-th call started in the step's answer):
//! unique within the run whatever the provider sends (servers repeat ids,
//! `call_0` every step or one id twice in an answer), and the same again
//! when a step is retried or a run picked up. The provider's id is kept
//! beside it for the wire.

use kiln_protocol::{Message, Part, Role, Usage};

use super::{FinishReason, ModelEvent};

/// Builds one assistant message from a stream of events.
#[derive(Debug, Default)]
pub struct AssistantBuilder {
    /// Reasoning blocks in arrival order. A signed block is closed: Anthropic
    /// verifies each signature against its own block's text.
    reasoning: Vec<ReasoningBlock>,
    text: String,
    /// Tool calls in order of their start.
    calls: Vec<PendingCall>,
    usage: Usage,
    finish_reason: Option<FinishReason>,
    /// The agent step the answer is for: the calls get Kiln's ids. `None`:
    /// they keep the provider's (an answer that runs no tools).
    step: Option<u32>,
}

#[derive(Debug, Default)]
struct ReasoningBlock {
    text: String,
    signature: Option<String>,
}

#[derive(Debug)]
struct PendingCall {
    index: usize,
    /// Kiln's id (the provider's when not built for a step).
    id: String,
    /// The provider's id, when it is not `id`.
    provider_id: Option<String>,
    name: String,
    /// The JSON text as received, unparsed until the stream ends.
    arguments: String,
}

/// The result of one model call.
#[derive(Debug, Clone, PartialEq)]
pub struct Assembled {
    /// Role assistant; parts in order: reasoning, text, tool calls. Only
    /// complete, well-formed tool calls are included.
    pub message: Message,
    pub usage: Usage,
    /// `None` when the stream never finished.
    pub finish_reason: Option<FinishReason>,
    /// Tool calls that must not run, with the reason.
    pub rejected_calls: Vec<RejectedCall>,
}

/// A tool call that was started but cannot be executed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedCall {
    pub id: String,
    pub name: String,
    /// The arguments text as the model sent it.
    pub raw_arguments: String,
    /// Why it was rejected, worded for the model.
    pub error: String,
}

impl AssistantBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder for the answer of agent step `step`: its calls get Kiln's
    /// ids (see the module's doc).
    pub fn for_step(step: u32) -> Self {
        AssistantBuilder { step: Some(step), ..Self::default() }
    }

    /// Takes in one event. Events that make no sense (a delta for a call
    /// never started, a second start for the same index) are ignored: the
    /// model's output is not trusted to be well formed.
    pub fn push(&mut self, event: &ModelEvent) {
        match event {
            ModelEvent::TextDelta(text) => self.text.push_str(text),
            ModelEvent::ReasoningDelta(text) => self.open_reasoning_block().text.push_str(text),
            ModelEvent::ReasoningSignature(signature) => {
                // Signatures stream as deltas of the current block's
                // signature (in practice one piece).
                if self.reasoning.is_empty() {
                    self.reasoning.push(ReasoningBlock::default());
                }
                if let Some(block) = self.reasoning.last_mut() {
                    block.signature.get_or_insert_with(String::new).push_str(signature);
                }
            }
            ModelEvent::ToolCallStart { index, id, name } => {
                if self.call(*index).is_none() {
                    // What goes back on the wire: some servers send no id.
                    let wire = if id.is_empty() { format!("call_{index}") } else { id.clone() };
                    let (id, provider_id) = match self.step {
                        Some(step) => (format!("{step}-{}", self.calls.len() + 1), Some(wire)),
                        None => (wire, None),
                    };
                    self.calls.push(PendingCall {
                        index: *index,
                        id,
                        provider_id,
                        name: name.clone(),
                        arguments: String::new(),
                    });
                }
            }
            ModelEvent::ToolCallDelta { index, arguments } => {
                if let Some(call) = self.calls.iter_mut().find(|c| c.index == *index) {
                    call.arguments.push_str(arguments);
                }
            }
            ModelEvent::Usage(usage) => merge_usage(&mut self.usage, usage),
            ModelEvent::Finish(reason) => self.finish_reason = Some(reason.clone()),
        }
    }

    /// Kiln's id of the call started under `index`, so the loop can label
    /// `tool_call.started`/`tool_call.delta` events while streaming.
    pub fn call_id(&self, index: usize) -> Option<&str> {
        self.call(index).map(|c| c.id.as_str())
    }

    /// The tool name of the call started under `index`.
    pub fn call_name(&self, index: usize) -> Option<&str> {
        self.call(index).map(|c| c.name.as_str())
    }

    /// Text received so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Usage reported so far.
    pub fn usage(&self) -> Usage {
        self.usage
    }

    pub fn finish_reason(&self) -> Option<&FinishReason> {
        self.finish_reason.as_ref()
    }

    /// Ends the message: parses every call's arguments and splits the calls
    /// into executable parts and rejected ones.
    pub fn finish(self) -> Assembled {
        let finished = self.finish_reason.is_some();
        let mut parts: Vec<Part> = self
            .reasoning
            .into_iter()
            // A signature alone (thinking shown as omitted) must still be
            // echoed back, so it is kept even without text.
            .filter(|b| !b.text.is_empty() || b.signature.as_deref().is_some_and(|s| !s.is_empty()))
            .map(|b| Part::Reasoning { text: b.text, signature: b.signature })
            .collect();
        if !self.text.is_empty() {
            parts.push(Part::Text { text: self.text });
        }
        let mut rejected_calls = Vec::new();
        for call in self.calls {
            match check_call(&call, finished) {
                Ok(arguments) => parts.push(Part::ToolCall {
                    id: call.id,
                    name: call.name,
                    arguments,
                    provider_id: call.provider_id,
                }),
                Err(error) => rejected_calls.push(RejectedCall {
                    id: call.id,
                    name: call.name,
                    raw_arguments: call.arguments,
                    error,
                }),
            }
        }
        Assembled {
            message: Message { role: Role::Assistant, parts },
            usage: self.usage,
            finish_reason: self.finish_reason,
            rejected_calls,
        }
    }

    fn call(&self, index: usize) -> Option<&PendingCall> {
        self.calls.iter().find(|c| c.index == index)
    }

    /// The reasoning block new text belongs to: the last one unless it is
    /// already signed (closed).
    fn open_reasoning_block(&mut self) -> &mut ReasoningBlock {
        if self.reasoning.last().is_none_or(|b| b.signature.is_some()) {
            self.reasoning.push(ReasoningBlock::default());
        }
        let last = self.reasoning.len() - 1;
        &mut self.reasoning[last]
    }
}

/// A later report supersedes an earlier one field by field; providers send
/// cumulative counts, and a zero means "not reported here" (Anthropic's
/// `message_delta` of older API versions carries output tokens only).
fn merge_usage(current: &mut Usage, report: &Usage) {
    let fields = [
        (&mut current.input_tokens, report.input_tokens),
        (&mut current.output_tokens, report.output_tokens),
        (&mut current.cache_read_tokens, report.cache_read_tokens),
        (&mut current.cache_write_tokens, report.cache_write_tokens),
    ];
    for (slot, value) in fields {
        if value != 0 {
            *slot = value;
        }
    }
}

/// The parsed arguments of a call that may run, or why it may not.
fn check_call(call: &PendingCall, finished: bool) -> Result<serde_json::Value, String> {
    if !finished {
        return Err("the response ended before this tool call was complete; it was not run".to_owned());
    }
    if call.name.trim().is_empty() {
        return Err("the tool call has no tool name; it was not run".to_owned());
    }
    let text = call.arguments.trim();
    // Providers send nothing at all for a call without arguments.
    if text.is_empty() {
        return Ok(serde_json::Value::Object(Default::default()));
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(value) if value.is_object() => Ok(value),
        Ok(_) => Err("the tool call's arguments are not a JSON object; it was not run".to_owned()),
        Err(e) => Err(format!("the tool call's arguments are not valid JSON ({e}); it was not run")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
#[path = "assemble_tests.rs"]
mod tests;
