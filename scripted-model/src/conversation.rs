//! Where a request stands in its conversation, for per-conversation replay.

use serde_json::Value;

/// The number of model turns the request's conversation already holds: runs
/// of consecutive model output (an assistant message; in the Responses API
/// also its `function_call` and `reasoning` items) in `messages` or
/// `input`. A conversation's first request holds none.
pub(crate) fn model_turns(request: &Value) -> usize {
    let Some(items) = request.get("messages").or_else(|| request.get("input")).and_then(Value::as_array) else {
        return 0;
    };
    let mut turns = 0;
    let mut in_turn = false;
    for item in items {
        let from_model = is_model_output(item);
        if from_model && !in_turn {
            turns += 1;
        }
        in_turn = from_model;
    }
    turns
}

fn is_model_output(item: &Value) -> bool {
    item.get("role").and_then(Value::as_str) == Some("assistant")
        || matches!(item.get("type").and_then(Value::as_str), Some("function_call" | "reasoning"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::model_turns;

    #[test]
    fn counts_each_run_of_model_output_once_in_every_wire_format() {
        let chat = json!({"messages": [
            {"role": "system", "content": "s"}, {"role": "user", "content": "go"},
            {"role": "assistant", "tool_calls": []}, {"role": "tool", "content": "x"},
            {"role": "assistant", "content": "done"}, {"role": "user", "content": "more"},
        ]});
        assert_eq!(model_turns(&chat), 2);
        let responses = json!({"input": [
            {"type": "message", "role": "user", "content": "go"},
            {"type": "reasoning"}, {"type": "message", "role": "assistant"}, {"type": "function_call"},
            {"type": "function_call_output"}, {"type": "function_call"},
        ]});
        assert_eq!(model_turns(&responses), 2);
        assert_eq!(model_turns(&json!({"messages": [{"role": "user", "content": "go"}]})), 0);
        assert_eq!(model_turns(&json!({"prompt": "not a conversation"})), 0);
    }
}
