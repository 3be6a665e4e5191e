//! The Anthropic Messages streaming format, event for event as the real API
//! sends it: `event:` and `data:` lines, a `ping` early on, each content
//! block opened, filled with deltas and closed, then `message_delta` with
//! the stop reason and `message_stop`.

use serde_json::{Value, json};

use crate::plan::{Plan, argument_pieces, text_pieces};

/// The events of a complete answer, each a ready-to-send SSE frame.
pub(crate) fn render(plan: &Plan) -> Vec<String> {
    let mut frames = vec![message_start(plan), frame(&json!({"type": "ping"}))];
    let mut index = 0;
    if !plan.text.is_empty() {
        frames.push(block_start(index, json!({"type": "text", "text": ""})));
        for piece in text_pieces(&plan.text) {
            frames.push(block_delta(index, json!({"type": "text_delta", "text": piece})));
        }
        frames.push(block_stop(index));
        index += 1;
    }
    for call in &plan.calls {
        let id = call.id("toolu_");
        frames.push(block_start(index, json!({"type": "tool_use", "id": id, "name": call.name, "input": {}})));
        // The real API opens every tool input with an empty piece.
        frames.push(block_delta(index, json!({"type": "input_json_delta", "partial_json": ""})));
        for piece in argument_pieces(&call.arguments) {
            frames.push(block_delta(index, json!({"type": "input_json_delta", "partial_json": piece})));
        }
        frames.push(block_stop(index));
        index += 1;
    }
    let stop_reason = if plan.calls.is_empty() { "end_turn" } else { "tool_use" };
    frames.push(frame(&json!({
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": null},
        "usage": {"output_tokens": plan.output_tokens},
    })));
    frames.push(frame(&json!({"type": "message_stop"})));
    frames
}

/// The events a hanging answer sends before going silent.
pub(crate) fn render_hang(plan: &Plan) -> Vec<String> {
    vec![
        message_start(plan),
        block_start(0, json!({"type": "text", "text": ""})),
        block_delta(0, json!({"type": "text_delta", "text": plan.hang_text()})),
    ]
}

/// The JSON body of an HTTP error, in the API's shape.
pub(crate) fn error_body(status: u16) -> Value {
    let kind = match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    };
    json!({
        "type": "error",
        "error": {"type": kind, "message": format!("scripted model: HTTP {status}")},
        "request_id": "req_scripted",
    })
}

fn message_start(plan: &Plan) -> String {
    frame(&json!({
        "type": "message_start",
        "message": {
            "id": format!("msg_scripted_{}", plan.seq),
            "type": "message",
            "role": "assistant",
            "model": plan.model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": {
                "input_tokens": plan.input_tokens,
                "cache_creation_input_tokens": plan.cache_write_tokens,
                "cache_read_input_tokens": plan.cached_tokens,
                "output_tokens": 1,
            },
        },
    }))
}

fn block_start(index: usize, block: Value) -> String {
    frame(&json!({"type": "content_block_start", "index": index, "content_block": block}))
}

fn block_delta(index: usize, delta: Value) -> String {
    frame(&json!({"type": "content_block_delta", "index": index, "delta": delta}))
}

fn block_stop(index: usize) -> String {
    frame(&json!({"type": "content_block_stop", "index": index}))
}

/// One SSE frame; the event name repeats the data's `type`, as the API does.
fn frame(data: &Value) -> String {
    let name = data.get("type").and_then(Value::as_str).unwrap_or("message");
    format!("event: {name}\ndata: {data}\n\n")
}
