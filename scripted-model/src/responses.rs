//! The OpenAI Responses API streaming format, event for event as the real
//! API sends it: `event:` and `data:` lines whose data names its own `type`
//! and carries a rising `sequence_number`; `response.created` and
//! `response.in_progress`, then each output item added, filled and done
//! under its `output_index` (a `message` with one `output_text` part, then
//! one `function_call` item per call with its arguments in pieces), then
//! `response.completed` with the whole output and the usage.

use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::plan::{Plan, argument_pieces, text_pieces};

/// The frames of a complete answer.
pub(crate) fn render(plan: &Plan) -> Vec<String> {
    let events = Events::new(plan);
    let mut frames = vec![events.lifecycle("response.created", "in_progress", json!([]), Value::Null)];
    frames.push(events.lifecycle("response.in_progress", "in_progress", json!([]), Value::Null));
    let mut output = Vec::new();
    if !plan.text.is_empty() {
        let index = output.len();
        let id = format!("msg_scripted_{}", plan.seq);
        frames.push(events.frame(json!({
            "type": "response.output_item.added",
            "output_index": index,
            "item": {"id": id, "type": "message", "status": "in_progress", "content": [], "role": "assistant"},
        })));
        frames.push(events.frame(json!({
            "type": "response.content_part.added",
            "item_id": id, "output_index": index, "content_index": 0,
            "part": output_text(""),
        })));
        for piece in text_pieces(&plan.text) {
            frames.push(events.frame(json!({
                "type": "response.output_text.delta",
                "item_id": id, "output_index": index, "content_index": 0,
                "delta": piece, "logprobs": [],
            })));
        }
        frames.push(events.frame(json!({
            "type": "response.output_text.done",
            "item_id": id, "output_index": index, "content_index": 0,
            "text": plan.text, "logprobs": [],
        })));
        frames.push(events.frame(json!({
            "type": "response.content_part.done",
            "item_id": id, "output_index": index, "content_index": 0,
            "part": output_text(&plan.text),
        })));
        let item = json!({
            "id": id, "type": "message", "status": "completed",
            "content": [output_text(&plan.text)], "role": "assistant",
        });
        frames.push(events.frame(json!({"type": "response.output_item.done", "output_index": index, "item": item})));
        output.push(item);
    }
    for call in &plan.calls {
        let index = output.len();
        let id = format!("fc_scripted_{}", call.number);
        let function_call = |status: &str, arguments: &str| {
            json!({
                "id": id, "type": "function_call", "status": status,
                "arguments": arguments, "call_id": call.id("call_"), "name": call.name,
            })
        };
        frames.push(events.frame(json!({
            "type": "response.output_item.added",
            "output_index": index,
            "item": function_call("in_progress", ""),
        })));
        for piece in argument_pieces(&call.arguments) {
            frames.push(events.frame(json!({
                "type": "response.function_call_arguments.delta",
                "item_id": id, "output_index": index, "delta": piece,
            })));
        }
        frames.push(events.frame(json!({
            "type": "response.function_call_arguments.done",
            "item_id": id, "output_index": index, "arguments": call.arguments,
        })));
        let item = function_call("completed", &call.arguments);
        frames.push(events.frame(json!({"type": "response.output_item.done", "output_index": index, "item": item})));
        output.push(item);
    }
    // Like Chat Completions, `input_tokens` includes the cached ones.
    let input = plan.input_tokens + plan.cached_tokens;
    let usage = json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": plan.cached_tokens},
        "output_tokens": plan.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input + plan.output_tokens,
    });
    frames.push(events.lifecycle("response.completed", "completed", Value::Array(output), usage));
    frames
}

/// The frames a hanging answer sends before going silent.
pub(crate) fn render_hang(plan: &Plan) -> Vec<String> {
    let events = Events::new(plan);
    let id = format!("msg_scripted_{}", plan.seq);
    vec![
        events.lifecycle("response.created", "in_progress", json!([]), Value::Null),
        events.frame(json!({
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {"id": id, "type": "message", "status": "in_progress", "content": [], "role": "assistant"},
        })),
        events.frame(json!({
            "type": "response.output_text.delta",
            "item_id": id, "output_index": 0, "content_index": 0,
            "delta": plan.hang_text(), "logprobs": [],
        })),
    ]
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "annotations": [], "logprobs": [], "text": text})
}

/// What every event of one answer shares: the response and its sequence.
struct Events<'a> {
    plan: &'a Plan,
    id: String,
    created_at: u64,
    /// The next `sequence_number`.
    sequence: Cell<u64>,
}

impl<'a> Events<'a> {
    fn new(plan: &'a Plan) -> Self {
        let created_at = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        Events { plan, id: format!("resp_scripted_{}", plan.seq), created_at, sequence: Cell::new(0) }
    }

    /// `response.created`, `.in_progress` or `.completed`: the response
    /// object so far.
    fn lifecycle(&self, kind: &str, status: &str, output: Value, usage: Value) -> String {
        self.frame(json!({
            "type": kind,
            "response": {
                "id": self.id,
                "object": "response",
                "created_at": self.created_at,
                "status": status,
                "error": null,
                "incomplete_details": null,
                "model": self.plan.model,
                "output": output,
                "parallel_tool_calls": true,
                "store": false,
                "usage": usage,
            },
        }))
    }

    /// One SSE frame, numbered; the event name repeats the data's `type`,
    /// as the API does.
    fn frame(&self, mut data: Value) -> String {
        let sequence = self.sequence.get();
        self.sequence.set(sequence + 1);
        if let Some(object) = data.as_object_mut() {
            object.insert("sequence_number".to_owned(), sequence.into());
        }
        let name = data.get("type").and_then(Value::as_str).unwrap_or("message").to_owned();
        format!("event: {name}\ndata: {data}\n\n")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::script::{Reply, ScriptedCall};

    /// The `(event name, data)` of every frame, checked for strict framing.
    fn parse(frames: &[String]) -> Vec<Value> {
        frames
            .iter()
            .map(|frame| {
                let rest = frame.strip_prefix("event: ").unwrap();
                let (name, rest) = rest.split_once("\ndata: ").unwrap();
                let data = rest.strip_suffix("\n\n").unwrap();
                assert!(!data.contains('\n'), "{frame}");
                let json: Value = serde_json::from_str(data).unwrap();
                assert_eq!(json["type"], name, "event name repeats the type");
                json
            })
            .collect()
    }

    #[test]
    fn complete_answer_has_the_real_shape() {
        let text = "Let me look — at the ✨ files.";
        let args = json!({"command": "echo \"héllo\" | grep 'x\\y'", "timeout_s": 30});
        let reply = Reply::tools(vec![ScriptedCall::new("bash", args.clone()), ScriptedCall::new("view", json!({}))])
            .with_text(text);
        let plan = Plan::new(3, "gpt-test".into(), &reply, 400, 7);
        let events = parse(&render(&plan));
        let sequence: Vec<u64> = events.iter().map(|e| e["sequence_number"].as_u64().unwrap()).collect();
        assert_eq!(sequence, (0..events.len() as u64).collect::<Vec<_>>());
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            &types[..4],
            ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
        );
        assert_eq!(types.last(), Some(&"response.completed"));

        let deltas: String = events
            .iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .map(|e| e["delta"].as_str().unwrap())
            .collect();
        assert_eq!(deltas, text);
        let added: Vec<&Value> =
            events.iter().filter(|e| e["type"] == "response.output_item.added").map(|e| &e["item"]).collect();
        assert_eq!(added.len(), 3);
        assert_eq!(added[1]["call_id"], "call_7");
        assert_eq!(added[1]["arguments"], "");
        assert_eq!(added[2]["call_id"], "call_8");
        let arguments = |index: u64| -> Value {
            let text: String = events
                .iter()
                .filter(|e| e["type"] == "response.function_call_arguments.delta" && e["output_index"] == index)
                .map(|e| e["delta"].as_str().unwrap())
                .collect();
            serde_json::from_str(&text).unwrap()
        };
        assert_eq!(arguments(1), args);
        assert_eq!(arguments(2), json!({}));

        let completed = &events.last().unwrap()["response"];
        assert_eq!(completed["status"], "completed");
        assert_eq!(completed["model"], "gpt-test");
        assert_eq!(completed["id"], "resp_scripted_3");
        let output = completed["output"].as_array().unwrap();
        assert_eq!(output.len(), 3);
        assert_eq!(output[0]["content"][0]["text"], text);
        assert_eq!(output[1]["name"], "bash");
        assert_eq!(serde_json::from_str::<Value>(output[1]["arguments"].as_str().unwrap()).unwrap(), args);
        assert_eq!(completed["usage"]["input_tokens"], 100);
        assert!(completed["usage"]["output_tokens"].as_u64().unwrap() > 0);
    }

    #[test]
    fn text_only_and_hanging_answers() {
        let plan = Plan::new(1, "m".into(), &Reply::text("hi"), 40, 1);
        let events = parse(&render(&plan));
        assert!(!events.iter().any(|e| e["item"]["type"] == "function_call"));
        assert_eq!(events.last().unwrap()["response"]["output"][0]["type"], "message");

        let plan = Plan::new(2, "m".into(), &Reply::hang(), 40, 1);
        let events = parse(&render_hang(&plan));
        assert_eq!(events.last().unwrap()["delta"], "Working");
        assert!(!events.iter().any(|e| e["type"] == "response.completed"));
    }
}
