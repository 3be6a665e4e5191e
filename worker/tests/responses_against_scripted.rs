//! The Responses API provider against the scripted model server over real
//! HTTP: what the model streams is assembled correctly, and what the
//! provider sends is shaped as the Responses API expects.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use futures::StreamExt;
use kiln_protocol::{Message, Part, Role};
use kiln_scripted_model::{Reply, ScriptedCall, ScriptedModel, demo_script};
use kiln_worker::providers::assemble::{Assembled, AssistantBuilder};
use kiln_worker::providers::openai_responses::OpenAiResponses;
use kiln_worker::providers::{
    Endpoint, FinishReason, ModelEvent, ModelProvider, ModelRequest, ProviderError, ToolSpec,
};
use kiln_worker::{ProviderEndpoints, ProviderKind, Providers};
use serde_json::{Value, json};

const KEY: &str = "sk-test-0123456789abcdef";

fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

fn responses(model: &ScriptedModel) -> OpenAiResponses {
    OpenAiResponses::new(Endpoint::new(client(), model.openai_base_url(), Some(KEY.into())))
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

#[tokio::test]
async fn responses_round_trip() {
    let model = ScriptedModel::start(vec![
        Reply::tool("bash", json!({"command": "ls -la \"my dir\""})).with_text("Looking — first."),
        Reply::text("A README and src/ ✓"),
    ])
    .await
    .unwrap();
    let provider = responses(&model);
    assert_eq!(provider.name(), "openai-responses");

    let mut messages = vec![Message::user("What is here?")];
    let first = call(&provider, &request(messages.clone())).await;
    assert_eq!(first.finish_reason, Some(FinishReason::ToolUse));
    assert!(first.rejected_calls.is_empty(), "{:?}", first.rejected_calls);
    assert_eq!(
        first.message.parts,
        vec![
            Part::Text { text: "Looking — first.".into() },
            Part::ToolCall {
                id: "call_1".into(),
                name: "bash".into(),
                arguments: json!({"command": "ls -la \"my dir\""}),
                provider_id: None,
            },
        ]
    );
    assert!(first.usage.input_tokens > 0 && first.usage.output_tokens > 0, "{:?}", first.usage);

    messages.push(first.message.clone());
    messages.push(tool_result("call_1", "README.md\nsrc"));
    let second = call(&provider, &request(messages)).await;
    assert_eq!(second.finish_reason, Some(FinishReason::EndTurn));
    assert_eq!(second.message.parts, vec![Part::Text { text: "A README and src/ ✓".into() }]);

    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    let sent = &requests[1];
    assert_eq!(sent.path, "/v1/responses");
    assert_eq!(sent.header("authorization"), Some(format!("Bearer {KEY}").as_str()));
    assert_eq!(sent.header("accept"), Some("text/event-stream"));
    assert_eq!(
        sent.body,
        json!({
            "include": ["reasoning.encrypted_content"],
            "model": "test-model",
            "instructions": "You are Kiln.",
            "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is here?"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking — first."}]},
                {"type": "function_call", "call_id": "call_1", "name": "bash",
                    "arguments": "{\"command\":\"ls -la \\\"my dir\\\"\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "README.md\nsrc"},
            ],
            "tools": [{
                "type": "function",
                "name": "bash",
                "description": "Run a shell command in the workspace.",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
                "strict": false,
            }],
            "max_output_tokens": 1024,
            "temperature": 0.0,
            "stream": true,
            "store": false,
        })
    );
}

#[tokio::test]
async fn parallel_calls_and_the_demo_script() {
    let calls = vec![
        ScriptedCall::new("view", json!({"path": "src/main.rs", "offset": 10})),
        ScriptedCall::new("bash", json!({"command": "printf 'é\\n😀' | wc -c"})),
    ];
    let mut script = vec![Reply::tools(calls).with_text("Two at once.")];
    script.extend(demo_script());
    let model = ScriptedModel::start(script.clone()).await.unwrap();
    let provider = responses(&model);
    for reply in &script {
        let got = call(&provider, &request(vec![Message::user("go")])).await;
        assert!(got.rejected_calls.is_empty(), "{:?}", got.rejected_calls);
        assert_eq!(got.message.text(), reply.text.clone().unwrap_or_default());
        let calls: Vec<(&str, &Value)> = got.message.tool_calls().map(|(_, name, args)| (name, args)).collect();
        let expected: Vec<(&str, &Value)> = reply.tool_calls.iter().map(|c| (c.name.as_str(), &c.arguments)).collect();
        assert_eq!(calls, expected);
        let finish = if reply.tool_calls.is_empty() { FinishReason::EndTurn } else { FinishReason::ToolUse };
        assert_eq!(got.finish_reason, Some(finish));
    }
}

#[tokio::test]
async fn http_errors_are_typed() {
    let model = ScriptedModel::start(vec![Reply::error(429), Reply::error(401)]).await.unwrap();
    let req = request(vec![Message::user("hi")]);
    let limited = responses(&model).stream(&req).await.err().unwrap();
    assert!(matches!(&limited, ProviderError::Http { status: 429, .. }) && limited.is_retryable(), "{limited:?}");
    let unauthorized = responses(&model).stream(&req).await.err().unwrap();
    assert!(matches!(&unauthorized, ProviderError::Http { status: 401, .. }) && !unauthorized.is_retryable());
    assert!(!unauthorized.to_string().contains(KEY));
}

#[tokio::test]
async fn a_stream_cut_by_the_server_is_truncated() {
    let model = ScriptedModel::start(vec![Reply::hang()]).await.unwrap();
    let provider = responses(&model);
    let mut stream = provider.stream(&request(vec![Message::user("hi")])).await.unwrap();
    assert_eq!(stream.next().await, Some(Ok(ModelEvent::TextDelta("Working".into()))));
    assert!(tokio::time::timeout(Duration::from_millis(200), stream.next()).await.is_err(), "it hangs");
    model.shutdown().await;
    let end = tokio::time::timeout(Duration::from_secs(5), stream.next()).await.unwrap();
    let err = end.unwrap().unwrap_err();
    assert!(matches!(err, ProviderError::Truncated | ProviderError::Connection(_)) && err.is_retryable(), "{err:?}");
    assert!(stream.next().await.is_none(), "nothing after the error");
}

#[tokio::test]
async fn the_worker_config_routes_openai_responses_to_this_provider() {
    let model = ScriptedModel::start(vec![Reply::text("via config")]).await.unwrap();
    assert_eq!("openai-responses".parse(), Ok(ProviderKind::OpenAiResponses));
    let providers = Providers::new(ProviderEndpoints {
        openai_base_url: Some(model.openai_base_url()),
        openai_api_key: Some(KEY.into()),
        ..ProviderEndpoints::default()
    })
    .unwrap();
    let provider = providers.get(ProviderKind::OpenAiResponses);
    assert_eq!(provider.name(), "openai-responses");
    let got = call(provider.as_ref(), &request(vec![Message::user("hi")])).await;
    assert_eq!(got.message.text(), "via config");
    assert_eq!(model.requests()[0].path, "/v1/responses");
    assert_eq!(providers.get(ProviderKind::OpenAi).name(), "openai");
}
