//! A group of attempts in the terminal: one line per thing an attempt did
//! (`[2] ✓ bash (12 ms): …`), its end with what it spent and changed, and
//! the choice.

use kiln_protocol::EventBody;

use super::one_line;

/// The lines of a group's `attempt.*` event; `None` for any other event and
/// for an attempt's events not worth a line of their own (its steps).
pub fn lines(body: &EventBody) -> Option<Vec<String>> {
    match body {
        EventBody::AttemptEvent { attempt, event, .. } => {
            let payload = &event["payload"];
            let line = match event["kind"].as_str()? {
                "sandbox.ready" => format!("[{attempt}] sandbox ready"),
                "tool.result" => {
                    let mark = if payload["is_error"].as_bool() == Some(true) { "✗" } else { "✓" };
                    let name = payload["name"].as_str().unwrap_or("?");
                    let ms = payload["duration_ms"].as_u64().unwrap_or(0);
                    let output = one_line(payload["output"].as_str().unwrap_or(""), 100);
                    format!("[{attempt}] {mark} {name} ({ms} ms): {output}")
                }
                _ => return None,
            };
            Some(vec![line])
        }
        EventBody::AttemptFinished { attempt, status, summary, usage, steps, changes, .. } => {
            let tokens = usage.input_tokens + usage.output_tokens;
            let changed =
                changes.map(|c| format!(", {} files +{} -{}", c.files, c.additions, c.deletions)).unwrap_or_default();
            Some(vec![format!(
                "[{attempt}] {status} after {steps} steps, {tokens} tokens{changed}: {}",
                one_line(summary, 120)
            )])
        }
        EventBody::AttemptSelected { attempt, run_id } => {
            Some(vec![format!("● attempt {attempt} chosen as the result [run {run_id}]")])
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempts_tool_result_and_end_are_one_line_each() {
        let run_id = uuid::Uuid::nil();
        let event = serde_json::json!({"kind": "tool.result",
            "payload": {"name": "bash", "output": "ok\n", "is_error": false, "duration_ms": 3, "call_id": "1-1"}});
        let lines = lines(&EventBody::AttemptEvent { attempt: 2, run_id, seq: 5, event }).unwrap();
        assert_eq!(lines, ["[2] ✓ bash (3 ms): ok"]);
        let step = serde_json::json!({"kind": "step.started", "payload": {"step": 1}});
        assert_eq!(super::lines(&EventBody::AttemptEvent { attempt: 1, run_id, seq: 1, event: step }), None);
    }
}
