//! The production providers against the scripted model server over real
//! HTTP: what the model streams is assembled correctly, and what the
//! providers send is shaped as each API expects.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use futures::StreamExt;
use kiln_protocol::{Message, Part, Role};
use kiln_scripted_model::{Reply, ScriptedCall, ScriptedModel, demo_script};
use kiln_worker::providers::anthropic::Anthropic;
use kiln_worker::providers::assemble::{Assembled, AssistantBuilder};
use kiln_worker::providers::openai_chat::OpenAiChat;
use kiln_worker::providers::{
    Endpoint, FinishReason, ModelEvent, ModelProvider, ModelRequest, ProviderError, ToolSpec,
};
use serde_json::{Value, json};

const KEY: &str = "sk-test-0123456789abcdef";

fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

fn openai(model: &ScriptedModel) -> OpenAiChat {
    OpenAiChat::new(Endpoint::new(client(), model.openai_base_url(), Some(KEY.into())))
}

fn anthropic(model: &ScriptedModel) -> Anthropic {
    Anthropic::new(Endpoint::new(client(), model.anthropic_base_url(), Some(KEY.into())))
}

fn bash_tool() -> ToolSpec {
    ToolSpec {
        name: "bash".into(),
        description: "Run a shell command in the workspace.".into(),
        input_schema: json!({"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}),
    }
}

fn request(messages: Vec<Message>) -> ModelRequest {
    ModelRequest {
        model: "test-model".into(),
        system: "You are Kiln.".into(),
        messages,
        tools: vec![bash_tool()],
        max_tokens: 1024,
        temperature: Some(0.0),
        cache_key: None,
    }
}

/// One model call, assembled as the agent loop does it.
async fn call(provider: &dyn ModelProvider, request: &ModelRequest) -> Assembled {
    let mut stream = provider.stream(request).await.unwrap();
    let mut builder = AssistantBuilder::new();
    while let Some(event) = stream.next().await {
        builder.push(&event.unwrap());
    }
    builder.finish()
}

fn tool_result(call_id: &str, output: &str) -> Message {
    Message {
        role: Role::Tool,
        parts: vec![Part::ToolResult {
            call_id: call_id.into(),
            name: "bash".into(),
            output: output.into(),
            is_error: false,
            provider_call_id: None,
        }],
    }
}

/// Two steps: a tool call, then (given its result) a final answer.
async fn two_steps(provider: &dyn ModelProvider, call_id: &str) -> (Assembled, Assembled) {
    let mut messages = vec![Message::user("What is here?")];
    let first = call(provider, &request(messages.clone())).await;
    assert_eq!(first.finish_reason, Some(FinishReason::ToolUse));
    assert!(first.rejected_calls.is_empty(), "{:?}", first.rejected_calls);
    assert_eq!(
        first.message.parts,
        vec![
            Part::Text { text: "Looking — first.".into() },
            Part::ToolCall {
                id: call_id.into(),
                name: "bash".into(),
                arguments: json!({"command": "ls -la \"my dir\""}),
                provider_id: None,
            },
        ]
    );
    assert!(first.usage.input_tokens > 0 && first.usage.output_tokens > 0, "{:?}", first.usage);

    messages.push(first.message.clone());
    messages.push(tool_result(call_id, "README.md\nsrc"));
    let second = call(provider, &request(messages)).await;
    assert_eq!(second.finish_reason, Some(FinishReason::EndTurn));
    assert_eq!(second.message.parts, vec![Part::Text { text: "A README and src/ ✓".into() }]);
    (first, second)
}

fn script() -> Vec<Reply> {
    vec![
        Reply::tool("bash", json!({"command": "ls -la \"my dir\""})).with_text("Looking — first."),
        Reply::text("A README and src/ ✓"),
    ]
}

#[tokio::test]
async fn openai_chat_round_trip() {
    let model = ScriptedModel::start(script()).await.unwrap();
    two_steps(&openai(&model), "call_1").await;

    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    let sent = &requests[1];
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(sent.header("authorization"), Some(format!("Bearer {KEY}").as_str()));
    assert_eq!(
        sent.body,
        json!({
            "model": "test-model",
            "messages": [
                {"role": "system", "content": "You are Kiln."},
                {"role": "user", "content": "What is here?"},
                {"role": "assistant", "content": "Looking — first.", "tool_calls": [{
                    "id": "call_1", "type": "function",
                    "function": {"name": "bash", "arguments": "{\"command\":\"ls -la \\\"my dir\\\"\"}"},
                }]},
                {"role": "tool", "tool_call_id": "call_1", "content": "README.md\nsrc"},
            ],
            "tools": [{"type": "function", "function": {
                "name": "bash",
                "description": "Run a shell command in the workspace.",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
            }}],
            "max_tokens": 1024,
            "temperature": 0.0,
            "stream": true,
            "stream_options": {"include_usage": true},
        })
    );
}

#[tokio::test]
async fn anthropic_round_trip() {
    let model = ScriptedModel::start(script()).await.unwrap();
    two_steps(&anthropic(&model), "toolu_1").await;

    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    let sent = &requests[1];
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.header("x-api-key"), Some(KEY));
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(sent.header("authorization"), None);
    assert_eq!(
        sent.body,
        json!({
            "model": "test-model",
            "max_tokens": 1024,
            "system": "You are Kiln.",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "What is here?"}]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Looking — first."},
                    {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls -la \"my dir\""}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "README.md\nsrc", "is_error": false},
                ]},
            ],
            "tools": [{
                "name": "bash",
                "description": "Run a shell command in the workspace.",
                "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
            }],
            "temperature": 0.0,
            "stream": true,
        })
    );
}

#[tokio::test]
async fn parallel_calls_and_the_demo_script_through_both_providers() {
    let calls = vec![
        ScriptedCall::new("view", json!({"path": "src/main.rs", "offset": 10})),
        ScriptedCall::new("bash", json!({"command": "printf 'é\\n😀' | wc -c"})),
    ];
    let mut script = vec![Reply::tools(calls.clone()), Reply::tools(calls.clone())];
    script.extend(demo_script());
    script.extend(demo_script());
    let model = ScriptedModel::start(script.clone()).await.unwrap();
    let providers: [Box<dyn ModelProvider>; 2] = [Box::new(openai(&model)), Box::new(anthropic(&model))];
    let mut replies = script.iter();
    for provider in &providers {
        // The script alternates providers: two parallel-call replies first,
        // then one demo script each.
        let reply = replies.next().unwrap();
        let got = call(provider.as_ref(), &request(vec![Message::user("go")])).await;
        assert_eq!(got.message.tool_calls().count(), 2, "{}", provider.name());
        expect_reply(provider.name(), &got, reply);
    }
    for provider in &providers {
        for _ in 0..demo_script().len() {
            let reply = replies.next().unwrap();
            let got = call(provider.as_ref(), &request(vec![Message::user("go")])).await;
            expect_reply(provider.name(), &got, reply);
        }
    }
}

fn expect_reply(provider: &str, got: &Assembled, reply: &Reply) {
    assert_eq!(got.message.text(), reply.text.clone().unwrap_or_default(), "{provider}");
    let calls: Vec<(&str, &Value)> = got.message.tool_calls().map(|(_, name, args)| (name, args)).collect();
    let expected: Vec<(&str, &Value)> = reply.tool_calls.iter().map(|c| (c.name.as_str(), &c.arguments)).collect();
    assert_eq!(calls, expected, "{provider}");
    let finish = if reply.tool_calls.is_empty() { FinishReason::EndTurn } else { FinishReason::ToolUse };
    assert_eq!(got.finish_reason, Some(finish), "{provider}");
}

#[tokio::test]
async fn http_errors_are_typed() {
    let model = ScriptedModel::start(vec![Reply::error(529), Reply::error(429), Reply::error(401), Reply::error(400)])
        .await
        .unwrap();
    let req = request(vec![Message::user("hi")]);

    let overloaded = anthropic(&model).stream(&req).await.err().unwrap();
    assert!(
        matches!(&overloaded, ProviderError::Http { status: 529, kind: Some(k), .. } if k == "overloaded_error"),
        "{overloaded:?}"
    );
    assert!(overloaded.is_retryable());

    let limited = openai(&model).stream(&req).await.err().unwrap();
    assert!(matches!(&limited, ProviderError::Http { status: 429, .. }) && limited.is_retryable(), "{limited:?}");

    let unauthorized = openai(&model).stream(&req).await.err().unwrap();
    assert!(matches!(&unauthorized, ProviderError::Http { status: 401, .. }) && !unauthorized.is_retryable());
    assert!(!unauthorized.to_string().contains(KEY));

    let bad = anthropic(&model).stream(&req).await.err().unwrap();
    assert!(matches!(&bad, ProviderError::Http { status: 400, .. }) && !bad.is_retryable(), "{bad:?}");
}

#[tokio::test]
async fn a_stream_cut_by_the_server_is_truncated() {
    for use_anthropic in [true, false] {
        let model = ScriptedModel::start(vec![Reply::hang()]).await.unwrap();
        let provider: Box<dyn ModelProvider> =
            if use_anthropic { Box::new(anthropic(&model)) } else { Box::new(openai(&model)) };
        let mut stream = provider.stream(&request(vec![Message::user("hi")])).await.unwrap();
        let mut first_text = None;
        while first_text.is_none() {
            match stream.next().await {
                Some(Ok(ModelEvent::TextDelta(text))) => first_text = Some(text),
                Some(Ok(_)) => {}
                other => panic!("{}: {other:?}", provider.name()),
            }
        }
        assert_eq!(first_text.as_deref(), Some("Working"));
        assert!(tokio::time::timeout(Duration::from_millis(200), stream.next()).await.is_err(), "it hangs");
        model.shutdown().await;
        let end = tokio::time::timeout(Duration::from_secs(5), stream.next()).await.unwrap();
        let err = end.unwrap().unwrap_err();
        assert!(
            matches!(err, ProviderError::Truncated | ProviderError::Connection(_)) && err.is_retryable(),
            "{}: {err:?}",
            provider.name()
        );
        assert!(stream.next().await.is_none(), "nothing after the error");
    }
}

#[tokio::test]
async fn an_unreachable_server_is_a_retryable_connection_error() {
    let model = ScriptedModel::start(vec![]).await.unwrap();
    let provider = openai(&model);
    model.shutdown().await;
    let err = provider.stream(&request(vec![Message::user("hi")])).await.err().unwrap();
    assert!(matches!(err, ProviderError::Connection(_)) && err.is_retryable(), "{err:?}");
}
