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
    decode_fixture_variants(decode_stream, &format!("anthropic/{name}")).await
}

async fn assembled_fixture(name: &str) -> Assembled {
    assemble_complete(&decode_fixture(name).await, name)
}

fn usage(input: u64, output: u64) -> Usage {
    Usage { input_tokens: input, output_tokens: output, cache_read_tokens: 0, cache_write_tokens: 0 }
}

#[tokio::test]
async fn every_fixture_decodes() {
    let names = fixture_names("anthropic");
    assert_eq!(names.len(), 9, "{names:?}");
    for name in names {
        let items = decode_fixture(&name).await;
        if name == "docs_error_event.sse" {
            continue;
        }
        let a = assemble(&items);
        assert!(a.finish_reason.is_some(), "{name}");
        assert!(a.rejected_calls.is_empty(), "{name}: {:?}", a.rejected_calls);
    }
}

#[tokio::test]
async fn docs_basic_text() {
    let a = assembled_fixture("docs_basic_text.sse").await;
    assert_eq!(a.message.parts, vec![Part::Text { text: "Hello!".into() }]);
    assert_eq!(a.finish_reason, Some(FinishReason::EndTurn));
    assert_eq!(a.usage, usage(25, 15));
}

#[tokio::test]
async fn vercel_text() {
    let a = assembled_fixture("vercel_text.sse").await;
    assert_eq!(
        a.message.text(),
        "Hello! I'm doing well, thank you for asking. How are you doing today? Is there anything I can help you with?"
    );
    assert_eq!(a.usage, usage(12, 30));
    assert_eq!(a.finish_reason, Some(FinishReason::EndTurn));
}

#[tokio::test]
async fn docs_tool_use() {
    let a = assembled_fixture("docs_tool_use.sse").await;
    assert_eq!(
        a.message.parts,
        vec![
            Part::Text { text: "Okay, let's check the weather for San Francisco, CA:".into() },
            Part::ToolCall {
                id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6".into(),
                name: "get_weather".into(),
                arguments: json!({"location": "San Francisco, CA"}),
                provider_id: None,
            },
        ]
    );
    assert_eq!(a.finish_reason, Some(FinishReason::ToolUse));
    assert_eq!(a.usage, usage(472, 89));
}

#[tokio::test]
async fn vercel_tool_use_alone_and_after_text() {
    let expected_args = json!({"elements": [{"location": "San Francisco", "temperature": 58, "condition": "sunny"}]});
    let a = assembled_fixture("vercel_tool_use.sse").await;
    assert_eq!(
        a.message.parts,
        vec![Part::ToolCall {
            id: "toolu_01KFbKqPYSuAKujiL6mTfzYA".into(),
            name: "json".into(),
            arguments: expected_args.clone(),
            provider_id: None,
        }]
    );
    assert_eq!(a.usage, usage(849, 47));
    assert_eq!(a.finish_reason, Some(FinishReason::ToolUse));

    let items = decode_fixture("vercel_text_then_tool_use.sse").await;
    assert!(items.contains(&Ok(ModelEvent::ToolCallStart {
        index: 1,
        id: "toolu_01KFbKqPYSuAKujiL6mTfzYA".into(),
        name: "json".into()
    })));
    let a = assemble(&items);
    assert_eq!(a.message.text(), "I'll invoke the JSON response tool.");
    assert_eq!(
        a.message.tool_calls().collect::<Vec<_>>(),
        vec![("toolu_01KFbKqPYSuAKujiL6mTfzYA", "json", &expected_args)]
    );
}

#[tokio::test]
async fn tool_use_without_arguments_gets_an_empty_object() {
    let a = assembled_fixture("vercel_tool_use_no_args.sse").await;
    assert_eq!(a.message.text(), "I'll update the issue list for you.");
    assert_eq!(
        a.message.tool_calls().collect::<Vec<_>>(),
        vec![("toolu_01QE1WLsSVp5hy5Q3GmGTmjP", "updateIssueList", &json!({}))]
    );
    assert_eq!(a.usage, usage(565, 48));
}

#[tokio::test]
async fn thinking_with_signature() {
    let a = assembled_fixture("vercel_thinking.sse").await;
    let Part::Reasoning { text, signature } = &a.message.parts[0] else { panic!("{:?}", a.message.parts) };
    assert_eq!(text, "The previous result was 925. Now I need to divide that by 5.\n\n925 ÷ 5 = 185");
    let signature = signature.as_deref().unwrap();
    assert!(signature.starts_with("EvQBCkYICxgCKkAxhD4N") && signature.ends_with("EhT6Ca17BgB"), "{signature}");
    assert_eq!(a.message.parts[1], Part::Text { text: "925 ÷ 5 = 185".into() });
    assert_eq!(a.message.parts.len(), 2);
    assert_eq!(a.usage, usage(69, 53));

    let a = assembled_fixture("docs_thinking.sse").await;
    assert_eq!(
        a.message.parts,
        vec![
            Part::Reasoning {
                text: "I need to find the GCD of 1071 and 462 using the Euclidean algorithm.\n\n\
                       1071 = 2 × 462 + 147\n462 = 3 × 147 + 21\n147 = 7 × 21 + 0\n\
                       The remainder is 0, so GCD(1071, 462) = 21."
                    .into(),
                signature: Some("EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds...".into()),
            },
            Part::Text { text: "The greatest common divisor of 1071 and 462 is **21**.".into() },
        ]
    );
    assert_eq!(a.usage, Usage::default(), "this docs example carries no usage");
    assert_eq!(a.finish_reason, Some(FinishReason::EndTurn));
}

#[tokio::test]
async fn error_event_is_a_retryable_overload() {
    let items = decode_fixture("docs_error_event.sse").await;
    assert_eq!(
        items,
        vec![Err(ProviderError::Stream {
            kind: "overloaded_error".into(),
            message: "overloaded_error: Overloaded".into()
        })]
    );
    assert!(items[0].clone().unwrap_err().is_retryable());
}

#[tokio::test]
async fn cut_before_message_stop_is_truncated() {
    for name in fixture_names("anthropic").into_iter().filter(|n| n != "docs_error_event.sse") {
        let text = String::from_utf8(fixture(&format!("anthropic/{name}"))).unwrap();
        let cut = text.find("event: message_stop").unwrap_or_else(|| panic!("{name}"));
        let items = decode_chunks(chunked(&text.as_bytes()[..cut], 7)).await;
        assert_eq!(items.last(), Some(&Err(ProviderError::Truncated)), "{name}");
        assert!(!items.iter().any(|i| matches!(i, Ok(ModelEvent::Finish(_)))), "{name}");
        let a = assemble(&items[..items.len() - 1]);
        assert_eq!(a.finish_reason, None);
        assert_eq!(a.message.tool_calls().count(), 0, "{name}: an unfinished call is never executable");
    }
}

#[tokio::test]
async fn cut_inside_tool_arguments_is_truncated_and_rejected() {
    let text = String::from_utf8(fixture("anthropic/docs_tool_use.sse")).unwrap();
    let cut = text.find(r#""partial_json":" Francisc""#).unwrap();
    let items = decode_chunks(chunked(&text.as_bytes()[..cut], 64)).await;
    assert_eq!(items.last(), Some(&Err(ProviderError::Truncated)));
    let a = assemble(&items[..items.len() - 1]);
    assert_eq!(a.rejected_calls.len(), 1);
    assert_eq!(a.rejected_calls[0].id, "toolu_01T1x1fJ34qAmk2tNTrN7Up6");
}

#[tokio::test]
async fn server_tool_input_is_not_a_client_call() {
    let body = "event: content_block_start\n\
        data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"server_tool_use\",\"id\":\"srvtoolu_1\",\"name\":\"web_search\",\"input\":{}}}\n\n\
        event: content_block_delta\n\
        data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"query\\\":\\\"x\\\"}\"}}\n\n\
        event: message_delta\n\
        data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"pause_turn\"},\"usage\":{\"output_tokens\":3}}\n\n\
        event: message_stop\n\
        data: {\"type\":\"message_stop\"}\n\n";
    let items = decode_chunks(chunked(body.as_bytes(), 13)).await;
    assert_eq!(
        items,
        vec![Ok(ModelEvent::Usage(usage(0, 3))), Ok(ModelEvent::Finish(FinishReason::Other("pause_turn".into()))),]
    );
}

#[tokio::test]
async fn garbage_never_panics() {
    let bodies = [
        "data: {not json\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\"}\n\n",
        "data: {\"type\":\"content_block_delta\",\"index\":-1,\"delta\":{}}\n\n",
        "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":\"many\"}}}\n\n",
        "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":7}}\n\n",
        "data: 42\n\nevent: message_stop\ndata: {}\n\n",
        "data: {\"type\":\"error\"}\n\n",
    ];
    for body in bodies {
        let items = decode_chunks(chunked(body.as_bytes(), 3)).await;
        assert!(!items.is_empty(), "{body}");
        let _ = assemble(&items.iter().filter(|i| i.is_ok()).cloned().collect::<Vec<_>>());
    }
    // The SSE event name stands in for a missing `type`.
    let items = decode_chunks(chunked(b"event: message_stop\ndata: {}\n\n", 3)).await;
    assert_eq!(items, vec![Ok(ModelEvent::Finish(FinishReason::Other("unknown".into())))]);
}

fn conversation() -> ModelRequest {
    ModelRequest {
        model: "claude-x".into(),
        system: "You are Kiln.".into(),
        messages: vec![
            Message::user("fix it"),
            Message {
                role: Role::Assistant,
                parts: vec![
                    Part::Reasoning { text: "signed".into(), signature: Some("sig".into()) },
                    Part::Reasoning { text: "unsigned".into(), signature: None },
                    // The Responses API's encrypted reasoning: not Anthropic's to read.
                    Part::Reasoning { text: "openai".into(), signature: Some("oai-enc:E".into()) },
                    Part::Text { text: "Looking.".into() },
                    Part::ToolCall {
                        id: "1-1".into(),
                        name: "bash".into(),
                        arguments: json!({"command": "ls"}),
                        provider_id: Some("toolu_1".into()),
                    },
                    Part::ToolCall {
                        id: "toolu_2".into(),
                        name: "view".into(),
                        arguments: json!("garbage"),
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
                        provider_call_id: Some("toolu_1".into()),
                    },
                    Part::ToolResult {
                        call_id: "toolu_2".into(),
                        name: "view".into(),
                        output: String::new(),
                        is_error: true,
                        provider_call_id: None,
                    },
                ],
            },
            Message::user("also check b"),
            Message::system("Summary of earlier work."),
            Message { role: Role::User, parts: vec![Part::Text { text: String::new() }] },
        ],
        tools: vec![ToolSpec {
            name: "bash".into(),
            description: "Run a command".into(),
            input_schema: json!({"type": "object"}),
        }],
        max_tokens: 4096,
        temperature: None,
        cache_key: None,
    }
}

#[test]
fn request_shape() {
    let body = serde_json::to_value(request_body(&conversation())).unwrap();
    assert_eq!(
        body,
        json!({
            "model": "claude-x",
            "max_tokens": 4096,
            "system": "You are Kiln.\n\nSummary of earlier work.",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "fix it"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "signed", "signature": "sig"},
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "view", "input": {}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a\nb", "is_error": false},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "(no output)", "is_error": true},
                    {"type": "text", "text": "also check b"},
                ]},
            ],
            "tools": [{"name": "bash", "description": "Run a command", "input_schema": {"type": "object"}}],
            "stream": true,
        })
    );
}

#[test]
fn tool_results_come_first_in_a_merged_user_turn() {
    let mut request = conversation();
    // A steering message persisted before the tool results.
    request.messages.swap(2, 3);
    let body = serde_json::to_value(request_body(&request)).unwrap();
    let types: Vec<&str> =
        body["messages"][2]["content"].as_array().unwrap().iter().map(|b| b["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["tool_result", "tool_result", "text"]);
}

#[test]
fn url_and_debug() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let at =
        |base_url: &str| Anthropic::new(Endpoint::new(reqwest::Client::new(), base_url, Some("sk-ant-secret".into())));
    let p = at(DEFAULT_BASE_URL);
    assert_eq!(p.url(), "https://api.anthropic.com/v1/messages");
    assert_eq!(at("http://h:1/").url(), "http://h:1/v1/messages");
    assert_eq!(at("http://h:1/v1").url(), "http://h:1/v1/messages");
    assert!(!format!("{p:?}").contains("secret"));
}

/// Every `cache_control` in a request body, by where it is.
fn breakpoints(body: &serde_json::Value) -> Vec<String> {
    let mut found = Vec::new();
    for (i, tool) in body["tools"].as_array().into_iter().flatten().enumerate() {
        if tool.get("cache_control").is_some() {
            found.push(format!("tools[{i}]"));
        }
    }
    for (i, block) in body["system"].as_array().into_iter().flatten().enumerate() {
        if block.get("cache_control").is_some() {
            found.push(format!("system[{i}]"));
        }
    }
    for (m, message) in body["messages"].as_array().into_iter().flatten().enumerate() {
        for (b, block) in message["content"].as_array().into_iter().flatten().enumerate() {
            if block.get("cache_control").is_some() {
                found.push(format!("messages[{m}][{b}]"));
            }
        }
    }
    found
}

#[test]
fn with_a_cache_key_the_tools_the_system_and_the_latest_two_messages_end_cached_prefixes() {
    let request = ModelRequest { cache_key: Some("session".into()), ..conversation() };
    let body = serde_json::to_value(request_body(&request)).unwrap();
    // messages: [user, assistant, user(results + "also check b")]: the last
    // block of the last two.
    assert_eq!(breakpoints(&body), ["tools[0]", "system[0]", "messages[1][3]", "messages[2][2]"]);
    assert_eq!(body["tools"][0]["cache_control"], json!({"type": "ephemeral"}));
    assert_eq!(
        body["system"],
        json!([{"type": "text", "text": "You are Kiln.\n\nSummary of earlier work.", "cache_control": {"type": "ephemeral"}}])
    );
    // The marked blocks keep their shape.
    assert_eq!(body["messages"][2]["content"][2]["type"], "text");
    assert_eq!(body["messages"][1]["content"][3]["type"], "tool_use");

    // The same request without a key: no breakpoint, the system as text.
    let plain = serde_json::to_value(request_body(&conversation())).unwrap();
    assert!(breakpoints(&plain).is_empty());
    assert!(plain["system"].is_string());
}

#[test]
fn a_thinking_block_is_never_a_breakpoint_and_at_most_four_are_set() {
    let mut request = ModelRequest { cache_key: Some("s".into()), ..conversation() };
    request.messages = vec![
        Message::user("go"),
        Message {
            role: Role::Assistant,
            parts: vec![
                Part::Text { text: "one".into() },
                Part::Reasoning { text: "t".into(), signature: Some("sig".into()) },
            ],
        },
    ];
    let body = serde_json::to_value(request_body(&request)).unwrap();
    let found = breakpoints(&body);
    assert_eq!(found, ["tools[0]", "system[0]", "messages[0][0]", "messages[1][0]"]);
    assert!(found.len() <= 4);
}
