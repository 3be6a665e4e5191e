//! The events of one long, ended run, of the kinds and sizes a real run
//! stores: text streamed a few words per delta, `bash` calls whose output
//! arrives a line at a time and whose result repeats it whole, now and then
//! a `write` of a 1.5 KB file, step totals, a plan and a network decision
//! every ten steps. Every kind is one the page listens for (an unknown kind
//! costs it a JSON page read, which a real run's events do not).

use serde_json::{Value, json};

/// `count` events: kind and payload of seq 2 onwards (seq 1 is the
/// `run.queued` that `POST /v1/runs` stored); the last is `run.succeeded`.
pub fn events(count: usize) -> Vec<(String, Value)> {
    let mut events: Vec<(String, Value)> = vec![
        ("run.started".into(), json!({"worker": "worker-1", "attempt": 1})),
        ("sandbox.ready".into(), json!({"container": "c0ffee", "image": "kiln-sandbox:latest"})),
    ];
    let mut step = 0;
    while events.len() < count - 60 {
        step += 1;
        push_step(&mut events, step);
    }
    while events.len() < count - 1 {
        events.push(("text.delta".into(), json!({"text": "and that is everything the task asked for. "})));
    }
    events.push(("run.succeeded".into(), json!({"summary": "All 412 tests pass; the parser handles CRLF input."})));
    events
}

const SENTENCE: &str = "I'll look at how the parser splits lines before changing it, then run the \
                        tests again to see which ones still fail and why they do.";

fn push_step(events: &mut Vec<(String, Value)>, step: usize) {
    events.push(("step.started".into(), json!({"step": step})));
    // About two tokens per delta, as providers stream them.
    let words: Vec<&str> = SENTENCE.split(' ').collect();
    for pair in words.chunks(2).take(20) {
        events.push(("text.delta".into(), json!({"text": format!("{} ", pair.join(" "))})));
    }
    let call = format!("toolu_{step:04}");
    if step.is_multiple_of(5) {
        push_write(events, &call, step);
    } else {
        push_bash(events, &call, step);
    }
    if step.is_multiple_of(10) {
        let items = json!([
            {"text": "read the parser", "status": "done"},
            {"text": format!("fix the failures of step {step}"), "status": "in_progress"},
            {"text": "run the whole suite", "status": "pending"}
        ]);
        events.push(("todo".into(), json!({ "items": items })));
        events.push(("network.allowed".into(), json!({"host": "index.crates.io", "port": 443})));
    }
    events.push((
        "step.finished".into(),
        json!({"step": step, "finish_reason": "tool_use",
               "usage": {"input_tokens": 12_400 + step * 310, "output_tokens": 180,
                         "cache_read_tokens": 11_900 + step * 300},
               "cost_usd": 0.0071}),
    ));
}

fn push_bash(events: &mut Vec<(String, Value)>, call: &str, step: usize) {
    let command = format!("cargo test -p parser --test lines_{step} 2>&1 | tail -n 40");
    events.push(("tool_call.started".into(), json!({"call_id": call, "name": "bash"})));
    let args = json!({ "command": command }).to_string();
    for piece in split3(&args) {
        events.push(("tool_call.delta".into(), json!({"call_id": call, "arguments_delta": piece})));
    }
    events
        .push(("tool_call.ready".into(), json!({"call_id": call, "name": "bash", "arguments": {"command": command}})));
    let lines: Vec<String> = (0..10)
        .map(|i| format!("test lines::splits_crlf_input_case_{step}_{i} ... ok (0.{i:02}s, 3 assertions)\n"))
        .collect();
    for line in &lines {
        events.push(("tool.output".into(), json!({"call_id": call, "text": line})));
    }
    events.push((
        "tool.result".into(),
        json!({"call_id": call, "name": "bash", "output": lines.concat(), "is_error": false, "duration_ms": 840}),
    ));
}

fn push_write(events: &mut Vec<(String, Value)>, call: &str, step: usize) {
    let path = format!("src/lines_{step}.rs");
    let content: String = (0..30)
        .map(|i| format!("    let part_{i} = input.split(\"\\r\\n\").nth({i}).unwrap_or_default();\n"))
        .collect();
    events.push(("tool_call.started".into(), json!({"call_id": call, "name": "write"})));
    let args = json!({"path": path, "content": content});
    for piece in split3(&args.to_string()) {
        events.push(("tool_call.delta".into(), json!({"call_id": call, "arguments_delta": piece})));
    }
    events.push(("tool_call.ready".into(), json!({"call_id": call, "name": "write", "arguments": args})));
    let output = format!("wrote {} bytes to {path}", content.len());
    events.push((
        "tool.result".into(),
        json!({"call_id": call, "name": "write", "output": output, "is_error": false, "duration_ms": 3}),
    ));
}

/// `text` in three pieces, cut at character boundaries.
fn split3(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let third = chars.len().div_ceil(3);
    chars.chunks(third.max(1)).map(|c| c.iter().collect()).collect()
}
