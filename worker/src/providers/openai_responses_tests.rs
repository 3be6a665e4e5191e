use super::*;
use crate::providers::assemble::Assembled;
use crate::providers::test_support::{self, *};
use crate::providers::{FinishReason, ModelEvent};
use kiln_protocol::Usage;
use serde_json::json;

async fn decode_chunks(chunks: Vec<Result<bytes::Bytes, std::io::Error>>) -> Vec<Result<ModelEvent, ProviderError>> {
    test_support::decode_chunks(decode_stream, chunks).await
}

async fn decode_fixture(name: &str) -> Vec<Result<ModelEvent, ProviderError>> {
    decode_fixture_variants(decode_stream, &format!("openai_responses/{name}")).await
}

async fn assembled_fixture(name: &str) -> Assembled {
    assemble_complete(&decode_fixture(name).await, name)
}

fn usage(input: u64, output: u64, cache_read: u64) -> Usage {
    Usage { input_tokens: input, output_tokens: output, cache_read_tokens: cache_read, cache_write_tokens: 0 }
}

/// The `data:` JSON of every event of a fixture, parsed without the
/// decoder: an oracle that shares no code with it.
fn raw_events(name: &str) -> Vec<Value> {
    String::from_utf8(fixture(&format!("openai_responses/{name}")))
        .unwrap()
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|json| serde_json::from_str(json).unwrap())
        .collect()
}

/// Every complete function call of a fixture per its
/// `response.function_call_arguments.done` events: (output_index, args).
fn oracle_calls(name: &str) -> Vec<(usize, Value)> {
    raw_events(name)
        .into_iter()
        .filter(|e| e["type"] == "response.function_call_arguments.done")
        .map(|e| {
            let index = e["output_index"].as_u64().unwrap() as usize;
            (index, serde_json::from_str(e["arguments"].as_str().unwrap()).unwrap())
        })
        .collect()
}

#[tokio::test]
async fn every_fixture_decodes_and_finishes() {
    let names = fixture_names("openai_responses");
    assert_eq!(names.len(), 5, "{names:?}");
    for name in names {
        let items = decode_fixture(&name).await;
        let a = assembled_fixture(&name).await;
        assert!(a.finish_reason.is_some(), "{name}");
        assert!(a.rejected_calls.is_empty(), "{name}: {:?}", a.rejected_calls);
        // Calls carry their output_index and the arguments the server
        // itself reported complete.
        let starts: Vec<usize> = items
            .iter()
            .filter_map(|i| match i {
                Ok(ModelEvent::ToolCallStart { index, .. }) => Some(*index),
                _ => None,
            })
            .collect();
        let oracle = oracle_calls(&name);
        assert_eq!(starts, oracle.iter().map(|(i, _)| *i).collect::<Vec<_>>(), "{name}");
        let args: Vec<&Value> = a.message.tool_calls().map(|c| c.2).collect();
        assert_eq!(args, oracle.iter().map(|(_, v)| v).collect::<Vec<_>>(), "{name}");
        let expected = if oracle.is_empty() { FinishReason::EndTurn } else { FinishReason::ToolUse };
        assert_eq!(a.finish_reason, Some(expected), "{name}");
    }
}

#[tokio::test]
async fn text_message() {
    let a = assembled_fixture("vercel_text_message.sse").await;
    assert_eq!(a.message.parts, vec![Part::Text { text: "The final result is **570**.".into() }]);
    let done =
        raw_events("vercel_text_message.sse").into_iter().find(|e| e["type"] == "response.output_text.done").unwrap();
    assert_eq!(a.message.text(), done["text"].as_str().unwrap());
    assert_eq!(a.finish_reason, Some(FinishReason::EndTurn));
    assert_eq!(a.usage, usage(299, 12, 0));
}

#[tokio::test]
async fn reasoning_summary_then_function_call() {
    let items = decode_fixture("vercel_reasoning_then_function_call.sse").await;
    assert!(items.contains(&Ok(ModelEvent::ToolCallStart {
        index: 1,
        id: "call_AB6AaRZ1FYZB2RwS6A5vbdqn".into(),
        name: "calculator".into()
    })));
    // The final encrypted content (from `output_item.done`, not the
    // different one `added` carried), once, though `completed` repeats it.
    let signatures: Vec<&String> = items
        .iter()
        .filter_map(|i| match i {
            Ok(ModelEvent::ReasoningSignature(s)) => Some(s),
            _ => None,
        })
        .collect();
    assert_eq!(signatures.len(), 1, "{signatures:?}");
    assert!(signatures[0].starts_with("oai-enc:gAAAAABpPDIVOKrsHNZ0Gwso"), "{}", signatures[0]);
    let a = assemble(&items);
    let signature = Some(signatures[0].clone());
    assert_eq!(
        a.message.parts,
        vec![
            Part::Reasoning {
                text: "**Calculating step-by-step using calculator**\n\nI'll compute 12 plus 7, then multiply the \
                       result by 3, and finally multiply that by 10, reporting the final product."
                    .into(),
                signature
            },
            Part::ToolCall {
                id: "call_AB6AaRZ1FYZB2RwS6A5vbdqn".into(),
                name: "calculator".into(),
                arguments: json!({"a": 12, "b": 7, "op": "add"}),
                provider_id: None,
            },
        ]
    );
    assert_eq!(a.finish_reason, Some(FinishReason::ToolUse));
    assert_eq!(a.usage, usage(134, 28, 0));
}

#[tokio::test]
async fn function_call_alone() {
    let a = assembled_fixture("vercel_function_call_step2.sse").await;
    assert_eq!(
        a.message.parts,
        vec![Part::ToolCall {
            id: "call_Q6pW65MUgW9vF59BmItYGos3".into(),
            name: "calculator".into(),
            arguments: json!({"a": 19, "b": 3, "op": "multiply"}),
            provider_id: None,
        }]
    );
    assert_eq!(a.finish_reason, Some(FinishReason::ToolUse));
    assert_eq!(a.usage, usage(221, 26, 0));
}

#[tokio::test]
async fn azure_function_call_with_content_filters() {
    let a = assembled_fixture("vercel_azure_function_call.sse").await;
    assert_eq!(
        a.message.tool_calls().collect::<Vec<_>>(),
        vec![("call_H5DxLSFnsGhiROnUiDHmgyc8", "weather", &json!({"location": "San Francisco"}))]
    );
    assert_eq!(a.message.parts.len(), 1);
    assert_eq!(a.finish_reason, Some(FinishReason::ToolUse));
    assert_eq!(a.usage, usage(45, 24, 0));
}

#[tokio::test]
async fn server_tool_search_items_are_ignored() {
    // tool_search_call has `"call_id": null` and object `arguments`, and
    // is run by the server: it must not become a Kiln tool call.
    let items = decode_fixture("vercel_tool_search_then_function_call.sse").await;
    assert_eq!(
        items,
        vec![
            Ok(ModelEvent::ToolCallStart {
                index: 2,
                id: "call_pddfxhfOx4gY56zn4vIIEbFp".into(),
                name: "get_weather".into()
            }),
            Ok(ModelEvent::ToolCallDelta { index: 2, arguments: "{\"".into() }),
            Ok(ModelEvent::ToolCallDelta { index: 2, arguments: "location".into() }),
            Ok(ModelEvent::ToolCallDelta { index: 2, arguments: "\":\"".into() }),
            Ok(ModelEvent::ToolCallDelta { index: 2, arguments: "San".into() }),
            Ok(ModelEvent::ToolCallDelta { index: 2, arguments: " Francisco".into() }),
            Ok(ModelEvent::ToolCallDelta { index: 2, arguments: ",".into() }),
            Ok(ModelEvent::ToolCallDelta { index: 2, arguments: " CA".into() }),
            Ok(ModelEvent::ToolCallDelta { index: 2, arguments: "\",\"".into() }),
            Ok(ModelEvent::ToolCallDelta { index: 2, arguments: "unit".into() }),
            Ok(ModelEvent::ToolCallDelta { index: 2, arguments: "\":\"".into() }),
            Ok(ModelEvent::ToolCallDelta { index: 2, arguments: "fahren".into() }),
            Ok(ModelEvent::ToolCallDelta { index: 2, arguments: "heit".into() }),
            Ok(ModelEvent::ToolCallDelta { index: 2, arguments: "\"}".into() }),
            Ok(ModelEvent::Usage(usage(640, 46, 0))),
            Ok(ModelEvent::Finish(FinishReason::ToolUse)),
        ]
    );
    let a = assemble(&items);
    assert_eq!(
        a.message.tool_calls().collect::<Vec<_>>(),
        vec![(
            "call_pddfxhfOx4gY56zn4vIIEbFp",
            "get_weather",
            &json!({"location": "San Francisco, CA", "unit": "fahrenheit"})
        )]
    );
}

#[tokio::test]
async fn cut_before_the_terminal_event_is_truncated() {
    for name in fixture_names("openai_responses") {
        let text = String::from_utf8(fixture(&format!("openai_responses/{name}"))).unwrap();
        let cut = text.find("event: response.completed").unwrap_or_else(|| panic!("{name}"));
        let items = decode_chunks(chunked(&text.as_bytes()[..cut], 7)).await;
        assert_eq!(items.last(), Some(&Err(ProviderError::Truncated)), "{name}");
        assert!(!items.iter().any(|i| matches!(i, Ok(ModelEvent::Finish(_)))), "{name}");
        let a = assemble(&items[..items.len() - 1]);
        assert_eq!(a.finish_reason, None);
        assert_eq!(a.message.tool_calls().count(), 0, "{name}: an unfinished call is never executable");
        // Cut in the middle of the terminal event's data line: the
        // event is never dispatched.
        let mid = cut + 200;
        let items = decode_chunks(chunked(&text.as_bytes()[..mid], 64)).await;
        assert_eq!(items.last(), Some(&Err(ProviderError::Truncated)), "{name} cut at {mid}");
    }
}

#[tokio::test]
async fn cut_inside_tool_arguments_is_truncated_and_rejected() {
    let text = String::from_utf8(fixture("openai_responses/vercel_azure_function_call.sse")).unwrap();
    let cut = text.find(r#""delta":" Francisco""#).unwrap();
    let items = decode_chunks(chunked(&text.as_bytes()[..cut], 64)).await;
    assert_eq!(items.last(), Some(&Err(ProviderError::Truncated)));
    let a = assemble(&items[..items.len() - 1]);
    assert_eq!(a.rejected_calls.len(), 1);
    assert_eq!(a.rejected_calls[0].id, "call_H5DxLSFnsGhiROnUiDHmgyc8");
    assert_eq!(a.rejected_calls[0].raw_arguments, "{\"location\":\"San");
}

#[tokio::test]
async fn finish_comes_after_usage() {
    let items = decode_fixture("vercel_text_message.sse").await;
    let n = items.len();
    assert!(matches!(items[n - 2], Ok(ModelEvent::Usage(_))), "{:?}", &items[n - 2..]);
    assert_eq!(items[n - 1], Ok(ModelEvent::Finish(FinishReason::EndTurn)));
}

/// A hand-made stream: `event:` lines named after each data `type`, as
/// the API sends them.
fn stream_of(events: &[Value]) -> String {
    events.iter().map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or("message"))).collect()
}

fn text_delta(text: &str) -> Value {
    json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": text})
}

#[tokio::test]
async fn error_event_mid_stream() {
    // Top-level code and message, as the API reference documents it.
    let body = stream_of(&[
        text_delta("Hel"),
        json!({"type": "error", "code": "server_error", "message": "The server had an error.", "param": null, "sequence_number": 5}),
        text_delta("never"),
    ]);
    let items = decode_chunks(chunked(body.as_bytes(), 11)).await;
    assert_eq!(items.len(), 2, "{items:?}");
    assert_eq!(items[0], Ok(ModelEvent::TextDelta("Hel".into())));
    let err = items[1].clone().unwrap_err();
    assert_eq!(
        err,
        ProviderError::Stream { kind: "server_error".into(), message: "server_error: The server had an error.".into() }
    );
    assert!(err.is_retryable());

    // A nested error object, as some servers send it: a request that no
    // retry can fix.
    let body = stream_of(&[json!({"type": "error", "sequence_number": 2, "error": {
        "type": "invalid_request_error", "code": "context_length_exceeded",
        "message": "Your input exceeds the context window of this model.", "param": "input"}})]);
    let items = decode_chunks(chunked(body.as_bytes(), 7)).await;
    let err = items[0].clone().unwrap_err();
    assert!(matches!(&err, ProviderError::Stream { kind, .. } if kind == "context_length_exceeded"), "{err:?}");
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn response_failed() {
    let failed = |error: Value| {
        stream_of(&[
            json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "output": []}}),
            text_delta("Partial"),
            json!({"type": "response.failed", "response": {"id": "resp_1", "status": "failed", "error": error,
                "output": [], "usage": null}}),
        ])
    };
    let body = failed(json!({"code": "server_error", "message": "Something went wrong."}));
    let items = decode_chunks(chunked(body.as_bytes(), 64)).await;
    assert_eq!(
        items,
        vec![
            Ok(ModelEvent::TextDelta("Partial".into())),
            Err(ProviderError::Stream {
                kind: "server_error".into(),
                message: "server_error: Something went wrong.".into()
            }),
        ]
    );
    assert!(items[1].clone().unwrap_err().is_retryable());

    let body = failed(json!({"code": "rate_limit_exceeded", "message": "Slow down."}));
    let err = decode_chunks(chunked(body.as_bytes(), 64)).await.pop().unwrap().unwrap_err();
    assert!(matches!(&err, ProviderError::Stream { kind, .. } if kind == "rate_limit_exceeded") && err.is_retryable());

    let body = failed(Value::Null);
    let err = decode_chunks(chunked(body.as_bytes(), 64)).await.pop().unwrap().unwrap_err();
    assert!(matches!(&err, ProviderError::Stream { kind, .. } if kind == "unknown_error"), "{err:?}");
}

#[tokio::test]
async fn incomplete_responses() {
    let incomplete = |reason: Value| {
        stream_of(&[
            json!({"type": "response.output_item.added", "output_index": 0,
                "item": {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "write", "arguments": ""}}),
            json!({"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 0,
                "delta": "{\"path\":\"a\",\"content\":\"lo"}),
            json!({"type": "response.incomplete", "response": {"status": "incomplete",
                "incomplete_details": reason,
                "usage": {"input_tokens": 50, "input_tokens_details": {"cached_tokens": 20}, "output_tokens": 16}}}),
        ])
    };
    let items = decode_chunks(chunked(incomplete(json!({"reason": "max_output_tokens"})).as_bytes(), 7)).await;
    assert_eq!(items[items.len() - 2], Ok(ModelEvent::Usage(usage(30, 16, 20))));
    assert_eq!(items.last(), Some(&Ok(ModelEvent::Finish(FinishReason::MaxTokens))));
    let a = assemble(&items);
    assert_eq!(a.finish_reason, Some(FinishReason::MaxTokens));
    assert_eq!(a.message.tool_calls().count(), 0, "arguments cut by the limit never run");
    assert_eq!(a.rejected_calls.len(), 1);

    let items = decode_chunks(chunked(incomplete(json!({"reason": "content_filter"})).as_bytes(), 64)).await;
    assert_eq!(items.last(), Some(&Ok(ModelEvent::Finish(FinishReason::Other("content_filter".into())))));
    let items = decode_chunks(chunked(incomplete(Value::Null).as_bytes(), 64)).await;
    assert_eq!(items.last(), Some(&Ok(ModelEvent::Finish(FinishReason::Other("incomplete".into())))));
}

#[tokio::test]
async fn cached_tokens_are_read_from_the_cache() {
    let body = stream_of(&[
        text_delta("ok"),
        json!({"type": "response.completed", "response": {"status": "completed", "usage": {
            "input_tokens": 2006, "input_tokens_details": {"cached_tokens": 1920},
            "output_tokens": 300, "output_tokens_details": {"reasoning_tokens": 256}, "total_tokens": 2306}}}),
    ]);
    let items = decode_chunks(chunked(body.as_bytes(), 9)).await;
    assert_eq!(
        items,
        vec![
            Ok(ModelEvent::TextDelta("ok".into())),
            Ok(ModelEvent::Usage(usage(86, 300, 1920))),
            Ok(ModelEvent::Finish(FinishReason::EndTurn)),
        ]
    );
}

#[tokio::test]
async fn calls_sent_whole_are_taken_once() {
    // One call announced with no deltas (arguments only in `.done`), one
    // only in the final output, and one streamed normally whose `.done`
    // and final item repeat the arguments.
    let body = stream_of(&[
        json!({"type": "response.output_item.added", "output_index": 0,
            "item": {"id": "fc_a", "type": "function_call", "call_id": "call_a", "name": "view", "arguments": ""}}),
        json!({"type": "response.function_call_arguments.done", "item_id": "fc_a", "output_index": 0,
            "arguments": "{\"path\":\"a\"}"}),
        json!({"type": "response.output_item.added", "output_index": 1,
            "item": {"id": "fc_b", "type": "function_call", "call_id": "call_b", "name": "bash", "arguments": ""}}),
        json!({"type": "response.function_call_arguments.delta", "item_id": "fc_b", "delta": "{\"command\":"}),
        json!({"type": "response.function_call_arguments.delta", "item_id": "fc_b", "output_index": 1, "delta": "\"ls\"}"}),
        json!({"type": "response.function_call_arguments.done", "item_id": "fc_b", "output_index": 1,
            "arguments": "{\"command\":\"ls\"}"}),
        json!({"type": "response.output_item.done", "output_index": 1,
            "item": {"id": "fc_b", "type": "function_call", "call_id": "call_b", "name": "bash",
                "arguments": "{\"command\":\"ls\"}"}}),
        json!({"type": "response.completed", "response": {"status": "completed", "output": [
            {"id": "fc_a", "type": "function_call", "call_id": "call_a", "name": "view", "arguments": "{\"path\":\"a\"}"},
            {"id": "fc_b", "type": "function_call", "call_id": "call_b", "name": "bash", "arguments": "{\"command\":\"ls\"}"},
            {"id": "fc_c", "type": "function_call", "call_id": "call_c", "name": "grep", "arguments": "{\"pattern\":\"x\"}"},
        ]}}),
    ]);
    let items = decode_chunks(chunked(body.as_bytes(), 13)).await;
    let a = assemble(&items);
    assert_eq!(
        a.message.tool_calls().collect::<Vec<_>>(),
        vec![
            ("call_a", "view", &json!({"path": "a"})),
            ("call_b", "bash", &json!({"command": "ls"})),
            ("call_c", "grep", &json!({"pattern": "x"})),
        ]
    );
    assert_eq!(a.finish_reason, Some(FinishReason::ToolUse));
    assert!(a.rejected_calls.is_empty());
}

#[tokio::test]
async fn reasoning_parts_are_separated_and_refusals_are_text() {
    let summary = |output_index: u64, summary_index: u64, delta: &str| {
        json!({"type": "response.reasoning_summary_text.delta", "item_id": "rs", "output_index": output_index,
            "summary_index": summary_index, "delta": delta})
    };
    let body = stream_of(&[
        summary(0, 0, "First"),
        summary(0, 0, " part."),
        summary(0, 1, "Second."),
        json!({"type": "response.reasoning_text.delta", "item_id": "rs2", "output_index": 1, "content_index": 0,
            "delta": "raw"}),
        json!({"type": "response.refusal.delta", "item_id": "msg", "output_index": 2, "content_index": 0,
            "delta": "I can't help with that."}),
        json!({"type": "response.completed", "response": {"status": "completed"}}),
    ]);
    let a = assemble(&decode_chunks(chunked(body.as_bytes(), 5)).await);
    assert_eq!(
        a.message.parts,
        vec![
            Part::Reasoning { text: "First part.\n\nSecond.\n\nraw".into(), signature: None },
            Part::Text { text: "I can't help with that.".into() },
        ]
    );
    assert_eq!(a.finish_reason, Some(FinishReason::EndTurn));
    assert_eq!(a.usage, Usage::default());
}

#[tokio::test]
async fn done_marker_and_bare_data_events() {
    // `[DONE]` before any terminal event is a cut stream, not an end.
    let body = format!("{}data: [DONE]\n\n", stream_of(&[text_delta("hi")]));
    let items = decode_chunks(chunked(body.as_bytes(), 3)).await;
    assert_eq!(items, vec![Ok(ModelEvent::TextDelta("hi".into())), Err(ProviderError::Truncated)]);
    // Without `event:` lines the data's `type` is enough; without a
    // `type` the event name stands in.
    let body = "data: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"a\"}\n\n\
        event: response.completed\ndata: {\"response\":{}}\n\n";
    let items = decode_chunks(chunked(body.as_bytes(), 4)).await;
    assert_eq!(items, vec![Ok(ModelEvent::TextDelta("a".into())), Ok(ModelEvent::Finish(FinishReason::EndTurn))]);
}

#[tokio::test]
async fn garbage_never_panics() {
    let bodies = [
        "data: {not json\n\n",
        "data: null\n\n",
        "data: []\n\n",
        "data: {\"type\":\"response.output_item.added\"}\n\n",
        "data: {\"type\":\"response.output_item.added\",\"output_index\":-1,\"item\":{\"type\":\"function_call\",\"call_id\":7}}\n\n",
        "data: {\"type\":\"response.output_item.added\",\"output_index\":18446744073709551615,\"item\":{\"type\":\"function_call\"}}\n\n",
        "data: {\"type\":\"response.function_call_arguments.delta\",\"output_index\":0,\"delta\":5}\n\n",
        "data: {\"type\":\"response.function_call_arguments.delta\",\"delta\":\"{}\"}\n\n",
        "data: {\"type\":\"response.output_text.delta\",\"delta\":null}\n\n",
        "data: {\"type\":\"response.completed\",\"response\":{\"output\":\"x\",\"usage\":{\"input_tokens\":-3}}}\n\n",
        "data: {\"type\":\"response.completed\",\"response\":{\"output\":[null,1,{\"type\":\"function_call\"}]}}\n\n",
        "data: {\"type\":\"response.failed\"}\n\n",
        "data: {\"type\":\"error\"}\n\n",
        "data: 42\n\n",
    ];
    for body in bodies {
        let items = decode_chunks(chunked(body.as_bytes(), 3)).await;
        assert!(!items.is_empty(), "{body}");
        let _ = assemble(&items.iter().filter(|i| i.is_ok()).cloned().collect::<Vec<_>>());
    }
}

fn conversation() -> ModelRequest {
    ModelRequest {
        model: "gpt-x".into(),
        system: "You are Kiln.".into(),
        messages: vec![
            Message::user("list files"),
            Message {
                role: Role::Assistant,
                parts: vec![
                    // Anthropic's signature: never sent here.
                    Part::Reasoning { text: "hmm".into(), signature: Some("opaque".into()) },
                    Part::Reasoning { text: "plan".into(), signature: Some("oai-enc:ENC1".into()) },
                    Part::Reasoning { text: String::new(), signature: Some("oai-enc:ENC2".into()) },
                    Part::Text { text: "Looking.".into() },
                    Part::ToolCall {
                        id: "1-1".into(),
                        name: "bash".into(),
                        arguments: json!({"command": "ls"}),
                        provider_id: Some("call_1".into()),
                    },
                    Part::ToolCall {
                        id: "call_2".into(),
                        name: "view".into(),
                        arguments: json!({"path": "a"}),
                        provider_id: None,
                    },
                ],
            },
            Message {
                role: Role::Tool,
                parts: vec![
                    Part::ToolResult {
                        call_id: "1-1".into(),
                        name: "bash".into(),
                        output: "a\nb".into(),
                        is_error: false,
                        provider_call_id: Some("call_1".into()),
                    },
                    Part::ToolResult {
                        call_id: "call_2".into(),
                        name: "view".into(),
                        output: "nope".into(),
                        is_error: true,
                        provider_call_id: None,
                    },
                ],
            },
            Message { role: Role::Assistant, parts: vec![Part::Reasoning { text: "only".into(), signature: None }] },
            Message::system("Summary of earlier work."),
            Message::user("thanks"),
        ],
        tools: vec![ToolSpec {
            name: "bash".into(),
            description: "Run a command".into(),
            input_schema: json!({"type": "object", "properties": {"command": {"type": "string"}}}),
        }],
        max_tokens: 1000,
        temperature: Some(0.5),
        cache_key: None,
    }
}

#[test]
fn request_shape() {
    let body = serde_json::to_value(request_body(&conversation())).unwrap();
    assert_eq!(
        body,
        json!({
            "model": "gpt-x",
            "instructions": "You are Kiln.",
            "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}],
                    "encrypted_content": "ENC1"},
                {"type": "reasoning", "summary": [], "encrypted_content": "ENC2"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
                {"type": "function_call", "call_id": "call_1", "name": "bash", "arguments": "{\"command\":\"ls\"}"},
                {"type": "function_call", "call_id": "call_2", "name": "view", "arguments": "{\"path\":\"a\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "a\nb"},
                {"type": "function_call_output", "call_id": "call_2", "output": "nope"},
                {"type": "message", "role": "system", "content": [
                    {"type": "input_text", "text": "Summary of earlier work."}
                ]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
            ],
            "tools": [{
                "type": "function", "name": "bash", "description": "Run a command",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
                "strict": false,
            }],
            "max_output_tokens": 1000,
            "temperature": 0.5,
            "stream": true,
            "store": false,
            "include": ["reasoning.encrypted_content"],
        })
    );
}

#[tokio::test]
async fn reasoning_items_without_streamed_text_keep_their_own_encrypted_content() {
    let item = |index: u64, id: &str, enc: &str| {
        json!({"type": "response.output_item.done", "output_index": index,
            "item": {"type": "reasoning", "id": id, "summary": [], "encrypted_content": enc}})
    };
    let body = stream_of(&[
        json!({"type": "response.reasoning_summary_text.delta", "item_id": "rs1", "output_index": 0,
            "summary_index": 0, "delta": "thinking"}),
        item(0, "rs1", "E1"),
        item(1, "rs2", "E2"),
        json!({"type": "response.completed", "response": {"status": "completed", "output": [
            {"type": "reasoning", "id": "rs1", "encrypted_content": "E1"},
            {"type": "reasoning", "id": "rs2", "encrypted_content": "E2"},
        ]}}),
    ]);
    let a = assemble(&decode_chunks(chunked(body.as_bytes(), 7)).await);
    assert_eq!(
        a.message.parts,
        vec![
            Part::Reasoning { text: "thinking".into(), signature: Some("oai-enc:E1".into()) },
            Part::Reasoning { text: String::new(), signature: Some("oai-enc:E2".into()) },
        ]
    );
}

#[test]
fn tool_only_turn_and_optional_fields() {
    let request = ModelRequest {
        model: "m".into(),
        system: String::new(),
        messages: vec![Message {
            role: Role::Assistant,
            parts: vec![
                Part::Text { text: String::new() },
                Part::ToolCall { id: "c".into(), name: "bash".into(), arguments: json!({}), provider_id: None },
            ],
        }],
        tools: vec![],
        max_tokens: 10,
        temperature: None,
        cache_key: None,
    };
    let body = serde_json::to_value(request_body(&request)).unwrap();
    assert_eq!(body["input"], json!([{"type": "function_call", "call_id": "c", "name": "bash", "arguments": "{}"}]));
    for key in ["instructions", "tools", "temperature"] {
        assert!(body.get(key).is_none(), "{key}: {body}");
    }
}

#[test]
fn url_and_debug() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let p = OpenAiResponses::new(Endpoint::new(reqwest::Client::new(), "http://h/v1/", Some("sk-secret-key".into())));
    assert_eq!(p.url(), "http://h/v1/responses");
    assert_eq!(p.name(), "openai-responses");
    assert!(!format!("{p:?}").contains("secret"));
}

#[test]
fn a_cache_key_goes_out_as_prompt_cache_key() {
    let request = ModelRequest { cache_key: Some("0192-session".into()), ..conversation() };
    let body = serde_json::to_value(request_body(&request)).unwrap();
    assert_eq!(body["prompt_cache_key"], "0192-session");
    let body = serde_json::to_value(request_body(&conversation())).unwrap();
    assert!(body.get("prompt_cache_key").is_none());
}
