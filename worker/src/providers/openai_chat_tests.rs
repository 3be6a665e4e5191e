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
    decode_fixture_variants(decode_stream, &format!("openai_chat/{name}")).await
}

async fn assembled_fixture(name: &str) -> Assembled {
    assemble_complete(&decode_fixture(name).await, name)
}

fn usage(input: u64, output: u64, cache_read: u64) -> Usage {
    Usage { input_tokens: input, output_tokens: output, cache_read_tokens: cache_read, cache_write_tokens: 0 }
}

#[tokio::test]
async fn every_fixture_decodes_and_finishes() {
    let names = fixture_names("openai_chat");
    assert_eq!(names.len(), 8, "{names:?}");
    for name in names {
        let a = assembled_fixture(&name).await;
        assert!(a.finish_reason.is_some(), "{name}");
        assert!(a.rejected_calls.is_empty(), "{name}: {:?}", a.rejected_calls);
    }
}

#[tokio::test]
async fn text_with_usage() {
    let a = assembled_fixture("openai_python_text_with_usage.sse").await;
    assert_eq!(
        a.message.text(),
        "I'm unable to provide real-time weather updates. To get the current weather in San Francisco, \
         I recommend checking a reliable weather website or a weather app."
    );
    assert_eq!(a.finish_reason, Some(FinishReason::EndTurn));
    assert_eq!(a.usage, usage(14, 30, 0));
    assert_eq!(a.message.tool_calls().count(), 0);
}

#[tokio::test]
async fn long_text_with_obfuscation_fields() {
    let a = assembled_fixture("vercel_text_with_usage_obfuscation.sse").await;
    let text = a.message.text();
    assert!(text.starts_with("**Holiday Name:** Harmony Day\n\n**Date:** Celebrated annually"), "{text}");
    assert!(text.contains("traditions, and celebrations") && text.contains("cultures’ histories"), "{text}");
    assert!(text.ends_with("shared human experiences and mutual respect."), "{text}");
    assert_eq!(text.chars().count(), 1724);
    // An oracle that shares no code with the decoder: every content
    // delta of every `data: {` line, in order.
    let raw = String::from_utf8(fixture("openai_chat/vercel_text_with_usage_obfuscation.sse")).unwrap();
    let oracle: String = raw
        .lines()
        .filter_map(|line| line.strip_prefix("data: {").map(|rest| format!("{{{rest}")))
        .map(|json| serde_json::from_str::<Value>(&json).unwrap())
        .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(text, oracle);
    assert_eq!(a.usage, usage(16, 300, 0));
    assert_eq!(a.finish_reason, Some(FinishReason::EndTurn));
}

#[tokio::test]
async fn single_tool_call() {
    let a = assembled_fixture("openai_python_tool_call.sse").await;
    let calls: Vec<_> = a.message.tool_calls().collect();
    assert_eq!(
        calls,
        vec![(
            "call_c91SqDXlYFuETYv8mUHzz6pp",
            "GetWeatherArgs",
            &json!({"city": "Edinburgh", "country": "UK", "units": "c"})
        )]
    );
    assert_eq!(a.finish_reason, Some(FinishReason::ToolUse));
    assert_eq!(a.usage, usage(76, 24, 0));
    assert_eq!(a.message.text(), "");
}

#[tokio::test]
async fn strict_tool_call() {
    let a = assembled_fixture("openai_python_tool_call_strict.sse").await;
    let calls: Vec<_> = a.message.tool_calls().collect();
    assert_eq!(
        calls,
        vec![("call_CTf1nWJLqSeRgDqaCG27xZ74", "get_weather", &json!({"city": "San Francisco", "state": "CA"}))]
    );
    assert_eq!(a.usage, usage(48, 19, 0));
}

#[tokio::test]
async fn parallel_tool_calls() {
    let a = assembled_fixture("openai_python_parallel_tool_calls.sse").await;
    let calls: Vec<_> = a.message.tool_calls().collect();
    assert_eq!(
        calls,
        vec![
            (
                "call_JMW1whyEaYG438VE1OIflxA2",
                "GetWeatherArgs",
                &json!({"city": "Edinburgh", "country": "GB", "units": "c"})
            ),
            ("call_DNYTawLBoN8fj3KN6qU9N1Ou", "get_stock_price", &json!({"ticker": "AAPL", "exchange": "NASDAQ"})),
        ]
    );
    assert_eq!(a.finish_reason, Some(FinishReason::ToolUse));
    assert_eq!(a.usage, usage(149, 60, 0));
}

#[tokio::test]
async fn finish_length() {
    let a = assembled_fixture("openai_python_finish_length.sse").await;
    assert_eq!(a.finish_reason, Some(FinishReason::MaxTokens));
    assert_eq!(a.message.text(), "{\"");
    assert_eq!(a.usage, usage(79, 1, 0));
}

#[tokio::test]
async fn azure_prompt_filter_chunk_and_reasoning_usage() {
    let a = assembled_fixture("vercel_azure_model_router.sse").await;
    assert_eq!(a.message.text(), "Capital of Denmark.");
    assert_eq!(a.finish_reason, Some(FinishReason::EndTurn));
    assert_eq!(a.usage, usage(15, 78, 0));
}

#[tokio::test]
async fn tool_call_index_starting_at_one_and_unterminated_done() {
    // This recording ends "data: [DONE]\n" with no blank line, so by the
    // SSE rules the [DONE] event is never dispatched: the finish_reason
    // alone has to complete the stream.
    let items = decode_fixture("vercel_anthropic_compat_tool_call_index1.sse").await;
    assert!(items.contains(&Ok(ModelEvent::ToolCallStart {
        index: 1,
        id: "toolu_sanitized".into(),
        name: "read_file".into()
    })));
    let a = assemble(&items);
    assert_eq!(a.message.text(), "Reading it.");
    let calls: Vec<_> = a.message.tool_calls().collect();
    assert_eq!(calls, vec![("toolu_sanitized", "read_file", &json!({"path": "a.txt"}))]);
    assert_eq!(a.finish_reason, Some(FinishReason::ToolUse));
    assert_eq!(a.usage, Usage::default(), "no usage chunk in this recording");
}

#[tokio::test]
async fn finish_comes_after_the_usage_chunk() {
    let items = decode_fixture("openai_python_tool_call.sse").await;
    let n = items.len();
    assert!(matches!(items[n - 2], Ok(ModelEvent::Usage(_))), "{:?}", &items[n - 2..]);
    assert_eq!(items[n - 1], Ok(ModelEvent::Finish(FinishReason::ToolUse)));
}

#[tokio::test]
async fn cut_before_finish_reason_is_truncated() {
    for name in fixture_names("openai_chat") {
        let bytes = fixture(&format!("openai_chat/{name}"));
        let text = String::from_utf8(bytes).unwrap();
        let cut = text.find("\"finish_reason\":\"").unwrap_or_else(|| panic!("{name}"));
        let cut = text[..cut].rfind("data:").unwrap();
        let items = decode_chunks(chunked(&text.as_bytes()[..cut], 7)).await;
        assert_eq!(items.last(), Some(&Err(ProviderError::Truncated)), "{name}");
        assert!(!items.iter().any(|i| matches!(i, Ok(ModelEvent::Finish(_)))), "{name}");
        let a = assemble(&items[..items.len() - 1]);
        assert_eq!(a.finish_reason, None);
        assert_eq!(a.message.tool_calls().count(), 0, "{name}: an unfinished call is never executable");
    }
}

#[tokio::test]
async fn done_without_finish_reason_is_truncated() {
    let body = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n";
    let items = decode_chunks(chunked(body.as_bytes(), 3)).await;
    assert_eq!(items, vec![Ok(ModelEvent::TextDelta("hi".into())), Err(ProviderError::Truncated)]);
}

#[tokio::test]
async fn error_chunk_mid_stream() {
    let body = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n\
        data: {\"error\":{\"message\":\"The server had an error while processing your request.\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n";
    let items = decode_chunks(chunked(body.as_bytes(), 11)).await;
    assert_eq!(items.len(), 2);
    assert_eq!(items[0], Ok(ModelEvent::TextDelta("Hel".into())));
    let err = items[1].clone().unwrap_err();
    assert!(matches!(&err, ProviderError::Stream { kind, .. } if kind == "server_error"), "{err:?}");
    assert!(err.is_retryable());
    assert!(err.to_string().contains("error while processing"));
}

#[tokio::test]
async fn malformed_json_is_a_decode_error() {
    let body = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\ndata: {not json\n\n";
    let items = decode_chunks(chunked(body.as_bytes(), 4)).await;
    assert_eq!(items[0], Ok(ModelEvent::TextDelta("a".into())));
    assert!(matches!(&items[1], Err(e @ ProviderError::Decode(_)) if !e.is_retryable()), "{items:?}");
}

#[tokio::test]
async fn compatible_server_variants() {
    // Reasoning under both names, keep-alive comments, a call without
    // index or id whose arguments come as an object, and a `stop` finish
    // after tool calls.
    let body = ": keep-alive\n\n\
        data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"think \"}}]}\n\n\
        data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"more\"}}]}\n\n\
        data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"x\",\"reasoning_content\":\"x\"}}]}\n\n\
        data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"function\":{\"name\":\"view\",\"arguments\":{\"path\":\"a\"}}}]}}]}\n\n\
        data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":60}}}\n\n\
        data: [DONE]\n\n";
    let items = decode_chunks(chunked(body.as_bytes(), 9)).await;
    let a = assemble(&items);
    assert_eq!(a.message.parts[0], Part::Reasoning { text: "think morex".into(), signature: None });
    let calls: Vec<_> = a.message.tool_calls().collect();
    assert_eq!(calls.len(), 1);
    assert!(calls[0].0.starts_with("call_"));
    assert_eq!((calls[0].1, calls[0].2), ("view", &json!({"path": "a"})));
    assert_eq!(a.finish_reason, Some(FinishReason::ToolUse));
    assert_eq!(a.usage, usage(40, 5, 60));
}

#[tokio::test]
async fn arguments_before_name_wait_for_the_start() {
    let body = "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"arguments\":\"{\\\"a\\\"\"}}]}}]}\n\n\
        data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"name\":\"bash\",\"arguments\":\":1}\"}}]}}]}\n\n\
        data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n";
    let items = decode_chunks(chunked(body.as_bytes(), 64)).await;
    assert_eq!(
        items,
        vec![
            Ok(ModelEvent::ToolCallStart { index: 0, id: "c1".into(), name: "bash".into() }),
            Ok(ModelEvent::ToolCallDelta { index: 0, arguments: "{\"a\":1}".into() }),
            Ok(ModelEvent::Finish(FinishReason::ToolUse)),
        ]
    );
}

#[tokio::test]
async fn garbage_never_panics() {
    let bodies = [
        "data: null\n\n",
        "data: []\n\n",
        "data: {\"choices\":\"x\"}\n\n",
        "data: {\"choices\":[null,1,{\"delta\":null,\"finish_reason\":7}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":18446744073709551615,\"function\":{\"name\":\"x\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":-1,\"id\":5}]}}],\"usage\":{\"prompt_tokens\":-3}}\n\n",
        "event: whatever\ndata: {\"usage\":null}\n\nretry: x\nid: \0\n\n",
    ];
    for body in bodies {
        let items = decode_chunks(chunked(body.as_bytes(), 2)).await;
        assert!(items.last().is_some_and(|i| i.is_err()), "{body}: {items:?}");
    }
}

#[test]
fn request_shape() {
    let request = ModelRequest {
        model: "gpt-x".into(),
        system: "You are Kiln.".into(),
        messages: vec![
            Message::user("list files"),
            Message {
                role: Role::Assistant,
                parts: vec![
                    Part::Reasoning { text: "hmm".into(), signature: None },
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
    };
    let body = serde_json::to_value(request_body(&request)).unwrap();
    assert_eq!(
        body,
        json!({
            "model": "gpt-x",
            "messages": [
                {"role": "system", "content": "You are Kiln."},
                {"role": "user", "content": "list files"},
                {"role": "assistant", "content": "Looking.", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"ls\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "view", "arguments": "{\"path\":\"a\"}"}},
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "a\nb"},
                {"role": "tool", "tool_call_id": "call_2", "content": "nope"},
                {"role": "user", "content": "thanks"},
            ],
            "tools": [{"type": "function", "function": {
                "name": "bash", "description": "Run a command",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}
            }}],
            "max_tokens": 1000,
            "temperature": 0.5,
            "stream": true,
            "stream_options": {"include_usage": true},
        })
    );
}

#[test]
fn tool_only_assistant_turn_has_null_content_and_no_tools_key_when_none() {
    let request = ModelRequest {
        model: "m".into(),
        system: String::new(),
        messages: vec![Message {
            role: Role::Assistant,
            parts: vec![Part::ToolCall {
                id: "c".into(),
                name: "bash".into(),
                arguments: json!({}),
                provider_id: None,
            }],
        }],
        tools: vec![],
        max_tokens: 10,
        temperature: None,
        cache_key: None,
    };
    let body = serde_json::to_value(request_body(&request)).unwrap();
    assert_eq!(
        body["messages"],
        json!([{"role": "assistant", "content": null, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        ]}])
    );
    assert!(body.get("tools").is_none() && body.get("temperature").is_none());
}

#[test]
fn url_and_debug() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let p = OpenAiChat::new(Endpoint::new(reqwest::Client::new(), "http://h/v1/", Some("sk-secret-key".into())));
    assert_eq!(p.url(), "http://h/v1/chat/completions");
    assert!(!format!("{p:?}").contains("secret"));
}

#[test]
fn a_cache_key_goes_out_as_prompt_cache_key() {
    let request = ModelRequest {
        model: "m".into(),
        system: "sys".into(),
        messages: vec![Message::user("hi")],
        tools: vec![],
        max_tokens: 10,
        temperature: None,
        cache_key: Some("0192-session".into()),
    };
    let body = serde_json::to_value(request_body(&request)).unwrap();
    assert_eq!(body["prompt_cache_key"], "0192-session");
    let body = serde_json::to_value(request_body(&ModelRequest { cache_key: None, ..request })).unwrap();
    assert!(body.get("prompt_cache_key").is_none());
}
