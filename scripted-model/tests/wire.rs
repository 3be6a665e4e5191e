//! The scripted model over real HTTP: raw response bytes checked against
//! the shapes the Anthropic and OpenAI streaming APIs send.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use kiln_scripted_model::{EXHAUSTED_TEXT, Reply, ScriptedCall, ScriptedModel, demo_script};
use serde_json::{Value, json};

fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// One SSE frame: its `event:` name, if any, and its `data:`.
#[derive(Debug)]
struct Frame {
    event: Option<String>,
    data: String,
}

/// Splits a body into frames strictly: LF line ends, one blank line after
/// every frame, only `event` and `data` fields, one data line per frame.
fn frames(body: &str) -> Vec<Frame> {
    assert!(body.ends_with("\n\n"), "body must end with a terminated frame: {body:?}");
    assert!(!body.contains('\r'));
    body.trim_end_matches('\n')
        .split("\n\n")
        .map(|frame| {
            let mut event = None;
            let mut data = None;
            for line in frame.lines() {
                if let Some(v) = line.strip_prefix("event: ") {
                    assert!(event.replace(v.to_owned()).is_none(), "{frame}");
                } else if let Some(v) = line.strip_prefix("data: ") {
                    assert!(data.replace(v.to_owned()).is_none(), "{frame}");
                } else {
                    panic!("unexpected line {line:?}");
                }
            }
            Frame { event, data: data.unwrap_or_else(|| panic!("frame without data: {frame}")) }
        })
        .collect()
}

fn json_of(frame: &Frame) -> Value {
    serde_json::from_str(&frame.data).unwrap_or_else(|e| panic!("{e}: {}", frame.data))
}

async fn post(model: &ScriptedModel, path: &str, body: Value) -> reqwest::Response {
    client().post(format!("{}{path}", model.anthropic_base_url())).json(&body).send().await.unwrap()
}

async fn stream_body(model: &ScriptedModel, path: &str, body: Value) -> String {
    let response = post(model, path, body).await;
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(content_type.starts_with("text/event-stream"), "{content_type}");
    response.text().await.unwrap()
}

fn anthropic_request() -> Value {
    json!({"model": "claude-test", "max_tokens": 100, "stream": true, "messages": [{"role": "user", "content": "hi"}]})
}

fn openai_request(include_usage: bool) -> Value {
    json!({
        "model": "gpt-test", "max_tokens": 100, "stream": true,
        "stream_options": {"include_usage": include_usage},
        "messages": [{"role": "user", "content": "hi"}],
    })
}

const TEXT: &str = "Let me look — at the ✨ files.";

fn tricky_args() -> Value {
    json!({"command": "echo \"héllo\" && ls -la | grep 'x\\y'", "timeout_s": 30})
}

#[tokio::test]
async fn anthropic_stream_has_the_real_shape() {
    let model = ScriptedModel::start(vec![Reply::tool("bash", tricky_args()).with_text(TEXT)]).await.unwrap();
    let body = stream_body(&model, "/v1/messages", anthropic_request()).await;
    let all = frames(&body);
    let events: Vec<Value> = all.iter().map(json_of).collect();
    for (frame, json) in all.iter().zip(&events) {
        assert_eq!(frame.event.as_deref(), json["type"].as_str(), "event name repeats the type");
    }
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(&types[..3], ["message_start", "ping", "content_block_start"]);
    assert_eq!(&types[types.len() - 2..], ["message_delta", "message_stop"]);

    let start = &events[0]["message"];
    assert_eq!(start["model"], "claude-test");
    assert_eq!(start["role"], "assistant");
    assert!(start["usage"]["input_tokens"].as_u64().unwrap() > 0);

    let text_pieces: Vec<&str> = events
        .iter()
        .filter(|e| e["delta"]["type"] == "text_delta")
        .map(|e| e["delta"]["text"].as_str().unwrap())
        .collect();
    assert!(text_pieces.len() > 3, "text streams in several deltas");
    assert_eq!(text_pieces.concat(), TEXT);

    let tool_start = events.iter().find(|e| e["content_block"]["type"] == "tool_use").unwrap();
    assert_eq!(tool_start["index"], 1);
    assert_eq!(tool_start["content_block"], json!({"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}}));
    let arg_pieces: Vec<&str> = events
        .iter()
        .filter(|e| e["delta"]["type"] == "input_json_delta")
        .map(|e| e["delta"]["partial_json"].as_str().unwrap())
        .collect();
    assert_eq!(arg_pieces[0], "", "the real API opens with an empty piece");
    assert!(arg_pieces.len() > 4);
    assert_eq!(serde_json::from_str::<Value>(&arg_pieces.concat()).unwrap(), tricky_args());

    let delta = &events[events.len() - 2];
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    assert!(delta["usage"]["output_tokens"].as_u64().unwrap() > 0);
    let stops = events.iter().filter(|e| e["type"] == "content_block_stop").count();
    assert_eq!(stops, 2);
}

#[tokio::test]
async fn openai_stream_has_the_real_shape() {
    let calls = vec![ScriptedCall::new("bash", tricky_args()), ScriptedCall::new("view", json!({"path": "a.txt"}))];
    let model = ScriptedModel::start(vec![Reply::tools(calls).with_text(TEXT), Reply::text("plain")]).await.unwrap();
    let body = stream_body(&model, "/v1/chat/completions", openai_request(true)).await;
    let all = frames(&body);
    assert!(all.iter().all(|f| f.event.is_none()), "chat completions frames are data-only");
    assert_eq!(all.last().unwrap().data, "[DONE]");
    let chunks: Vec<Value> = all[..all.len() - 1].iter().map(json_of).collect();
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], "gpt-test");
        assert_eq!(chunk["id"], chunks[0]["id"]);
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");

    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert!(usage["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(finish["choices"][0]["delta"], json!({}));

    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, TEXT);

    let deltas: Vec<&Value> =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array()).flatten().collect();
    let first = |index: u64| deltas.iter().find(|d| d["index"] == index).unwrap();
    assert_eq!(first(0)["id"], "call_1");
    assert_eq!(first(0)["type"], "function");
    assert_eq!(first(0)["function"]["name"], "bash");
    assert_eq!(first(1)["id"], "call_2");
    assert_eq!(first(1)["function"]["name"], "view");
    let arguments = |index: u64| -> Value {
        let text: String = deltas
            .iter()
            .filter(|d| d["index"] == index)
            .map(|d| d["function"]["arguments"].as_str().unwrap())
            .collect();
        serde_json::from_str(&text).unwrap()
    };
    assert_eq!(arguments(0), tricky_args());
    assert_eq!(arguments(1), json!({"path": "a.txt"}));

    // Without include_usage there is no usage chunk, as with the real API.
    let body = stream_body(&model, "/v1/chat/completions", openai_request(false)).await;
    let plain = frames(&body);
    let last_chunk = json_of(&plain[plain.len() - 2]);
    assert_eq!(last_chunk["choices"][0]["finish_reason"], "stop");
    assert!(plain.iter().all(|f| !f.data.contains("prompt_tokens")));
}

#[tokio::test]
async fn script_is_shared_across_endpoints_then_exhausted() {
    let model = ScriptedModel::start(vec![
        Reply::tool("bash", json!({"command": "ls"})),
        Reply::tool("view", json!({"path": "x"})),
    ])
    .await
    .unwrap();
    let first = stream_body(&model, "/v1/messages", anthropic_request()).await;
    assert!(first.contains("\"id\":\"toolu_1\""));
    let second = stream_body(&model, "/v1/chat/completions", openai_request(true)).await;
    assert!(second.contains("\"id\":\"call_2\""), "call ids never repeat");
    for path in ["/v1/messages", "/v1/chat/completions"] {
        let body = if path == "/v1/messages" { anthropic_request() } else { openai_request(true) };
        let text = stream_body(&model, path, body).await;
        let pieces: String = frames(&text)
            .iter()
            .filter(|f| f.data != "[DONE]")
            .map(json_of)
            .filter_map(|e| {
                e["delta"]["text"].as_str().or(e["choices"][0]["delta"]["content"].as_str()).map(str::to_owned)
            })
            .collect();
        assert_eq!(pieces, EXHAUSTED_TEXT, "{path}");
    }

    let requests = model.wait_for_requests(4, Duration::from_secs(1)).await.unwrap();
    let paths: Vec<&str> = requests.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths, ["/v1/messages", "/v1/chat/completions", "/v1/messages", "/v1/chat/completions"]);
    assert_eq!(requests[0].body, anthropic_request());
    assert_eq!(requests[0].header("Content-Type"), Some("application/json"));
    let timed_out = model.wait_for_requests(5, Duration::from_millis(50)).await.unwrap_err();
    assert_eq!((timed_out.expected, timed_out.received), (5, 4));
}

#[tokio::test]
async fn error_replies_use_each_api_error_shape() {
    let model = ScriptedModel::start(vec![Reply::error(529), Reply::error(429), Reply::text("ok")]).await.unwrap();
    let response = post(&model, "/v1/messages", anthropic_request()).await;
    assert_eq!(response.status(), 529);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "overloaded_error");

    let response = post(&model, "/v1/chat/completions", openai_request(true)).await;
    assert_eq!(response.status(), 429);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");

    let ok = stream_body(&model, "/v1/messages", anthropic_request()).await;
    assert!(ok.contains("\"text\":\"ok\""));
}

#[tokio::test]
async fn non_streaming_and_malformed_requests_are_refused_without_using_the_script() {
    let model = ScriptedModel::start(vec![Reply::text("first")]).await.unwrap();
    let mut request = anthropic_request();
    request["stream"] = json!(false);
    assert_eq!(post(&model, "/v1/messages", request).await.status(), 400);
    let garbage =
        client().post(format!("{}/chat/completions", model.openai_base_url())).body("{not json").send().await.unwrap();
    assert_eq!(garbage.status(), 400);
    let ok = stream_body(&model, "/v1/messages", anthropic_request()).await;
    assert!(ok.contains("\"text\":\"firs"), "{ok}");
}

#[tokio::test]
async fn hang_streams_a_delta_then_waits_until_shutdown() {
    for path in ["/v1/messages", "/v1/chat/completions"] {
        let model = ScriptedModel::start(vec![Reply::hang()]).await.unwrap();
        let body = if path == "/v1/messages" { anthropic_request() } else { openai_request(true) };
        let mut response = post(&model, path, body).await;
        assert_eq!(response.status(), 200);
        let mut received = String::new();
        while !received.contains("Working") {
            let chunk = tokio::time::timeout(Duration::from_secs(5), response.chunk()).await.unwrap().unwrap().unwrap();
            received.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        assert!(
            !received.contains("message_stop")
                && !received.contains("finish_reason\":\"")
                && !received.contains("[DONE]")
        );
        assert!(tokio::time::timeout(Duration::from_millis(300), response.chunk()).await.is_err(), "{path}: it hangs");
        model.shutdown().await;
        let rest = tokio::time::timeout(Duration::from_secs(5), response.chunk()).await.unwrap();
        assert!(matches!(rest, Ok(None) | Err(_)), "{path}: shutdown ends the stream");
    }
}

#[tokio::test]
async fn demo_script_plays_through() {
    let script = demo_script();
    let model = ScriptedModel::start(script.clone()).await.unwrap();
    for reply in &script {
        let body = stream_body(&model, "/v1/chat/completions", openai_request(true)).await;
        let expected =
            if reply.tool_calls.is_empty() { "\"finish_reason\":\"stop\"" } else { "\"finish_reason\":\"tool_calls\"" };
        assert!(body.contains(expected), "{body}");
        for call in &reply.tool_calls {
            assert!(body.contains(&format!("\"name\":\"{}\"", call.name)));
        }
    }
}
