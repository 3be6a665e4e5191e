//! The OpenAI Chat Completions streaming format, chunk for chunk as the
//! real API sends it: `data:` lines of `chat.completion.chunk` objects, the
//! role first, content deltas, tool calls announced with id and name under
//! their `index` and then argument pieces, a finish chunk, a usage chunk
//! with `choices: []` when asked for, and `data: [DONE]`.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::plan::{Plan, argument_pieces, text_pieces};

/// The frames of a complete answer.
pub(crate) fn render(plan: &Plan, include_usage: bool) -> Vec<String> {
    let chunks = Chunks::new(plan);
    let mut frames = vec![chunks.delta(json!({"role": "assistant", "content": ""}))];
    for piece in text_pieces(&plan.text) {
        frames.push(chunks.delta(json!({"content": piece})));
    }
    for (index, call) in plan.calls.iter().enumerate() {
        let id = call.id("call_");
        frames.push(chunks.delta(json!({"tool_calls": [{
            "index": index, "id": id, "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }]})));
        for piece in argument_pieces(&call.arguments) {
            frames.push(chunks.delta(json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})));
        }
    }
    let finish_reason = if plan.calls.is_empty() { "stop" } else { "tool_calls" };
    frames
        .push(chunks.frame(json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": finish_reason}]), None));
    if include_usage {
        // Chat Completions counts cached tokens inside `prompt_tokens`.
        let prompt = plan.input_tokens + plan.cached_tokens;
        let usage = json!({
            "prompt_tokens": prompt,
            "completion_tokens": plan.output_tokens,
            "total_tokens": prompt + plan.output_tokens,
            "prompt_tokens_details": {"cached_tokens": plan.cached_tokens},
        });
        frames.push(chunks.frame(json!([]), Some(usage)));
    }
    frames.push("data: [DONE]\n\n".to_owned());
    frames
}

/// The frames a hanging answer sends before going silent.
pub(crate) fn render_hang(plan: &Plan) -> Vec<String> {
    let chunks = Chunks::new(plan);
    vec![chunks.delta(json!({"role": "assistant", "content": ""})), chunks.delta(json!({"content": plan.hang_text()}))]
}

/// The JSON body of an HTTP error, in the API's shape.
pub(crate) fn error_body(status: u16) -> Value {
    let (kind, code) = match status {
        401 => ("invalid_request_error", Value::from("invalid_api_key")),
        429 => ("requests", Value::from("rate_limit_exceeded")),
        500..=599 => ("server_error", Value::Null),
        _ => ("invalid_request_error", Value::Null),
    };
    json!({"error": {"message": format!("scripted model: HTTP {status}"), "type": kind, "param": null, "code": code}})
}

/// The fields every chunk of one answer shares.
struct Chunks<'a> {
    id: String,
    created: u64,
    model: &'a str,
}

impl<'a> Chunks<'a> {
    fn new(plan: &'a Plan) -> Self {
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        Chunks { id: format!("chatcmpl-scripted-{}", plan.seq), created, model: &plan.model }
    }

    fn delta(&self, delta: Value) -> String {
        self.frame(json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": null}]), None)
    }

    /// Like the real API with `include_usage`, every chunk carries `usage`:
    /// null except on the last.
    fn frame(&self, choices: Value, usage: Option<Value>) -> String {
        let chunk = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": choices,
            "usage": usage,
        });
        format!("data: {chunk}\n\n")
    }
}
