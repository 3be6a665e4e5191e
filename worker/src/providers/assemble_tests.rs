use super::*;
use serde_json::json;

fn build(events: &[ModelEvent]) -> Assembled {
    let mut builder = AssistantBuilder::new();
    for event in events {
        builder.push(event);
    }
    builder.finish()
}

fn start(index: usize, id: &str, name: &str) -> ModelEvent {
    ModelEvent::ToolCallStart { index, id: id.into(), name: name.into() }
}

fn delta(index: usize, arguments: &str) -> ModelEvent {
    ModelEvent::ToolCallDelta { index, arguments: arguments.into() }
}

#[test]
fn parts_come_in_order_reasoning_text_calls() {
    let a = build(&[
        ModelEvent::TextDelta("Let me ".into()),
        start(1, "toolu_1", "bash"),
        ModelEvent::ReasoningDelta("thinking".into()),
        delta(1, "{\"command\":"),
        ModelEvent::TextDelta("look.".into()),
        delta(1, "\"ls\"}"),
        ModelEvent::Usage(Usage { input_tokens: 10, output_tokens: 1, cache_read_tokens: 5, cache_write_tokens: 0 }),
        ModelEvent::Usage(Usage { input_tokens: 0, output_tokens: 42, cache_read_tokens: 0, cache_write_tokens: 0 }),
        ModelEvent::Finish(FinishReason::ToolUse),
    ]);
    assert_eq!(
        a.message,
        Message {
            role: Role::Assistant,
            parts: vec![
                Part::Reasoning { text: "thinking".into(), signature: None },
                Part::Text { text: "Let me look.".into() },
                Part::ToolCall {
                    id: "toolu_1".into(),
                    name: "bash".into(),
                    arguments: json!({"command": "ls"}),
                    provider_id: None
                },
            ],
        }
    );
    assert_eq!(a.usage, Usage { input_tokens: 10, output_tokens: 42, cache_read_tokens: 5, cache_write_tokens: 0 });
    assert_eq!(a.finish_reason, Some(FinishReason::ToolUse));
    assert!(a.rejected_calls.is_empty());
}

#[test]
fn arguments_split_inside_escapes_and_multibyte_text() {
    // The JSON text `{"s":"a\"é😀\\n"}` cut at every possible place.
    let json_text = "{\"s\":\"a\\\"é😀\\\\n\"}";
    let boundaries: Vec<usize> = (0..=json_text.len()).filter(|&i| json_text.is_char_boundary(i)).collect();
    for &cut in &boundaries {
        let a = build(&[
            start(0, "c", "write"),
            delta(0, &json_text[..cut]),
            delta(0, &json_text[cut..]),
            ModelEvent::Finish(FinishReason::ToolUse),
        ]);
        assert_eq!(a.message.tool_calls().next().map(|c| c.2.clone()), Some(json!({"s": "a\"é😀\\n"})), "cut at {cut}");
    }
}

#[test]
fn empty_arguments_are_an_empty_object() {
    let a = build(&[start(0, "c", "ls"), delta(0, ""), ModelEvent::Finish(FinishReason::ToolUse)]);
    assert_eq!(a.message.tool_calls().next(), Some(("c", "ls", &json!({}))));
}

#[test]
fn bad_calls_are_rejected_good_ones_kept() {
    let a = build(&[
        start(0, "c0", "bash"),
        delta(0, "{\"command\": \"ls\""),
        start(1, "c1", "view"),
        delta(1, "[1,2]"),
        start(2, "c2", "edit"),
        delta(2, "{\"path\":\"a\"}"),
        start(3, "c3", ""),
        delta(3, "{}"),
        ModelEvent::Finish(FinishReason::MaxTokens),
    ]);
    assert_eq!(a.message.tool_calls().collect::<Vec<_>>(), vec![("c2", "edit", &json!({"path": "a"}))]);
    let rejected: Vec<(&str, &str)> =
        a.rejected_calls.iter().map(|r| (r.id.as_str(), r.raw_arguments.as_str())).collect();
    assert_eq!(rejected, vec![("c0", "{\"command\": \"ls\""), ("c1", "[1,2]"), ("c3", "{}")]);
    assert!(a.rejected_calls[0].error.contains("not valid JSON"), "{:?}", a.rejected_calls[0]);
    assert!(a.rejected_calls[1].error.contains("not a JSON object"));
    assert!(a.rejected_calls[2].error.contains("no tool name"));
}

#[test]
fn unfinished_stream_never_yields_executable_calls() {
    let a = build(&[
        start(0, "c0", "bash"),
        delta(0, "{\"command\":\"rm -rf /tmp/x\"}"),
        ModelEvent::TextDelta("hi".into()),
    ]);
    assert_eq!(a.finish_reason, None);
    assert_eq!(a.message.tool_calls().count(), 0);
    assert_eq!(a.message.text(), "hi");
    assert_eq!(a.rejected_calls.len(), 1);
    assert!(a.rejected_calls[0].error.contains("ended before"));
}

#[test]
fn call_ids_are_available_while_streaming() {
    let mut builder = AssistantBuilder::new();
    builder.push(&start(3, "toolu_9", "grep"));
    builder.push(&start(3, "other", "bash"));
    builder.push(&delta(7, "{\"ignored\":true}"));
    assert_eq!(builder.call_id(3), Some("toolu_9"));
    assert_eq!(builder.call_name(3), Some("grep"));
    assert_eq!(builder.call_id(7), None);
    builder.push(&start(4, "", "ls"));
    assert_eq!(builder.call_id(4), Some("call_4"), "a call always gets an id");
    builder.push(&ModelEvent::Finish(FinishReason::ToolUse));
    let a = builder.finish();
    assert_eq!(a.message.tool_calls().map(|c| c.0).collect::<Vec<_>>(), vec!["toolu_9", "call_4"]);
}

#[test]
fn signed_reasoning_blocks_stay_separate() {
    let a = build(&[
        ModelEvent::ReasoningDelta("first".into()),
        ModelEvent::ReasoningSignature("sig1".into()),
        ModelEvent::TextDelta("t".into()),
        ModelEvent::ReasoningDelta("sec".into()),
        ModelEvent::ReasoningDelta("ond".into()),
        ModelEvent::ReasoningSignature("sig".into()),
        ModelEvent::ReasoningSignature("2".into()),
        ModelEvent::Finish(FinishReason::EndTurn),
    ]);
    assert_eq!(
        a.message.parts,
        vec![
            Part::Reasoning { text: "first".into(), signature: Some("sig1".into()) },
            Part::Reasoning { text: "second".into(), signature: Some("sig2".into()) },
            Part::Text { text: "t".into() },
        ]
    );
    let a = build(&[ModelEvent::ReasoningSignature("redacted".into()), ModelEvent::Finish(FinishReason::EndTurn)]);
    assert_eq!(a.message.parts, vec![Part::Reasoning { text: String::new(), signature: Some("redacted".into()) }]);
}

#[test]
fn empty_response() {
    let a = build(&[ModelEvent::Finish(FinishReason::EndTurn)]);
    assert!(a.message.parts.is_empty());
    assert_eq!(a.message.role, Role::Assistant);
}

#[test]
fn for_a_step_calls_get_kilns_ids_and_keep_the_providers() {
    let mut builder = AssistantBuilder::for_step(7);
    // The same id twice, then none at all (`call_{index}` on the wire).
    for event in [
        start(0, "dup", "bash"),
        delta(0, "{}"),
        start(1, "dup", "bash"),
        delta(1, "{\"a\":1}"),
        start(2, "", "view"),
        delta(2, "{"),
        ModelEvent::Finish(FinishReason::ToolUse),
    ] {
        builder.push(&event);
    }
    // Streamed events name the calls by Kiln's id too.
    assert_eq!((builder.call_id(0), builder.call_id(1), builder.call_id(2)), (Some("7-1"), Some("7-2"), Some("7-3")));
    let a = builder.finish();
    let ids: Vec<(&str, Option<&str>)> = a
        .message
        .parts
        .iter()
        .filter_map(|p| match p {
            Part::ToolCall { id, provider_id, .. } => Some((id.as_str(), provider_id.as_deref())),
            _ => None,
        })
        .collect();
    assert_eq!(ids, [("7-1", Some("dup")), ("7-2", Some("dup"))]);
    let wire: Vec<&str> = a.message.wire_tool_calls().map(|(id, _, _)| id).collect();
    assert_eq!(wire, ["dup", "dup"]);
    // A rejected call keeps its place in the numbering.
    assert_eq!(a.rejected_calls.len(), 1);
    assert_eq!(a.rejected_calls[0].id, "7-3");
}
